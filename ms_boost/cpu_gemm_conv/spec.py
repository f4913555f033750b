"""The ``cpu_gemm_conv`` algorithm for the pipeline: its config section and ``SPEC``."""
from __future__ import annotations

import dataclasses

import mindspore as ms

from ms_boost.cpu_gemm_conv.layer import swap_convolutions
from ms_boost.cpu_gemm_conv.section import PLAN, CpuGemmConvConfig
from ms_boost.spec import BuildContext

__all__ = ["CpuGemmConvConfig", "SPEC"]


def _on_cpu() -> bool:
    return ms.get_context("device_target") == "CPU"


def _rewrite_train(network, optimizer, cfg: CpuGemmConvConfig, ctx: BuildContext):
    if _on_cpu():
        swap_convolutions(network, cfg.skip)
    return network, optimizer


def _rewrite_eval(network, cfg: CpuGemmConvConfig, ctx: BuildContext):
    return _rewrite_train(network, None, cfg, ctx)[0]


def _describe(cfg: CpuGemmConvConfig, ctx: BuildContext) -> str:
    if not _on_cpu():
        return f"cpu_gemm_conv (off: device {ms.get_context('device_target')}, not CPU)"
    skipped = f", except {', '.join(cfg.skip)}" if cfg.skip else ""
    return f"nn.Conv2d as im2col + GEMM{skipped} (layers left alone are logged)"


#: Computes ``nn.Conv2d`` as im2col + GEMM on CPU; before LessBN (order 10), so every later rewrite sees the
#: swapped layers (still ``nn.Conv2d`` objects).
SPEC = dataclasses.replace(PLAN, rewrite_train=_rewrite_train, rewrite_eval=_rewrite_eval, describe=_describe)

"""The ``cpu_gemm_conv`` algorithm for the pipeline: its config section and ``SPEC``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Dict, Tuple

import mindspore as ms

from ms_boost.cpu_gemm_conv.layer import swap_convolutions
from ms_boost.spec import AlgorithmSpec, BuildContext, Rule, Section
from ms_boost.validation import BoostConfigError

__all__ = ["CpuGemmConvConfig", "SPEC"]


def _names(path: str, value) -> Tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or \
            not all(isinstance(v, str) and v for v in value):
        raise BoostConfigError(f"boost config '{path}' must be a list of layer names (non-empty strings, as in "
                               f"network.cells_and_names()), got {value!r}.")
    return tuple(value)


@dataclass(frozen=True)
class CpuGemmConvConfig(Section):
    """``cpu_gemm_conv`` section.

    Attributes:
        skip: names of ``nn.Conv2d`` layers (as in ``network.cells_and_names()``) to leave as they are.
    """

    skip: Tuple[str, ...] = ()

    SECTION: ClassVar[str] = "cpu_gemm_conv"
    RULES: ClassVar[Dict[str, Rule]] = {"skip": _names}


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
SPEC = AlgorithmSpec(name="cpu_gemm_conv", section=CpuGemmConvConfig, order=5, levels=("O1", "O2"),
                     in_enable_all=True, rewrite_train=_rewrite_train, rewrite_eval=_rewrite_eval,
                     describe=_describe)

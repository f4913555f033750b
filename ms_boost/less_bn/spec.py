"""LessBN as the pipeline sees it: its ``less_bn`` section and its ``SPEC``."""
from __future__ import annotations

import dataclasses

from ms_boost.less_bn.convert import LessBN, apply_less_bn, apply_less_bn_eval, preview_less_bn
from ms_boost.less_bn.section import PLAN, LessBNConfig
from ms_boost.spec import BuildContext

__all__ = ["LessBNConfig", "SPEC"]


def _rewrite_train(network, optimizer, cfg: LessBNConfig, ctx: BuildContext):
    return apply_less_bn(network, optimizer, cfg, ctx.common)


def _rewrite_eval(network, cfg: LessBNConfig, ctx: BuildContext):
    return apply_less_bn_eval(network, cfg)


def _preview(network, cfg: LessBNConfig):
    return preview_less_bn(network, cfg.fn_flag)


def _rewritten(network, optimizer) -> bool:
    return any(isinstance(cell, LessBN) for _, cell in network.cells_and_names())


#: The LessBN algorithm for the pipeline (network rewrite for training and evaluation).
SPEC = dataclasses.replace(PLAN, rewrite_train=_rewrite_train, rewrite_eval=_rewrite_eval, rewritten=_rewritten,
                           preview=_preview)

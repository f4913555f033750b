"""Gradient freezing as the pipeline sees it: its ``grad_freeze`` section and its ``SPEC``."""
from __future__ import annotations

import dataclasses

from ms_boost.grad_freeze.cell import apply_grad_freeze
from ms_boost.grad_freeze.optimizer import FreezeOpt
from ms_boost.grad_freeze.section import PLAN, GradFreezeConfig
from ms_boost.spec import BuildContext

__all__ = ["GradFreezeConfig", "SPEC"]


def _rewrite_train(network, optimizer, cfg: GradFreezeConfig, ctx: BuildContext):
    return apply_grad_freeze(network, optimizer, cfg)


def _rewritten(network, optimizer) -> bool:
    return isinstance(optimizer, FreezeOpt)


#: Gradient freezing: the optimizer becomes a FreezeOpt updating the step's unfrozen groups.
SPEC = dataclasses.replace(PLAN, rewrite_train=_rewrite_train, rewritten=_rewritten,
                           apply_text="optimizer on this step's unfrozen groups")

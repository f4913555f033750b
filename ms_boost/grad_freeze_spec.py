"""The gradient-freezing algorithm as the pipeline sees it (kept apart from :mod:`ms_boost.grad_freeze`)."""
from __future__ import annotations

from ms_boost.grad_freeze import apply_grad_freeze
from ms_boost.sections import GradFreezeConfig
from ms_boost.spec import AlgorithmSpec, BuildContext

__all__ = ["SPEC"]


def _rewrite_train(network, optimizer, cfg: GradFreezeConfig, ctx: BuildContext):
    return apply_grad_freeze(network, optimizer, cfg)


#: Gradient freezing: the optimizer becomes a FreezeOpt updating the step's unfrozen groups.
SPEC = AlgorithmSpec(name="grad_freeze", section=GradFreezeConfig, order=20, levels=("O1", "O2"),
                     in_enable_all=True, rewrite_train=_rewrite_train,
                     apply_text="optimizer on this step's unfrozen groups")

"""THOR through the boost configuration, as the pipeline sees it."""
from __future__ import annotations

from ms_boost.sections import ThorConfig
from ms_boost.spec import AlgorithmSpec, BuildContext
from ms_boost.thor.boost import apply_boost_thor

__all__ = ["SPEC"]


def _rewrite_train(network, optimizer, cfg: ThorConfig, ctx: BuildContext):
    return apply_boost_thor(network, optimizer, cfg)


#: THOR replaces the network (converted copy) and the optimizer, and runs alone.
SPEC = AlgorithmSpec(name="thor", section=ThorConfig, order=70, runs_alone=True, rewrite_train=_rewrite_train,
                     apply_text="THOR preconditioned optimizer")

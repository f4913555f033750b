"""THOR through the boost configuration, as the pipeline sees it: its ``thor`` section and its ``SPEC``."""
from __future__ import annotations

import dataclasses

from ms_boost.spec import BuildContext
from ms_boost.thor.boost import apply_boost_thor
from ms_boost.thor.section import PLAN, ThorConfig

__all__ = ["ThorConfig", "SPEC"]


def _rewrite_train(network, optimizer, cfg: ThorConfig, ctx: BuildContext):
    return apply_boost_thor(network, optimizer, cfg)


#: THOR replaces the network (converted copy) and the optimizer, and runs alone.
SPEC = dataclasses.replace(PLAN, rewrite_train=_rewrite_train, apply_text="THOR preconditioned optimizer")

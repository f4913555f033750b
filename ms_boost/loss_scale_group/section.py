"""The ``loss_scale_group`` section and ``PLAN``, the algorithm's place in the boost plan (its spec without hooks).

No MindSpore here: the boost plan is checked from these alone (:mod:`ms_boost.plans`, the launchers' check);
``spec.py`` adds the hooks that build cells.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ms_boost.spec import AlgorithmSpec, Section

__all__ = ["LossScaleGroupConfig", "PLAN"]


@dataclass(frozen=True)
class LossScaleGroupConfig(Section):
    """``loss_scale_group`` section (no keys: groups come from the ``GroupLossScaleManager``)."""

    SECTION: ClassVar[str] = "loss_scale_group"


#: the ``loss_scale_group`` algorithm's place in the plan (name, section, order, levels, exclusivity)
PLAN = AlgorithmSpec(name="loss_scale_group", section=LossScaleGroupConfig, order=50)

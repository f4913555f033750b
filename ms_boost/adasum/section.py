"""The ``adasum`` section and ``PLAN``, the algorithm's place in the boost plan (its spec without hooks).

No MindSpore here: the boost plan is checked from these alone (:mod:`ms_boost.plans`, the launchers' check);
``spec.py`` adds the hooks that build cells.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ms_boost.spec import AlgorithmSpec, Section

__all__ = ["AdaSumConfig", "PLAN"]


@dataclass(frozen=True)
class AdaSumConfig(Section):
    """``adasum`` section (no keys yet: the hierarchy comes from ``common.device_number``)."""

    SECTION: ClassVar[str] = "adasum"


#: the ``adasum`` algorithm's place in the plan (name, section, order, levels, exclusivity)
PLAN = AlgorithmSpec(name="adasum", section=AdaSumConfig, order=40, levels=("O2",), in_enable_all=True)

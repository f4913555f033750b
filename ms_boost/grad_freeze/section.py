"""The ``grad_freeze`` section and ``PLAN``, the algorithm's place in the boost plan (its spec without hooks).

No MindSpore here: the boost plan is checked from these alone (:mod:`ms_boost.plans`, the launchers' check);
``spec.py`` adds the hooks that build cells.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Dict, Optional

from ms_boost.grad_freeze.schedule import SCHEDULE_RULES
from ms_boost.spec import AlgorithmSpec, Rule, Section, optional_rule
from ms_boost.validation import check_bool

__all__ = ["GradFreezeConfig", "PLAN"]


@dataclass(frozen=True)
class GradFreezeConfig(Section):
    """``grad_freeze`` section (upstream's schedules, seeded).

    Attributes:
        param_groups: number of parameter groups the network is split into (>= 1; more groups than
            trainable parameters are clamped to the parameter count when the optimizer is built).
        freeze_type: :class:`~ms_boost.grad_freeze.schedule.FreezeStrategy` (stored as its int): 0 = upstream's
            continuous schedule (``'00001234'``), 1 = its interval schedule (``'01020304'``); both freeze groups
            from the input side.
        freeze_p: share of steps on which every group trains, in [0, 1] (0.7: something is frozen on 30%).
        total_steps: the schedule's length; every group trains again before it ends (int64).
        seed: seed of the schedule (ms_boost addition; upstream used unseeded numpy randomness).
        graph_variants: Graph mode, steps called from Python (ms_boost addition): True, each train set runs a
            graph compiled for it on its first step, whose backward pass computes only that set's weight gradients
            (as upstream's per-group networks and as PyNative mode here); False, one graph computes every gradient
            and masks the frozen groups' updates (one compile in all); None (default, auto): per-set graphs for runs
            ``ms_boost.Model`` knows to be at least ``AUTO_VARIANTS_MIN_STEPS`` (20,000) steps. Dataset sink mode
            always runs the one graph.
    """

    param_groups: int = 10
    freeze_type: int = 1
    freeze_p: float = 0.7
    total_steps: int = 65536
    seed: int = 0
    graph_variants: Optional[bool] = None

    SECTION: ClassVar[str] = "grad_freeze"
    RULES: ClassVar[Dict[str, Rule]] = {**SCHEDULE_RULES, "graph_variants": optional_rule(check_bool)}


#: the ``grad_freeze`` algorithm's place in the plan (name, section, order, levels, exclusivity)
PLAN = AlgorithmSpec(name="grad_freeze", section=GradFreezeConfig, order=20, levels=("O1", "O2"), in_enable_all=True)

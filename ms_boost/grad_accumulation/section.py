"""The ``grad_accumulation`` section and ``PLAN``, the algorithm's place in the boost plan (its spec without hooks).

No MindSpore here: the boost plan is checked from these alone (:mod:`ms_boost.plans`, the launchers' check);
``spec.py`` adds the hooks that build cells.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Dict

from ms_boost.spec import AlgorithmSpec, Rule, Section, int_rule

__all__ = ["GradAccumulationConfig", "PLAN", "check_accumulation_step"]

#: The one rule for ``grad_accumulation.grad_accumulation_step`` (the section and the stage both use it).
check_accumulation_step = int_rule(low=1, holder="the micro-step counter is an int32")


@dataclass(frozen=True)
class GradAccumulationConfig(Section):
    """``grad_accumulation`` section.

    ``grad_accumulation_step`` micro-steps per weight update (upstream: ``max_accumulation_step``); at most ``2**31 -
    1``, what the int32 micro-step counter holds.
    """

    grad_accumulation_step: int = 1

    SECTION: ClassVar[str] = "grad_accumulation"
    ALIASES: ClassVar[Dict[str, str]] = {"max_accumulation_step": "grad_accumulation_step"}
    RULES: ClassVar[Dict[str, Rule]] = {
        "grad_accumulation_step": check_accumulation_step,
    }


def _warn_config(cfg: GradAccumulationConfig):
    if cfg.grad_accumulation_step == 1:
        return ("grad_accumulation is on with grad_accumulation.grad_accumulation_step=1: every step updates the "
                "weights (no accumulation)")
    return None


#: the ``grad_accumulation`` algorithm's place in the plan (name, section, order, levels, exclusivity)
PLAN = AlgorithmSpec(name="grad_accumulation", section=GradAccumulationConfig, order=30, in_enable_all=True,
                     warn_config=_warn_config,
                     branches_on_device=True)  # the update runs under `if count >= k`

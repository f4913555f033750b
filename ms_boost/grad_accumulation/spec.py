"""Gradient accumulation as the pipeline sees it: its ``grad_accumulation`` section and its ``SPEC``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Dict

from ms_boost.grad_accumulation.stage import AccumulateUpdate, check_accumulation_step
from ms_boost.spec import AlgorithmSpec, BuildContext, Rule, Section

__all__ = ["GradAccumulationConfig", "SPEC"]


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


def _stage(inner, weights, cfg: GradAccumulationConfig, ctx: BuildContext):
    if cfg.grad_accumulation_step == 1:
        return None  # every step updates: no stage
    return AccumulateUpdate(inner, weights, cfg.grad_accumulation_step)


def _describe(cfg: GradAccumulationConfig, ctx: BuildContext) -> str:
    return f"accumulate x{cfg.grad_accumulation_step}"


def _warn_config(cfg: GradAccumulationConfig):
    if cfg.grad_accumulation_step == 1:
        return ("grad_accumulation is on with grad_accumulation.grad_accumulation_step=1: every step updates the "
                "weights (no accumulation)")
    return None


#: Gradient accumulation for the pipeline: the outermost update stage.
SPEC = AlgorithmSpec(name="grad_accumulation", section=GradAccumulationConfig, order=30, in_enable_all=True,
                     stage=_stage, describe=_describe, warn_config=_warn_config)

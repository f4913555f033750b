"""Gradient accumulation as the pipeline sees it: its ``grad_accumulation`` section and its ``SPEC``."""
from __future__ import annotations

import dataclasses

from ms_boost.grad_accumulation.section import PLAN, GradAccumulationConfig
from ms_boost.grad_accumulation.stage import AccumulateUpdate
from ms_boost.spec import BuildContext

__all__ = ["GradAccumulationConfig", "SPEC"]


def _stage(inner, weights, cfg: GradAccumulationConfig, ctx: BuildContext):
    if cfg.grad_accumulation_step == 1:
        return None  # every step updates: no stage
    return AccumulateUpdate(inner, weights, cfg.grad_accumulation_step)


def _describe(cfg: GradAccumulationConfig, ctx: BuildContext) -> str:
    return f"accumulate x{cfg.grad_accumulation_step}"



#: Gradient accumulation for the pipeline: the outermost update stage.
SPEC = dataclasses.replace(PLAN, stage=_stage, describe=_describe)

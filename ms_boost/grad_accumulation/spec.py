"""Gradient accumulation as the pipeline sees it: its ``grad_accumulation`` section and its ``SPEC``."""
from __future__ import annotations

import dataclasses

from ms_boost.grad_accumulation.section import PLAN, GradAccumulationConfig
from ms_boost.grad_accumulation.stage import AccumulateUpdate
from ms_boost.spec import BuildContext, TrainingData

__all__ = ["GradAccumulationConfig", "SPEC"]


def _stage(inner, weights, cfg: GradAccumulationConfig, ctx: BuildContext):
    if cfg.grad_accumulation_step == 1:
        return None  # every step updates: no stage
    return AccumulateUpdate(inner, weights, cfg.grad_accumulation_step)


def _describe(cfg: GradAccumulationConfig, ctx: BuildContext) -> str:
    return f"accumulate x{cfg.grad_accumulation_step}"


def _warn_data(cfg: GradAccumulationConfig, data: TrainingData):
    """A short last batch: the update is the mean of the micro-steps' gradients, not the gradient of their samples."""
    if cfg.grad_accumulation_step == 1 or data.last_batch is None or data.batch_size is None:
        return None
    return (f"grad_accumulation: the training data set's last batch holds {data.last_batch} of {data.batch_size} "
            f"rows (batch(..., drop_remainder=False)); each update is the mean of "
            f"grad_accumulation.grad_accumulation_step={cfg.grad_accumulation_step} micro-steps' gradients, so "
            f"that short batch weighs as much as a full one (as in mindspore.boost) and such an update is not the "
            f"gradient of the samples it saw; batch(..., drop_remainder=True) keeps every update exact")


#: Gradient accumulation for the pipeline: the outermost update stage.
SPEC = dataclasses.replace(PLAN, stage=_stage, describe=_describe, warn_data=_warn_data)

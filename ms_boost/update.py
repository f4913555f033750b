"""Old name of :mod:`ms_boost.stages` (the update stages and the hook protocols).

Kept for code that imports ``ms_boost.update`` (``from ms_boost.update import UpdateStage``, as the earlier docs
showed).
"""
from __future__ import annotations

from ms_boost.stages import (
    OptimizerHooks,
    OptimizerUpdate,
    StageHooks,
    UpdateStage,
    learning_rate_parameters,
    optimizer_hooks,
    register_optimizer_hooks,
    runs_as_python,
    scale_gradients,
    stage_chain,
)

__all__ = ["StageHooks", "UpdateStage", "OptimizerUpdate", "stage_chain", "runs_as_python", "scale_gradients",
           "OptimizerHooks", "register_optimizer_hooks", "optimizer_hooks", "learning_rate_parameters"]

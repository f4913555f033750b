"""Gradient freezing: on some steps the input-side layers are not updated.

The trainable parameters are split, in network order, into ``G = param_groups`` consecutive groups
``g_0`` (input side) ... ``g_{G-1}`` (output side). A *schedule* gives, for every step ``t``, the number
``s_t`` in ``[0, G-1]`` of leading groups that are frozen: groups ``g_0 .. g_{s_t - 1}`` keep their weights
**and** their optimizer state (momentum, Adam moments ...) untouched on that step, groups
``g_{s_t} .. g_{G-1}`` are updated as usual. ``s_t = 0`` trains everything; the output-side group always
trains. This is upstream's scheme (its "train parameter group" ``i`` is the suffix ``g_i .. g_{G-1}``).

* :mod:`ms_boost.grad_freeze.schedule` -- :class:`FreezeStrategy`, the schedules (:class:`FreezeSchedule`,
  :func:`freeze_schedule`) and the parameter groups (:func:`partition_parameters`);
* :mod:`ms_boost.grad_freeze.optimizer` -- :class:`FreezeOpt`, the optimizer updating this step's groups;
* :mod:`ms_boost.grad_freeze.cell` -- upstream's :class:`GradientFreeze` and :func:`freeze_cell`;
* :mod:`ms_boost.grad_freeze.spec` -- the ``grad_freeze`` section and ``SPEC``.
"""
from __future__ import annotations

from ms_boost.grad_freeze.cell import GradientFreeze, apply_grad_freeze, freeze_cell
from ms_boost.grad_freeze.optimizer import DEVICE_TABLE_MAX, FreezeOpt
from ms_boost.grad_freeze.schedule import (
    CONTINUOUS_STRATEGY,
    INTERVAL_STRATEGY,
    MAX_TOTAL_STEPS,
    FreezeSchedule,
    FreezeStrategy,
    freeze_schedule,
    partition_parameters,
)
from ms_boost.grad_freeze.spec import SPEC, GradFreezeConfig

__all__ = [
    "FreezeStrategy", "CONTINUOUS_STRATEGY", "INTERVAL_STRATEGY", "MAX_TOTAL_STEPS", "DEVICE_TABLE_MAX",
    "FreezeSchedule", "freeze_schedule", "partition_parameters", "FreezeOpt", "GradientFreeze", "freeze_cell",
    "apply_grad_freeze", "GradFreezeConfig", "SPEC",
]

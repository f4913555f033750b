"""Gradient accumulation: k micro-steps of batch b make one update, as one step on batch k*b.

* :mod:`ms_boost.grad_accumulation.stage` -- :class:`AccumulateUpdate`, the update stage (and its formula);
* :mod:`ms_boost.grad_accumulation.spec` -- the ``grad_accumulation`` section and ``SPEC``;
* :mod:`ms_boost.grad_accumulation.cell` -- upstream's :class:`GradientAccumulation` cell.
"""
from __future__ import annotations

from ms_boost.grad_accumulation.cell import GradientAccumulation
from ms_boost.grad_accumulation.spec import SPEC, GradAccumulationConfig
from ms_boost.grad_accumulation.stage import AccumulateUpdate

__all__ = ["AccumulateUpdate", "GradientAccumulation", "GradAccumulationConfig", "SPEC"]

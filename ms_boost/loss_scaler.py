"""One loss-scaler interface for the train cell: fixed, dynamic (an update cell) and per-group scales.

A :class:`LossScaler` is a Cell called as ``scaler(scale, grads, forward_bad) -> (grads, overflow)``: it
divides the gradients by the scale that produced them, decides whether the step overflowed on any rank, and
updates its scale(s). ``forward_bad`` counts the non-finite values the forward pass produced outside the
gradients (the loss, BatchNorm statistics it updated: see :func:`forward_non_finite`): a step is an overflow
when any gradient computed *or* anything the forward pass wrote is not finite, so weights frozen on that step
(whose gradients were never computed) cannot hide it. ``scale`` is the train cell's ``scale_sense`` Parameter
(the sensitivity of the backward pass). The train cell skips the update when ``overflow`` is True.

* :class:`FixedLossScaler` -- ``g / S``; overflow = some gradient or forward value on some rank is not finite.
* :class:`DynamicLossScaler` -- as fixed, then MindSpore's update cell (``DynamicLossScaleUpdateCell``,
  ``FixedLossScaleUpdateCell``) updates ``S`` and returns the overflow flag.
* :class:`GroupLossScaler` -- a :class:`~ms_boost.loss_scale_group.GroupLossScaleManager`: per-group scales
  applied inside the network (``S = 1`` here), unscaled and updated per group.

:func:`make_loss_scaler` picks one from what the user passed as ``scale_sense``.
"""
from __future__ import annotations

from typing import Any, Sequence, Tuple

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from ms_boost import comm
from ms_boost.loss_scale_group import GroupLossScaleManager, is_group_manager
from ms_boost.stages import unscale_gradients

__all__ = ["LossScaler", "FixedLossScaler", "DynamicLossScaler", "GroupLossScaler", "make_loss_scaler",
           "forward_non_finite", "non_finite_count", "is_group_manager"]

# Per-tensor steps mapped over tuples with HyperMap: a Python loop in ``construct`` unrolls into one call
# per tensor, which exceeds Graph mode's call-depth limit on deep networks (ResNet-101 has ~300 tensors).
_non_finite = ops.MultitypeFuncGraph("non_finite")


_REDUCE_ALL = ops.ReduceAll(keep_dims=False)


@_non_finite.register("Tensor")
def _non_finite_tensor(g):
    # the primitive over every axis, not Tensor.all(): the method costs more to compile at each gradient's shape
    return ops.cast(ops.logical_not(_REDUCE_ALL(ops.isfinite(g), ())), ms.float32)


_hyper_map = ops.HyperMap()


def non_finite_count(grads) -> Tensor:
    """Number of gradients holding an inf or NaN (a float32 scalar)."""
    return ops.addn(_hyper_map(_non_finite, grads))


def forward_non_finite(loss, buffers=None) -> Tensor:
    """What a forward pass wrote that is not finite.

    1 for a non-finite loss, plus one per buffer (BatchNorm moving statistics updated by that pass) holding an inf or
    NaN; a float32 scalar.

    Read after the forward pass: the buffers' new values are checked, the ones the update would keep.
    """
    bad = _non_finite_tensor(loss)
    if buffers is not None:
        bad = bad + non_finite_count(buffers)
    return bad


class LossScaler(nn.Cell):
    """Base: ``construct(scale, grads, forward_bad) -> (grads, overflow)``.

    ``forward_bad`` (float32 scalar, see :func:`forward_non_finite`) > 0 makes the step an overflow on every
    rank, like a non-finite gradient.

    Attributes:
        initial_scale: the value the train cell's ``scale_sense`` starts at.
    """

    initial_scale: float = 1.0

    def state_parameters(self) -> Sequence[Parameter]:
        """The scaler's own Parameters (not restored by the overflow snapshot: a back-off must stick)."""
        return ()

    def current_scale(self, scale, overflow):
        """The loss scale the train cell reports after the step: ``scale`` (the cell's, updated in place)."""
        return scale


class FixedLossScaler(LossScaler):
    """Divide by the whole ``scale``; overflow when any gradient on any rank is not finite.

    An optimizer built with ``loss_scale=S`` (MindSpore's convention with ``FixedLossScaleManager(S,
    drop_overflow_update=False)``) gets its share back from its apply stage
    (:attr:`~ms_boost.stages.OptimizerUpdate.gradient_scale`), so every stage in between sees true gradients.

    Args:
        value: the loss scale ``S`` (> 0, finite).
        reduce_overflow: sum the non-finite counts over the ranks (data parallel: one rank's overflow skips the
            step on every rank); False for ranks that train on their own (no collective, as MindSpore's cell).
    """

    def __init__(self, value: float, reduce_overflow: bool = True):
        super().__init__(auto_prefix=False)
        self.initial_scale = float(value)
        # non-finite gradients, summed over the data-parallel ranks
        self.overflow_reduce = comm.AllReduce("sum", enabled=reduce_overflow)

    def unscale(self, scale, grads, forward_bad=0.0) -> Tuple[Any, Tensor]:
        """``(grads / scale, overflow)``; overflow counts non-finite gradients and ``forward_bad`` over every rank."""
        grads = unscale_gradients(scale, grads)
        bad = non_finite_count(grads) + forward_bad
        overflow = self.overflow_reduce(ops.reshape(bad, (1,)))[0] > 0.5
        return grads, overflow

    def construct(self, scale, grads, forward_bad=0.0):
        """``(grads, overflow)`` for the fixed scale."""
        return self.unscale(scale, grads, forward_bad)


class DynamicLossScaler(FixedLossScaler):
    """:class:`FixedLossScaler`, then ``update_cell(scale, overflow)`` updates the scale in place."""

    def __init__(self, update_cell: nn.Cell, reduce_overflow: bool = True):
        super().__init__(float(update_cell.get_loss_scale()), reduce_overflow)
        self.update_cell = update_cell

    def construct(self, scale, grads, forward_bad=0.0):
        """``(grads, overflow)``, then the update cell updates the scale (and returns the overflow flag)."""
        grads, overflow = self.unscale(scale, grads, forward_bad)
        overflow = self.update_cell(scale, overflow)
        return grads, overflow


class GroupLossScaler(LossScaler):
    """Per-group scales of a :class:`~ms_boost.loss_scale_group.GroupLossScaleManager` (the train cell's scale is 1)."""

    def __init__(self, manager: GroupLossScaleManager, weights, reduce_overflow: bool = True):
        super().__init__(auto_prefix=False)
        self.manager = manager.bind(weights, reduce_overflow)  # learns the order of the gradients

    def state_parameters(self) -> Sequence[Parameter]:
        """The manager's scales and counters (an overflow back-off must stick, so they are never restored)."""
        return tuple(self.manager.get_parameters())

    def current_scale(self, scale, overflow):
        """The first group's scale after the step's update.

        Upstream's third output with a group manager; the cell's own ``scale`` stays 1.
        """
        return ops.depend(self.manager.scales, overflow)[1]

    def construct(self, scale, grads, forward_bad=None):
        """The manager unscales every group by its own scale and updates the scales."""
        return self.manager.unscale_and_update(grads, forward_bad)


def make_loss_scaler(scale_sense: Any, weights: Sequence[Parameter], reduce_overflow: bool = True) -> LossScaler:
    """The scaler for what the user passed as ``scale_sense``.

    Args:
        scale_sense: a :class:`GroupLossScaleManager`, a loss-scale update Cell (``manager.get_update_cell()``),
            a Tensor holding one value, or a positive number.
        weights: the parameters in gradient order (a group manager needs them).
        reduce_overflow: agree on overflow across the ranks (data parallel); False: this rank decides alone.

    Raises:
        TypeError: ``scale_sense`` is none of these.
        ValueError: the scale is not a positive finite number, or the Tensor holds more than one value.
    """
    if isinstance(scale_sense, GroupLossScaleManager):
        return GroupLossScaler(scale_sense, weights, reduce_overflow)
    if isinstance(scale_sense, nn.Cell):
        scaler = DynamicLossScaler(scale_sense, reduce_overflow)
    elif isinstance(scale_sense, Tensor):
        arr = scale_sense.asnumpy()
        if arr.size != 1:
            raise ValueError(f"scale_sense must hold one value (shape () or (1,)), got shape {arr.shape}.")
        scaler = FixedLossScaler(float(arr.reshape(())), reduce_overflow)
    elif isinstance(scale_sense, (int, float)) and not isinstance(scale_sense, bool):
        scaler = FixedLossScaler(float(scale_sense), reduce_overflow)
    else:
        raise TypeError("scale_sense must be a loss-scale update Cell, a Tensor, a number or a "
                        f"GroupLossScaleManager, got {type(scale_sense).__name__}.")
    if not np.isfinite(scaler.initial_scale) or scaler.initial_scale <= 0:
        raise ValueError(f"scale_sense must be a positive finite loss scale, got {scaler.initial_scale}.")
    return scaler

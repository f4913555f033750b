"""Boost training cells: one step of loss, gradients, reduction and the configured update pipeline.

``construct`` has one path::

    loss  = network(*inputs)
    grads = d loss / d weights            (with the loss scale as sensitivity in the loss-scale cell)
    grads = reducer(grads)                 (data-parallel mean; within a server when AdaSum is on)
    [loss-scale cell] unscale, overflow = any non-finite gradient on any rank, update the scale
    if not overflow: update(loss, grads, *inputs)

All choices (which reducer, which update stages) are made in ``__init__`` from the resolved
:class:`~ms_boost.config.AutoBoost`. An overflow step skips the whole update: no weight, optimizer
state or algorithm state changes.
"""
from __future__ import annotations

import logging
from typing import Any, Optional, Union

import mindspore as ms
import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

from ms_boost import comm
from ms_boost.config import AutoBoost, resolve
from ms_boost.update import build_update

logger = logging.getLogger("ms_boost")

__all__ = ["BoostTrainOneStepCell", "BoostTrainOneStepWithLossScaleCell", "build_reducer"]


def build_reducer(boost: AutoBoost, weights) -> comm.GradReducer:
    """The data-parallel gradient reducer the configuration asks for.

    Follows MindSpore's parallel context (``set_auto_parallel_context(parallel_mode=DATA_PARALLEL,
    gradients_mean=...)``): identity in stand-alone mode or on one rank. With AdaSum on, gradients are
    averaged only among the ``common.device_number`` ranks of a server; AdaSum combines the servers.
    """
    reduce, mean, degree = comm.data_parallel_reduce_config()
    if reduce and boost.enabled("adasum"):
        per_server = comm.server_size(boost.common.device_number)
        group, _ = comm.server_groups(per_server)
        return comm.GradReducer(weights, mean, per_server, group, enabled=group is not None)
    return comm.GradReducer(weights, mean, degree, None, enabled=reduce)


class BoostTrainOneStepCell(nn.Cell):
    """One boosted training step without loss scaling.

    Args:
        network: the loss network (``WithLossCell`` or any Cell returning the loss).
        optimizer: the optimizer (an ``nn.Optimizer``, a ``FreezeOpt`` or THOR).
        sens: gradient sensitivity (a constant scale of the loss); 1.0 when None.
        boost_config: an :class:`~ms_boost.config.AutoBoost`, a level string, or None for O0. (Upstream
            read a process-wide singleton instead; ms_boost passes the plan explicitly.)

    Returns from ``construct``: the loss.
    """

    def __init__(self, network: nn.Cell, optimizer: nn.Cell, sens: Optional[float] = None,
                 boost_config: Union[AutoBoost, str, None] = None):
        super().__init__(auto_prefix=False)
        self.boost = resolve(boost_config)
        self.network = network
        self.network.set_grad()
        self.optimizer = optimizer
        self.weights = optimizer.parameters
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)
        self.sens = 1.0 if sens is None else float(sens)
        self.reducer = build_reducer(self.boost, self.weights)
        self.update = build_update(self.boost, network, optimizer, self.weights)

    def construct(self, *inputs):
        loss = self.network(*inputs)
        sens = ops.ones_like(loss) * self.sens
        grads = self.grad(self.network, self.weights)(*inputs, sens)
        grads = self.reducer(grads)
        loss = ops.depend(loss, self.update(loss, grads, *inputs))
        return loss


# Per-tensor steps mapped over tuples with HyperMap: a Python loop in ``construct`` unrolls into one call
# per tensor, which exceeds Graph mode's call-depth limit on deep networks (ResNet-101 has ~300 tensors).
_non_finite = ops.MultitypeFuncGraph("non_finite")
_scale_by = ops.MultitypeFuncGraph("scale_by")
_copy_into = ops.MultitypeFuncGraph("copy_into")


@_non_finite.register("Tensor")
def _non_finite_tensor(g):
    return ops.cast(ops.logical_not(ops.isfinite(g).all()), ms.float32)


@_scale_by.register("Tensor", "Tensor")
def _scale_tensor(factor, g):
    return g * ops.cast(factor, g.dtype)


@_copy_into.register("Tensor", "Tensor")
def _copy_tensor(dst, src):
    return ops.assign(dst, src)


_hyper_map = ops.HyperMap()


def _non_finite_count(grads) -> Tensor:
    """Number of gradients holding an inf or NaN (a float32 scalar)."""
    return ops.addn(_hyper_map(_non_finite, grads))


class BoostTrainOneStepWithLossScaleCell(BoostTrainOneStepCell):
    """One boosted training step with loss scaling and overflow skipping.

    Args:
        network: the loss network.
        optimizer: the optimizer.
        scale_sense: a loss-scale update cell (``DynamicLossScaleUpdateCell``,
            ``FixedLossScaleUpdateCell``, from ``manager.get_update_cell()``), a Tensor holding a fixed
            scale of shape ``()`` or ``(1,)``, or a :class:`~ms_boost.loss_scale.GroupLossScaleManager`.
        boost_config: as :class:`BoostTrainOneStepCell`.

    Gradients leave the cell divided by ``loss_scale / optimizer.loss_scale``: an optimizer built with
    ``loss_scale=S`` (MindSpore's convention with ``FixedLossScaleManager(S, drop_overflow_update=False)``)
    divides by ``S`` itself, and every combination of manager and optimizer ends with unscaled updates.

    Returns from ``construct``: ``(loss, overflow, loss_scale)`` like MindSpore's
    ``TrainOneStepWithLossScaleCell``. An overflow on any rank skips the update on every rank, whatever
    the manager's ``drop_overflow_update`` (ms_boost never writes non-finite values into weights).
    """

    def __init__(self, network: nn.Cell, optimizer: nn.Cell, scale_sense: Any,
                 boost_config: Union[AutoBoost, str, None] = None):
        super().__init__(network, optimizer, sens=None, boost_config=boost_config)
        self.group_manager = None
        self.scale_update_cell = None
        if callable(getattr(scale_sense, "unscale_and_update", None)):  # a GroupLossScaleManager
            self.group_manager = scale_sense.bind(self.weights)  # learns the order of the gradients
            value = 1.0
        elif isinstance(scale_sense, nn.Cell):
            self.scale_update_cell = scale_sense
            value = float(scale_sense.get_loss_scale())
        elif isinstance(scale_sense, Tensor):
            arr = scale_sense.asnumpy()
            if arr.size != 1:
                raise ValueError(f"scale_sense must hold one value (shape () or (1,)), got shape {arr.shape}.")
            value = float(arr.reshape(()))
        elif isinstance(scale_sense, (int, float)) and not isinstance(scale_sense, bool):
            value = float(scale_sense)
        else:
            raise TypeError("scale_sense must be a loss-scale update Cell, a Tensor, a number or a "
                            f"GroupLossScaleManager, got {type(scale_sense).__name__}.")
        if not np.isfinite(value) or value <= 0:
            raise ValueError(f"scale_sense must be a positive finite loss scale, got {value}.")
        self.scale_sense = Parameter(Tensor(value, ms.float32), name="scale_sense")
        self.use_group = self.group_manager is not None
        self.use_update_cell = self.scale_update_cell is not None
        self.overflow_reduce = comm.AllReduce("sum")  # non-finite gradients, summed over the ranks
        # An optimizer built with loss_scale=S divides the gradients by S itself (MindSpore's convention for
        # FixedLossScaleManager(drop_overflow_update=False)); the cell leaves that share of the scale in.
        self.optimizer_loss_scale = float(getattr(optimizer, "loss_scale", 1.0) or 1.0)
        # Buffers the forward pass writes (BatchNorm moving statistics): snapshotted before the step and
        # restored on overflow, so an overflow step leaves the network exactly as it was.
        # (A group manager's scales are excluded: their back-off on overflow must stick.)
        manager_params = set() if self.group_manager is None else {
            id(p) for p in self.group_manager.get_parameters()}
        # THOR's scratch statistics and factors are only folded in by the (skipped) optimizer step: no restore.
        from ms_boost.thor import thor_state_parameters

        manager_params |= {id(p) for p in thor_state_parameters(network)}
        self.buffers = ParameterTuple(p for p in network.get_parameters()
                                      if not p.requires_grad and p.dtype in (ms.float32, ms.float16)
                                      and id(p) not in manager_params)
        self.buffer_shadows = self.buffers.clone(prefix="overflow_shadow", init="same")
        self.has_buffers = len(self.buffers) > 0
        if hasattr(optimizer, "bind_loss_scale"):  # THOR unscales its captured G by the live loss scale
            optimizer.bind_loss_scale(self.scale_sense)

    def set_sense_scale(self, sens) -> None:
        """Set the loss scale (as MindSpore's loss-scale cell)."""
        value = sens.asnumpy().reshape(()) if isinstance(sens, Tensor) else sens
        self.scale_sense.set_data(Tensor(float(value), ms.float32))

    def construct(self, *inputs):
        if self.has_buffers:
            inputs = ops.depend(inputs, _hyper_map(_copy_into, self.buffer_shadows, self.buffers))
        loss = self.network(*inputs)
        scaling_sens = self.scale_sense
        sens = ops.ones_like(loss) * ops.cast(scaling_sens, loss.dtype)
        grads = self.grad(self.network, self.weights)(*inputs, sens)
        grads = self.reducer(grads)
        if self.use_group:
            grads, overflow = self.group_manager.unscale_and_update(grads)
        else:
            inv = ops.reciprocal(scaling_sens) * self.optimizer_loss_scale
            grads = _hyper_map(ops.partial(_scale_by, inv), grads)
            overflow = self.overflow_reduce(ops.reshape(_non_finite_count(grads), (1,)))[0] > 0.5
            if self.use_update_cell:
                overflow = self.scale_update_cell(self.scale_sense, overflow)
        if not overflow:
            loss = ops.depend(loss, self.update(loss, grads, *inputs))
        elif self.has_buffers:
            loss = ops.depend(loss, _hyper_map(_copy_into, self.buffers, self.buffer_shadows))
        return loss, overflow, scaling_sens

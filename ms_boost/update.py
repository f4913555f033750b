"""Update stages: how one step's gradients turn into new weights.

An update stage is an ``nn.Cell`` whose ``construct(self, loss, grads, *inputs)`` applies one step and
returns a Tensor the train cell chains with ``ops.depend``. Stages compose by wrapping, and the chain
is fixed in ``__init__`` (:func:`build_update`), so the train cell's ``construct`` has a single path:

    accumulate (k micro-steps) -> AdaSum across servers -> apply (optimizer | frozen groups | DimReduce | THOR)

The gradient reduction across ranks and the overflow skip happen in the train cell before any stage
runs, so stages never see an overflow step and never need to undo one.
"""
from __future__ import annotations

from mindspore import nn

from ms_boost.config import AutoBoost

__all__ = ["OptimizerUpdate", "build_update"]


class OptimizerUpdate(nn.Cell):
    """Apply the optimizer to the gradients (plain SGD/Momentum/Adam/LARS, a FreezeOpt, THOR, ...)."""

    def __init__(self, optimizer):
        super().__init__(auto_prefix=False)
        self.optimizer = optimizer

    def construct(self, loss, grads, *inputs):
        return self.optimizer(grads)


def build_update(boost: AutoBoost, network, optimizer, weights) -> nn.Cell:
    """Compose the update stage chain the configuration asks for.

    Args:
        boost: resolved configuration.
        network: the loss network (DimReduce re-evaluates the loss with it during its line search).
        optimizer: the optimizer (possibly a FreezeOpt or THOR) the apply stage calls.
        weights: the parameters the gradients belong to, in gradient order.

    Returns:
        The outermost stage.
    """
    if boost.enabled("dim_reduce"):
        from ms_boost.dim_reduce import build_dim_reduce_update

        stage = build_dim_reduce_update(network, weights, boost.dim_reduce, boost.common)
    else:
        stage = OptimizerUpdate(optimizer)
    if boost.enabled("adasum"):
        from ms_boost.adasum import AdaSumUpdate

        stage = AdaSumUpdate(stage, weights, boost.common.device_number)
    if boost.enabled("grad_accumulation") and boost.grad_accumulation.grad_accumulation_step > 1:
        from ms_boost.grad_accumulation import AccumulateUpdate

        stage = AccumulateUpdate(stage, weights, boost.grad_accumulation.grad_accumulation_step)
    return stage

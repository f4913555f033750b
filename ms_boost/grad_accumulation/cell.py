"""Upstream's ``mindspore.boost.GradientAccumulation`` cell, built on the accumulation stage."""
from __future__ import annotations

from mindspore import nn, ops

from ms_boost.grad_accumulation.spec import GradAccumulationConfig
from ms_boost.grad_accumulation.stage import AccumulateUpdate
from ms_boost.stages import OptimizerUpdate

__all__ = ["GradientAccumulation"]


class GradientAccumulation(nn.Cell):
    """Upstream API: accumulate the gradients of ``max_accumulation_step`` steps, then call the optimizer.

    Args:
        max_accumulation_step: micro-steps per update, ``>= 1``.
        optimizer: the optimizer (anything with ``parameters`` and ``__call__(grads)``).

    Inputs:
        - **loss** (Tensor) - the step's loss.
        - **grads** (tuple[Tensor]) - the step's gradients, in ``optimizer.parameters`` order.

    Outputs:
        Tensor, ``loss`` (after the accumulation and, every ``max_accumulation_step`` calls, the update).

    Example:
        >>> accumulate = GradientAccumulation(4, optimizer)
        >>> loss = accumulate(loss, grads)   # inside a train step; updates every 4th call
    """

    def __init__(self, max_accumulation_step: int, optimizer):
        super().__init__(auto_prefix=False)
        GradAccumulationConfig(grad_accumulation_step=max_accumulation_step)  # the one rule for the value
        if not hasattr(optimizer, "parameters"):
            raise TypeError(f"GradientAccumulation: optimizer must expose 'parameters', got "
                            f"{type(optimizer).__name__}.")
        self._max_accumulation_step = max_accumulation_step
        self.optimizer = optimizer
        self.weights = optimizer.parameters
        self.stage = AccumulateUpdate(OptimizerUpdate(optimizer), self.weights, max_accumulation_step)

    def construct(self, loss, grads):
        """Accumulate ``grads``; every ``max_accumulation_step``-th call updates. Returns ``loss``."""
        return ops.depend(loss, self.stage(loss, grads))

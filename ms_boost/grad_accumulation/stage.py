r"""Gradient accumulation: k micro-steps of batch b make one update, as one step on batch k*b.

The gradients of ``k`` consecutive micro-batches are summed into accumulator Parameters; every
``k``-th call applies the inner update with their mean

.. math::

    \bar g = \frac{1}{k} \sum_{j=1}^{k} g_j

and clears the accumulators. For a loss that is a mean over the batch and micro-batches of equal size,
:math:`\bar g` is exactly the gradient of the loss over the ``k*b`` samples, so e.g. SGD takes the same
step as on the large batch (BatchNorm statistics, being per micro-batch, are the exception).

State (the accumulators and the micro-step counter) lives in Parameters, so it lands in checkpoints.
Steps the loss-scale cell drops for overflow never reach the stage and are not counted.
"""
from __future__ import annotations

from mindspore import Parameter, ParameterTuple, Tensor, nn, ops
from mindspore.common import dtype as mstype
from mindspore.ops import composite as C
from mindspore.ops import functional as F

from ms_boost.grad_accumulation.section import check_accumulation_step
from ms_boost.stages import UpdateStage

__all__ = ["AccumulateUpdate", "check_accumulation_step"]


_add_into = C.MultitypeFuncGraph("ms_boost_add_into")
_clear = C.MultitypeFuncGraph("ms_boost_clear")
_scaled = C.MultitypeFuncGraph("ms_boost_scaled")


@_add_into.register("Tensor", "Tensor")
def _add_into_one(accumulator, grad):
    """Accumulator += grad (cast to the accumulator's dtype)."""
    return ops.assign_add(accumulator, grad.astype(accumulator.dtype))


@_clear.register("Tensor")
def _clear_one(accumulator):
    """Accumulator = 0."""
    return ops.assign(accumulator, ops.zeros_like(accumulator))


@_scaled.register("Tensor", "Tensor")
def _scaled_one(factor, total):
    r"""The mean gradient from the accumulated sum: :math:`\bar g = \text{total} \cdot (1/k)`."""
    return total * factor.astype(total.dtype)


class AccumulateUpdate(UpdateStage):
    r"""Update stage: accumulate ``k`` gradients, then run ``inner`` once with their mean.

    Args:
        inner: update stage with ``construct(self, loss, grads, *inputs)`` (e.g. ``OptimizerUpdate``).
        weights: the parameters the gradients belong to, in gradient order.
        k: micro-steps per update (``grad_accumulation.grad_accumulation_step``), ``>= 1``.

    Inputs:
        - **loss** (Tensor) - this micro-step's loss (passed on to ``inner``).
        - **grads** (tuple[Tensor]) - this micro-step's gradients.
        - **\*inputs** - this micro-step's inputs (passed on to ``inner``).

    Outputs:
        Tensor, the micro-step counter after the call (0 right after an update), for ``ops.depend``.

    Raises:
        TypeError, ValueError: ``k`` is not an int in ``[1, 2**31 - 1]`` (the int32 counter).
    """

    def __init__(self, inner: nn.Cell, weights, k: int):
        self.k = check_accumulation_step("grad_accumulation.grad_accumulation_step", k)
        super().__init__(inner)
        weights = weights if isinstance(weights, ParameterTuple) else ParameterTuple(list(weights))
        self.accumulators = weights.clone(prefix="grad_accumulation", init="zeros")
        self.counter = Parameter(Tensor(0, mstype.int32), name="accumulation_step", requires_grad=False)
        self.inv_k = Tensor(1.0 / self.k, mstype.float32)
        self.hyper_map = C.HyperMap()

    def construct(self, loss, grads, *inputs):
        """Add ``grads`` to the accumulators; on the ``k``-th call run ``inner`` with their mean and clear them."""
        added = self.hyper_map(_add_into, self.accumulators, grads)
        count = ops.depend(self.counter, added) + 1
        done = ops.assign(self.counter, count)
        if count >= self.k:
            mean = self.hyper_map(F.partial(_scaled, self.inv_k), self.accumulators)
            done = ops.depend(done, self.inner(loss, mean, *inputs))
            done = ops.depend(done, self.hyper_map(_clear, self.accumulators))
            done = ops.depend(done, ops.assign(self.counter, ops.zeros_like(count)))
        return done

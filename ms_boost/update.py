"""Update stages: how one step's gradients turn into new weights, and the hooks a stage offers the train cell.

An update stage is an ``nn.Cell`` whose ``construct(self, loss, grads, *inputs)`` applies one step and
returns a Tensor the train cell chains with ``ops.depend``. Stages compose by wrapping: the pipeline
(:mod:`ms_boost.pipeline`) builds the chain in ``__init__`` from the ordered algorithm specs, so the
train cell's ``construct`` has a single path, e.g.::

    accumulate (k micro-steps) -> AdaSum across servers -> apply (optimizer | frozen groups | DimReduce | THOR)

The gradient reduction across ranks and the overflow skip happen in the train cell before any stage
runs, so stages never see an overflow step and never need to undo one.

Hooks (:class:`StageHooks`): what the loss-scale train cell asks every stage, instead of testing types.

* :meth:`StageHooks.transient_parameters` -- Parameters the forward pass writes that an overflow
  snapshot must *not* restore (scratch statistics folded in only by the skipped update);
* :meth:`StageHooks.bind_loss_scale` -- told the Parameter that holds the live loss scale.
"""
from __future__ import annotations

from typing import Iterator, Sequence

from mindspore import Parameter, nn

__all__ = ["StageHooks", "UpdateStage", "OptimizerUpdate", "stage_chain"]


class StageHooks:
    """Optional hooks of an update stage or an optimizer (defaults: nothing to do)."""

    def transient_parameters(self) -> Sequence[Parameter]:
        """Parameters that an overflow step's snapshot/restore of network buffers skips."""
        return ()

    def bind_loss_scale(self, loss_scale: Parameter) -> None:
        """Receive the Parameter holding the live loss scale (the loss-scale train cell calls this once)."""
        del loss_scale


class UpdateStage(nn.Cell, StageHooks):
    """Base of the update stages: ``inner`` is the wrapped stage (None for an apply stage).

    Subclasses implement ``construct(self, loss, grads, *inputs)``.
    """

    def __init__(self, inner=None, auto_prefix: bool = False):
        super().__init__(auto_prefix=auto_prefix)
        if inner is not None and not isinstance(inner, nn.Cell):
            raise TypeError(f"{type(self).__name__}: inner must be an update stage (nn.Cell), got "
                            f"{type(inner).__name__}.")
        self.inner = inner


class OptimizerUpdate(UpdateStage):
    """Apply the optimizer to the gradients (plain SGD/Momentum/Adam/LARS, a FreezeOpt, THOR, ...).

    Its hooks forward to the optimizer when the optimizer offers them (:class:`StageHooks`, e.g. THOR).
    """

    def __init__(self, optimizer):
        super().__init__()
        self.optimizer = optimizer

    def transient_parameters(self) -> Sequence[Parameter]:
        if isinstance(self.optimizer, StageHooks):
            return tuple(self.optimizer.transient_parameters())
        return ()

    def bind_loss_scale(self, loss_scale: Parameter) -> None:
        if isinstance(self.optimizer, StageHooks):
            self.optimizer.bind_loss_scale(loss_scale)

    def construct(self, loss, grads, *inputs):
        return self.optimizer(grads)


def stage_chain(stage: nn.Cell) -> Iterator[nn.Cell]:
    """The stages of a chain from the outermost to the apply stage (following ``inner``)."""
    while stage is not None:
        yield stage
        stage = getattr(stage, "inner", None) if isinstance(stage, UpdateStage) else None

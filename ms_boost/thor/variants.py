"""Two compiled THOR train steps, chosen on the host each step: a capturing/refresh variant and a plain one.

A THOR train step compiled as one graph tests, on the device, every layer's capture flag (forward and
backward) and the optimizer's refresh condition. Those switches cost even when they do nothing (on CPU,
copies of the activations entering each branch and actor hand-offs; ``docs/thor.md`` "Cost"). The host
knows before each step whether it captures and refreshes (the capture flags, ``step % frequency``, the
first step, a step after a skipped one), so it can run a graph compiled for exactly that case instead:

* *capturing/refresh* variant: every THOR layer captures, no capture switch; the refresh stays a device
  condition, which orders its reads of the statistics after the backward pass that writes them (one switch,
  on refresh steps only);
* *plain* variant: nothing is captured or refreshed, no capture or refresh switch -- the step between
  refreshes.

A variant is the train cell compiled under its own ``phase`` (MindSpore keeps one graph per phase, as
upstream's THOR model does with ``train0`` / ``train1``), with the layers' and the optimizer's static modes
set while it compiles; each variant is compiled on its first use. Anything else -- dataset sink mode on GPU or
Ascend, where MindSpore runs the steps without returning to Python (on CPU MindSpore 2.10 trains a sink run step
by step, and the variants are chosen there too: :func:`ms_boost.thor.guard.runs_sunk`), PyNative mode, a direct
call of the train cell -- runs the default graph with the device-side switches. Both give the same numbers.
"""
from __future__ import annotations

from typing import Optional, Tuple

import mindspore as ms
from mindspore import nn

__all__ = ["StepVariants", "ThorTrainStep"]

Variant = Tuple[bool, bool]  # (capture, refresh)


class StepVariants:
    """Host-side choice of THOR's step variant for one optimizer.

    Args:
        optimizer: the :class:`~ms_boost.thor.optimizer.THOR` optimizer the train cell steps.
    """

    def __init__(self, optimizer: nn.Optimizer):
        self.optimizer = optimizer
        self._restore_phase: Optional[str] = None

    def decide(self) -> Variant:
        """``(capture, refresh)`` of the next step from the optimizer's state (four scalar reads).

        The first layer's capture flag stands for all of them: the optimizer and ``request_capture`` write them
        together, and a checkpoint saves them together. Flags set by hand to different values are not seen:
        then call the train cell directly (device-side switches).
        """
        opt = self.optimizer
        capture = bool(opt.capture_flags[0].asnumpy()) if len(opt.capture_flags) else False
        refresh = (not bool(opt.thor_initialised.asnumpy()) or bool(opt.refresh_next.asnumpy())
                   or int(opt.global_step.asnumpy().reshape(-1)[0]) % opt.frequency == 0)
        return capture, refresh

    def select(self, cell: nn.Cell) -> Optional[Variant]:
        """Make the next call of the train cell ``cell`` run the variant of the next step (Graph mode only).

        Call :meth:`restore` after the step. Returns the variant, or None when the default graph runs.
        """
        if ms.get_context("mode") != ms.GRAPH_MODE or not isinstance(cell, nn.Cell):
            return None
        capture, refresh = variant = self.decide()
        self._set(capture, refresh)
        self._restore_phase = cell.phase
        cell.phase = f"{cell.phase}_thor_{'capture' if capture else 'plain'}{'_refresh' if refresh else ''}"
        return variant

    def restore(self, cell: nn.Cell) -> None:
        """Back to the default graph with device-side switches (for whatever compiles next, e.g. a sink graph).

        Nothing to do when :meth:`select` chose no variant.
        """
        if self._restore_phase is None:
            return
        self._set(None, None)
        if isinstance(cell, nn.Cell):
            cell.phase = self._restore_phase
        self._restore_phase = None

    def _set(self, capture: Optional[bool], refresh: Optional[bool]) -> None:
        for layer in self.optimizer.thor_layers:
            layer.set_static_capture(capture)
        # a refresh stays a device condition (see THOR.construct); a step without refresh compiles it out
        self.optimizer.static_refresh = None if refresh is None or refresh else False


class ThorTrainStep:
    """Call a THOR train cell with the step variant chosen on the host (for loops that call the cell directly).

    ``ms_boost.Model.train`` does this itself (through :class:`~ms_boost.thor.guard.ThorGuard`); a custom loop
    wraps its train cell: ``step = ThorTrainStep(train_cell, opt)``, then ``loss = step(x, y)``.

    Args:
        cell: the train cell (``TrainOneStepCell`` or ms_boost's train cells) holding ``optimizer``.
        optimizer: its THOR optimizer.
    """

    def __init__(self, cell: nn.Cell, optimizer: nn.Optimizer):
        self.cell = cell
        self.variants = StepVariants(optimizer)

    def __call__(self, *inputs):
        """One train step of the wrapped cell, in the variant the host chose; returns the cell's output."""
        self.variants.select(self.cell)
        try:
            return self.cell(*inputs)
        finally:
            self.variants.restore(self.cell)

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

The choice is THOR's stage hook (:class:`ThorStepVariants`, which the THOR optimizer inherits): ms_boost's train
cell asks every stage of its update chain for its part of the step's variant before each Graph-mode step it
runs from Python (:func:`ms_boost.stages.plan_graph_variant`) and compiles the step under its own ``phase``
(MindSpore keeps one graph per phase, as upstream's THOR model does with ``train0`` / ``train1``), with the
layers' and the optimizer's static modes set while it compiles; each variant is compiled on its first use, and
the modes are reset after the step (:meth:`ThorStepVariants.end_step`). That covers a direct call of the train
cell, ``ms_boost.Model.train`` (with or without evaluations between epochs) and a CPU run asked to sink (MindSpore
2.10 trains it step by step). Where MindSpore runs the steps without returning to Python (dataset sink mode on GPU
or Ascend), and in PyNative mode, the default graph with the device-side switches runs. Both give the same numbers.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

from mindspore import Parameter, nn

from ms_boost.stages import PlansStepVariants, StageHooks, phase_suffix, plan_graph_variant, runs_as_python

__all__ = ["ThorStepVariants", "ThorTrainStep"]

Variant = Tuple[bool, bool]  # (capture, refresh)


class ThorStepVariants(StageHooks):
    """THOR's stage hook choosing the compiled step variant on the host (a mixin of the THOR optimizer).

    Reads the optimizer's ``capture_flags``, ``thor_initialised``, ``refresh_next``, ``global_step``, ``frequency``,
    has it check its written-out inverses against their blocks (``sync_dense_inverses``), and sets its
    ``thor_layers``' static capture, its ``static_refresh`` and ``use_dense_inverses`` while a variant runs.
    """

    _planned_variant: Optional[str] = None  # the variant chosen for the running step (None: none chosen)
    # what the hook reads and sets, provided by the THOR optimizer that inherits it
    capture_flags: Sequence[Parameter]
    thor_initialised: Parameter
    refresh_next: Parameter
    global_step: Parameter
    frequency: int
    static_refresh: Optional[bool]
    use_dense_inverses: bool

    @property
    def thor_layers(self) -> tuple:
        """The THOR layers whose static capture a variant sets (the optimizer that inherits this provides them)."""
        raise NotImplementedError

    def sync_dense_inverses(self) -> bool:
        """Bring the written-out inverses in line with their blocks before a step (the THOR optimizer provides it)."""
        raise NotImplementedError

    def next_step_variant(self) -> Variant:
        """``(capture, refresh)`` of the next step from the optimizer's state (four scalar reads).

        The first layer's capture flag stands for all of them: the optimizer and ``request_capture`` write them
        together, and a checkpoint saves them together. Flags set by hand to different values are not seen:
        then train in PyNative mode, or through a train cell of MindSpore's (device-side switches).
        """
        capture = bool(self.capture_flags[0].asnumpy()) if len(self.capture_flags) else False
        refresh = (not bool(self.thor_initialised.asnumpy()) or bool(self.refresh_next.asnumpy())
                   or int(self.global_step.asnumpy().reshape(-1)[0]) % self.frequency == 0)
        return capture, refresh

    def plan_graph_step(self, outermost: bool) -> Optional[Tuple[str, None]]:
        """:class:`~ms_boost.stages.StageHooks`: this step's variant, ``thor_capture_refresh`` / ``thor_plain`` / ...

        Sets the layers' and the optimizer's static modes for it (they are constants of the variant's graph).
        Wherever THOR sits in the chain: it reads every gradient it gets. None in PyNative mode (the capture flags
        are read on the host there anyway).
        """
        del outermost
        if runs_as_python():
            return None
        capture, refresh = self.next_step_variant()
        self.sync_dense_inverses()  # a variant multiplies by the written-out inverses: checked here
        self._set_static_modes(capture, refresh)
        self._planned_variant = f"thor_{'capture' if capture else 'plain'}{'_refresh' if refresh else ''}"
        return self._planned_variant, None

    def end_step(self) -> None:
        """:class:`~ms_boost.stages.StageHooks`: back to the default graph's modes (device-side switches).

        Whatever compiles next without a choice (an evaluation, a sink graph) gets the default graph.
        """
        if self._planned_variant is not None:
            self._set_static_modes(None, None)
            self._planned_variant = None

    def _set_static_modes(self, capture: Optional[bool], refresh: Optional[bool]) -> None:
        for layer in self.thor_layers:
            layer.set_static_capture(capture)
        # a refresh stays a device condition (see THOR.construct); a step without refresh compiles it out
        self.static_refresh = None if refresh is None or refresh else False
        self.use_dense_inverses = capture is not None  # sync_dense_inverses ran before a chosen variant


class ThorTrainStep:
    """Kept for compatibility: one THOR train step in the variant the host chooses, for any train cell.

    ms_boost's train cells (``BoostTrainOneStepCell``, ``build_train_network``'s, ``Model``'s) choose the variant
    themselves through THOR's stage hook: call them directly (wrapping one changes nothing). A train cell of another
    kind (MindSpore's ``nn.TrainOneStepCell``) asks no stage; this wrapper asks the THOR optimizer's hook for it:
    ``step = ThorTrainStep(train_cell, opt)``, then ``loss = step(x, y)``.

    Args:
        cell: the train cell holding ``optimizer``.
        optimizer: its THOR optimizer.
    """

    def __init__(self, cell: nn.Cell, optimizer: ThorStepVariants):
        self.cell = cell
        self.optimizer = optimizer

    def __call__(self, *inputs):
        """One train step of the wrapped cell, in the variant the host chose; returns the cell's output."""
        if isinstance(self.cell, PlansStepVariants):
            return self.cell(*inputs)
        plan = plan_graph_variant((self.optimizer,))
        if plan is None:
            return self.cell(*inputs)
        try:
            with phase_suffix(self.cell, plan[0]):
                return self.cell(*inputs)
        finally:
            self.optimizer.end_step()

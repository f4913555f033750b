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
* :meth:`StageHooks.bind_loss_scale` -- told the Parameter that holds the live loss scale;
* :meth:`StageHooks.plan_step` / :meth:`StageHooks.end_step` -- (PyNative only) before the forward pass, which
  gradients this step's update reads, so the train cell differentiates only those weights (gradient freezing:
  the frozen layers' weight gradients, and the backward pass below the lowest trained layer, are never run).
* :meth:`StageHooks.plan_graph_step` -- (Graph mode, a step called from Python) every stage's part of the compiled
  step variant the host chooses for this step; :func:`plan_graph_variant` composes them into one name (the train
  cell's phase): gradient freezing's train set, THOR's capture/refresh, or both.

Optimizer hooks (:class:`OptimizerHooks`, :func:`optimizer_hooks`): what ``Model`` and the train cells ask the
optimizer -- the network to train, ``frequency=``, a plan note, callbacks, its own loss scale -- so ``Model``
imports no algorithm and tests no type.
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

__all__ = ["StageHooks", "UpdateStage", "OptimizerUpdate", "stage_chain", "runs_as_python", "scale_gradients",
           "unscale_gradients", "plan_graph_variant", "phase_suffix", "PlansStepVariants", "OptimizerHooks",
           "register_optimizer_hooks", "OptimizerView", "optimizer_view",
           "optimizer_hooks", "learning_rate_parameters", "optimizers_in"]


def runs_as_python() -> bool:
    """True when a Cell's ``construct`` runs as Python, step by step.

    That is PyNative mode, or Graph mode with ``MS_JIT=0``: host-side decisions can then be made per step.
    """
    return ms.get_context("mode") != ms.GRAPH_MODE or os.getenv("MS_JIT") == "0"


class StageHooks:
    """Optional hooks of an update stage or an optimizer (defaults: nothing to do)."""

    def transient_parameters(self) -> Sequence[Parameter]:
        """Parameters that an overflow step's snapshot/restore of network buffers skips."""
        return ()

    def bind_loss_scale(self, loss_scale: Parameter) -> None:
        """Receive the Parameter holding the live loss scale (the loss-scale train cell calls this once)."""
        del loss_scale

    def plan_step(self) -> Optional[Tuple[bool, ...]]:
        """Called by the train cell before each step's forward pass when :func:`runs_as_python`.

        Returns:
            None when the update reads every gradient; else one bool per weight of the train cell (the
            optimizer's ``parameters`` order): the gradients this step's update reads. The others are passed
            as zeros and must not be used. A stage that answers keeps its decision for this step's update.
        """
        return None

    def plan_graph_step(self, outermost: bool) -> Optional[Tuple[str, Optional[Tuple[bool, ...]]]]:
        """Called by the train cell on every stage, before each step it runs in Graph mode from Python.

        (Not in dataset sink mode on GPU/Ascend: MindSpore then runs the steps without calling the train cell from
        Python, and the default graph, with every decision on the device, runs.)

        Args:
            outermost: whether this stage gets the train cell's gradients itself (the first stage of the chain);
                a stage further in gets what the stages before it pass on, so it may not narrow them.

        Returns:
            None when nothing of this stage is decided on the host for this step; else ``(part, gradients read)``:
            ``part`` is this stage's share of the step variant's name, a decision the stage made now and may rely on
            as a constant of the graph compiled for that name (:func:`plan_graph_variant` joins the parts; each name
            is compiled on its first use); the gradients read are as :meth:`plan_step`'s (None: all), and only
            the outermost stage may name some. :meth:`end_step` follows the step.
        """
        del outermost
        return None

    def end_step(self) -> None:
        """Called by the train cell after the step (also when an overflow skipped the update): forget the plan."""


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
        # the share of the loss scale this optimizer divides by itself (built with loss_scale=S): the loss-scale
        # train cell hands every stage the gradients of the loss itself and sets this to S, so the gradients
        # are multiplied back just before the optimizer (stages in between see true gradients)
        self.gradient_scale = 1.0

    def transient_parameters(self) -> Sequence[Parameter]:
        """The optimizer's transient Parameters when it offers the hooks."""
        if isinstance(self.optimizer, StageHooks):
            return tuple(self.optimizer.transient_parameters())
        return ()

    def bind_loss_scale(self, loss_scale: Parameter) -> None:
        """Hand the live loss scale to the optimizer when it offers the hooks."""
        if isinstance(self.optimizer, StageHooks):
            self.optimizer.bind_loss_scale(loss_scale)

    def plan_step(self) -> Optional[Tuple[bool, ...]]:
        """The optimizer's plan for this step when it offers the hooks, else None."""
        return self.optimizer.plan_step() if isinstance(self.optimizer, StageHooks) else None

    def plan_graph_step(self, outermost: bool) -> Optional[Tuple[str, Optional[Tuple[bool, ...]]]]:
        """The optimizer's part of this Graph-mode step's variant when it offers the hooks, else None."""
        return self.optimizer.plan_graph_step(outermost) if isinstance(self.optimizer, StageHooks) else None

    def end_step(self) -> None:
        """Forward the end of the step to the optimizer when it offers the hooks."""
        if isinstance(self.optimizer, StageHooks):
            self.optimizer.end_step()

    def construct(self, loss, grads, *inputs):
        """Apply the optimizer (the gradients times ``gradient_scale`` first, when it is not 1)."""
        if self.gradient_scale != 1.0:
            grads = scale_gradients(Tensor(self.gradient_scale, ms.float32), grads)
        return self.optimizer(grads)


# mapped with HyperMap: a Python loop in a construct unrolls into one call per tensor, which exceeds Graph mode's
# call-depth limit on deep networks (ResNet-101 has ~300 tensors)
_MAP = ops.HyperMap()
_scale_by = ops.MultitypeFuncGraph("scale_by")


@_scale_by.register("Tensor", "Tensor")
def _scale_tensor(factor, grad):
    return grad * ops.cast(factor, grad.dtype)


def scale_gradients(factor, grads):
    """Every gradient of the tuple ``grads`` times the scalar Tensor ``factor``.

    ``factor`` is cast to each gradient's dtype; usable in PyNative and inside Graph-mode constructs.
    """
    return _MAP(ops.partial(_scale_by, factor), grads)


_divide_by = ops.MultitypeFuncGraph("divide_by")


@_divide_by.register("Tensor", "Tensor")
def _divide_tensor(divisor, grad):
    return grad / ops.cast(divisor, grad.dtype)


def unscale_gradients(scale, grads):
    """Every gradient of the tuple ``grads`` divided by the scalar Tensor ``scale`` (the loss scale).

    A division, not a product with ``1 / scale``: above :math:`2^{126}` (e.g. the float32 maximum of MindSpore's
    loss-scale examples) the reciprocal is a float32 subnormal, rounded coarsely, and Graph mode's kernels flush it to
    zero, so every gradient became 0 without an overflow. ``g * S / S`` is ``g`` while ``g * S`` is finite.
    """
    return _MAP(ops.partial(_divide_by, scale), grads)


def stage_chain(stage: Optional[nn.Cell]) -> Iterator[nn.Cell]:
    """The stages of a chain from the outermost to the apply stage (following ``inner``)."""
    while stage is not None:
        yield stage
        stage = stage.inner if isinstance(stage, UpdateStage) else None


def plan_graph_variant(stages: Sequence[StageHooks]) -> Optional[Tuple[str, Optional[Tuple[bool, ...]]]]:
    """This Graph-mode step's compiled variant: ``(name, gradients read)``, or None for the default graph.

    Asks :meth:`StageHooks.plan_graph_step` of every stage, the first one as the outermost; the name joins the
    answering stages' parts with ``_`` in chain order (e.g. ``freeze_set2``, ``thor_plain``), the gradients read are
    the outermost stage's answer (None: all). Every stage asked gets :meth:`StageHooks.end_step` after the step.

    Args:
        stages: the stages of the update chain that offer hooks, outermost first (for a train cell that walks no
            chain, the optimizer alone).

    Raises:
        ValueError: a stage other than the outermost named the gradients it reads.
    """
    parts, reads = [], None
    for i, stage in enumerate(stages):
        plan = stage.plan_graph_step(i == 0)
        if plan is None:
            continue
        part, mask = plan
        if mask is not None:
            if i:
                raise ValueError(f"{type(stage).__name__}.plan_graph_step(outermost=False) named the gradients it "
                                 f"reads; only the outermost stage may (the others get what it passes on).")
            reads = mask
        parts.append(part)
    return ("_".join(parts), reads) if parts else None


@contextlib.contextmanager
def phase_suffix(cell: nn.Cell, name: str) -> Iterator[None]:
    """Run ``cell`` under the phase ``<its phase>_<name>`` inside the block (a compiled variant), then put it back.

    MindSpore keeps one compiled graph per phase: the variant is compiled on the name's first use.
    """
    phase = cell.phase
    cell.phase = f"{phase}_{name}"
    try:
        yield
    finally:
        cell.phase = phase


class PlansStepVariants:
    """A train cell that asks its update stages for the step variant itself before each step (ms_boost's own).

    A wrapper that would choose the variant for a train cell of another kind (``ThorTrainStep``) leaves it to one
    of these.
    """


class OptimizerHooks:
    """What ``Model`` and the train cells ask an optimizer, instead of testing its type (defaults: a plain one).

    An optimizer class answers by subclassing it (:class:`~ms_boost.grad_freeze.FreezeOpt`), or through an
    adapter registered for its class with :func:`register_optimizer_hooks` (THOR:
    :class:`ms_boost.thor.convert.ThorModelHooks`, registered by :mod:`ms_boost.builtins`).
    :func:`optimizer_hooks` gives the hooks of any optimizer.
    """

    def train_network(self, network: nn.Cell, has_loss_fn: bool) -> nn.Cell:
        """The network ``Model`` must train when given this optimizer and ``network`` (default: ``network``).

        Args:
            network: the ``network`` argument of Model.
            has_loss_fn: whether Model was given a ``loss_fn`` (``network`` is then the bare network).
        """
        del has_loss_fn
        return network

    def check_train_cell(self, train_cell: nn.Cell) -> None:
        """Raise when ``train_cell``, a train step cell holding this optimizer, cannot train with it as built.

        ``Model`` asks when given such a cell and no optimizer (default: nothing to check; THOR: the cell must call
        its THOR layers).
        """
        del train_cell

    def set_frequency(self, frequency: object) -> None:
        """``Model(..., frequency=N)`` (the THOR tutorial's argument): the optimizer's refresh interval.

        Raises:
            ValueError: the optimizer has no refresh interval (the default).
        """
        raise ValueError(f"Model: frequency={frequency!r} is THOR's refresh interval; the optimizer is "
                         f"{self.optimizer_name()}, not THOR (allowed: a THOR optimizer from ms_boost.thor).")

    def plan_note(self) -> str:
        """A line for the plan summary when the optimizer itself does more than a plain step ("" when not)."""
        return ""

    def is_first_order(self) -> bool:
        """Whether the optimizer is a plain first-order method (SGD, Momentum, Adam, ...; the default).

        ``Model(boost_level="auto")`` needs one: its candidate plans (THOR among them) start from the run's
        first-order optimizer. A second-order optimizer (THOR) answers False.
        """
        return True

    def callbacks(self) -> List[Any]:
        """Callbacks ``Model.train`` adds for this optimizer (THOR: its guard against a run that stays non-finite)."""
        return []

    def own_loss_scale(self) -> float:
        """The static loss scale the optimizer divides the gradients by itself (``loss_scale=S``; default 1)."""
        return 1.0

    def schedule_parameters(self) -> Sequence[Parameter]:
        """Parameters holding a per-step schedule computed from the configuration (learning rates, THOR's damping).

        A resumed run keeps its own values for them (its schedule may be longer); the step counter is the position.
        """
        return ()

    def callback_optimizer(self) -> Optional[nn.Optimizer]:
        """What MindSpore's callbacks get as ``cb_params.optimizer`` when this optimizer trains (None: itself).

        An optimizer that is no ``nn.Optimizer`` (gradient freezing's) answers an :class:`OptimizerView` of itself:
        MindSpore's ``SummaryCollector`` reads the learning rate and the weights only from an ``nn.Optimizer``.
        """
        return None

    def damping_parameters(self) -> Optional[Sequence[Parameter]]:
        """The Parameters holding the optimizer's damping, which a divergence rollback may raise.

        ``()`` when the optimizer has no damping (the default); None when it has one that no Parameter holds
        (THOR given a ``LearningRateSchedule`` damping), so it cannot be raised.
        """
        return ()

    def optimizer_name(self) -> str:
        """The optimizer's class name, for messages."""
        return type(self).__name__


class _PlainOptimizerHooks(OptimizerHooks):
    """The hooks of an optimizer that offers none: a plain step (an ``nn.Optimizer`` keeps its ``loss_scale``)."""

    def __init__(self, optimizer: Any):
        self.optimizer = optimizer

    def own_loss_scale(self) -> float:
        return float(self.optimizer.loss_scale) if isinstance(self.optimizer, nn.Optimizer) else 1.0

    def schedule_parameters(self) -> Sequence[Parameter]:
        return learning_rate_parameters(self.optimizer)

    def optimizer_name(self) -> str:
        return type(self.optimizer).__name__


def _viewed_method(name: str) -> Callable[..., Any]:
    """A method of :class:`OptimizerView` calling the viewed optimizer's method ``name``."""
    def method(self, *args, **kwargs):
        return getattr(self.viewed, name)(*args, **kwargs)
    method.__name__ = name
    method.__doc__ = f"The viewed optimizer's ``{name}``."
    return method


class OptimizerView(nn.Optimizer):
    """An optimizer that is no ``nn.Optimizer``, shown to MindSpore's callbacks as one (``cb_params.optimizer``).

    Not part of any network (no Parameter of its own, nothing compiled, no checkpoint entry): its ``parameters``
    and ``learning_rate`` are the viewed optimizer's own objects (the weights it trains, the Parameter its steps
    read, so a rate callback's ``assign`` changes the rate that trains); every other public attribute is read from
    and written to the viewed optimizer, and calling the view steps it. :func:`optimizer_view` names the view's class
    after the optimizer the script gave (what ``SummaryCollector``'s lineage records as the optimizer).
    """

    def __init__(self, optimizer: Any):  # pylint: disable=super-init-not-called
        object.__setattr__(self, "_viewed", optimizer)
        nn.Cell.__init__(self, auto_prefix=False)  # nn.Optimizer's own would build a learning rate and a step
        object.__setattr__(self, "_view_ready", True)  # from now on public attributes are the viewed optimizer's

    @property
    def viewed(self) -> Any:
        """The optimizer this view shows."""
        return self.__dict__["_viewed"]

    @property
    def parameters(self):
        """The viewed optimizer's ``parameters`` (the weights it trains, in its gradients' order)."""
        return self.viewed.parameters

    @property
    def learning_rate(self):
        """The viewed optimizer's ``learning_rate`` (the very Parameter its steps read)."""
        return self.viewed.learning_rate

    def __getattr__(self, name: str) -> Any:
        # the Cell's own state (never the viewed cell's graphs or parameters), and what Cell.__init__ probes
        if name.startswith("_") or "_view_ready" not in self.__dict__:
            return super().__getattr__(name)
        return getattr(self.viewed, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if "_view_ready" in self.__dict__ and not name.startswith("_"):
            setattr(self.viewed, name, value)
            return
        super().__setattr__(name, value)

    def get_lr(self):
        """The viewed optimizer's ``get_lr()``."""
        return self.viewed.get_lr()

    # a Cell's parameter and cell walks are the viewed optimizer's (ms.save_checkpoint of the view saves its state)
    parameters_and_names = _viewed_method("parameters_and_names")
    get_parameters = _viewed_method("get_parameters")
    trainable_params = _viewed_method("trainable_params")
    untrainable_params = _viewed_method("untrainable_params")
    parameters_dict = _viewed_method("parameters_dict")
    cells_and_names = _viewed_method("cells_and_names")
    name_cells = _viewed_method("name_cells")

    def __call__(self, *args, **kwargs):
        """Step the viewed optimizer."""
        return self.viewed(*args, **kwargs)

    def construct(self, *inputs):
        """Step the viewed optimizer (a view is never compiled: :meth:`__call__` calls the viewed one)."""
        return self.viewed(*inputs)


_VIEW_CLASSES: Dict[str, type] = {}


def optimizer_view(optimizer: Any, name: str) -> OptimizerView:
    """An :class:`OptimizerView` of ``optimizer`` whose class is named ``name`` (e.g. ``"Momentum"``)."""
    if name not in _VIEW_CLASSES:
        _VIEW_CLASSES[name] = type(name, (OptimizerView,), {"__module__": __name__, "__doc__": OptimizerView.__doc__})
    return _VIEW_CLASSES[name](optimizer)


def learning_rate_parameters(optimizer: Any) -> Tuple[Parameter, ...]:
    """The Parameters holding an ``nn.Optimizer``'s learning rate(s); ``()`` for anything else.

    A per-step array is a cell holding one.
    """
    if not isinstance(optimizer, nn.Optimizer):
        return ()
    rates = optimizer.learning_rate
    out = []
    for rate in rates if isinstance(rates, (tuple, list)) else (rates,):  # a ParameterTuple is a tuple
        if isinstance(rate, Parameter):
            out.append(rate)
        elif isinstance(rate, nn.Cell):
            out.extend(rate.get_parameters())
    return tuple(out)


#: optimizer class -> adapter class (``adapter(optimizer)`` is that optimizer's :class:`OptimizerHooks`)
_ADAPTERS: Dict[type, Callable[[Any], OptimizerHooks]] = {}


def register_optimizer_hooks(optimizer_class: type, adapter: Callable[[Any], OptimizerHooks]) -> None:
    """Answer :func:`optimizer_hooks` for instances of ``optimizer_class`` (and subclasses) with ``adapter(opt)``.

    Raises:
        ValueError: ``optimizer_class`` already has an adapter.
    """
    if optimizer_class in _ADAPTERS:
        raise ValueError(f"register_optimizer_hooks: {optimizer_class.__name__} already has optimizer hooks.")
    _ADAPTERS[optimizer_class] = adapter


def optimizers_in(network: Any) -> list:
    """The optimizers ``network`` holds (a train step cell: ``nn.TrainOneStepCell`` and the like); [] for a non-Cell."""
    if not isinstance(network, nn.Cell):
        return []
    return [cell for _, cell in network.cells_and_names() if isinstance(cell, nn.Optimizer)]


def optimizer_hooks(optimizer: Any) -> OptimizerHooks:
    """The :class:`OptimizerHooks` of ``optimizer``.

    itself when it subclasses them, its class's registered adapter, else the plain defaults.
    """
    if isinstance(optimizer, OptimizerHooks):
        return optimizer
    for cls in type(optimizer).__mro__:
        if cls in _ADAPTERS:
            return _ADAPTERS[cls](optimizer)
    return _PlainOptimizerHooks(optimizer)

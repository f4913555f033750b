"""Drop-in ``Model`` honouring ``boost_level`` / ``boost_config_dict``, and ``build_train_network``.

``ms_boost.Model`` has exactly the signature of ``mindspore.train.Model``; ``train``, ``eval``,
``predict``, callbacks and checkpoints are MindSpore's own. What differs:

* the boost plan is parsed and validated once (:class:`~ms_boost.config.AutoBoost`) and applied whether
  or not ``metrics``/``eval_network`` are given (upstream silently skipped boost without them);
* the train network is an ms_boost train cell, so every loss-scale manager (fixed, dynamic, group)
  works on CPU too, and overflow steps are always skipped whole;
* the plan's summary is logged when training starts;
* it asks the optimizer's hooks (:func:`ms_boost.stages.optimizer_hooks`) instead of knowing any algorithm:
  with a THOR optimizer it trains the network whose THOR layers capture statistics
  (``optimizer.thor_network`` when given the net ``thor()`` was built from, as ``convert_to_thor_model``
  does), accepts the THOR tutorial's ``frequency=N`` (the optimizer's refresh interval), and ``train`` adds
  its guard callback (``optimizer.training_guard()``), which stops a
  run whose loss stays non-finite with an error naming the step and the layer;
* with MindSpore's compile cache on, graphs are cached per boost plan, amp and optimizer settings
  (:mod:`ms_boost.compile_cache`): MindSpore alone would reuse a graph compiled with other settings;
* ``boost_level="auto"`` picks the plan from a short measured trial when ``train`` starts
  (:mod:`ms_boost.autotune`, :func:`autotune_plan`, ``docs/autotune.md``);
* ``train`` and ``fit`` warn what an enabled algorithm's ``warn_data`` hook says of the training data set (gradient
  accumulation over a short last batch, :mod:`ms_boost.training_data`), and ``Model(train_step_cell)`` lets the
  optimizers the cell holds check it (a THOR whose layers the cell does not call is an error).
"""
from __future__ import annotations

import logging
import time
import warnings
from typing import Optional

import mindspore as ms
from mindspore import Tensor, nn
from mindspore.train import Callback
from mindspore.train import Model as _MsModel
from mindspore.train.loss_scale_manager import LossScaleManager

from ms_boost import comm, gpu_code
from ms_boost.autotune import (
    AutotuneReport,
    CellTrialRun,
    TrialBatches,
    TrialContext,
    batch_size_of,
    clone_for_trial,
    count_conv2d,
    run_trials,
)
from ms_boost.autotune.engine import batches_needed
from ms_boost.autotune.options import AUTO_LEVEL, split_auto_config
from ms_boost.compile_cache import cache_enabled, constant_settings, optimizer_settings, scope_compile_cache
from ms_boost.config import AutoBoost, resolve
from ms_boost.loss_scaler import is_group_manager
from ms_boost.mindspore_api import amp_level_config, apply_amp_level, with_loss
from ms_boost.overflow_watch import SkippedStepsWatch
from ms_boost.pipeline import preview_network, rewrite_eval, rewrite_train
from ms_boost.replaced_memory import MemoryWatch, compile_again_for, memory_key, replaced_parameters
from ms_boost.source_pin import pin_cell_sources
from ms_boost.stages import optimizer_hooks, optimizers_in
from ms_boost.train_cell import BoostTrainOneStepCell, BoostTrainOneStepWithLossScaleCell
from ms_boost.training_data import describe_training_data

logger = logging.getLogger("ms_boost")


def _first_order(optimizer) -> bool:
    """Whether ``optimizer`` is a plain first-order one (its hooks say so: THOR answers False)."""
    return optimizer is not None and optimizer_hooks(optimizer).is_first_order()


__all__ = ["Model", "build_train_network", "autotune_plan"]

_AMP_LEVELS = ("O0", "O1", "O2", "O3", "auto")
_AMP_KWARGS = ("cast_model_type", "keep_batchnorm_fp32", "loss_scale_manager")


def _amp_config(level: str, kwargs: dict) -> dict:
    if not isinstance(level, str) or level not in _AMP_LEVELS:
        raise ValueError(f"amp_level={level!r} is not allowed; allowed: {list(_AMP_LEVELS)}.")
    for key in kwargs:
        if key not in _AMP_KWARGS:
            raise ValueError(f"build_train_network: unknown argument {key!r}; allowed: {list(_AMP_KWARGS)} "
                             f"(plus boost_config_dict).")
    lsm = kwargs.get("loss_scale_manager")
    if lsm is not None and not isinstance(lsm, LossScaleManager) and not is_group_manager(lsm):
        raise TypeError(f"loss_scale_manager must be a mindspore LossScaleManager or an ms_boost "
                        f"GroupLossScaleManager, got {type(lsm).__name__}.")
    kbf = kwargs.get("keep_batchnorm_fp32")
    if kbf is not None and not isinstance(kbf, bool):
        raise TypeError(f"keep_batchnorm_fp32 must be a bool, got {kbf!r}.")
    return dict(amp_level_config(level), **kwargs)


def _train_cell(network: nn.Cell, optimizer, boost: AutoBoost, loss_scale_manager) -> nn.Cell:
    """Wrap a loss network into the right ms_boost train cell."""
    for spec in boost.enabled_specs():
        if spec.check_model is not None:
            spec.check_model(boost.section(spec.name), loss_scale_manager)
    if loss_scale_manager is None:
        return BoostTrainOneStepCell(network, optimizer, boost_config=boost).set_train()
    if is_group_manager(loss_scale_manager):
        scale_sense = loss_scale_manager
    else:
        scale_sense = loss_scale_manager.get_update_cell()
        if scale_sense is None:  # FixedLossScaleManager(drop_overflow_update=False): a fixed scale
            scale_sense = Tensor(float(loss_scale_manager.get_loss_scale()))
    return BoostTrainOneStepWithLossScaleCell(network, optimizer, scale_sense, boost_config=boost).set_train()


def _scope_cache(boost: AutoBoost, level, optimizer, kwargs: dict) -> None:
    """Key MindSpore's compile cache (when on) by everything ms_boost compiles into the graphs as constants."""
    if not cache_enabled():
        return
    # a loss-scale manager keeps its settings in private attributes (FixedLossScaleManager._loss_scale)
    amp = sorted((k, constant_settings(v, private=True) if hasattr(v, "__dict__") else repr(v))
                 for k, v in kwargs.items())
    scope_compile_cache("\n".join((boost.summary(), f"amp_level: {level!r} {amp}", optimizer_settings(optimizer))))


def _cast_for_amp(network: nn.Cell, config: dict, level: str) -> nn.Cell:
    """``apply_amp_level``, on the network a pass-through wrapper calls (``forwards_to_network``, e.g. LessBN's).

    The wrapper computes nothing, so the cast is the same; and MindSpore's amp ``"O1"`` (a rewrite of the source)
    fails on a wrapper that forwards ``*inputs`` to a ``SequentialCell`` ("Please handle custom-object first"),
    where the user's network alone is cast fine. Cells of a class with ``amp_rewrite_leaf`` are left to the rewrite
    as opaque calls (their inner operators stay in their own precision).
    """
    while level != "O0" and getattr(type(network), "forwards_to_network", False):
        network = network.network
    # cells whose source MindSpore's rewrite cannot regenerate (amp_rewrite_leaf, e.g. cpu_gemm_conv's convolution,
    # which reads helpers of its own module) are called as they are
    leaves = sorted({type(cell) for _, cell in network.cells_and_names()
                     if getattr(type(cell), "amp_rewrite_leaf", False)}, key=lambda t: t.__qualname__)
    return apply_amp_level(network, config, level, leaf_types=leaves)


def _build(network, optimizer, loss_fn, level: str, boost: AutoBoost, kwargs: dict) -> nn.Cell:
    config = _amp_config(level, kwargs)
    network = _cast_for_amp(network, config, level)
    if loss_fn is not None:
        network = with_loss(network, loss_fn, config["cast_model_type"])
    return _train_cell(network, optimizer, boost, config["loss_scale_manager"])


def build_train_network(network: nn.Cell, optimizer, loss_fn: Optional[nn.Cell] = None, level: str = "O0",
                        boost_level: str = "O0", **kwargs) -> nn.Cell:
    """Build a boosted, mixed-precision training cell (ms_boost's ``mindspore.amp.build_train_network``).

    Args:
        network: the backbone (or a loss network when ``loss_fn`` is None).
        optimizer: the optimizer.
        loss_fn: loss function added on top of ``network``.
        level: amp level, one of ``O0``, ``O1``, ``O2``, ``O3``, ``auto``.
        boost_level: ``O0``, ``O1`` or ``O2`` (or an :class:`AutoBoost`).
        **kwargs: ``boost_config_dict`` (dict or YAML/JSON path), ``loss_scale_manager``,
            ``keep_batchnorm_fp32``, ``cast_model_type``.

    Returns:
        The training cell (``BoostTrainOneStepCell`` or ``BoostTrainOneStepWithLossScaleCell``).
    """
    pin_cell_sources((network, loss_fn, optimizer))  # graphs compiled later parse the source as loaded
    boost = resolve(boost_level, kwargs.pop("boost_config_dict", None))
    _scope_cache(boost, level, optimizer, kwargs)
    network, optimizer = rewrite_train(boost, network, optimizer)
    return _build(network, optimizer, loss_fn, level, boost, kwargs)


def _data_parallel_ranks() -> int:
    reduce, _, _ = comm.data_parallel_reduce_config()
    return comm.get_size() if reduce else 1


def autotune_plan(network: nn.Cell, loss_fn: Optional[nn.Cell], optimizer, train_dataset, epochs: int,
                  boost_config_dict=None, amp_level: str = "O0", steps_per_epoch: Optional[int] = None,
                  **kwargs) -> AutotuneReport:
    """Measure candidate boost plans on a short trial and pick one; the given objects end at their starting state.

    Each candidate trains copies of ``network`` and ``optimizer`` (and of the loss-scale manager) from their
    current state -- except the plain step (O0), which trains the objects themselves -- on the same first batches
    of ``train_dataset`` in the same order, and is written back to its starting state after each use. The
    candidates are probed for compile and step time, the shortest predicted run first, while a probe is predicted to
    save time and the budget pays (:func:`ms_boost.autotune.candidates.probe_order`), held-out progress is measured
    where it pays, and the pick is the plan with the shortest predicted run of ``epochs``
    epochs (:mod:`ms_boost.autotune.decide`). ``report.trial_run`` is the pick's step, compiled by the trial, at the
    starting state. See :mod:`ms_boost.autotune` and ``docs/autotune.md``.

    Args:
        network, loss_fn, optimizer: as given to :class:`Model` (the optimizer must not be a THOR: THOR is one
            of the candidates).
        train_dataset: the training data set (its first batches are read once more for the trial).
        epochs: epochs of the planned run.
        boost_config_dict: the ``autotune`` options section and algorithm sections (see
            :func:`~ms_boost.autotune.options.split_auto_config`), a dict or a YAML/JSON path.
        amp_level: amp level of the run.
        steps_per_epoch: steps per epoch of the planned run (default: the data set's size).
        **kwargs: ``loss_scale_manager``, ``keep_batchnorm_fp32``, ``cast_model_type`` as for :class:`Model`.

    Returns:
        The :class:`~ms_boost.autotune.AutotuneReport`; ``report.level`` and ``report.boost_config_dict``
        reproduce the pick.

    Raises:
        ValueError / TypeError: bad options (naming the key), a THOR optimizer, no candidate able to run.
    """
    options, sections = split_auto_config(boost_config_dict)
    if not _first_order(optimizer):
        raise ValueError("boost_level='auto': the trial needs the run's first-order optimizer (Momentum, SGD, ...); "
                         f"got {type(optimizer).__name__}. THOR is one of the candidates; to train THOR without a "
                         "trial, give a fixed boost_level.")
    _amp_config(amp_level, kwargs)  # the same checks as the real run, before anything is trained
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"autotune: epochs={epochs!r} must be an int >= 1.")
    per_epoch = int(train_dataset.get_dataset_size()) if steps_per_epoch is None else int(steps_per_epoch)
    started = time.perf_counter()  # reading the trial's batches is part of its cost
    held, steps = batches_needed(options, per_epoch * epochs)  # only what the budget lets the trial use
    # the held-out batches and the first probe's now; the others in the background only if the trial goes on past
    # that probe (a second plan, or a progress window): its compile, which the run may reuse, has no reader beside it
    batches = TrialBatches(train_dataset, held, steps, ready=options.probe_steps)
    try:
        return _run_trial(network, loss_fn, optimizer, amp_level, kwargs, options, sections, per_epoch * epochs,
                          batches, started)
    finally:
        batches.close()  # no reader thread or data pipeline outlives the trial, whatever happened


def _run_trial(network, loss_fn, optimizer, amp_level: str, kwargs: dict, options, sections, planned_steps: int,
               batches: TrialBatches, started: float) -> AutotuneReport:
    """:func:`autotune_plan`'s trial on ``batches`` (its held-out ones and the training ones being read)."""
    first = (batches.holdout or batches[:1])[:1]
    if not first:
        raise ValueError("autotune: the training data set yields no batch.")
    holdout, trial = batches.holdout, batches
    ctx = TrialContext(ranks=_data_parallel_ranks(), batch_size=batch_size_of(first[0]),
                       planned_steps=planned_steps, user_sections=sections,
                       device=str(ms.get_context("device_target")), conv2d_layers=count_conv2d(network),
                       previews=preview_network(AutoBoost("O0", sections), network))

    def build(boost: AutoBoost, on_originals: bool) -> CellTrialRun:
        if on_originals:  # a plan that rewrites nothing: the step the run would build, restored after each use
            cell = _build(network, optimizer, loss_fn, amp_level, boost, dict(kwargs))
            return CellTrialRun(cell, network, optimizer, on_originals=True)
        net, opt, lsm = clone_for_trial(network, optimizer, kwargs.get("loss_scale_manager"))
        amp = dict(kwargs, **({"loss_scale_manager": lsm} if "loss_scale_manager" in kwargs else {}))
        net, opt = rewrite_train(boost, net, opt)
        return CellTrialRun(_build(net, opt, loss_fn, amp_level, boost, amp), net, opt)

    return run_trials(build, ctx, options, trial, holdout, started=started)


def _sunk_steps_per_epoch(dataset_sink_mode: bool, sink_size: int) -> Optional[int]:
    """The steps of one epoch when MindSpore's Model sinks ``sink_size`` steps an epoch; None: the data set's size.

    MindSpore 2.10's Model does not sink on CPU: there it trains the whole data set each epoch whatever ``sink_size``
    says (``cb_params.batch_num`` still reports ``sink_size``).
    """
    if not dataset_sink_mode or sink_size <= 0 or str(ms.get_context("device_target")) == "CPU":
        return None
    return int(sink_size)


def _optimizer_step(optimizer) -> Optional[int]:
    """The optimizer's ``global_step`` (the updates it made, or loaded from a checkpoint), None when it has none."""
    step = getattr(optimizer, "global_step", None)
    if not isinstance(step, Tensor):
        return None
    return int(step.asnumpy().reshape(-1)[0])


def _holds_optimizer(network) -> bool:
    """Whether ``network`` contains an optimizer: a train step cell (``nn.TrainOneStepCell`` and the like)."""
    return bool(optimizers_in(network))


class _PendingAutotune(nn.Cell):
    """The train network of a ``boost_level="auto"`` Model before its trial.

    ``train`` (or ``autotune``) builds the real one.
    """

    def construct(self, *inputs):
        raise RuntimeError("Model(boost_level='auto'): the plan is chosen when train() starts (or call "
                           "model.autotune(dataset, epochs) first).")


def _warn_if_optimizer_empty(optimizer) -> None:
    """Say when the optimizer holds no weight to update (training would change nothing, silently).

    MindSpore refuses an empty parameter list, but builds an empty optimizer from parameter groups whose ``params``
    are iterators it consumed before storing them (``{"params": filter(...)}``), and its Model then trains nothing
    without a word (thirteenth users' round).
    """
    params = getattr(optimizer, "parameters", None)
    if not isinstance(params, (tuple, list)) or len(params) > 0:  # None too: no optimizer
        return
    warnings.warn(f"ms_boost: the optimizer given to Model ({type(optimizer).__name__}) holds no parameters, so "
                  f"training updates no weight. A parameter group whose 'params' is an iterator (filter(...), a "
                  f"generator) is consumed before the optimizer stores it: pass a list, e.g. "
                  f"{{'params': list(filter(...))}}.", UserWarning, stacklevel=3)


class _ShowOptimizer(Callback):
    """Hands MindSpore's callbacks ``optimizer`` as ``cb_params.optimizer`` (set when training begins)."""

    def __init__(self, optimizer):
        super().__init__()
        self.optimizer = optimizer

    def on_train_begin(self, run_context):
        """Replace the callback parameters' optimizer with the one to show."""
        run_context.original_args().optimizer = self.optimizer


class Model(_MsModel):
    """``mindspore.train.Model`` with ms_boost's boost pipeline.

    Same arguments as ``mindspore.train.Model``: ``network, loss_fn=None, optimizer=None, metrics=None,
    eval_network=None, eval_indexes=None, amp_level="O0", boost_level="O0", **kwargs`` with kwargs
    ``loss_scale_manager``, ``keep_batchnorm_fp32``, ``boost_config_dict`` (dict or YAML/JSON path), and
    ``frequency`` (the THOR tutorial's ``Model_Thor`` argument: the THOR optimizer's refresh interval;
    an error with any other optimizer).

    ``boost_level="auto"`` chooses the plan by a short measured trial when ``train`` starts (or when
    :meth:`autotune` is called): ``boost_config_dict`` then holds the ``autotune`` options and algorithm
    sections (``docs/autotune.md``).

    Attributes:
        boost: the resolved :class:`~ms_boost.config.AutoBoost` plan (``model.boost.summary()``).
        autotune_report: with ``boost_level="auto"``, the trial's :class:`~ms_boost.autotune.AutotuneReport`
            once it ran (else None).
    """

    def __init__(self, network, loss_fn=None, optimizer=None, metrics=None, eval_network=None, eval_indexes=None,
                 amp_level="O0", boost_level="O0", **kwargs):
        if "acc_level" in kwargs:
            warnings.warn("'acc_level' is the old name of 'boost_level'; use boost_level.", DeprecationWarning,
                          stacklevel=2)
            boost_level = kwargs.pop("acc_level")
        boost_config_dict = kwargs.pop("boost_config_dict", None)
        # every graph of this Model is compiled later (the first train step, the first evaluation, a freezing
        # variant): it must parse the source text that was loaded, not a file edited since (ms_boost.source_pin)
        pin_cell_sources((network, loss_fn, optimizer, eval_network))
        hooks = optimizer_hooks(optimizer)  # what this optimizer needs of Model (THOR: its network, frequency)
        if "frequency" in kwargs:  # the THOR tutorial's Model(..., frequency=config.frequency)
            hooks.set_frequency(kwargs.pop("frequency"))
        if isinstance(network, nn.Cell):
            network = hooks.train_network(network, loss_fn is not None)
            if optimizer is None:  # Model(train_step_cell): the optimizers it holds check the cell (THOR's layers)
                for inner in optimizers_in(network):
                    optimizer_hooks(inner).check_train_cell(network)
        _warn_if_optimizer_empty(optimizer)
        self._user_optimizer = optimizer
        self._user_network = network
        self._trained_copies: Optional[CellTrialRun] = None
        self._memory_key = None  # the train network's Parameter addresses when it last trained (replaced_memory)
        self._memory_watch: Optional[MemoryWatch] = None  # the running train/fit's watch, when its step has branches
        self.autotune_report: Optional[AutotuneReport] = None
        self._auto_config = None
        auto_on_train_cell = False
        if isinstance(boost_level, str) and boost_level == AUTO_LEVEL and optimizer is None \
                and isinstance(network, nn.Cell) and _holds_optimizer(network):
            # Model(train_step_cell, boost_level="auto"): nothing to choose, the cell trains itself (as at O1/O2,
            # and as mindspore.train.Model): said, and trained as it is
            split_auto_config(boost_config_dict)  # a bad dict is still refused
            logger.warning("Model: boost_level='auto' is not applied: the network holds its own optimizer (a train "
                           "step cell) and Model got none, so it trains as it is. To boost it, give Model the "
                           "backbone, loss_fn and optimizer.")
            auto_on_train_cell = True
            boost_level, boost_config_dict = "O0", None
        if isinstance(boost_level, str) and boost_level == AUTO_LEVEL:
            split_auto_config(boost_config_dict)  # checked now, before anything is built
            if not _first_order(optimizer):
                raise ValueError(f"Model(boost_level='auto') needs the run's first-order optimizer (Momentum, SGD, "
                                 f"...); got {type(optimizer).__name__}. THOR is one of the candidates; give a fixed "
                                 f"boost_level to train a THOR optimizer of your own.")
            self._auto_config = {} if boost_config_dict is None else boost_config_dict  # not None: auto pending
            self._user_eval = (eval_network, eval_indexes)
            boost_level, boost_config_dict = "O0", None  # until the trial has picked
        self.boost = AutoBoost(boost_level, boost_config_dict)
        self._plan_logged = False
        # set when the network is a train step cell of its own (no boost applied)
        self._train_cell_given = auto_on_train_cell
        super().__init__(network, loss_fn=loss_fn, optimizer=optimizer, metrics=metrics, eval_network=eval_network,
                         eval_indexes=eval_indexes, amp_level=amp_level, boost_level=boost_level, **kwargs)
        # the script's optimizer's step when the plan rebuilt it (LessBN, freezing): see _warn_if_user_optimizer_moved
        rebuilt = optimizer is not None and self._optimizer is not optimizer
        self._rebuilt_at_step = _optimizer_step(optimizer) if rebuilt else None

    # -- construction hooks of mindspore.train.Model ------------------------------------------------
    def _build_boost_network(self, kwargs):
        if not self.boost.is_active:
            return
        if self._optimizer is None and _holds_optimizer(self._network):
            # Model(train_step_cell): the network trains itself; an evaluation rewrite (done in place) would change
            # what it trains. As mindspore.train.Model: not boosted, with a warning.
            self._train_cell_given = True
            logger.warning("Model: boost_level=%r is not applied: the network holds its own optimizer (a train step "
                           "cell) and Model got none, so it trains as it is. To boost it, give Model the backbone, "
                           "loss_fn and optimizer.", self.boost.level)
            return
        if self._optimizer is None:  # an evaluation/prediction Model: the structure the weights were trained in
            self._network = rewrite_eval(self.boost, self._network)
            if self._eval_network is not None:
                self._eval_network = rewrite_eval(self.boost, self._eval_network)
            logger.info("Model: no optimizer, so boost_level=%r applies its evaluation rewrites only (%s); "
                        "training needs an optimizer.", self.boost.level, ", ".join(self._enabled()))
            return
        self._network, self._optimizer = rewrite_train(self.boost, self._network, self._optimizer)
        if self._eval_network is not None:
            self._eval_network = rewrite_eval(self.boost, self._eval_network)

    def _build_train_network(self):
        if self._auto_config is not None and self.autotune_report is None:
            return _PendingAutotune()
        network = self._network
        if not isinstance(network, nn.Cell):
            raise TypeError(f"Model: network must be a mindspore.nn.Cell, got {type(network).__name__}.")
        if self._loss_scale_manager is not None and self._optimizer is None:
            raise ValueError("Model: 'optimizer' can not be None when 'loss_scale_manager' is set.")
        amp_kwargs = {}
        if self._loss_scale_manager_set:
            amp_kwargs["loss_scale_manager"] = self._loss_scale_manager
        if self._keep_bn_fp32 is not None:
            amp_kwargs["keep_batchnorm_fp32"] = self._keep_bn_fp32
        _scope_cache(self.boost, self._amp_level, self._optimizer, amp_kwargs)  # eval-only models too
        if self._optimizer is None:
            return nn.WithLossCell(network, self._loss_fn) if self._loss_fn else network
        return _build(network, self._optimizer, self._loss_fn, self._amp_level, self.boost, amp_kwargs)

    def _plan_text(self) -> str:
        """The boost plan's summary, plus the optimizer's own note when the user gave it.

        A THOR from ``thor()`` has one: the plan alone would read as a plain training step.
        """
        text = self.boost.summary()
        if self._train_cell_given:
            text += ("\n  note: not applied: the network holds its own optimizer (a train step cell) and Model got "
                     "none; it trains as it is")
        elif self._optimizer is None and self.boost.is_active:
            text += ("\n  note: Model has no optimizer: only the evaluation rewrites were applied, and no boost "
                     "algorithm takes part in training")
        if self._optimizer is not None and self._optimizer is self._user_optimizer:  # not built by the plan
            note = optimizer_hooks(self._optimizer).plan_note()
            if note:
                text += f"\n  {note}"
        return text

    def _enabled(self):
        return [k for k, v in self.boost.boost_config.items() if v]

    # -- autotune --------------------------------------------------------------------------------
    def autotune(self, train_dataset, epochs: int, steps_per_epoch: Optional[int] = None) -> AutotuneReport:
        """Run the ``boost_level="auto"`` trial for a planned run of ``epochs`` epochs; build the pick's network.

        ``train`` calls this itself when it has not run. The network and optimizer end at their starting weights and
        state (the trial trains copies, or restores them). The run then trains the pick's step as the trial compiled
        it; when that step trained copies (a plan that rewrites the network or optimizer), ``train`` writes their
        values back into this Model's network and optimizer by Parameter name when it ends.

        Returns:
            The :class:`~ms_boost.autotune.AutotuneReport` (also ``model.autotune_report``).

        Raises:
            RuntimeError: the Model's boost_level is not ``"auto"``, or its trial already ran.
        """
        if self._auto_config is None:
            raise RuntimeError(f"Model.autotune: this Model has boost_level={self.boost.level!r}; only "
                               f"boost_level='auto' runs a trial.")
        if self.autotune_report is not None:
            raise RuntimeError(f"Model.autotune: the trial already ran (pick: {self.autotune_report.pick}).")
        amp = {}
        if self._loss_scale_manager_set:
            amp["loss_scale_manager"] = self._loss_scale_manager
        if self._keep_bn_fp32 is not None:
            amp["keep_batchnorm_fp32"] = self._keep_bn_fp32
        report = autotune_plan(self._network, self._loss_fn, self._optimizer, train_dataset, epochs,
                               self._auto_config, self._amp_level, steps_per_epoch=steps_per_epoch, **amp)
        self.boost = AutoBoost(report.level, report.boost_config_dict)
        self.autotune_report = report
        eval_network, eval_indexes = self._user_eval
        self._eval_network = eval_network
        jit_config = self._network.jit_config_dict
        run = report.trial_run
        if run is not None and not run.on_originals and eval_network is not None:
            run = None  # your eval_network reads your network's Parameters: the run must train those, not copies
        if run is None:
            self._build_boost_network({})
            self._train_network = self._build_train_network()
        else:  # the pick's step compiled by the trial, at the starting state: its compile is not paid twice
            if not run.on_originals:  # it trains copies (rewritten); train() writes their values back to ours
                self._trained_copies = run
                self._network, self._optimizer = run.network, run.optimizer
            self._train_network = run.train_cell
        self._train_network._jit_config_dict = jit_config
        self._build_eval_network(self._metrics, self._eval_network, eval_indexes)
        self._build_predict_network()
        self._memory_key = memory_key(self._train_network)  # the trial compiled the step: see _compile_if_replaced
        return report

    # -- training ------------------------------------------------------------------------------
    def _prepare_training(self, epoch, train_dataset, callbacks, dataset_sink_mode, sink_size, initial_epoch):
        """Before MindSpore's loop, for ``train`` and ``fit``: the trial (``"auto"``), the plan's log, extra callbacks.

        Returns:
            The callbacks to hand to MindSpore (the user's, plus the optimizer's own, e.g. THOR's guard, and with a
            loss-scale cell a :class:`~ms_boost.overflow_watch.SkippedStepsWatch`).
        """
        if self._auto_config is not None and self.autotune_report is None:
            per_epoch = _sunk_steps_per_epoch(dataset_sink_mode, sink_size)
            self.autotune(train_dataset, max(1, int(epoch) - int(initial_epoch)), steps_per_epoch=per_epoch)
        # a GPU MindSpore's kernels have no machine code for (Hopper): said once, before the first step's long JIT
        gpu_code.warn_if_compiled_from_ptx(str(ms.get_context("device_target")), int(ms.get_context("device_id")))
        self._compile_if_replaced()
        if not self._plan_logged:
            self._plan_logged = True
            if comm.get_rank() == 0:
                logger.info("%s", self._plan_text())
        self._warn_about_data(train_dataset)
        self._warn_if_user_optimizer_moved()
        extra = optimizer_hooks(self._optimizer).callbacks() if self._optimizer is not None else []
        first = []
        shown = optimizer_hooks(self._optimizer).callback_optimizer() if self._optimizer is not None else None
        if shown is not None:  # first, so that every other callback gets it (SummaryCollector needs an nn.Optimizer)
            first.append(_ShowOptimizer(shown))
        if isinstance(self._train_network, BoostTrainOneStepWithLossScaleCell):
            # says when every step overflows (a run that trains nothing); first, so that with a fixed scale that
            # MindSpore's Model trains through nn.TrainOneStepCell the script's callbacks get the loss alone, as there
            first.append(SkippedStepsWatch(loss_only=self._fixed_scale_without_drop()))
        if self._branches_on_device():  # a callback's set_data between two steps: compile the step again
            self._memory_watch = MemoryWatch(self._train_network, compiled=self._memory_key is not None)
            extra.append(self._memory_watch)
        if extra or first:  # THOR: its guard, which stops a run that stays non-finite; the skipped-steps watch
            if callbacks is None:
                callbacks = []
            callbacks = first + (list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]) + extra
        return callbacks

    def _fixed_scale_without_drop(self) -> bool:
        """Whether the loss-scale manager is a fixed one without ``drop_overflow_update``.

        MindSpore's Model trains that through ``nn.TrainOneStepCell(..., sens=scale)`` (its output: the loss), not
        through the loss-scale cell (``(loss, overflow, scale)``), on every device.
        """
        manager = self._loss_scale_manager
        return (manager is not None and not is_group_manager(manager)
                and getattr(manager, "get_update_cell", lambda: True)() is None)

    def _branches_on_device(self) -> bool:
        """Whether the train step reads Parameters inside device-side branches (:class:`MemoryWatch`).

        The loss-scale cell (an overflowing step is skipped under a branch) and the algorithms whose spec says
        ``branches_on_device`` (gradient accumulation's update); not a train cell the script built itself.
        """
        if self._train_cell_given or self._optimizer is None:
            return False
        if isinstance(self._train_network, BoostTrainOneStepWithLossScaleCell):
            return True
        return any(spec.branches_on_device for spec in self.boost.enabled_specs())

    def _warn_about_data(self, train_dataset) -> None:
        """Warn what an enabled algorithm's ``warn_data`` hook says about this training data set.

        Only the trained plan's algorithms: none when the network trains itself or there is no optimizer.
        """
        if self._train_cell_given or self._optimizer is None:
            return
        specs = [spec for spec in self.boost.enabled_specs() if spec.warn_data is not None]
        if not specs:
            return
        data = describe_training_data(train_dataset)
        for spec in specs:
            text = spec.warn_data(self.boost.section(spec.name), data)
            if text:
                warnings.warn(f"ms_boost: {text}", UserWarning, stacklevel=4)

    def _warn_if_user_optimizer_moved(self) -> None:
        """Say when the optimizer given to Model changed its step after the plan rebuilt it.

        A plan that rebuilds the optimizer (LessBN, gradient freezing) starts the rebuilt ones from the script's
        optimizer's state when Model is built; a script that then steps that optimizer itself (a functional loop, a
        train cell of its own) or loads a checkpoint into it changes state the Model does not train with. Said once
        per change, naming both steps.
        """
        if self._rebuilt_at_step is None:
            return
        now = _optimizer_step(self._user_optimizer)
        if now is None or now == self._rebuilt_at_step:
            return
        warnings.warn(f"ms_boost: the optimizer given to Model is at global_step {now}, but boost_level "
                      f"{self.boost.level!r} rebuilt it (plan: {', '.join(self._enabled())}) when Model was built, at "
                      f"global_step {self._rebuilt_at_step}: Model trains the rebuilt optimizer "
                      f"(model.train_network.optimizer), which does not see the steps or checkpoint the script gave "
                      f"its own optimizer since (its momenta, its step for a learning-rate schedule). Build the Model "
                      f"after those steps, or load a checkpoint into model.train_network.", UserWarning, stacklevel=4)
        self._rebuilt_at_step = now

    def _compile_if_replaced(self) -> None:
        """Compile the train step again when a Parameter got new memory since it last trained.

        E.g. a checkpoint loaded with ``load_param_into_net`` into a model that has trained: see
        :mod:`ms_boost.replaced_memory`.
        """
        if self._memory_key is None:  # not trained yet: nothing compiled on old memory
            return
        replaced = replaced_parameters(self._memory_key, memory_key(self._train_network))
        if replaced:
            compile_again_for(self._train_network, replaced, "since it last trained (e.g. load_param_into_net")

    def _end_training(self) -> None:
        # the memory the step last ran on: a callback may replace memory after the last step (EarlyStopping's
        # restore_best_weights), which the next train/fit must then compile on
        watch, self._memory_watch = self._memory_watch, None
        ran_on = watch.last_step_key() if watch is not None else None
        self._memory_key = ran_on if ran_on is not None else memory_key(self._train_network)
        if self._trained_copies is not None:  # the autotune pick trained copies: the user's objects get the values
            self._trained_copies.sync_to(self._user_network, self._user_optimizer)

    def train(self, epoch, train_dataset, callbacks=None, dataset_sink_mode=False, sink_size=-1, initial_epoch=0):
        """Train as ``mindspore.train.Model.train``; logs the boost plan once first (rank 0).

        With ``boost_level="auto"`` the trial runs first (once), planned over the epochs left to train; when its pick
        trained copies, their values are written back to the given network and optimizer at the end.
        """
        callbacks = self._prepare_training(epoch, train_dataset, callbacks, dataset_sink_mode, sink_size,
                                           initial_epoch)
        try:
            return super().train(epoch, train_dataset, callbacks=callbacks, dataset_sink_mode=dataset_sink_mode,
                                 sink_size=sink_size, initial_epoch=initial_epoch)
        finally:
            self._end_training()

    def fit(self, epoch, train_dataset, valid_dataset=None, valid_frequency=1, callbacks=None,
            dataset_sink_mode=False, valid_dataset_sink_mode=False, sink_size=-1, initial_epoch=0):
        """Train and evaluate as ``mindspore.train.Model.fit``, with what :meth:`train` adds.

        (MindSpore's ``fit`` runs its own loop, not ``train``: without this, ``boost_level="auto"`` never ran its
        trial and THOR's guard callback was left out.)
        """
        callbacks = self._prepare_training(epoch, train_dataset, callbacks, dataset_sink_mode, sink_size,
                                           initial_epoch)
        try:
            return super().fit(epoch, train_dataset, valid_dataset=valid_dataset, valid_frequency=valid_frequency,
                               callbacks=callbacks, dataset_sink_mode=dataset_sink_mode,
                               valid_dataset_sink_mode=valid_dataset_sink_mode, sink_size=sink_size,
                               initial_epoch=initial_epoch)
        finally:
            self._end_training()

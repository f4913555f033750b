"""Boost training cells: one step of loss, gradients, reduction and the configured update pipeline.

``construct`` has one path::

    loss  = network(*inputs)
    grads = d loss / d weights            (with the loss scale as sensitivity in the loss-scale cell)
    grads = reducer(grads)                 (data-parallel mean; within a server when AdaSum is on)
    [loss-scale cell] unscale, overflow = any non-finite gradient, loss or BatchNorm statistic on any rank,
                      update the scale; on overflow the statistics the forward pass wrote are restored
    if not overflow: update(loss, grads, *inputs)

All choices (which reducer, which update stages) are made in ``__init__`` from the resolved
:class:`~ms_boost.config.AutoBoost`. An overflow step skips the whole update: no weight, optimizer
state or algorithm state changes.
"""
from __future__ import annotations

import logging
import math
import os
import warnings
from typing import Any, Optional, Union

import mindspore as ms
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

from ms_boost import comm, pipeline
from ms_boost.config import AutoBoost, prepared_plan, resolve
from ms_boost.loss_scaler import forward_non_finite, make_loss_scaler
from ms_boost.mindspore_api import graph_compiled
from ms_boost.stages import (
    OptimizerUpdate,
    PlansStepVariants,
    StageHooks,
    optimizer_hooks,
    phase_suffix,
    plan_graph_variant,
    runs_as_python,
    stage_chain,
    unscale_gradients,
)
from ms_boost.topology import Topology

logger = logging.getLogger("ms_boost")

__all__ = ["BoostTrainOneStepCell", "BoostTrainOneStepWithLossScaleCell", "build_reducer"]


def build_reducer(boost: AutoBoost, weights, topology: Optional[Topology] = None) -> comm.GradReducer:
    """The data-parallel gradient reducer the configuration asks for (see :func:`ms_boost.pipeline.build_reducer`).

    Follows MindSpore's parallel context (``set_auto_parallel_context(parallel_mode=DATA_PARALLEL,
    gradients_mean=...)``): identity in stand-alone mode or on one rank. With AdaSum on, gradients are
    averaged only among the ranks of a server; AdaSum combines the servers.
    """
    return pipeline.build_reducer(boost, weights, pipeline.build_context(boost, topology))


def _sens_value(sens) -> float:
    """``sens`` as a float: a finite number (int, float, numpy or a one-element Tensor), else a clear error."""
    try:
        value = None if isinstance(sens, (bool, str, bytes)) else float(sens)
    except (TypeError, ValueError):
        value = None
    if value is None or not math.isfinite(value):
        raise TypeError(f"BoostTrainOneStepCell: sens must be a finite number (the gradient sensitivity, a constant "
                        f"scale of the loss) or None for 1.0; got {sens!r} ({type(sens).__name__}).")
    return value


# Per-tensor steps mapped over tuples with HyperMap (a Python loop would unroll one call per tensor).
_copy_into = ops.MultitypeFuncGraph("copy_into")
_zeros = ops.MultitypeFuncGraph("zeros")
_hyper_map = ops.HyperMap()


@_copy_into.register("Tensor", "Tensor")
def _copy_tensor(dst, src):
    return ops.assign(dst, src)


@_zeros.register("Tensor")
def _zeros_tensor(weight):
    return ops.zeros_like(weight)


def _span(mask):
    """``(lo, hi)`` when the True entries of ``mask`` are exactly ``lo .. hi-1`` (at least one), else None."""
    if mask is None or not any(mask):
        return None
    lo = mask.index(True)
    hi = len(mask) - mask[::-1].index(True)
    return (lo, hi) if all(mask[lo:hi]) else None


class _ScaledLoss(nn.Cell):
    """``(sens * loss, loss)`` of the loss network.

    differentiated with ``has_aux`` (gradients of the first output only), one forward pass gives the loss and the
    gradients with ``sens`` as sensitivity.
    """

    def __init__(self, network: nn.Cell):
        super().__init__(auto_prefix=False)
        # held, not registered as a sub-cell: the train cell registers the network already, and MindSpore walks
        # every registered sub-cell on each call (the compile phase, set_train, ...): twice the tree otherwise
        object.__setattr__(self, "network", network)

    def construct(self, inputs, sens):
        loss = self.network(*inputs)
        return loss * sens, loss


class BoostTrainOneStepCell(nn.Cell, PlansStepVariants):
    """One boosted training step without loss scaling.

    Args:
        network: the loss network (``WithLossCell`` or any Cell returning the loss).
        optimizer: the optimizer (an ``nn.Optimizer``, a ``FreezeOpt`` or THOR).
        sens: gradient sensitivity (a constant scale of the loss); 1.0 when None.
        boost_config: an :class:`~ms_boost.config.AutoBoost`, a level string, or None: the plan whose
            ``network_auto_process_train`` returned ``network`` when it came from there, else O0. (Upstream read a
            process-wide singleton instead; ms_boost passes the plan explicitly.)

    Returns from ``construct``: the loss.
    """

    def __init__(self, network: nn.Cell, optimizer: nn.Cell, sens: Optional[float] = None,
                 boost_config: Union[AutoBoost, str, None] = None):
        super().__init__(auto_prefix=False)
        prepared = prepared_plan(network) if boost_config is None else None
        if prepared is not None:
            # the network came from AutoBoost.network_auto_process_train: its plan (upstream's cell read the
            # AutoBoost the script had configured), not O0, which would drop the plan's accumulation, AdaSum, ...
            boost_config = prepared
            logger.info(f"{type(self).__name__}: no boost_config given; using {boost_config!r}, the plan "
                        f"network_auto_process_train prepared this network with")
        self.boost = resolve(boost_config)
        self.network = network
        self.network.set_grad()
        self.optimizer = optimizer
        optimizer_hooks(optimizer).check_train_cell(self)  # THOR: the network must call its THOR layers
        self.weights = optimizer.parameters
        # not used by construct (loss_and_grads): kept for subclasses written against upstream's cell, which
        # call self.grad(self.network, self.weights)(*inputs, sens)
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)
        self.scaled_loss = _ScaledLoss(network)
        self.sens = 1.0 if sens is None else _sens_value(sens)
        self.sens_tensor = Tensor(self.sens, ms.float32)
        self.topology = Topology.current(self.boost.common.device_number)  # built and validated once
        mode = comm.uninitialised_parallel_mode()
        if mode is not None:  # said, not silently trained alone (MindSpore's own train cell crashes here on CPU)
            warnings.warn(f"parallel_mode={mode!r} is set but communication is not initialised: this process trains "
                          f"alone and its gradients are not reduced across ranks. Call "
                          f"mindspore.communication.init() and start the script with msrun (or another launcher).",
                          UserWarning, stacklevel=2)
        not_rewritten = pipeline.not_rewritten(self.boost, network, optimizer)
        if not_rewritten:  # said: a hand-built cell cannot rewrite the network or optimizer it is given
            several = len(not_rewritten) > 1
            warnings.warn(f"boost plan {self.boost.level}: {', '.join(not_rewritten)} "
                          f"{'rewrite' if several else 'rewrites'} the network and optimizer, which this train cell "
                          f"was given unrewritten, so {'they do' if several else 'it does'} not run here. Pass the "
                          f"pair through AutoBoost(...).network_auto_process_train(network, optimizer) first, or train "
                          f"with ms_boost.Model(..., boost_level=...), which does.", UserWarning, stacklevel=2)
        ctx = pipeline.build_context(self.boost, self.topology)
        self.reducer = pipeline.build_reducer(self.boost, self.weights, ctx)
        self.update = pipeline.build_update(self.boost, network, optimizer, self.weights, ctx)
        # PyNative: the gradients the outermost stage says this step's update reads (None: all), see __call__
        self._grad_mask = None
        self._grad_span = None  # (lo, hi) when the marked weights are exactly weights[lo:hi] (set with _grad_mask)
        # upstream's flags, fixed by the plan (read by check_*_enable and by subclasses written against upstream)
        self.enable_adasum = bool(self.boost.boost_config.get("adasum") and self.topology.data_parallel
                                  and self.topology.num_servers > 1)
        self.enable_dim_reduce = bool(self.boost.boost_config.get("dim_reduce"))
        self._graceful_exit_parameters()

    def _graceful_exit_parameters(self) -> None:
        """MindSpore's graceful exit: with ``MS_ENABLE_GRACEFUL_EXIT=1`` the train cell holds two flags.

        ``mindspore.train.OnRequestExit`` finds them by name in the train network: on the exit request (its signal
        or its ``config_file``) it sets ``graceful_init`` to 1 (and, on one process, ``graceful_exit`` to True)
        before a step; after the step, ``graceful_exit`` True makes it save a checkpoint and stop training. Across
        data-parallel ranks the step sets ``graceful_exit`` to whether every rank asked (a sum of ``graceful_init``
        equal to the rank count), as ``nn.TrainOneStepCell`` does, so the ranks stop at the same step. Without the
        variable: no flags, as MindSpore's cell.
        """
        self.use_graceful_exit = os.environ.get("MS_ENABLE_GRACEFUL_EXIT") == "1"
        if self.use_graceful_exit:
            self.exit_param = Parameter(Tensor(False, ms.bool_), name="graceful_exit")
            self.init_param = Parameter(Tensor([0], ms.int32), name="graceful_init")
            self.exit_votes = comm.AllReduce("sum", enabled=self.topology.data_parallel)
            # float32: MindSpore's CPU AllReduce has no int32 kernel (nn.TrainOneStepCell's int32 vote fails there)
            self.exit_quorum = Tensor([self.exit_votes.size if self.exit_votes.active else 1], ms.float32)

    def graceful_exit_vote(self, loss):
        """``loss``, after the ranks' exit requests are agreed into ``graceful_exit`` (several ranks only)."""
        if self.use_graceful_exit and self.exit_votes.active:
            votes = self.exit_votes(ops.cast(self.init_param, ms.float32))
            agreed = ops.all(ops.equal(votes, self.exit_quorum))
            loss = ops.depend(loss, ops.assign(self.exit_param, agreed))
        return loss

    def __call__(self, *args, **kwargs):
        """Run the step; ask the update chain first which gradients this step reads and which variant it runs.

        PyNative: the outermost stage's :meth:`~ms_boost.stages.StageHooks.plan_step`; ``loss_and_grads`` then
        differentiates only those weights. Graph mode: every stage's part of the step's variant
        (:func:`~ms_boost.stages.plan_graph_variant`: gradient freezing's train set, THOR's capture/refresh); when
        one answers, the step runs the graph compiled for that variant under the phase ``<phase>_<name>``
        (compiled on its first use), in which ``loss_and_grads`` differentiates only the weights the outermost
        stage reads. Either way every stage is told :meth:`~ms_boost.stages.StageHooks.end_step` after the step.
        """
        stages = self.stage_hooks()
        if not stages:
            return super().__call__(*args, **kwargs)
        try:  # end_step also when planning fails half-way (a stage may have set constants for its variant)
            name = None
            if runs_as_python():
                self._grad_mask = self.update.plan_step()  # stages[0] is self.update (the chain starts there)
            else:
                plan = plan_graph_variant(stages)
                if plan is not None:
                    name, self._grad_mask = plan
            self._grad_span = _span(self._grad_mask)
            if name is None:
                return super().__call__(*args, **kwargs)
            with phase_suffix(self, name):
                return super().__call__(*args, **kwargs)
        finally:
            self._grad_mask = None
            self._grad_span = None
            for stage in stages:
                stage.end_step()

    @property
    def compile_phase(self):
        """MindSpore's ``Cell.compile_phase``: the phase of the graph being compiled or run."""
        return self._compile_phase

    @compile_phase.setter
    def compile_phase(self, value):
        # MindSpore sets the phase on every sub-cell before every call, compiled or not (a walk of the whole tree
        # through Cell.__setattr__: ~0.2-0.6 ms of host time a step on a small ResNet, more than the rest of the
        # call's Python). Only a compile reads the sub-cells' phase: a phase whose graph is compiled (every step
        # after the first of each variant) is set on this cell alone.
        if graph_compiled(self, value):
            object.__setattr__(self, "_compile_phase", value)
            return
        nn.Cell.compile_phase.fset(self, value)

    def stage_hooks(self):
        """The stages of the update chain that offer hooks (:class:`~ms_boost.stages.StageHooks`)."""
        return [stage for stage in stage_chain(self.update) if isinstance(stage, StageHooks)]

    def loss_and_grads(self, inputs, sens):
        """The loss and the gradients of ``sens * loss`` with respect to the weights, from ONE forward pass.

        (``loss = network(x); grads = grad(network)(x, sens)`` shares the forward pass only while the graph
        calls the network nowhere else: a stage that re-evaluates it, as DimReduce's line search does, made
        Graph mode run that forward pass twice.) ``sens`` is a float32 scalar Tensor (1.0 or the loss scale):
        ``loss * sens`` is float32 even for a float16 loss, so a loss scale above float16's range stays finite.
        """
        if self._grad_mask is not None:
            return self._loss_and_planned_grads(inputs, sens)
        (_, loss), grads = ops.value_and_grad(self.scaled_loss, None, self.weights, has_aux=True)(inputs, sens)
        return loss, grads

    def _loss_and_planned_grads(self, inputs, sens):
        """:meth:`loss_and_grads` differentiating only the weights ``_grad_mask`` marks (PyNative, or a Graph variant).

        The other gradients are zeros the update does not read (the reducer and loss scaler see the usual tuple).
        """
        if self._grad_span is not None:  # one slice (freezing's train sets): no per-weight loop to compile
            lo, hi = self._grad_span
            (_, loss), part = ops.value_and_grad(self.scaled_loss, None, self.weights[lo:hi], has_aux=True)(inputs,
                                                                                                           sens)
            if lo > 0:
                part = _hyper_map(_zeros, self.weights[:lo]) + part
            if hi < len(self.weights):
                part = part + _hyper_map(_zeros, self.weights[hi:])
            return loss, part
        mask = self._grad_mask
        wanted = ()
        for i in range(len(mask)):  # unrolled in Graph mode (mask is a constant of the step's variant)
            if mask[i]:
                wanted = wanted + (self.weights[i],)
        (_, loss), part = ops.value_and_grad(self.scaled_loss, None, wanted, has_aux=True)(inputs, sens)
        grads = ()
        taken = 0
        for i in range(len(mask)):
            if mask[i]:
                grads = grads + (part[taken],)
                taken = taken + 1
            else:
                grads = grads + (ops.zeros_like(self.weights[i]),)
        return loss, grads

    def construct(self, *inputs):
        """One training step on ``inputs``; returns the loss."""
        loss, grads = self.loss_and_grads(inputs, self.sens_tensor)
        grads = self.reducer(grads)
        loss = ops.depend(loss, self.update(loss, grads, *inputs))
        return self.graceful_exit_vote(loss)

    # -- upstream's per-algorithm entry points (mindspore.boost.BoostTrainOneStepCell) ----------------------
    # Upstream's construct branches into these; here one pipeline built in __init__ runs every enabled stage,
    # and these names stay for scripts and subclasses that call them.
    def check_adasum_enable(self) -> bool:
        """Whether AdaSum combines this cell's updates: on in the plan, data parallel, more than one server."""
        return self.enable_adasum

    def check_dim_reduce_enable(self) -> bool:
        """Whether the plan replaces the optimizer step by DimReduce."""
        return self.enable_dim_reduce

    def gradient_freeze_process(self, *inputs):
        """One training step on ``inputs`` (the freezing schedule is part of every step here); returns the loss."""
        return self.construct(*inputs)

    def gradient_accumulation_process(self, loss, grads, sens, *inputs):
        """Run this cell's update pipeline on gradients the caller computed with sensitivity ``sens``.

        The pipeline is accumulation, AdaSum, DimReduce or the optimizer, as the plan says; the gradients were
        reduced across ranks by the caller. Returns the loss.

        The gradients are divided by ``sens`` first: the stages work on the gradients of the loss itself.
        """
        grads = unscale_gradients(ops.cast(sens, ms.float32), grads)
        return ops.depend(loss, self.update(loss, grads, *inputs))

    def adasum_process(self, loss, grads):
        """Run this cell's update pipeline on reduced gradients; returns the loss.

        With AdaSum on: the optimizer step, then the servers' weight deltas combined. Stages that need the network
        inputs (DimReduce) need :meth:`gradient_accumulation_process`.
        """
        return ops.depend(loss, self.update(loss, grads))


class BoostTrainOneStepWithLossScaleCell(BoostTrainOneStepCell):
    """One boosted training step with loss scaling and overflow skipping.

    Args:
        network: the loss network.
        optimizer: the optimizer.
        scale_sense: a loss-scale update cell (``DynamicLossScaleUpdateCell``,
            ``FixedLossScaleUpdateCell``, from ``manager.get_update_cell()``), a Tensor holding a fixed
            scale of shape ``()`` or ``(1,)``, or a :class:`~ms_boost.loss_scale_group.GroupLossScaleManager`.
        boost_config: as :class:`BoostTrainOneStepCell`.

    The update stages (accumulation, AdaSum, DimReduce, a user's stage) get the gradients of the loss itself,
    divided by the whole loss scale; an optimizer built with ``loss_scale=S`` (MindSpore's convention with
    ``FixedLossScaleManager(S, drop_overflow_update=False)``) divides by ``S`` itself, so its apply stage
    multiplies them by ``S`` again just before it. Every combination of manager and optimizer ends with
    unscaled updates, and no stage sees a share of the scale.

    Returns from ``construct``: ``(loss, overflow, loss_scale)`` like MindSpore's
    ``TrainOneStepWithLossScaleCell``; with a group manager ``loss_scale`` is the first group's scale after the
    step's update (as upstream). An overflow on any rank skips the update on every rank, whatever
    the manager's ``drop_overflow_update`` (ms_boost never writes non-finite values into weights).
    """

    def __init__(self, network: nn.Cell, optimizer: nn.Cell, scale_sense: Any,
                 boost_config: Union[AutoBoost, str, None] = None):
        super().__init__(network, optimizer, sens=None, boost_config=boost_config)
        # An optimizer built with loss_scale=S divides the gradients by S itself (MindSpore's convention for
        # FixedLossScaleManager(drop_overflow_update=False)): the scaler removes the whole scale, so every
        # stage sees true gradients, and the optimizer's apply stage puts S back just before the optimizer.
        optimizer_loss_scale = optimizer_hooks(optimizer).own_loss_scale()
        # the ranks agree on overflow only when they train one model (data parallel): ranks that train on their own
        # (stand-alone parallel mode after init()) run no collective here, as MindSpore's loss-scale cell
        self.loss_scaler = make_loss_scaler(scale_sense, self.weights, reduce_overflow=self.topology.data_parallel)
        for stage in stage_chain(self.update):
            if isinstance(stage, OptimizerUpdate):
                stage.gradient_scale = optimizer_loss_scale or 1.0
        self.scale_sense = Parameter(Tensor(self.loss_scaler.initial_scale, ms.float32), name="scale_sense")
        # Buffers the forward pass writes (BatchNorm moving statistics): snapshotted before the step and
        # restored on overflow, so an overflow step leaves the network exactly as it was. Skipped: the
        # scaler's own state (a back-off must stick) and the stages' transient state (e.g. THOR's scratch
        # statistics, folded in only by the skipped update).
        skipped = {id(p) for p in self.loss_scaler.state_parameters()}
        hooks = self.stage_hooks()
        for stage in hooks:
            skipped |= {id(p) for p in stage.transient_parameters()}
        self.buffers = ParameterTuple(p for p in network.get_parameters()
                                      if not p.requires_grad and p.dtype in (ms.float32, ms.float16)
                                      and id(p) not in skipped)
        self.buffer_shadows = self.buffers.clone(prefix="overflow_shadow", init="same")
        self.has_buffers = len(self.buffers) > 0
        for stage in hooks:  # e.g. THOR unscales its captured output gradients by the live loss scale
            stage.bind_loss_scale(self.scale_sense)

    def set_sense_scale(self, sens) -> None:
        """Set the loss scale (as MindSpore's loss-scale cell)."""
        value = sens.asnumpy().reshape(()) if isinstance(sens, Tensor) else sens
        self.scale_sense.set_data(Tensor(float(value), ms.float32))

    def construct(self, *inputs):
        """One training step with loss scaling; returns ``(loss, overflow, loss_scale)``."""
        if self.has_buffers:
            inputs = ops.depend(inputs, _hyper_map(_copy_into, self.buffer_shadows, self.buffers))
        scaling_sens = self.scale_sense
        loss, grads = self.loss_and_grads(inputs, scaling_sens)
        # The overflow covers what the forward pass wrote too: on a freezing step the frozen layers' gradients
        # are not computed (PyNative) or are not read, but their BatchNorm statistics were updated.
        forward_bad = forward_non_finite(loss, self.buffers if self.has_buffers else None)
        grads = self.reducer(grads)
        grads, overflow = self.loss_scaler(scaling_sens, grads, forward_bad)
        if not overflow:
            loss = ops.depend(loss, self.update(loss, grads, *inputs))
        elif self.has_buffers:
            loss = ops.depend(loss, _hyper_map(_copy_into, self.buffers, self.buffer_shadows))
        loss = self.graceful_exit_vote(loss)
        return loss, overflow, self.loss_scaler.current_scale(scaling_sens, overflow)

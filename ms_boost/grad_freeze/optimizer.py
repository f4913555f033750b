"""The freezing optimizer :class:`FreezeOpt`: each step updates only the parameter groups its schedule trains.

:class:`FreezeOpt` is used exactly like an optimizer: ``freeze_opt(grads)`` applies this step's groups
and advances its step counter (a Parameter, so a checkpoint resumes the schedule). It keeps one inner
optimizer per set of parameters that are always trained together, so each parameter has exactly one
optimizer state, and the inner optimizers' learning rate and step follow the FreezeOpt's (a dynamic
learning rate stays in step even for groups that were frozen).

In PyNative mode the boost train cells ask :meth:`FreezeOpt.plan_step` before the forward pass and differentiate
only the weights of the step's train group: the frozen layers' weight gradients, and the backward pass below the
lowest trained layer, are never computed (as upstream's per-group train cells do). In Graph mode they ask
:meth:`FreezeOpt.plan_graph_step` and run a graph compiled for the step's train set (one per set, each compiled on
its set's first step) that does the same. Where no host decides (dataset sink mode), one compiled step serves every
schedule entry: it computes all gradients and masks the frozen groups' updates.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

import mindspore as ms
import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops
from mindspore.common import dtype as mstype
from mindspore.train import Callback

from ms_boost.divergence import callback_mark
from ms_boost.grad_freeze.schedule import MAX_TOTAL_STEPS, FreezeSchedule, _ArraySchedule
from ms_boost.grad_process import OptimizerProcess, optimizer_params
from ms_boost.stages import OptimizerHooks, OptimizerView, StageHooks, optimizer_view, runs_as_python

__all__ = ["FreezeOpt", "DEVICE_TABLE_MAX", "AUTO_VARIANTS_MIN_STEPS"]

#: Entries of the schedule table FreezeOpt keeps on the device for Graph mode (4 MB of int32).
DEVICE_TABLE_MAX = 2 ** 20
#: ``graph_variants=None`` (auto): one graph per train set from runs of this many optimizer steps. On the zoo's GEMM
#: ResNet-10 (CPU, ``bench/results/o1_parts.md``) the nine extra graphs of the default schedule cost about 30 s of
#: CPU to compile and save about 0.1 of a 17 ms step against the masked graph: they pay after 14,000-21,000 steps;
#: larger networks compile in fewer of their (longer) steps, so they pay sooner.
AUTO_VARIANTS_MIN_STEPS = 20_000


def _take(values, indices):
    """``tuple(values[i] for i in indices)``, written so that Graph mode unrolls it."""
    out = ()
    for i in indices:
        out = out + (values[i],)
    return out


# Graph mode's Momentum fast path (see FreezeOpt._momentum_atom): a frozen atom's ApplyMomentum runs with a zero
# gradient, a zero learning rate and a momentum of one, which leaves its weights and moments as they were.
_apply_momentum = ops.MultitypeFuncGraph("freeze_apply_momentum")
_times = ops.MultitypeFuncGraph("freeze_times")


@_apply_momentum.register("Function", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor")
def _apply_momentum_tensor(kernel, momentum, learning_rate, gradient, weight, moment):
    return ops.depend(True, kernel(weight, moment, learning_rate, gradient, momentum))


@_times.register("Tensor", "Tensor")
def _times_tensor(factor, value):
    if value.dtype != factor.dtype:  # decided when compiling: no Cast operator for float32 gradients
        factor = factor.astype(value.dtype)
    return value * factor


def _momentum_fast_path(inner) -> bool:
    """Whether ``inner`` runs MindSpore's own ``nn.Momentum`` step (possibly with ms_boost's GC mixin)."""
    return isinstance(inner, nn.Momentum) and type(inner).construct is nn.Momentum.construct


def _flatten_group(group, what: str) -> List[Parameter]:
    if not isinstance(group, (list, tuple)):
        raise TypeError(f"FreezeOpt: each element of train_parameter_groups must be a list of Parameters or of "
                        f"parameter-group dicts, got {type(group).__name__} in {what}.")
    out = []
    for item in group:
        if isinstance(item, Parameter):
            out.append(item)
        elif isinstance(item, dict) and "params" in item:
            out.extend(item["params"])
        elif isinstance(item, dict) and "order_params" in item:
            continue
        else:
            raise TypeError(f"FreezeOpt: {what} holds {type(item).__name__}; expected Parameter or a dict with "
                            f"'params'.")
    return out


def _prefix_local_parameters(cell: nn.Cell, prefix: str, user_ids: set) -> None:
    """Prefix the names of the optimizer's own parameters (state, learning rate, step) only."""
    for param in cell.get_parameters():
        if id(param) not in user_ids and not param.name.startswith(prefix):
            param.name = prefix + param.name


class FreezeOpt(nn.Cell, StageHooks, OptimizerHooks):
    """An optimizer that updates, at each step, only the parameter group the schedule names.

    Args:
        opt: the optimizer to split (any :class:`mindspore.nn.Optimizer`, or LARS around one). It is not
            modified; new inner optimizers of its class with its hyper-parameters and parameter-group
            settings are built.
        train_parameter_groups: list of parameter sets (lists of Parameters, or of parameter-group dicts as
            upstream passes them); ``train_strategy[t]`` names the set trained at step ``t``. Sets may
            overlap. None: one set holding every parameter.
        train_strategy: per-step index into ``train_parameter_groups`` (list, tuple, numpy array, 1-D int32
            Tensor or a lazy :class:`FreezeSchedule`, as :class:`GradientFreeze` passes;
            Graph mode at most ``DEVICE_TABLE_MAX`` steps), used cyclically. None: ``0, 1, ...,
            len(train_parameter_groups)-1`` cyclically.

    PyNative mode selects the groups on the host (one read of :attr:`global_step` per step, see
    :meth:`host_step`); Graph mode selects them on the device from the table :attr:`train_strategy`.
    In PyNative mode the boost train cells ask :meth:`plan_step` before the forward pass and differentiate
    only the weights of the step's train group: the frozen layers' weight gradients, and the backward pass
    below the lowest trained layer, are never computed (as upstream's per-group train cells do). In Graph mode
    they ask :meth:`plan_graph_step` and do the same in a graph compiled for the step's train set.

    Attributes:
        parameters: every parameter of ``opt``, in ``opt``'s order (the gradients' order).
        learning_rate: the learning rate Parameter (fixed learning rate; assigning it changes every inner
            optimizer's rate), or the first inner optimizer's learning rate (dynamic or per-group rates).
        global_step: the step counter (int32 Parameter of shape (1,)), also the position in the schedule; it starts
            at ``opt``'s ``global_step`` (a resumed optimizer goes on from its step).
        schedule: the schedule (``schedule[t]``, ``len(schedule)``), lazy when a :class:`FreezeSchedule`.
        train_strategy: int32 Tensor, the schedule's first ``min(len(schedule), DEVICE_TABLE_MAX)`` entries.
        loss_scale: ``opt``'s static ``loss_scale`` (every inner optimizer divides the gradients by it).
        opts: the inner optimizers, one per set of parameters always trained together.
        graph_variants: whether :meth:`plan_graph_step` chooses a graph per train set: True, False, or None (auto,
            the default: see :meth:`uses_graph_variants`); the ``grad_freeze`` section's ``graph_variants`` sets it.
        planned_steps: the run's optimizer steps, set by ``ms_boost.Model.train`` (None until then).

    Inputs:
        - **gradients** (tuple[Tensor]) - one per element of :attr:`parameters`.

    Raises:
        TypeError: ``opt`` is not an optimizer, or the groups/strategy have the wrong type.
        ValueError: a strategy without groups, a strategy index out of range, a parameter of ``opt`` in no
            group, or a group parameter ``opt`` does not hold.
    """

    def __init__(self, opt, train_parameter_groups=None, train_strategy=None):
        super().__init__(auto_prefix=False)
        if not isinstance(opt, nn.Optimizer):
            raise TypeError(f"FreezeOpt: 'opt' must be a mindspore.nn.Optimizer, got {type(opt).__name__}.")
        if train_strategy is not None and train_parameter_groups is None:
            raise ValueError("FreezeOpt: train_strategy was given without train_parameter_groups; give both.")
        process = OptimizerProcess(opt)
        inner = process.single_opt
        all_params = list(opt.parameters)
        position = {id(p): i for i, p in enumerate(all_params)}

        if train_parameter_groups is None:
            sets = [all_params]
        elif isinstance(train_parameter_groups, (list, tuple)) and train_parameter_groups:
            sets = [_flatten_group(g, f"train_parameter_groups[{j}]") for j, g in enumerate(train_parameter_groups)]
        else:
            raise TypeError(f"FreezeOpt: train_parameter_groups must be a non-empty list or tuple, got "
                            f"{train_parameter_groups!r}.")
        for j, group in enumerate(sets):
            foreign = [p.name for p in group if id(p) not in position]
            if foreign:
                raise ValueError(f"FreezeOpt: train_parameter_groups[{j}] holds parameters the optimizer does not "
                                 f"update: {foreign[:5]}.")
        strategy = self._strategy(train_strategy, len(sets))

        # atoms: parameters trained by exactly the same sets, in optimizer order
        member = np.zeros((len(all_params), len(sets)), bool)
        for j, group in enumerate(sets):
            member[[position[id(p)] for p in group], j] = True
        orphans = [all_params[i].name for i in np.flatnonzero(~member.any(axis=1))]
        if orphans:
            raise ValueError(f"FreezeOpt: parameters {orphans[:5]} (of {len(orphans)}) are in no train parameter "
                             f"group and would never be updated; put them in a group or leave them out of the "
                             f"optimizer.")
        signatures = {}
        for i in range(len(all_params)):
            signatures.setdefault(member[i].tobytes(), []).append(i)
        atoms = list(signatures.values())
        self._mask = np.array([[member[a[0], j] for a in atoms] for j in range(len(sets))], bool)
        # per train set: which gradients (optimizer order) its update reads; None when it reads all of them
        self._needed = tuple(None if member[:, j].all() else tuple(bool(v) for v in member[:, j])
                             for j in range(len(sets)))
        self._planned = None  # train set chosen by plan_step for the current step (PyNative)
        self.train_mask = Tensor(self._mask)
        self.group_atoms = tuple(tuple(int(a) for a in np.flatnonzero(row)) for row in self._mask)
        self.schedule = strategy
        self.period = len(strategy)
        # Graph mode selects on the device from this table: the whole schedule, or its first
        # DEVICE_TABLE_MAX steps (then only PyNative mode, which selects on the host, can run it).
        self.table_complete = self.period <= DEVICE_TABLE_MAX
        self.train_strategy = Tensor(strategy.values(0, min(self.period, DEVICE_TABLE_MAX)), mstype.int32)
        self.groups_num = len(sets)
        self.n_atoms = len(atoms)

        settings = self._settings_by_parameter(inner)
        user_ids = set(position)
        opts, order = [], []
        for a, indices in enumerate(atoms):
            params = [all_params[i] for i in indices]
            sub = OptimizerProcess(opt)
            sub.origin_params = self._regroup(params, settings)
            new = sub.generate_new_optimizer()
            _prefix_local_parameters(new, f"freeze_group_{a}.", user_ids)
            opts.append(new)
            # the gradients go to the inner optimizer in its own parameter order
            order.append(tuple(position[id(p)] for p in new.parameters))
        self.atom_indices = tuple(order)
        # an atom's gradients as one slice of the tuple when its indices are consecutive (Graph mode then compiles
        # one node, not a loop growing a tuple; freezing's groups are runs of consecutive layers)
        self.atom_spans = tuple((ix[0], ix[-1] + 1) if ix == tuple(range(ix[0], ix[-1] + 1)) else None
                                for ix in order)
        self.opts = nn.CellList(opts, auto_prefix=False)
        inners = [o.opt if isinstance(o, nn.LARS) else o for o in opts]

        self.parameters = ParameterTuple(all_params)
        self.opt_class = process.opt_class
        self.is_group = inner.is_group
        self.is_group_lr = inner.is_group_lr
        self.dynamic_lr = inner.dynamic_lr
        self.loss_scale = float(inner.loss_scale)  # the inner optimizers divide the gradients by it, as opt did
        self.sync_lr = not (inner.is_group_lr or inner.dynamic_lr)
        # the given optimizer's step (a resumed run's, loaded into it): the schedule and the learning rate go on from it
        self.global_step = Parameter(Tensor(inner.global_step.asnumpy().reshape(1).astype(np.int32), mstype.int32),
                                     name="global_step")
        self.atom_steps = ParameterTuple([o.global_step for o in inners])
        if self.sync_lr:
            # the given optimizer's own Parameter: assigning it (a script's callback on its optimizer object) changes
            # the rate that trains; a float32 copy where it is of another type
            lr = inner.learning_rate
            self.learning_rate = lr if isinstance(lr, Parameter) and lr.dtype == mstype.float32 and lr.shape == () \
                else Parameter(Tensor(lr.asnumpy(), mstype.float32), name="learning_rate")
            self.atom_lrs = ParameterTuple([o.learning_rate for o in inners])
        else:
            self.learning_rate = inners[0].learning_rate
            self.atom_lrs = ()
        self._inners = tuple(inners)
        # Graph mode: every inner optimizer is MindSpore's Momentum -> one straight graph without control flow
        self.momentum_fast = all(not isinstance(o, nn.LARS) and _momentum_fast_path(o) for o in opts)
        self.always_trained = tuple(bool(v) for v in self._mask.all(axis=0))  # atoms that every train set holds
        # atoms that read their own learning rate (Graph fast path): all of them when the user's optimizer has per-group
        # learning rates, since an atom rebuilt from a group without 'lr' is no group-lr optimizer but still has its own
        # rate (the constructor's), which is not the first atom's
        self.atom_own_lr = tuple(bool(o.is_group_lr or inner.is_group_lr) for o in inners)
        self.atom_step_read = tuple(bool(own and o.dynamic_lr or o.dynamic_weight_decay)
                                    for own, o in zip(self.atom_own_lr, inners))
        if self.momentum_fast:  # per train set and atom: 1.0 / 0.0, trained or not (read by the fast path only)
            self.train_factor = Tensor(self._mask.astype(np.float32))
            self.unstack = ops.Unstack(axis=0)
            self.stack = ops.Stack(axis=0)
        # Graph mode: the train set a host-chosen step variant was compiled for (None: the generic graph, which
        # selects the set on the device); see plan_graph_step
        self.graph_variants: Optional[bool] = None
        self.planned_steps: Optional[int] = None  # the run's length when Model.train told it (auto variants)
        self._static_set = None
        self._atom_step_cells = {}  # inner optimizer -> its compiled PyNative step (_AtomStep), built on first use
        self._atom_steps_compiled = set()  # inner optimizers whose PyNative step has run (been compiled) once

    # -- construction helpers --------------------------------------------------------------------
    @staticmethod
    def _strategy(train_strategy, n_sets: int):
        """The schedule as an object with ``total_steps``, ``[t]`` and ``values(start, count)``."""
        if train_strategy is None:
            return _ArraySchedule(np.arange(n_sets, dtype=np.int32))
        if isinstance(train_strategy, FreezeSchedule):
            if train_strategy.groups > n_sets:
                raise ValueError(f"FreezeOpt: the freeze schedule names up to {train_strategy.groups - 1} frozen "
                                 f"groups; allowed: indices 0 <= i < {n_sets} of train_parameter_groups.")
            return train_strategy
        if isinstance(train_strategy, Tensor):
            if train_strategy.ndim != 1 or train_strategy.dtype not in (mstype.int32, mstype.int64):
                raise TypeError("FreezeOpt: a Tensor train_strategy must be 1-D with an integer dtype.")
            values = train_strategy.asnumpy()
        elif isinstance(train_strategy, (list, tuple, np.ndarray)):
            values = np.asarray(train_strategy)
            if values.ndim != 1 or (values.size and not np.issubdtype(values.dtype, np.integer)):
                raise TypeError("FreezeOpt: train_strategy must be a flat sequence of ints.")
        else:
            raise TypeError(f"FreezeOpt: train_strategy must be None, a list/tuple/array of ints, a FreezeSchedule or "
                            f"a Tensor, got {type(train_strategy).__name__}.")
        if values.size == 0:
            raise ValueError("FreezeOpt: train_strategy is empty.")
        if values.size > MAX_TOTAL_STEPS:
            raise ValueError(f"FreezeOpt: train_strategy has {values.size} entries; allowed: at most "
                             f"{MAX_TOTAL_STEPS}.")
        bad = values[(values < 0) | (values >= n_sets)]
        if bad.size:
            raise ValueError(f"FreezeOpt: train_strategy holds {sorted(set(bad.tolist()))[:5]}; allowed: indices "
                             f"0 <= i < {n_sets} of train_parameter_groups.")
        return _ArraySchedule(values.astype(np.int32))

    @staticmethod
    def _settings_by_parameter(inner) -> dict:
        """``id(parameter) -> (group index, group settings)`` from the optimizer's parameter groups."""
        raw = optimizer_params(inner)
        out = {}
        if isinstance(raw[0], dict):
            for index, group in enumerate(raw):
                if "params" not in group:
                    continue
                settings = {k: v for k, v in group.items() if k not in ("params", "order_params")}
                for param in group["params"]:
                    out[id(param)] = (index, settings)
        return out

    @staticmethod
    def _regroup(params: List[Parameter], settings: dict):
        """``params`` as the optimizer's parameter argument, each keeping its original group's settings."""
        if not settings:
            return params
        groups: Dict[Any, Any] = {}
        for param in params:
            index, values = settings.get(id(param), (-1, {}))
            groups.setdefault(index, (values, []))[1].append(param)
        return [{**values, "params": members} for values, members in groups.values()]

    # -- public helpers ----------------------------------------------------------------------------
    def get_lr(self):
        """The learning rate of the current step (the first inner optimizer's, at this step)."""
        if self.sync_lr:
            return self.learning_rate
        # not synced: self.learning_rate is the first inner optimizer's own (a registered sub-cell or Parameters);
        # reading it through the plain tuple self._inners made MindSpore 2.10's compile fail ("Specializer should
        # not be null") when a FreezeOpt was compiled after many other graphs in one process
        if self.is_group_lr:
            if self.dynamic_lr:
                return tuple(lr(self.global_step).reshape(()) for lr in self.learning_rate)
            return self.learning_rate
        return self.learning_rate(self.global_step).reshape(())

    def trained_atoms(self, step: int) -> np.ndarray:
        """Which inner optimizers run at ``step`` (bool per element of :attr:`opts`); Python side."""
        return self._mask[self.schedule[step % self.period]]

    def group_parameters(self, group: int) -> ParameterTuple:
        """The parameters of train group ``group`` in the order :meth:`apply_group` takes their gradients."""
        return ParameterTuple([self.parameters[i] for a in self.group_atoms[group] for i in self.atom_indices[a]])

    def _apply_atom(self, a, grads, step):
        """Run inner optimizer ``a`` on ``grads`` at ``step``, with the FreezeOpt's learning rate."""
        done = step
        if self.sync_lr:
            done = ops.depend(done, ops.assign(self.atom_lrs[a], self.learning_rate))
        done = ops.depend(done, ops.assign(self.atom_steps[a], step))
        return ops.depend(done, self.opts[a](grads))

    def apply_group(self, group: int, gradients):
        """Update train group ``group`` (a Python int) with ``gradients``, then advance the step counter.

        The gradients are those of :meth:`group_parameters`. Used by the per-group train cells of
        :func:`~ms_boost.grad_freeze.freeze_cell`.
        """
        step = self.global_step
        done = step
        start = 0
        for a in self.group_atoms[group]:
            count = len(self.atom_indices[a])
            done = ops.depend(done, self._apply_atom(a, gradients[start:start + count], step))
            start = start + count
        return ops.depend(done, ops.assign_add(self.global_step, ops.ones_like(step)))

    def _schedule_position(self) -> int:
        """The train set of the coming step: ``schedule[global_step % period]`` (one device read)."""
        return self.schedule[int(self.global_step.asnumpy()[0]) % self.period]

    def own_loss_scale(self) -> float:
        """:class:`~ms_boost.stages.OptimizerHooks`: the inner optimizers divide the gradients by ``loss_scale``."""
        return self.loss_scale

    def plan_step(self):
        """Choose this step's train set now (PyNative).

        One read of :attr:`global_step`; returns which gradients its update reads (None: all). :meth:`host_step` of
        this step applies the same set.
        """
        if not runs_as_python():
            return None
        self._planned = self._schedule_position()
        return self._needed[self._planned]

    def plan_graph_step(self, outermost: bool):
        """Choose this step's compiled variant now (Graph mode, a step called from Python).

        One read of :attr:`global_step`, as :meth:`plan_step`. The step then compiles (once per train set, on the
        set's first step) and runs a graph made for that set: its backward pass computes only the set's weight
        gradients (none below the lowest trained layer) and its update launches only the set's optimizers, with
        nothing masked. The generic graph (:meth:`construct` selecting the set on the device) computes every
        gradient and masks the frozen groups' updates; it still runs where no host decides (dataset sink mode,
        a stage before this optimizer's in the chain (``outermost`` False: it may read every gradient),
        :attr:`graph_variants` off).

        Args:
            outermost: whether this optimizer's stage is the first of the train cell's update chain.

        Returns:
            ``(variant name part, gradients read)``: the name part keys the compiled graph (with the other stages'
            parts, the train cell's phase); the second item is :meth:`plan_step`'s (None: all). None when
            ``outermost`` is False or :meth:`uses_graph_variants` says no.
        """
        if runs_as_python() or not outermost or not self.uses_graph_variants():
            return None
        self._static_set = self._schedule_position()
        return f"freeze_set{self._static_set}", self._needed[self._static_set]

    def uses_graph_variants(self) -> bool:
        """Whether :meth:`plan_graph_step` chooses a graph per train set.

        :attr:`graph_variants` True or False decides; None (auto): when the run is known to be at least
        :data:`AUTO_VARIANTS_MIN_STEPS` optimizer steps long (:attr:`planned_steps`, which ``ms_boost.Model.train``
        sets), so that the extra compiles pay. A train cell stepped without that Model does not know its run's
        length (the schedule's ``total_steps`` is often just the default): it keeps the one masked graph.
        """
        if self.graph_variants is not None:
            return bool(self.graph_variants)
        return self.planned_steps is not None and self.planned_steps >= AUTO_VARIANTS_MIN_STEPS

    def callbacks(self) -> List[Any]:
        """:class:`~ms_boost.stages.OptimizerHooks`: a callback telling this optimizer the run's length."""
        return [_RunLength(self)]

    def callback_optimizer(self) -> OptimizerView:
        """:class:`~ms_boost.stages.OptimizerHooks`: MindSpore's callbacks see this optimizer as an ``nn.Optimizer``.

        ``SummaryCollector`` then records the learning rate (:attr:`learning_rate`) and the weights' histograms
        (:attr:`parameters`) as for the script's optimizer; the view is not part of the train network (no checkpoint
        entry, the compiled step unchanged); its class is named after the script's optimizer.
        """
        return optimizer_view(self, self.opt_class.__name__)

    def end_step(self) -> None:
        """Forget the train set :meth:`plan_step` or :meth:`plan_graph_step` chose (called after the step)."""
        self._planned = None
        self._static_set = None

    def __call__(self, *args, **kwargs):
        """Apply this step's groups: on the host in PyNative mode, from the device table in Graph mode."""
        if not runs_as_python():
            if not self.table_complete and self._static_set is None:
                raise ValueError(f"FreezeOpt: a schedule of {self.period} steps (grad_freeze.total_steps) runs only in "
                                 f"PYNATIVE_MODE; GRAPH_MODE keeps the schedule on the device and allows at most "
                                 f"{DEVICE_TABLE_MAX} steps.")
            return super().__call__(*args, **kwargs)
        return self.host_step(*args, **kwargs)

    def host_step(self, gradients):
        """One PyNative step: the schedule position is read once.

        One host round trip per step, not one per group; the trained groups are looked up on the host and only their
        optimizers are launched.

        The position comes from :attr:`global_step` (a Parameter), so a loaded checkpoint resumes exactly; when
        the train cell called :meth:`plan_step` for this step, its decision is used (no second read).
        Each inner optimizer runs as its own compiled function (:class:`_AtomStep`). Step 0 trains every
        group, so every function is compiled by the first step and no later step compiles anything. (One
        compiled function per train *set* instead compiled a new graph the first time each of the up to
        ``param_groups`` sets came up, 0.2-0.5 s each, scattered over the first hundreds of steps: that
        made O1 10-20% slower than O0 in short PyNative runs.)

        Selecting on the device instead (the groups' optimizers under tensor-conditioned ``if`` in one
        ``ms.jit`` graph, as :meth:`construct`) was measured and not kept (MindSpore 2.10, CPU): the
        optimizer step took 16 ms instead of 3 ms, and after ``load_param_into_net`` the branches kept
        writing the weights' old memory (the checkpoint-load test fails).
        """
        step = self.global_step
        index = self._planned
        if index is None:
            index = self._schedule_position()
        self._planned = None
        done = step
        for a in self.group_atoms[index]:
            done = ops.depend(done, self._run_atom_step(a, step, gradients))
        return ops.depend(done, ops.assign_add(self.global_step, ops.ones_like(step)))

    def _run_atom_step(self, a: int, step, gradients):
        """Run inner optimizer ``a``'s compiled PyNative step.

        Its first run compiles it, possibly late in training (the first step whose train group holds it): an error
        then names the train groups and the parameters it updates and the step, instead of a compiler message
        about a source line.
        """
        if a not in self._atom_step_cells:
            self._atom_step_cells[a] = _AtomStep(self, a)
        args = (step, *_take(gradients, self.atom_indices[a]))
        if a in self._atom_steps_compiled:
            return self._atom_step_cells[a](*args)
        try:
            out = self._atom_step_cells[a](*args)
        except Exception as exc:  # noqa: BLE001 - re-raised with the group named
            groups = [j for j in range(self.groups_num) if self._mask[j, a]]
            names = [self.parameters[i].name for i in self.atom_indices[a]]
            first = (str(exc).strip().splitlines() or [""])[0]
            raise RuntimeError(f"grad_freeze: compiling the update of train parameter group(s) {groups} (inner "
                               f"optimizer {a} of {self.n_atoms}: {len(names)} parameter(s), {names[:4]}) failed "
                               f"at step {int(step.asnumpy()[0])}: {type(exc).__name__}: {first}") from exc
        self._atom_steps_compiled.add(a)
        return out

    def construct(self, gradients):
        """Graph-mode step: the groups of this step selected on the device from :attr:`train_strategy`."""
        step = self.global_step
        done = step
        if self._static_set is not None:  # a host-chosen variant: exactly this set's atoms, nothing frozen to mask
            for a in self.group_atoms[self._static_set]:
                grads = self._atom_gradients(gradients, a)
                if self.momentum_fast:
                    done = ops.depend(done, self._momentum_atom(a, grads, step))
                else:
                    done = ops.depend(done, self._apply_atom(a, grads, step))
            return ops.depend(done, ops.assign_add(self.global_step, ops.ones_like(step)))
        index = self.train_strategy[step % self.period]
        if self.momentum_fast:
            row = self.train_factor[index][0]
            factors = self.unstack(row)  # one operator for every atom's scalar
            live = ()  # the momentum each ApplyMomentum gets, read live: the atom's own (factor 1) or 1.0
            for inner in self._inners:
                live = live + (inner.momentum,)
            momenta = self.unstack(self.stack(live) * row + (1.0 - row))
            for a in range(self.n_atoms):
                grads = self._atom_gradients(gradients, a)
                done = ops.depend(done, self._momentum_atom(a, grads, step, factors[a], momenta[a]))
        else:
            row = self.train_mask[index][0]
            for a in range(self.n_atoms):
                if row[a]:
                    done = ops.depend(done, self._apply_atom(a, self._atom_gradients(gradients, a), step))
        done = ops.depend(done, ops.assign_add(self.global_step, ops.ones_like(step)))
        return done

    def _atom_gradients(self, gradients, a):
        """The gradients of inner optimizer ``a``, in its parameter order (Graph mode)."""
        span = self.atom_spans[a]
        if span is None:
            return _take(gradients, self.atom_indices[a])
        return gradients[span[0]:span[1]]

    def _momentum_atom(self, a, grads, step, factor=None, momentum=None):
        """Graph mode, Momentum: inner optimizer ``a``'s step written without control flow.

        Its gradients pass through its own weight decay, gradient centralization and loss-scale division, as in
        ``nn.Momentum``; when the schedule freezes the atom (``factor`` 0.0), its ApplyMomentum runs with the
        gradient and the learning rate multiplied by zero and a momentum of one, so that ``moment = 1 * moment + 0``
        and ``weight = weight - 0 * moment`` leave both as they were. A tensor-conditioned ``if`` per atom (the general
        path) makes MindSpore 2.10 compile a sub-graph per atom and run it through its control-flow runtime: on the
        zoo's GEMM ResNet-10 (CPU) that made the step 1.3x O0's (``bench/results/o1_parts.md``). ``factor`` None: the
        atom trains at this step (a host-chosen variant, :meth:`plan_graph_step`), nothing is masked.
        """
        inner = self._inners[a]
        done = step
        if self.atom_step_read[a]:  # its own counter drives a per-group dynamic lr or a dynamic weight decay
            done = ops.assign(self.atom_steps[a], step)
            grads = ops.depend(grads, done)
        grads = inner.decay_weight(grads)
        grads = inner.gradients_centralization(grads)
        grads = inner.scale_grad(grads)
        if self.atom_own_lr[a]:
            lr = inner.get_lr()
        else:  # one learning rate for every atom: the FreezeOpt's (read once per step by the graph's CSE)
            lr = self.get_lr()
        if factor is None or self.always_trained[a]:  # trained at this step: its own momentum, nothing to mask
            momentum = inner.momentum
        else:  # factor 1.0 or 0.0; momentum: the atom's own (read live), or 1.0
            grads = inner.map_(ops.partial(_times, factor), grads)
            if inner.is_group_lr:
                lr = inner.map_(ops.partial(_times, factor), lr)
            else:
                lr = lr * factor
        if inner.is_group_lr:
            applied = inner.hyper_map_reverse(ops.partial(_apply_momentum, inner.opt, momentum), lr, grads,
                                              inner.params, inner.moments)
        else:
            applied = inner.hyper_map_reverse(ops.partial(_apply_momentum, inner.opt, momentum, lr), grads,
                                              inner.params, inner.moments)
        return ops.depend(done, applied)


class _RunLength(Callback):
    """Sets :attr:`FreezeOpt.planned_steps` when ``Model.train`` begins (the epochs it trains x an epoch's steps)."""

    def __init__(self, freeze_opt: FreezeOpt):
        super().__init__()
        self.freeze_opt = freeze_opt

    def on_train_begin(self, run_context):
        """Record the run's length."""
        args = run_context.original_args()
        # MindSpore sets epoch_num to the epochs this call trains (after initial_epoch), batch_num to sink_size when
        # one is given, but an epoch is the whole data set when it does not sink (always on CPU, where batch_num
        # still says sink_size); its callback parameters raise KeyError for a name they lack
        try:
            per_epoch = int(args.batch_num)
            if callback_mark(args, "dataset_sink_mode") is False:
                per_epoch = int(args.train_dataset.get_dataset_size())
            self.freeze_opt.planned_steps = int(args.epoch_num) * per_epoch
        except (AttributeError, KeyError, TypeError, ValueError):
            self.freeze_opt.planned_steps = None


class _AtomStep(nn.Cell):
    """One inner optimizer of a :class:`FreezeOpt` as one compiled function (``ms.jit``).

    in PyNative mode its learning-rate and step assignments and its update launch one graph, not one operation each.
    """

    def __init__(self, freeze_opt: FreezeOpt, atom: int):
        super().__init__(auto_prefix=False)
        self.opt = freeze_opt.opts[atom]
        self.atom_step = freeze_opt.atom_steps[atom]
        self.sync_lr = freeze_opt.sync_lr
        if self.sync_lr:
            self.learning_rate = freeze_opt.learning_rate
            self.atom_lr = freeze_opt.atom_lrs[atom]

    @ms.jit
    def construct(self, step, *gradients):
        done = step
        if self.sync_lr:
            done = ops.depend(done, ops.assign(self.atom_lr, self.learning_rate))
        done = ops.depend(done, ops.assign(self.atom_step, step))
        return ops.depend(done, self.opt(gradients))

"""Gradient freezing: on some steps the input-side layers are not updated.

The trainable parameters are split, in network order, into ``G = param_groups`` consecutive groups
``g_0`` (input side) ... ``g_{G-1}`` (output side). A *schedule* gives, for every step ``t``, the number
``s_t`` in ``[0, G-1]`` of leading groups that are frozen: groups ``g_0 .. g_{s_t - 1}`` keep their weights
**and** their optimizer state (momentum, Adam moments ...) untouched on that step, groups
``g_{s_t} .. g_{G-1}`` are updated as usual. ``s_t = 0`` trains everything; the output-side group always
trains. This is upstream's scheme (its "train parameter group" ``i`` is the suffix ``g_i .. g_{G-1}``).

Schedules (:func:`freeze_schedule`) are those of upstream, with these differences: the random one is
drawn from a seeded generator (upstream used the global, unseeded numpy state, so ranks and reruns
disagreed), the last step of the schedule trains every group, and bad arguments raise. As upstream,
``freeze_p`` is the share of steps on which *every* group trains (upstream calls it the freezing
probability, but both of its schedules make it the share of unfrozen steps; it is kept that way so that
configurations tuned for upstream behave the same).

:class:`FreezeOpt` is used exactly like an optimizer: ``freeze_opt(grads)`` applies this step's groups
and advances its step counter (a Parameter, so a checkpoint resumes the schedule). It keeps one inner
optimizer per set of parameters that are always trained together, so each parameter has exactly one
optimizer state, and the inner optimizers' learning rate and step follow the FreezeOpt's (a dynamic
learning rate stays in step even for groups that were frozen).

Unlike upstream, frozen layers still get their gradients computed (the train step computes all
gradients once, then this optimizer skips the frozen groups): the saving is in the update, not in
the backward pass.
"""
from __future__ import annotations

import logging
from typing import List, Optional, Sequence

import mindspore as ms
import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops
from mindspore.common import dtype as mstype
from mindspore.nn.layer.normalization import _BatchNorm

from ms_boost import comm
from ms_boost.grad_accumulation import AccumulateUpdate
from ms_boost.grad_process import OptimizerProcess, optimizer_params
from ms_boost.sections import GradFreezeConfig
from ms_boost.topology import Topology
from ms_boost.update import StageHooks, runs_as_python

logger = logging.getLogger("ms_boost")

__all__ = [
    "CONTINUOUS_STRATEGY", "INTERVAL_STRATEGY", "FreezeSchedule", "freeze_schedule", "partition_parameters",
    "FreezeOpt", "GradientFreeze", "freeze_cell", "apply_grad_freeze",
]

CONTINUOUS_STRATEGY = 0
INTERVAL_STRATEGY = 1


# --------------------------------------------------------------------------------------------------
# argument checks
# --------------------------------------------------------------------------------------------------
def _check_int(name: str, value, low: int, high: Optional[int] = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"grad_freeze: {name} must be an int, got {value!r} ({type(value).__name__}).")
    if value < low or (high is not None and value > high):
        allowed = f"{low} <= {name} <= {high}" if high is not None else f"{name} >= {low}"
        raise ValueError(f"grad_freeze: {name}={value!r} is out of range; allowed: {allowed}.")
    return int(value)


def _check_probability(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)):
        raise TypeError(f"grad_freeze: {name} must be a number in [0, 1], got {value!r} ({type(value).__name__}).")
    if not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"grad_freeze: {name}={value!r} is out of range; allowed: 0 <= {name} <= 1.")
    return float(value)


# --------------------------------------------------------------------------------------------------
# schedule
# --------------------------------------------------------------------------------------------------
#: Upper bound of ``total_steps`` (int64, as ``GradFreezeConfig``); the lazy schedule needs no memory for it.
MAX_TOTAL_STEPS = 2 ** 63 - 1
#: Entries of the schedule table FreezeOpt keeps on the device for Graph mode (4 MB of int32).
DEVICE_TABLE_MAX = 2 ** 20


class FreezeSchedule:
    r"""A freezing schedule computed lazily from its seeded description (O(groups) memory).

    ``schedule[t]`` is the number of leading groups frozen at step ``t`` (see :func:`freeze_schedule`
    for the definition); :meth:`values` gives a block of steps at once. Nothing of size ``total_steps``
    is ever built, so ``total_steps`` may be as large as int64 allows.

    How the interval schedule (``freeze_type=1``) is evaluated at any ``t`` without the steps before it:

    * step ``t >= 1`` freezes iff :math:`f_t < q t` with :math:`q = 1 - p` and :math:`f_t` the number of
      freezing steps among ``1 .. t-1``; by induction :math:`f_t = \lceil q (t-1) \rceil` (in float64, as
      the step-by-step rule computes it);
    * the ``j``-th freezing step (``j = f_t``) takes the ``j``-th draw of
      ``default_rng(seed).choice(levels, p=...)``, i.e. the ``j``-th uniform of PCG64(seed) mapped through
      the cumulative level probabilities; PCG64 jumps to draw ``j`` in O(log j) (``advance``).

    Args:
        param_groups, freeze_type, freeze_p, total_steps, seed: as :func:`freeze_schedule`.
    """

    BLOCK = 4096

    def __init__(self, param_groups: int, freeze_type: int, freeze_p: float, total_steps: int, seed: int = 0):
        self.groups = _check_int("param_groups", param_groups, 1)
        self.kind = _check_int("freeze_type", freeze_type, 0, 1)
        self.p = _check_probability("freeze_p", freeze_p)
        self.total_steps = _check_int("total_steps", total_steps, 1, MAX_TOTAL_STEPS)
        self.seed = _check_int("seed", seed, 0)
        self.trivial = self.groups == 1 or self.p == 1.0
        if not self.trivial and self.kind == CONTINUOUS_STRATEGY:
            zeros = int(round(self.p * (self.groups - 1) / (1.0 - self.p)))
            self.pattern = np.array([0] * zeros + list(range(1, self.groups)), np.int32)
        self.levels = np.arange(1, self.groups)
        weights = (self.groups - self.levels).astype(np.float64)
        cdf = (weights / weights.sum()).cumsum() if self.groups > 1 else np.ones(1)
        self.cdf = cdf / cdf[-1]
        self._block = (-1, None)

    def __len__(self) -> int:
        return self.total_steps

    def __getitem__(self, t: int) -> int:
        t = int(t)
        if not 0 <= t < self.total_steps:
            raise IndexError(f"step {t} outside the schedule of {self.total_steps} steps")
        first, block = self._block
        if block is None or not first <= t < first + self.BLOCK:
            first = t - t % self.BLOCK
            block = self.values(first, min(self.BLOCK, self.total_steps - first))
            self._block = (first, block)
        return int(block[t - first])

    def values(self, start: int, count: int) -> np.ndarray:
        """``int32`` entries ``start .. start + count - 1`` (within ``[0, total_steps)``)."""
        if count < 0 or start < 0 or start + count > self.total_steps:
            raise IndexError(f"steps [{start}, {start + count}) outside the schedule of {self.total_steps} steps")
        t = np.arange(start, start + count, dtype=np.int64)
        out = np.zeros(count, np.int32)
        if self.trivial or count == 0:
            return out
        if self.kind == CONTINUOUS_STRATEGY:
            out[:] = self.pattern[t % len(self.pattern)]
        else:
            q = 1.0 - self.p
            before = np.ceil(q * (t - 1).astype(np.float64))  # freezing steps among 1 .. t-1
            freezing = (t >= 1) & (before < q * t.astype(np.float64))
            if freezing.any():
                draws = before[freezing].astype(np.int64)
                first = int(draws[0])
                generator = np.random.PCG64(self.seed)
                generator.advance(first)
                uniform = np.random.Generator(generator).random(int(draws[-1]) - first + 1)
                out[freezing] = self.levels[self.cdf.searchsorted(uniform[draws - first], side="right")]
        if start + count == self.total_steps:
            out[-1] = 0
        return out


def freeze_schedule(param_groups: int, freeze_type: int, freeze_p: float, total_steps: int,
                    seed: int = 0) -> np.ndarray:
    r"""Number of leading parameter groups frozen at each step, as an array (see :class:`FreezeSchedule`
    for the lazy form that training uses).

    With ``G = param_groups`` and ``p = freeze_p``, entry ``t`` is ``s_t`` in ``[0, G-1]``:

    * ``G = 1``: ``s_t = 0`` for all ``t``.
    * ``freeze_type=0`` (continuous, upstream's ``'00001234'``): the period
      ``[0]*z + [1, 2, ..., G-1]`` repeated, with :math:`z = \operatorname{round}(p (G-1) / (1-p))`
      (``p = 1``: no freezing), so about a share ``p`` of the steps train every group.
    * ``freeze_type=1`` (interval, upstream's ``'01020304'``): ``s_0 = 0``; step ``t`` freezes iff the share
      of freezing steps so far is below ``1 - p``, and then draws ``s_t`` from ``{1, ..., G-1}`` with
      :math:`P(s) \propto G - s` (freezing few groups is likelier) from ``numpy.random.default_rng(seed)``.

    In both, the last entry is 0: every group trains again before the schedule ends.

    Args:
        param_groups: ``G >= 1``.
        freeze_type: 0 or 1.
        freeze_p: share of steps training every group, in ``[0, 1]``.
        total_steps: length of the schedule, ``1 <= total_steps <= 2**63 - 1``.
        seed: seed of the random schedule (``freeze_type=1``).

    Returns:
        int32 array of shape ``(total_steps,)``.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: an argument out of range.
    """
    schedule = FreezeSchedule(param_groups, freeze_type, freeze_p, total_steps, seed)
    return schedule.values(0, schedule.total_steps)


class _ArraySchedule:
    """An explicit schedule (FreezeOpt's ``train_strategy`` list), with :class:`FreezeSchedule`'s interface."""

    def __init__(self, values: np.ndarray):
        self.array = values
        self.total_steps = len(values)

    def __len__(self) -> int:
        return self.total_steps

    def __getitem__(self, t: int) -> int:
        return int(self.array[t])

    def values(self, start: int, count: int) -> np.ndarray:
        return self.array[start:start + count]


# --------------------------------------------------------------------------------------------------
# parameter groups
# --------------------------------------------------------------------------------------------------
def _layer_units(params: Sequence[Parameter], owners: dict) -> List[List[Parameter]]:
    """Consecutive parameters of one layer form a unit; a BatchNorm joins the layer before it."""
    units: List[List[Parameter]] = []
    last_owner = None
    for param in params:
        owner = owners.get(id(param))
        joins = units and (owner is last_owner and owner is not None or isinstance(owner, _BatchNorm))
        if joins:
            units[-1].append(param)
        else:
            units.append([param])
        last_owner = owner
    return units


def _chunks(items: list, count: int) -> List[list]:
    """``items`` cut into ``count`` consecutive non-empty chunks of near-equal length."""
    bounds = [round(j * len(items) / count) for j in range(count + 1)]
    return [items[bounds[j]:bounds[j + 1]] for j in range(count)]


def partition_parameters(params: Sequence[Parameter], param_groups: int,
                         owners: Optional[dict] = None) -> List[List[Parameter]]:
    """Split ``params`` (network order) into ``param_groups`` consecutive, disjoint, non-empty groups.

    Groups are cut between layers (a layer's weight, bias and following BatchNorm stay together) when
    there are at least ``param_groups`` layers, else between parameters.

    Args:
        params: the parameters, input side first.
        param_groups: number of groups, ``1 <= param_groups <= len(params)``.
        owners: ``id(parameter) -> owning cell`` (see ``OptimizerProcess.build_params_dict``); without it
            every parameter is its own layer.

    Raises:
        ValueError: ``param_groups`` < 1 or more than the number of parameters.
    """
    params = list(params)
    if not params:
        raise ValueError("grad_freeze: the network has no trainable parameter to group.")
    count = _check_int("param_groups", param_groups, 1)
    if count > len(params):
        raise ValueError(f"grad_freeze: param_groups={count} is more than the {len(params)} trainable parameters "
                         f"of the network; allowed: 1 <= param_groups <= {len(params)}.")
    units = _layer_units(params, owners or {})
    if count <= len(units):
        return [[p for unit in chunk for p in unit] for chunk in _chunks(units, count)]
    return _chunks(params, count)


# --------------------------------------------------------------------------------------------------
# FreezeOpt
# --------------------------------------------------------------------------------------------------
def _take(values, indices):
    """``tuple(values[i] for i in indices)``, written so that Graph mode unrolls it."""
    out = ()
    for i in indices:
        out = out + (values[i],)
    return out


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


class FreezeOpt(nn.Cell, StageHooks):
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
    below the lowest trained layer, are never computed (as upstream's per-group train cells do).

    Attributes:
        parameters: every parameter of ``opt``, in ``opt``'s order (the gradients' order).
        learning_rate: the learning rate Parameter (fixed learning rate; assigning it changes every inner
            optimizer's rate), or the first inner optimizer's learning rate (dynamic or per-group rates).
        global_step: the step counter (int32 Parameter of shape (1,)), also the position in the schedule.
        schedule: the schedule (``schedule[t]``, ``len(schedule)``), lazy when a :class:`FreezeSchedule`.
        train_strategy: int32 Tensor, the schedule's first ``min(len(schedule), DEVICE_TABLE_MAX)`` entries.
        loss_scale: ``opt``'s static ``loss_scale`` (every inner optimizer divides the gradients by it).
        opts: the inner optimizers, one per set of parameters always trained together.

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
        self.opts = nn.CellList(opts, auto_prefix=False)
        inners = [o.opt if isinstance(o, nn.LARS) else o for o in opts]

        self.parameters = ParameterTuple(all_params)
        self.opt_class = process.opt_class
        self.is_group = inner.is_group
        self.is_group_lr = inner.is_group_lr
        self.dynamic_lr = inner.dynamic_lr
        self.loss_scale = float(inner.loss_scale)  # the inner optimizers divide the gradients by it, as opt did
        self.sync_lr = not (inner.is_group_lr or inner.dynamic_lr)
        self.global_step = Parameter(Tensor([0], mstype.int32), name="global_step")
        self.atom_steps = ParameterTuple([o.global_step for o in inners])
        if self.sync_lr:
            self.learning_rate = Parameter(Tensor(inner.learning_rate.asnumpy(), mstype.float32), name="learning_rate")
            self.atom_lrs = ParameterTuple([o.learning_rate for o in inners])
        else:
            self.learning_rate = inners[0].learning_rate
            self.atom_lrs = ()
        self._inners = tuple(inners)
        self._atom_step_cells = {}  # inner optimizer -> its compiled PyNative step (_AtomStep), built on first use

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
        groups = {}
        for param in params:
            index, values = settings.get(id(param), (-1, {}))
            groups.setdefault(index, (values, []))[1].append(param)
        return [{**values, "params": members} for values, members in groups.values()]

    # -- public helpers ----------------------------------------------------------------------------
    def get_lr(self):
        """The learning rate of the current step (the first inner optimizer's, at this step)."""
        if self.sync_lr:
            return self.learning_rate
        inner = self._inners[0]
        if self.is_group_lr:
            if self.dynamic_lr:
                return tuple(lr(self.global_step).reshape(()) for lr in inner.learning_rate)
            return inner.learning_rate
        return inner.learning_rate(self.global_step).reshape(())

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
        """Update train group ``group`` (a Python int) with ``gradients`` of :meth:`group_parameters`, then
        advance the step counter. Used by the per-group train cells of :func:`freeze_cell`."""
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

    def plan_step(self):
        """PyNative: choose this step's train set now (one read of :attr:`global_step`) and return which
        gradients its update reads (None: all). :meth:`host_step` of this step applies the same set."""
        if not runs_as_python():
            return None
        self._planned = self._schedule_position()
        return self._needed[self._planned]

    def end_step(self) -> None:
        self._planned = None

    def __call__(self, *args, **kwargs):
        if not runs_as_python():
            if not self.table_complete:
                raise ValueError(f"FreezeOpt: a schedule of {self.period} steps (grad_freeze.total_steps) runs only in "
                                 f"PYNATIVE_MODE; GRAPH_MODE keeps the schedule on the device and allows at most "
                                 f"{DEVICE_TABLE_MAX} steps.")
            return super().__call__(*args, **kwargs)
        return self.host_step(*args, **kwargs)

    def host_step(self, gradients):
        """PyNative step: the schedule position is read once (one host round trip per step, not one per
        group), the trained groups are looked up on the host and only their optimizers are launched.

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
            if a not in self._atom_step_cells:
                self._atom_step_cells[a] = _AtomStep(self, a)
            done = ops.depend(done, self._atom_step_cells[a](step, *_take(gradients, self.atom_indices[a])))
        return ops.depend(done, ops.assign_add(self.global_step, ops.ones_like(step)))

    def construct(self, gradients):
        """Graph-mode step: the groups of this step selected on the device from :attr:`train_strategy`."""
        step = self.global_step
        row = self.train_mask[self.train_strategy[step % self.period]][0]
        done = step
        for a in range(self.n_atoms):
            if row[a]:
                done = ops.depend(done, self._apply_atom(a, _take(gradients, self.atom_indices[a]), step))
        done = ops.depend(done, ops.assign_add(self.global_step, ops.ones_like(step)))
        return done


class _AtomStep(nn.Cell):
    """One inner optimizer of a :class:`FreezeOpt` as one compiled function (``ms.jit``): in PyNative mode
    its learning-rate and step assignments and its update launch one graph, not one operation each."""

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


class _GroupUpdate(nn.Cell):
    """Update stage applying one train group of a :class:`FreezeOpt`."""

    def __init__(self, freeze_opt: FreezeOpt, group: int):
        super().__init__(auto_prefix=False)
        self.freeze_opt = freeze_opt
        self.group = group

    def construct(self, loss, grads, *inputs):
        return self.freeze_opt.apply_group(self.group, grads)


class _TrainFreezeCell(nn.Cell):
    """Train step of one train group: gradients of that group only (the frozen layers' weight gradients
    are not computed), reduced, then applied (through gradient accumulation when asked)."""

    def __init__(self, network, sens, grad, grad_reducer, freeze_opt, group, accumulation_step=1):
        super().__init__(auto_prefix=False)
        self.network = network
        self.weights = freeze_opt.group_parameters(group)
        self.grad = grad
        self.grad_reducer = grad_reducer
        self.sens = float(sens)
        stage = _GroupUpdate(freeze_opt, group)
        if accumulation_step > 1:
            stage = AccumulateUpdate(stage, self.weights, accumulation_step)
        self.update = stage

    def construct(self, *inputs):
        loss = self.network(*inputs)
        sens = ops.ones_like(loss) * self.sens
        grads = self.grad(self.network, self.weights)(*inputs, sens)
        grads = self.grad_reducer(grads)
        return ops.depend(loss, self.update(loss, grads, *inputs))


def freeze_cell(reducer_flag, network, optimizer, sens, grad, use_grad_accumulation, mean=None, degree=None,
                max_accumulation_step=1) -> tuple:
    """Upstream API: one train cell per train parameter group of a :class:`FreezeOpt`.

    Cell ``j`` computes the loss, the gradients of group ``j``'s parameters only, reduces them across
    ranks when ``reducer_flag``, and updates group ``j``. Running cell ``train_strategy[t]`` at step ``t``
    is the freezing schedule with the frozen layers' weight gradients never computed.

    Args:
        reducer_flag: reduce the gradients across ranks (data parallel).
        network: the loss network.
        optimizer: a :class:`FreezeOpt`.
        sens: sensitivity (constant scale of the loss).
        grad: ``ops.GradOperation(get_by_list=True, sens_param=True)``.
        use_grad_accumulation: accumulate ``max_accumulation_step`` gradients per update.
        mean: divide the reduced gradients by ``degree`` (default: MindSpore's ``gradients_mean``).
        degree: number of ranks averaged (default: the world size).
        max_accumulation_step: micro-steps per update.

    Returns:
        tuple of cells, one per train parameter group.
    """
    if not isinstance(optimizer, FreezeOpt):
        raise TypeError(f"freeze_cell: optimizer must be a FreezeOpt, got {type(optimizer).__name__}.")
    steps = int(max_accumulation_step) if use_grad_accumulation else 1
    cells = []
    for group in range(optimizer.groups_num):
        weights = optimizer.group_parameters(group)
        if reducer_flag:
            topology = Topology.current()
            default_mean, default_degree = topology.mean, topology.degree
            reducer = comm.GradReducer(weights, default_mean if mean is None else mean, degree or default_degree)
        else:
            reducer = nn.Identity()
        cells.append(_TrainFreezeCell(network, sens, grad, reducer, optimizer, group, steps))
    return tuple(cells)


# --------------------------------------------------------------------------------------------------
# GradientFreeze (upstream API)
# --------------------------------------------------------------------------------------------------
class GradientFreeze:
    """Build a gradient-freezing optimizer for a network.

    Args:
        param_groups: number of parameter groups ``G`` (1 <= G <= number of trainable parameters).
        freeze_type: 0 (continuous) or 1 (interval) schedule, see :func:`freeze_schedule`.
        freeze_p: share of steps training every group, in [0, 1].
        total_steps: schedule length (optimizer steps); the schedule repeats after it.
        seed: seed of the interval schedule (ms_boost addition; same seed, same schedule on every rank).

    Raises:
        TypeError, ValueError: an argument of the wrong type or out of range.

    Example:
        >>> network, optimizer = GradientFreeze(10, 1, 0.7, 2000).freeze_generate(loss_net, optimizer)
    """

    def __init__(self, param_groups: int, freeze_type: int, freeze_p: float, total_steps: int, seed: int = 0):
        cfg = GradFreezeConfig(param_groups=param_groups, freeze_type=freeze_type, freeze_p=freeze_p,
                               total_steps=total_steps, seed=seed)  # the one rule for each value
        self._param_groups, self._freeze_type, self._freeze_p = cfg.param_groups, cfg.freeze_type, cfg.freeze_p
        self._total_steps, self._seed = cfg.total_steps, cfg.seed

    def split_parameters_groups(self, net: nn.Cell, freeze_para_groups_number: int) -> List[List[Parameter]]:
        """The train parameter groups of ``net``: group ``i`` holds ``g_i .. g_{G-1}`` (see the module doc).

        Args:
            net: the network.
            freeze_para_groups_number: ``G``.
        """
        chunks = partition_parameters(net.trainable_params(), freeze_para_groups_number,
                                      OptimizerProcess.build_params_dict(net))
        return [[p for chunk in chunks[i:] for p in chunk] for i in range(len(chunks))]

    def generate_freeze_index_sequence(self, parameter_groups_number: int, freeze_strategy: int, freeze_p: float,
                                       total_steps: int) -> List[int]:
        """The schedule as a list (see :func:`freeze_schedule`), seeded with this object's seed."""
        return freeze_schedule(parameter_groups_number, freeze_strategy, freeze_p, total_steps,
                               self._seed).tolist()

    def freeze_generate(self, network: nn.Cell, optimizer: nn.Optimizer) -> tuple:
        """``(network, FreezeOpt)``: the network unchanged and the freezing optimizer.

        The groups are cut over the network's trainable parameters that ``optimizer`` updates (network
        order); parameters the optimizer holds outside the network join the output-side group.

        More groups than trainable parameters are clamped to one group per parameter (logged, as upstream
        runs ``GradientFreeze(10, ...)`` on any network).
        """
        if not isinstance(optimizer, nn.Optimizer):
            raise TypeError(f"grad_freeze: optimizer must be a mindspore.nn.Optimizer, got "
                            f"{type(optimizer).__name__}.")
        opt_ids = {id(p) for p in optimizer.parameters}
        ordered = [p for p in network.trainable_params() if id(p) in opt_ids]
        seen = {id(p) for p in ordered}
        extra = [p for p in optimizer.parameters if id(p) not in seen]
        groups = min(self._param_groups, max(len(ordered), 1))
        if groups < self._param_groups:
            logger.info("grad_freeze: param_groups=%d clamped to %d, the number of trainable parameters",
                        self._param_groups, groups)
        chunks = partition_parameters(ordered, groups, OptimizerProcess.build_params_dict(network))
        chunks[-1] = chunks[-1] + extra
        train_groups = [[p for chunk in chunks[i:] for p in chunk] for i in range(len(chunks))]
        schedule = FreezeSchedule(groups, self._freeze_type, self._freeze_p, self._total_steps, self._seed)
        head = schedule.values(0, min(len(schedule), 65536))
        logger.info("grad_freeze: %d groups of %s parameters; %.1f%% of the first %d of %d steps freeze some group",
                    len(chunks), [len(c) for c in chunks], 100.0 * float(np.mean(head > 0)), len(head),
                    len(schedule))
        return network, FreezeOpt(optimizer, train_groups, schedule)


def apply_grad_freeze(network: nn.Cell, optimizer: nn.Optimizer, grad_freeze_cfg) -> tuple:
    """The gradient-freezing step of ``AutoBoost.network_auto_process_train``.

    Args:
        network: the (loss) network.
        optimizer: the optimizer (after LessBN's rebuild when that runs first).
        grad_freeze_cfg: object with ``param_groups``, ``freeze_type``, ``freeze_p``, ``total_steps``, ``seed``.

    Returns:
        ``(network, FreezeOpt)``.
    """
    freezer = GradientFreeze(grad_freeze_cfg.param_groups, grad_freeze_cfg.freeze_type, grad_freeze_cfg.freeze_p,
                             grad_freeze_cfg.total_steps, seed=grad_freeze_cfg.seed)
    return freezer.freeze_generate(network, optimizer)

"""The freezing plan: parameter groups in network order, and the schedule of how many are frozen each step.

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

The values of a schedule have one rule each (:data:`SCHEDULE_RULES`), shared by the ``grad_freeze`` section,
:class:`FreezeSchedule` and upstream's ``GradientFreeze(...)``: one rule, one message.
"""
from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ms_boost.spec import Rule, check_fields, int_rule
from ms_boost.validation import INT64_MAX, check_float, check_int

if TYPE_CHECKING:  # MindSpore is imported where parameters are partitioned: the rules load without it
    from mindspore import Parameter

__all__ = [
    "FreezeStrategy", "CONTINUOUS_STRATEGY", "INTERVAL_STRATEGY", "MAX_TOTAL_STEPS", "SCHEDULE_RULES",
    "check_schedule", "FreezeSchedule", "freeze_schedule", "partition_parameters",
]


class FreezeStrategy(enum.IntEnum):
    """How the schedule freezes (``grad_freeze.freeze_type``; the ints 0 and 1 are accepted where users pass them).

    Attributes:
        CONTINUOUS: upstream's continuous schedule (``'00001234'``): a period of unfrozen steps, then 1, 2, ...
            frozen groups.
        INTERVAL: upstream's interval schedule (``'01020304'``): freezing steps spread evenly, each freezing a
            seeded random number of groups.
    """

    CONTINUOUS = 0
    INTERVAL = 1


#: Upstream's names of the two strategies.
CONTINUOUS_STRATEGY = FreezeStrategy.CONTINUOUS
INTERVAL_STRATEGY = FreezeStrategy.INTERVAL
#: Upper bound of ``total_steps`` (int64); the lazy schedule needs no memory for it.
MAX_TOTAL_STEPS = INT64_MAX


def _check_freeze_type(path: str, value: Any) -> int:
    """A :class:`FreezeStrategy` or its int; stored as the plain int (plans and summaries show 0 or 1)."""
    return int(check_int(path, value, low=min(FreezeStrategy), high=max(FreezeStrategy)))


#: The one rule of each schedule value (the ``grad_freeze`` section's rules).
SCHEDULE_RULES: Dict[str, Rule] = {
    "param_groups": int_rule(low=1),
    "freeze_type": _check_freeze_type,
    "freeze_p": lambda p, v: check_float(p, v, low=0.0, high=1.0),
    "total_steps": lambda p, v: check_int(p, v, low=1, high=MAX_TOTAL_STEPS,
                                          holder="the schedule position is an int64"),
    "seed": lambda p, v: check_int(p, v, low=0),
}


def check_schedule(**values: Any) -> Dict[str, Any]:
    """``values`` checked by :data:`SCHEDULE_RULES`.

    The values are ``param_groups``, ``freeze_type``, ``freeze_p``, ``total_steps`` and ``seed``; messages name
    the section's paths (``grad_freeze.freeze_p``).
    """
    return check_fields("grad_freeze", SCHEDULE_RULES, **values)




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

    def __init__(self, param_groups: int, freeze_type: FreezeStrategy | int, freeze_p: float, total_steps: int,
                 seed: int = 0):
        values = check_schedule(param_groups=param_groups, freeze_type=freeze_type, freeze_p=freeze_p,
                                total_steps=total_steps, seed=seed)
        self.groups = values["param_groups"]
        self.kind = FreezeStrategy(values["freeze_type"])
        self.p = values["freeze_p"]
        self.total_steps = values["total_steps"]
        self.seed = values["seed"]
        self.trivial = self.groups == 1 or self.p == 1.0
        if not self.trivial and self.kind == CONTINUOUS_STRATEGY:
            zeros = int(round(self.p * (self.groups - 1) / (1.0 - self.p)))
            self.pattern = np.array([0] * zeros + list(range(1, self.groups)), np.int32)
        self.levels = np.arange(1, self.groups)
        weights = (self.groups - self.levels).astype(np.float64)
        cdf = (weights / weights.sum()).cumsum() if self.groups > 1 else np.ones(1)
        self.cdf = cdf / cdf[-1]
        self._block: Tuple[int, Optional[np.ndarray]] = (-1, None)

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


def freeze_schedule(param_groups: int, freeze_type: FreezeStrategy | int, freeze_p: float, total_steps: int,
                    seed: int = 0) -> np.ndarray:
    r"""Number of leading parameter groups frozen at each step, as an array.

    :class:`FreezeSchedule` is the lazy form that training uses.

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
        freeze_type: a :class:`FreezeStrategy` (or its int, 0 or 1).
        freeze_p: share of steps training every group, in ``[0, 1]``.
        total_steps: length of the schedule, ``1 <= total_steps <= 2**63 - 1``.
        seed: seed of the random schedule (``freeze_type=1``).

    Returns:
        int32 array of shape ``(total_steps,)``.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: an argument out of range (the rules and messages of the ``grad_freeze`` section).
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


def _layer_units(params: Sequence[Parameter], owners: dict) -> List[List[Parameter]]:
    """Consecutive parameters of one layer form a unit; a BatchNorm joins the layer before it."""
    from mindspore.nn.layer.normalization import _BatchNorm

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
    count = SCHEDULE_RULES["param_groups"]("grad_freeze.param_groups", param_groups)
    if count > len(params):
        raise ValueError(f"grad_freeze: param_groups={count} is more than the {len(params)} trainable parameters "
                         f"of the network; allowed: 1 <= param_groups <= {len(params)}.")
    units = _layer_units(params, owners or {})
    if count <= len(units):
        return [[p for unit in chunk for p in unit] for chunk in _chunks(units, count)]
    return _chunks(params, count)

"""A run that heals itself: detect divergence after a step and roll back to the last good state.

:class:`DivergenceRollback` is a ``mindspore.train.Callback`` for :class:`ms_boost.Model` (or MindSpore's own
``Model``). After every training step it judges the step:

* **non-finite**: the step's loss holds NaN/Inf, or (at snapshot steps, where the Parameters are copied
  anyway) a Parameter of the train network does;
* **spike**: the loss is above ``spike_factor`` x the median of the last ``window`` accepted losses
  (:class:`LossSpikeDetector`; judged once ``window`` losses are recorded).

Every rank judges its own step and one collective (a max over the ranks' verdict codes, through
:mod:`ms_boost.comm`) decides for all, so the ranks always roll back together and stay in step. On a bad step
with ``action="rollback"`` the callback

1. restores every Parameter of the train network (weights, BatchNorm statistics, optimizer moments, boost and
   THOR state) from the last *confirmed* in-memory snapshot, taken every ``snapshot_steps`` steps; a
   snapshot of step ``s`` is confirmed by the next step's loss, which is computed from its weights, so the
   state restored is never the one that produced the bad loss. The step counters (``global_step``) and the
   schedules are not restored: training goes on at the data position where it stopped, so the batches of
   the offending window (after the snapshot, up to the bad step) are skipped, not replayed;
2. multiplies every optimizer's learning-rate Parameter(s) by ``lr_factor`` and THOR's damping values by
   ``damping_factor`` (they stay lowered/raised for the rest of the run; repeated rollbacks compound);
3. writes one log line and calls ``on_rollback(record)`` with a JSON-able record (the model zoo appends it
   to the run's metrics file).

After ``max_rollbacks`` rollbacks (or at once with ``action="stop"``) it gives up: it sets
:attr:`DivergenceRollback.failure`, marks the step (``cb_params.divergence_failure``) and requests the end of
training, so the caller raises its usual divergence error. A step that was rolled back is marked
``cb_params.divergence_rolled_back = True`` for the callbacks after this one (a checkpoint callback must not
save, or check, the abandoned state of that step; read the marks with :func:`callback_mark`).

The math (median, verdicts) is plain numpy in :class:`LossSpikeDetector` and :func:`first_non_finite`; the
callback holds the plumbing.
"""
from __future__ import annotations

import math
import numbers
from collections import deque
from dataclasses import dataclass, fields
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Set, Tuple, Union, cast

import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.train import Callback

from ms_boost import comm
from ms_boost.stages import learning_rate_parameters as optimizer_learning_rates
from ms_boost.stages import optimizer_hooks, optimizers_in

__all__ = ["DIVERGENCE_ACTIONS", "DivergencePolicy", "LossSpikeDetector", "DivergenceRollback", "first_non_finite",
           "learning_rates_of", "dampings_of", "fixed_dampings", "callback_mark"]

DIVERGENCE_ACTIONS = ("stop", "rollback")

#: verdict codes, ordered by severity (the collective takes the max over the ranks)
_FINE, _SPIKE, _NONFINITE_LOSS, _NONFINITE_STATE = 0, 1, 2, 3


def first_non_finite(arrays: Iterable[Tuple[str, np.ndarray]]) -> Optional[str]:
    """``"<name> (<k> of <n> values non-finite, e.g. nan)"`` for the first array holding NaN/Inf, else ``None``.

    Integer and boolean arrays are always finite.
    """
    for name, value in arrays:
        value = np.asarray(value)
        if value.dtype.kind not in "fc":
            continue
        bad = ~np.isfinite(value)
        if bad.any():
            example = value[bad].flat[0]
            return f"{name} ({int(bad.sum())} of {value.size} values non-finite, e.g. {example})"
    return None


def _number(key: str, value: Any, allowed: str, ok: Callable[[float], bool],
            integer: bool = False) -> Union[int, float]:
    """``value`` as an int (``integer``) or a float, or a ``ValueError`` naming ``key`` and what is ``allowed``."""
    kind = numbers.Integral if integer else numbers.Real
    if isinstance(value, bool) or not isinstance(value, kind) or not math.isfinite(float(value)) \
            or not ok(float(value)):
        raise ValueError(f"{key}={value!r} is not allowed; allowed: {allowed}.")
    return int(cast(numbers.Integral, value)) if integer else float(value)


@dataclass(frozen=True)
class DivergencePolicy:
    """What a diverging step triggers, validated on construction.

    Args:
        action: ``"stop"`` (end training at the first bad step) or ``"rollback"`` (heal and continue).
        spike_factor: a loss above ``spike_factor`` x the running median is a spike (> 1; 0 turns spike
            detection off, leaving only non-finite values).
        window: number of accepted losses the running median is taken over (>= 1).
        max_rollbacks: rollbacks allowed in one run; the next bad step stops training (>= 0).
        lr_factor: every rollback multiplies the learning rates by this (0 < f <= 1).
        damping_factor: every rollback multiplies THOR's damping by this (>= 1; ignored without THOR).
        snapshot_steps: steps between in-memory snapshots of the train network (>= 1).
        names: the key names used in error messages (a caller's config spells them its own way).
    """

    action: str = "rollback"
    spike_factor: float = 10.0
    window: int = 20
    max_rollbacks: int = 3
    lr_factor: float = 0.5
    damping_factor: float = 2.0
    snapshot_steps: int = 10
    names: Optional[Mapping[str, str]] = None

    def __post_init__(self):
        key = (self.names or {}).get
        if self.action not in DIVERGENCE_ACTIONS:
            raise ValueError(f"{key('action', 'action')}={self.action!r} is not allowed; allowed: "
                             f"{', '.join(DIVERGENCE_ACTIONS)}.")
        checks = {
            "spike_factor": ("a float > 1, or 0 to turn spike detection off", lambda v: v == 0 or v > 1, False),
            "window": ("an int >= 1", lambda v: v >= 1, True),
            "max_rollbacks": ("an int >= 0", lambda v: v >= 0, True),
            "lr_factor": ("a float in (0, 1]", lambda v: 0 < v <= 1, False),
            "damping_factor": ("a float >= 1", lambda v: v >= 1, False),
            "snapshot_steps": ("an int >= 1", lambda v: v >= 1, True),
        }
        for name, (allowed, ok, integer) in checks.items():
            object.__setattr__(self, name, _number(key(name, name), getattr(self, name), allowed, ok, integer))

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], names: Optional[Mapping[str, str]] = None) -> DivergencePolicy:
        """Build from a mapping of this class's field names (an unknown key is refused, naming it)."""
        known = {f.name for f in fields(cls)} - {"names"}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"divergence policy: unknown key(s) {unknown}; known: {sorted(known)}.")
        return cls(**dict(values), names=names)


class LossSpikeDetector:
    """Running median of the last ``window`` accepted losses and the spike rule.

    A loss ``l`` is a spike when ``window`` losses are recorded and ``l > factor * median(recorded)``; a
    non-finite loss is always bad. Only losses judged fine are recorded (:meth:`accept`).

    Args:
        factor: spike factor (> 1; 0 turns spikes off).
        window: number of recent accepted losses kept.
    """

    def __init__(self, factor: float, window: int):
        self.factor = float(factor)
        self.history: deque = deque(maxlen=int(window))

    @property
    def median(self) -> Optional[float]:
        """Median of the recorded losses (``None`` before any)."""
        return float(np.median(np.asarray(self.history, np.float64))) if self.history else None

    def verdict(self, loss: float) -> Optional[str]:
        """Why ``loss`` is bad, or ``None`` when it is fine.

        E.g. ``"loss is nan"``, ``"loss 52.1 is above 10 x its running median 2.3"``.
        """
        if not math.isfinite(loss):
            return f"loss is {loss}"
        if self.factor and len(self.history) == self.history.maxlen:
            median = self.median
            if median is not None and loss > self.factor * median:
                return f"loss {loss:.6g} is above {self.factor:g} x its running median {median:.6g}"
        return None

    def accept(self, loss: float) -> None:
        """Record a loss judged fine."""
        self.history.append(float(loss))


def learning_rates_of(network: nn.Cell) -> List[Parameter]:
    """The learning-rate Parameters of every optimizer in ``network``.

    A float or per-step array learning rate is one Parameter; group learning rates are several. A
    ``LearningRateSchedule`` holds none.
    """
    found: Dict[str, Parameter] = {}
    for optimizer in optimizers_in(network):
        found.update((p.name, p) for p in optimizer_learning_rates(optimizer))
    return list(found.values())


def dampings_of(network: nn.Cell) -> List[Parameter]:
    """The Parameters holding the optimizers' dampings (THOR's, given as a float or a per-step array).

    Asked through :meth:`ms_boost.stages.OptimizerHooks.damping_parameters`; none for other optimizers or a
    ``LearningRateSchedule`` damping (see :func:`fixed_dampings`).
    """
    found: Dict[str, Parameter] = {}
    for optimizer in optimizers_in(network):
        found.update((p.name, p) for p in optimizer_hooks(optimizer).damping_parameters() or ())
    return list(found.values())


def fixed_dampings(network: nn.Cell) -> bool:
    """Whether an optimizer of ``network`` has a damping no Parameter holds (a ``LearningRateSchedule``)."""
    return any(optimizer_hooks(optimizer).damping_parameters() is None for optimizer in optimizers_in(network))


def callback_mark(params, key: str) -> Any:
    """``params.<key>`` of MindSpore's callback parameters, ``None`` when unset.

    Their attribute lookup raises ``KeyError``, so ``getattr`` with a default does not work; this is how later
    callbacks read this one's marks.
    """
    try:
        return getattr(params, key)
    except (AttributeError, KeyError):
        return None


def _loss_of(outputs) -> float:
    while isinstance(outputs, (tuple, list)) and outputs:
        outputs = outputs[0]
    if outputs is None:
        return 0.0
    return float(np.mean(outputs.asnumpy() if hasattr(outputs, "asnumpy") else outputs))


def _write(param: Parameter, value: np.ndarray) -> None:
    """Write ``value`` into ``param``'s own memory.

    A compiled train step keeps updating the memory it was compiled with, which ``set_data`` would replace (the
    step would then update a copy nobody reads).
    """
    ops.assign(param, Tensor(value))


def _scale(params: Iterable[Parameter], factor: float) -> None:
    for param in params:
        value = param.asnumpy()
        _write(param, (value * factor).astype(value.dtype))


class DivergenceRollback(Callback):
    """Roll a diverging run back to its last good state and continue (see the module docstring).

    Args:
        policy: what to detect and do (:class:`DivergencePolicy`).
        network: the cell whose Parameters are snapshotted and restored (``None``: the train network of the
            run, ``cb_params.train_network``).
        step_offset: global step the run starts from (a resumed run's), for log lines and records.
        log: where the one line per rollback goes (``print`` by default; ``None``: nowhere).
        on_rollback: called with each rollback's record (``kind``, ``step``, ``restored_step``, ``reason``,
            ``rollback``, ``lr_factor``, ``damping_factor``, ``skipped_steps``).
        snapshot_at: extra global steps to snapshot at (and so to check every Parameter for NaN/Inf), e.g. a
            checkpoint callback's save steps, so a non-finite state is caught here before it is saved.

    Attributes:
        rollbacks: the records of this run's rollbacks.
        failure: why training stopped (``None`` while it goes on).

    Raises:
        ValueError: (at the start of training) ``lr_factor`` < 1 but the optimizer's learning rate is a
            ``LearningRateSchedule`` (no Parameter to lower), or ``damping_factor`` > 1 with a THOR damping
            given as a schedule.
    """

    def __init__(self, policy: Optional[DivergencePolicy] = None, network: Optional[nn.Cell] = None,
                 step_offset: int = 0, log: Optional[Callable[[str], None]] = print,
                 on_rollback: Optional[Callable[[Dict[str, Any]], None]] = None,
                 snapshot_at: Optional[Callable[[int], bool]] = None):
        super().__init__()
        self.policy = policy if policy is not None else DivergencePolicy()
        self.network = network
        self.step_offset = int(step_offset)
        self.log = log
        self.on_rollback = on_rollback
        self.snapshot_at = snapshot_at
        self.detector = LossSpikeDetector(self.policy.spike_factor, self.policy.window)
        self.rollbacks: List[Dict[str, Any]] = []
        self.failure: Optional[str] = None
        self._confirmed: Optional[Tuple[int, Dict[str, np.ndarray]]] = None
        self._pending: Optional[Tuple[int, Dict[str, np.ndarray]]] = None
        self._kept: Set[str] = set()
        self._decide: Optional[nn.Cell] = None

    # -- hooks ---------------------------------------------------------------------------------------------
    def on_train_begin(self, run_context) -> None:
        """Find the train network, its learning rates and dampings; check the policy fits them; first snapshot.

        Raises:
            ValueError: a factor that cannot be applied (see the class docstring).
        """
        params = run_context.original_args()
        if self.network is None:
            self.network = params.train_network
        lrs, dampings = learning_rates_of(self.network), dampings_of(self.network)
        names = self.policy.names or {}
        if self.policy.action == "rollback" and self.policy.lr_factor < 1 and not lrs:
            raise ValueError(f"{names.get('lr_factor', 'lr_factor')}={self.policy.lr_factor} cannot be applied: the "
                             f"optimizer's learning rate is a LearningRateSchedule (no Parameter to lower); give "
                             f"the learning rate as a float or a per-step array, or set it to 1.")
        if self.policy.action == "rollback" and self.policy.damping_factor > 1 and fixed_dampings(self.network):
            raise ValueError(f"{names.get('damping_factor', 'damping_factor')}={self.policy.damping_factor} cannot "
                             f"be applied: THOR's damping is a LearningRateSchedule (no Parameter to raise); give "
                             f"it as a float or a per-step array, or set the factor to 1.")
        self._kept = {p.name for p in (*lrs, *dampings)}
        self._kept.update(p.name for p in self.network.get_parameters() if p.name.split(".")[-1] == "global_step")
        # data-parallel ranks train one model and agree on the verdict; ranks that train on their own do not
        self._decide = comm.AllReduce("max", enabled=comm.data_parallel_reduce_config()[0])
        self._pending = (self.step_offset, self._copy())  # the starting state, confirmed by the first step

    def on_train_step_end(self, run_context) -> None:
        """Judge the step on every rank, agree on the worst verdict, and accept, roll back or stop."""
        if self.failure is not None:
            return
        params = run_context.original_args()
        params.divergence_rolled_back, params.divergence_failure = False, None
        step = self.step_offset + int(params.cur_step_num)
        loss = _loss_of(callback_mark(params, "net_outputs"))
        code, reason = _FINE, self.detector.verdict(loss)
        if reason is not None:
            code = _NONFINITE_LOSS if not math.isfinite(loss) else _SPIKE
        snapshot = None
        if code == _FINE and self._snapshot_due(step):
            snapshot = self._copy()
            bad = first_non_finite(snapshot.items())
            if bad is not None:
                code, reason = _NONFINITE_STATE, f"the train network holds non-finite values: first {bad}"
        agreed = self._agree(code)
        if agreed == _FINE:
            self.detector.accept(loss)
            self._confirm(step)
            if snapshot is not None:
                self._pending = (step, snapshot)
            return
        if reason is None:  # another rank's step was bad
            reason = {_SPIKE: "another rank's loss spiked", _NONFINITE_LOSS: "another rank's loss is non-finite",
                      _NONFINITE_STATE: "another rank's train network holds non-finite values"}[agreed]
        self._handle(run_context, params, step, reason)

    # -- work ----------------------------------------------------------------------------------------------
    def _snapshot_due(self, step: int) -> bool:
        last = self._pending[0] if self._pending is not None else (self._confirmed[0] if self._confirmed else 0)
        return step - last >= self.policy.snapshot_steps or bool(self.snapshot_at and self.snapshot_at(step))

    def _train_network(self) -> nn.Cell:
        if self.network is None:
            raise RuntimeError("DivergenceRollback: no train network before on_train_begin.")
        return self.network

    def _copy(self) -> Dict[str, np.ndarray]:
        return {p.name: p.asnumpy().copy() for p in self._train_network().get_parameters()
                if p.name not in self._kept}

    def _confirm(self, step: int) -> None:
        """A fine loss at ``step`` was computed from the weights of ``step - 1``: a snapshot taken then is good."""
        if self._pending is not None and self._pending[0] < step:
            self._confirmed, self._pending = self._pending, None

    def _agree(self, code: int) -> int:
        """The worst verdict over every rank (one collective; the local one on a single rank)."""
        if self._decide is None or not self._decide.active:
            return code
        return int(round(float(self._decide(Tensor(np.array([code], np.float32))).asnumpy()[0])))

    def _handle(self, run_context, params, step: int, reason: str) -> None:
        names = self.policy.names or {}
        self._pending = None  # taken after the last fine loss: not confirmed
        if self.policy.action == "stop" or len(self.rollbacks) >= self.policy.max_rollbacks \
                or self._confirmed is None:
            if self.policy.action == "stop":
                why = f"{names.get('action', 'action')}=stop"
            elif self._confirmed is None:
                why = "no good state to roll back to"
            else:
                why = f"{len(self.rollbacks)} rollback(s) done, {names.get('max_rollbacks', 'max_rollbacks')}=" \
                      f"{self.policy.max_rollbacks}"
            self.failure = f"training diverged: at step {step} {reason} ({why})"
            params.divergence_failure = reason
            run_context.request_stop()
            return
        restored, state = self._confirmed
        network = self._train_network()
        for param in network.get_parameters():
            if param.name in state:
                _write(param, state[param.name])
        _scale(learning_rates_of(network), self.policy.lr_factor)
        _scale(dampings_of(network), self.policy.damping_factor)
        record = {"kind": "rollback", "step": step, "restored_step": restored, "reason": reason,
                  "rollback": len(self.rollbacks) + 1, "lr_factor": self.policy.lr_factor,
                  "damping_factor": self.policy.damping_factor, "skipped_steps": step - restored}
        self.rollbacks.append(record)
        params.divergence_rolled_back = True
        if self.log is not None:
            self.log(f"divergence: step {step}: {reason}; rolled back to the state of step {restored} "
                     f"(rollback {record['rollback']}/{self.policy.max_rollbacks}), learning rate x "
                     f"{self.policy.lr_factor:g}" + (f", THOR damping x {self.policy.damping_factor:g}"
                                                     if dampings_of(network) else "")
                     + f", skipping the batches of steps {restored + 1}-{step}")
        if self.on_rollback is not None:
            self.on_rollback(dict(record))

"""The trial: probe the candidates, measure progress where it pays, agree over the ranks, pick (:func:`run_trials`).

The engine knows neither networks nor optimizers: the caller gives ``build(boost, on_originals) -> TrialRun`` that
makes a fresh train step for a resolved plan, starting from the same weights each time (``ms_boost.Model`` and
:func:`ms_boost.autotune_plan` build it on copies of the network and optimizer; a plan that rewrites nothing, on
the objects themselves). Every run is put back at its starting state after each use, and kept until the pick:
the pick's run -- its step compiled by the trial -- is handed to the real run (``report.trial_run``), so the pick's
compile is paid once.

1. **Probe**: ``probe_steps`` timed steps each (compile and steady step time). The first probe is the candidate
   whose priors predict the shortest run (:func:`~ms_boost.autotune.candidates.probe_order`). With the time budget,
   each next one is the shortest run its priors predict from O0's compile and step time as the probes measured
   them, probed only while it is predicted to save time (its whole run shorter than what the best plan so far
   still needs) and the budget pays for it (:func:`~ms_boost.autotune.decide.over_time_budget`); without it, the
   prior order while the step budget pays.
2. **Progress**, only when the budget still pays for it and a probed plan computes a different function than the
   probed O0-like one (the reference): the held-out loss over a window of steps, reference first.
3. **Pick** by predicted run time (:mod:`ms_boost.autotune.decide`).

A candidate that cannot be built, raises during its trial or diverges is dropped with a line saying why; the
trial itself never ends the run.

Multi-rank: every rank runs the same trials (the order, the budget and the step counts depend only on values
every rank shares; the time budget's decisions are taken from numbers maxed over the ranks, one small all-reduce
each). The figures are averaged over the ranks by one all-reduce after the probes and one after the progress
measurements (:mod:`ms_boost.comm`), and every rank decides from the same numbers, so all ranks pick the same plan.
"""
from __future__ import annotations

import gc
import logging
import math
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Protocol, Sequence, Tuple

import numpy as np
from mindspore import Tensor

from ms_boost import comm
from ms_boost.autotune.candidates import (
    Candidate,
    TrialContext,
    candidate_plan,
    probe_order,
    progress_of,
    resolve_candidates,
)
from ms_boost.autotune.decide import (
    NO_ESTIMATE,
    Figures,
    TrialRecord,
    best_left,
    best_run,
    o0_scale,
    over_time_budget,
    pack,
    pick,
    predicted_run,
    prior_figures,
    summarize,
    trial_waste,
    unpack,
    with_gains,
)
from ms_boost.autotune.options import AutotuneOptions
from ms_boost.autotune.report import AutotuneReport, CandidateResult
from ms_boost.config import AutoBoost

__all__ = ["TrialRun", "run_trials", "eval_steps", "agree", "plan_dict", "batches_needed"]

logger = logging.getLogger("ms_boost")


class TrialRun(Protocol):
    """One candidate's train step, built fresh from the starting weights.

    Attributes:
        train_cell: the train step (handed to the run when this candidate is picked).
    """

    train_cell: Any

    def step(self, *batch: Any) -> Any:
        """Train one step on ``batch``; returns the training loss (a Tensor or a number)."""

    def holdout_loss(self, batches: Sequence[tuple]) -> float:
        """Mean loss over the held-out ``batches``, the network in evaluation mode, no update."""

    def restore(self) -> None:
        """Put every Parameter of the step back at its starting value."""


def eval_steps(steps: int, points: int) -> List[int]:
    """Step counts at which the held-out loss is measured: 0 and ``points`` about evenly spaced up to ``steps``."""
    return sorted({0, *(max(1, round(steps * j / points)) for j in range(1, points + 1))})


def budget_steps(options: AutotuneOptions, planned_steps: int) -> int:
    """The most training steps a trial of a run of ``planned_steps`` may take (``budget`` x the run)."""
    return int(options.budget * planned_steps + 1e-9)


def batches_needed(options: AutotuneOptions, planned_steps: int) -> Tuple[int, int]:
    """``(held-out, training)`` batches the trial of a run of ``planned_steps`` can use; the caller reads no more.

    Probes use the first ``probe_steps`` training batches; a progress window needs the held-out batches and up to
    ``max_trial_steps`` training batches, and is possible only when the step budget leaves ``min_trial_steps`` each
    to two plans after one probe. Without a trial (the budget pays no probe): one batch (the batch size).
    """
    steps = budget_steps(options, planned_steps)
    if steps < options.probe_steps:
        return 0, 1
    if not options.measure_progress or (steps - options.probe_steps) // 2 < options.min_trial_steps:
        return 0, options.probe_steps
    return options.holdout_batches, min(options.max_trial_steps, max(options.probe_steps, steps))


def _scalar(loss: Any) -> float:
    if isinstance(loss, (tuple, list)):  # a loss-scale cell returns (loss, overflow, scale)
        loss = loss[0]
    value = loss.asnumpy() if hasattr(loss, "asnumpy") else np.asarray(loss)
    return float(np.asarray(value, np.float64).reshape(-1)[0])


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    line = text[0] if text else ""
    return f"{type(exc).__name__}: {line[:300]}"


def _measure(run: TrialRun, batches: Sequence[tuple], holdout: Sequence[tuple], at: Sequence[int],
             wrap: Optional[Callable]) -> TrialRecord:
    """Train ``run`` on ``batches``, timing each step; the held-out loss at step 0 and the steps ``at`` (if any)."""
    step = wrap(run.step) if wrap is not None else run.step
    where: List[int] = [0] if at else []
    losses: List[float] = [float(run.holdout_loss(holdout))] if at else []
    seconds: List[float] = []
    done = 0
    try:
        for done, batch in enumerate(batches, start=1):
            start = time.perf_counter()
            value = _scalar(step(*batch))
            seconds.append(time.perf_counter() - start)
            if not math.isfinite(value):
                return TrialRecord(tuple(where), tuple(losses), tuple(seconds),
                                   error=f"diverged: training loss {value} at step {done}")
            if done in at:
                where.append(done)
                losses.append(float(run.holdout_loss(holdout)))
    except Exception as exc:  # noqa: BLE001 - a failing candidate is dropped, never ends the run
        return TrialRecord(tuple(where), tuple(losses), tuple(seconds), error=f"failed at step {done}: "
                                                                              f"{_first_line(exc)}")
    return TrialRecord(tuple(where), tuple(losses), tuple(seconds))


def agree(figures: Sequence[Figures], ranks: int) -> List[Figures]:
    """The figures every rank decides from: this rank's on one rank, else the mean over the ranks.

    One all-reduce of :func:`~ms_boost.autotune.decide.pack`.
    """
    if ranks <= 1:
        return list(figures)
    summed = comm.AllReduce("sum")(Tensor(np.asarray(pack(figures), np.float32))).asnumpy()
    return unpack(summed.tolist(), figures, ranks)


def _agreed_max(values: Sequence[float], ranks: int) -> List[float]:
    """``values`` maxed over the ranks (one all-reduce; as is on one rank)."""
    if ranks <= 1:
        return [float(v) for v in values]
    out = comm.AllReduce("max")(Tensor(np.asarray(values, np.float32))).asnumpy()
    return [float(v) for v in out]


def _say(text: str) -> None:
    if comm.get_rank() == 0:
        logger.info("%s", text)


class _State(NamedTuple):
    """What the trial's next decision reads (:meth:`_Trial.state`), the same on every rank.

    Attributes:
        waste: the trial's loss so far (its wall time minus the best plan's compile).
        run: the best plan's predicted run (:data:`NO_ESTIMATE`: none scored).
        left: what the best plan still needs once its compile is paid (:func:`best_left`).
        scale: O0's ``(compile, step)`` seconds as the probes measured them (:func:`o0_scale`), or None.
        overhead: the most seconds a probe took beyond its steps (building, copying, restoring).
        dearest: the most seconds one candidate's trial took so far.
        best: the best plan's name ("" when none), for the log.
    """

    waste: float
    run: float
    left: float
    scale: Optional[Tuple[float, float]]
    overhead: float
    dearest: float
    best: str


class _Trial:
    """The state of one trial (one instance per :func:`run_trials` call)."""

    def __init__(self, build: Callable[[AutoBoost, bool], TrialRun], ctx: TrialContext, options: AutotuneOptions,
                 candidates: List[Candidate], boosts: List[Optional[AutoBoost]], errors: List[Optional[str]]):
        self.build, self.ctx, self.options = build, ctx, options
        self.candidates, self.boosts = candidates, boosts
        self.started = time.perf_counter()
        n = len(candidates)
        self.records: List[TrialRecord] = [TrialRecord(error=e) if e else TrialRecord(error="not tried")
                                           for e in errors]
        self.figures: List[Figures] = [Figures(False, reason=r.error or "") for r in self.records]
        self.seconds = [0.0] * n
        self.runs: Dict[int, TrialRun] = {}
        self.steps_used = 0
        self.window = 0  # steps of the progress windows (0: none measured)
        self.priors = [progress_of(c, ctx) for c in candidates]
        self.compile_priors = [float(c.compile_prior(ctx)) for c in candidates]
        self.step_priors = [float(c.step_prior(ctx)) for c in candidates]
        self.exact = [c.exact_progress for c in candidates]
        self.probed: List[int] = []  # in the order probed (the same on every rank)

    # -- the budget -------------------------------------------------------------------------------
    def decided(self) -> List[Figures]:
        """The figures with their gains, as the decision would read them now."""
        return with_gains(self.figures, self.exact, self.priors, self.window)

    def state(self) -> _State:
        """The numbers the next decision reads, maxed over the ranks (one small all-reduce) so all ranks agree."""
        figures, n_steps = self.decided(), self.ctx.planned_steps
        waste = trial_waste(time.perf_counter() - self.started, figures, n_steps)
        scale = o0_scale(self.figures, self.compile_priors, self.step_priors) or (-1.0, -1.0)
        overhead = max([self.seconds[i] - sum(self.records[i].step_seconds) for i in self.probed] or [0.0])
        dearest = max(self.seconds)
        values = [waste, -min(best_run(figures, n_steps)[1], NO_ESTIMATE), best_left(figures, n_steps), *scale,
                  max(0.0, overhead), dearest]
        waste, neg_run, left, compile_o0, step_o0, overhead, dearest = _agreed_max(values, self.ctx.ranks)
        best = best_run(figures, n_steps)[0]
        return _State(waste, -neg_run, left, (compile_o0, step_o0) if step_o0 > 0 else None, overhead, dearest,
                      self.candidates[best].name if best is not None else "")

    def over_budget(self, next_cost: float, state: Optional[_State] = None) -> Optional[str]:
        """Why one more probe or measurement costing about ``next_cost`` s is not paid (the time budget), or None."""
        if not self.options.time_budget:
            return None
        state = state or self.state()
        if not over_time_budget(state.waste, next_cost, state.run, self.options.budget):
            return None
        return (f"the time budget ({self.options.budget:g} x the predicted {state.run:.1f} s run = "
                f"{self.options.budget * state.run:.1f} s) would be passed ({state.waste:.1f} s lost so far, about "
                f"{next_cost:.1f} s more)")

    # -- phase 1 ----------------------------------------------------------------------------------
    def predicted(self, i: int, scale: Tuple[float, float]) -> Figures:
        """Candidate ``i``'s figures as its priors predict them from O0's measured ``(compile, step)`` ``scale``."""
        return prior_figures(self.compile_priors[i], self.step_priors[i], self.priors[i], scale)

    def next_probe(self, left: Sequence[int], steps: int, allowed: int) -> Tuple[int, Optional[str]]:
        """The candidate of ``left`` to probe next, and why it is not probed (None: probe it).

        Before any probe, and without ``time_budget`` (every candidate the step budget pays for is probed, in the
        prior order, with no collective): the first of ``left``. After a probe, with ``time_budget``: the one with the
        shortest run predicted from its priors and the measured scale (agreed over the ranks), only when that run is
        shorter than what the best plan so far still needs (it saves time) and the time budget pays for its probe.
        """
        if not self.probed:
            return left[0], None
        if not self.options.time_budget:
            over = self.steps_used + steps > allowed
            return left[0], (f"the step budget ({allowed} steps) is spent ({self.steps_used} used, {steps} per "
                             f"probe)" if over else None)
        state = self.state()
        if state.scale is None:  # every probe so far failed: the prior order, the dearest probe as the cost
            i, cost, run = left[0], state.dearest, None
        else:
            n_steps = self.ctx.planned_steps
            runs = {j: predicted_run(self.predicted(j, state.scale), n_steps) or NO_ESTIMATE for j in left}
            i = min(left, key=lambda j: (runs[j], left.index(j)))
            guess = self.predicted(i, state.scale)
            cost, run = guess.compile_s + steps * guess.step_s + state.overhead, runs[i]
        if self.steps_used + steps > allowed:
            return i, f"the step budget ({allowed} steps) is spent ({self.steps_used} used, {steps} per probe)"
        if run is not None and run >= state.left:
            return i, (f"no candidate left is predicted to save time: the shortest predicted run, "
                       f"{self.candidates[i].name}'s {run:.1f} s, is not below the {state.left:.1f} s {state.best} "
                       f"still needs (its compile is paid)")
        return i, self.over_budget(cost, state)

    def probe(self, order: Sequence[int], batches: Sequence[tuple], reuse: Optional[int]) -> None:
        """Probe the candidates of ``order`` (the prior order) while one more pays; :meth:`next_probe` picks each."""
        allowed = budget_steps(self.options, self.ctx.planned_steps)
        steps = len(batches[:self.options.probe_steps])  # the probes' batches (read before the trial)
        left = list(order)
        while left:
            i, stop = self.next_probe(left, steps, allowed)
            if stop:
                for j in left:
                    self.records[j] = TrialRecord(error=f"not probed: {stop}")
                    self.figures[j] = Figures(False, reason=f"not probed: {stop}")
                _say(f"autotune: not probed: {stop}: {[self.candidates[j].name for j in left]}")
                return
            left.remove(i)
            if self.probed:  # a second plan: the rest of the batches are read while it builds and compiles
                _start_reading(batches)
            self._probe_one(i, batches[:steps], i == reuse)
            self.probed.append(i)

    def _probe_one(self, i: int, batches: Sequence[tuple], on_originals: bool) -> None:
        """Build candidate ``i`` and time its ``batches`` steps; keep its run (at the start) unless it failed."""
        cand, t0 = self.candidates[i], time.perf_counter()
        boost = self.boosts[i]
        assert boost is not None
        try:
            run = self.build(boost, on_originals)
        except Exception as exc:  # noqa: BLE001 - a failing candidate is dropped, never ends the run
            record = TrialRecord(error=f"failed to build: {_first_line(exc)}")
        else:
            try:
                record = _measure(run, batches, (), (), cand.wrap_step)
            finally:
                run.restore()  # back at the start, whatever happened (the caller's own objects too)
            if not record.error:
                self.runs[i] = run
            del run
        self._record(i, record, len(batches), t0)

    # -- phase 2 ----------------------------------------------------------------------------------
    def progress(self, order: Sequence[int], batches: Sequence[tuple], holdout: Sequence[tuple]) -> List[str]:
        """Measure held-out progress of the reference and then the other probed plans while the budget pays.

        Returns:
            Notes on what was (not) measured and why.
        """
        options, n_steps = self.options, self.ctx.planned_steps
        figures = self.decided()
        ok = [i for i in order if figures[i].ok]
        ref = next((i for i in ok if self.exact[i]), None)
        others = [i for i in ok if not self.exact[i]]
        if not options.measure_progress or ref is None or not others or not holdout:
            return []
        others.sort(key=lambda i: predicted_run(figures[i], n_steps) or NO_ESTIMATE)
        allowed = budget_steps(options, n_steps)
        window = min(options.max_trial_steps, len(batches), (allowed - self.steps_used) // 2)
        if window < options.min_trial_steps:
            return [f"progress not measured: the step budget leaves {max(0, allowed - self.steps_used)} steps, "
                    f"fewer than {options.min_trial_steps} each for the reference and one more plan; progress "
                    f"priors used"]
        at = eval_steps(window, options.eval_points)
        self.window = window

        def cost(i: int) -> float:  # steps, held-out losses, and the held-out graph's compile (about a step's)
            f = figures[i]
            return window * f.step_s + len(at) * len(holdout) * f.step_s + f.compile_s

        queue = [ref, *others]
        notes: List[str] = []
        for n, i in enumerate(queue):
            if self.steps_used + window > allowed:
                notes.append(f"progress measured for {n} plan(s): the step budget is spent")
                break
            stop = self.over_budget(cost(i) + (cost(queue[1]) if n == 0 else 0.0))
            if stop:
                notes.append(f"progress measured for {n} plan(s): {stop}")
                break
            self._measure_one(i, batches[:window], holdout, at)
        if not notes:
            notes.append(f"progress measured for {len(queue)} plan(s) over {window} steps")
        return notes

    def _measure_one(self, i: int, batches: Sequence[tuple], holdout: Sequence[tuple], at: Sequence[int]) -> None:
        """Measure candidate ``i``'s held-out progress on its probed run, which is put back at the start after."""
        cand, run, t0 = self.candidates[i], self.runs[i], time.perf_counter()
        try:
            record = _measure(run, batches, holdout, at, cand.wrap_step)
        finally:
            run.restore()
        probe = self.records[i]  # its timed steps continue the probe's (the first one compiled)
        merged = TrialRecord(record.eval_steps, record.holdout_losses, probe.step_seconds + record.step_seconds,
                             record.error)
        self._record(i, merged, len(batches), t0)

    def _record(self, i: int, record: TrialRecord, steps: int, t0: float) -> None:
        """Keep candidate ``i``'s record and figures after ``steps`` more steps begun at ``t0``; drop it on failure."""
        self.steps_used += steps
        self.records[i] = record
        self.figures[i] = summarize(record, self.options.divergence_ratio, self.priors[i])
        self.seconds[i] += time.perf_counter() - t0
        if not self.figures[i].ok:
            self.runs.pop(i, None)
            gc.collect()  # a dropped candidate's step is freed now
            _say(f"autotune: candidate {self.candidates[i].name} dropped: {self.figures[i].reason}")


def run_trials(build: Callable[[AutoBoost, bool], TrialRun], ctx: TrialContext, options: AutotuneOptions,
               batches: Sequence[tuple], holdout: Sequence[tuple], started: Optional[float] = None) -> AutotuneReport:
    """Try the candidates of ``options`` and pick one (the module docstring gives the phases).

    Args:
        build: ``build(boost, on_originals)`` makes a fresh :class:`TrialRun` for a resolved plan, from the
            starting weights; ``on_originals`` (for the first plan that rewrites nothing) on the caller's own
            objects, else on copies.
        ctx: the run (ranks, batch size, planned steps, the user's algorithm sections, the network's layers).
        options: the validated autotune options.
        batches: the trial's training batches, in order (at least as many as a trial may take): a list, or a
            sequence still being read (:class:`~ms_boost.autotune.cells.TrialBatches`: the probes slice only the
            batches they train on, so the rest need not be read before; its ``start()`` is called before a second
            probe, so that the reading overlaps that probe's compile, and its ``close()`` when the trial needs no
            more).
        holdout: the held-out batches progress is measured on.
        started: ``time.perf_counter()`` when the trial began (e.g. before reading its batches; default: now),
            from which its wall time is counted.

    Returns:
        The :class:`AutotuneReport` (also saved to ``options.save_path`` by rank 0 when set); its ``trial_run`` is
        the pick's run, at the starting state, when the trial built it.

    Raises:
        BoostConfigError: an unknown candidate name (before anything is trained).
        ValueError: no candidate can run in this setting.
    """
    candidates: List[Candidate] = resolve_candidates(options.candidates, ctx)
    plans: List[Tuple[str, Dict[str, Any]]] = []
    boosts: List[Optional[AutoBoost]] = []
    errors: List[Optional[str]] = []
    for cand in candidates:
        level, config = candidate_plan(cand, ctx)
        plans.append((level, config))
        reason = cand.unavailable(ctx)
        boost = None
        if reason is None:
            try:
                boost = AutoBoost(level, config)
            except (ValueError, TypeError) as exc:
                reason = f"invalid plan: {_first_line(exc)}"
        boosts.append(boost)
        errors.append(reason)
    trial = _Trial(build, ctx, options, candidates, boosts, errors)
    if started is not None:
        trial.started = started
    runnable = [i for i, b in enumerate(boosts) if b is not None]
    if not runnable:
        raise ValueError("autotune: no candidate can run here: " + "; ".join(
            f"{c.name}: {e}" for c, e in zip(candidates, errors)))
    order = [i for i in probe_order(candidates, ctx) if i in runnable]
    allowed = budget_steps(options, ctx.planned_steps)
    if allowed < options.probe_steps or len(batches[:2]) < 2:  # a slice: no wait for batches read later
        chosen = order[0]
        note = (f"no trial: the budget of {allowed} steps (budget {options.budget:g} x {ctx.planned_steps} "
                f"planned steps) cannot pay for one probe of {options.probe_steps} steps; {candidates[chosen].name} "
                f"(the shortest run its priors predict) trains the run unmeasured")
        reasons = [f"dropped: {f.reason}" if errors[i] else "not tried" for i, f in enumerate(trial.figures)]
        reasons[chosen] = "picked unmeasured: the shortest run its priors predict"
        _stop_reading(batches)
        return _finish(trial, plans, reasons, chosen, False, [note])
    reuse = next((i for i in order if not boosts[i].is_active), None)  # type: ignore[union-attr]
    _say(f"autotune: prior order {[candidates[i].name for i in order]} (the shortest predicted run first; after a "
         f"probe, by the measured times): {options.probe_steps} steps each, budget {options.budget:g} of "
         f"{ctx.planned_steps} planned steps")
    trial.probe(order, batches, reuse)
    trial.figures = agree(trial.figures, ctx.ranks)  # phase 2 decides from the same numbers on every rank
    for i in list(trial.runs):
        if not trial.figures[i].ok:
            trial.runs.pop(i)
    notes = trial.progress(order, batches, holdout)
    figures = with_gains(agree(trial.figures, ctx.ranks), trial.exact, trial.priors, trial.window)
    trial.figures = figures
    names = [c.name for c in candidates]
    decision = pick(names, figures, ctx.planned_steps, options.tolerance, fallback=_fallback(names, figures, order))
    if not decision.measured:
        notes.append(decision.reasons[decision.index])
    _stop_reading(batches)
    return _finish(trial, plans, list(decision.reasons), decision.index, decision.measured, notes)


def _start_reading(batches: Sequence[tuple]) -> None:
    """The trial goes on past its first probe: a source that reads the rest of its batches on demand starts now.

    (:meth:`~ms_boost.autotune.cells.TrialBatches.start`: the reading overlaps the next plan's build and compile.
    The first probe's compile, the one a run that picks it reuses, has no reader beside it.)
    """
    start = getattr(batches, "start", None)
    if callable(start):
        start()


def _stop_reading(batches: Sequence[tuple]) -> None:
    """The trial needs no more batches: a source reading them in the background stops now, inside the trial's time.

    A source with ``close()`` (:class:`~ms_boost.autotune.cells.TrialBatches`) releases its data iterator there.
    """
    close = getattr(batches, "close", None)
    if callable(close):
        close()


def _fallback(names: Sequence[str], figures: Sequence[Figures], order: Sequence[int]) -> int:
    """Who trains the run when no candidate can be scored.

    O0 if it ran cleanly, else the first probed that did, else the first in the probe order.
    """
    kept = [i for i in order if figures[i].ok]
    o0 = names.index("O0") if "O0" in names else None
    if o0 is not None and o0 in kept:
        return o0
    return kept[0] if kept else order[0]


def plan_dict(boost: AutoBoost) -> Dict[str, Any]:
    """The resolved plan as a ``boost_config_dict``.

    Every switch (``mode: manual``), ``common``, and the sections of the enabled algorithms (the others would only
    be noted as unused).
    """
    full = boost.to_dict()
    return {key: value for key, value in full.items()
            if key in ("boost", "common") or full["boost"].get(key)}


def _finish(trial: _Trial, plans: Sequence[Tuple[str, Dict[str, Any]]], reasons: Sequence[str], chosen: int,
            measured: bool, notes: Sequence[str]) -> AutotuneReport:
    ctx, options = trial.ctx, trial.options
    steps = [len(r.step_seconds) for r in trial.records]
    figures = trial.figures
    reference = any(e and f.ok and f.measured and f.progress > 0 for e, f in zip(trial.exact, figures))
    gain_from = ["-" if not f.ok else "exact" if e else "measured" if f.measured and reference else "prior"
                 for e, f in zip(trial.exact, figures)]
    results = tuple(CandidateResult(c.name, c.description, plans[i][0], plans[i][1], figures[i], steps[i],
                                    trial.seconds[i], reasons[i], gain_from[i])
                    for i, c in enumerate(trial.candidates))
    boost = trial.boosts[chosen]
    assert boost is not None
    run = trial.runs.get(chosen)
    if set(trial.runs) - {chosen}:  # the other candidates' steps are freed (a collection costs 0.1-0.3 s: only then)
        trial.runs.clear()
        gc.collect()
    report = AutotuneReport(results, trial.candidates[chosen].name, boost.level, plan_dict(boost), measured,
                            ctx.planned_steps, trial.steps_used, options.budget,
                            time.perf_counter() - trial.started, ctx.ranks, tuple(notes), trial_run=run)
    _say(report.table())
    if options.save_path and comm.get_rank() == 0:
        report = AutotuneReport(**{**report.__dict__, "saved_to": report.save(options.save_path)})
        _say(f"autotune: pick written to {report.saved_to} (pass it as boost_config_dict to skip the trial)")
    return report

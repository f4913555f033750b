"""The trial: train each candidate for a few steps, measure it, agree over the ranks, pick (:func:`run_trials`).

The engine knows neither networks nor optimizers: the caller gives ``build(boost, on_originals) -> TrialRun`` that
makes a fresh train step for a resolved plan, starting from the same weights each time (``ms_boost.Model`` and
:func:`ms_boost.autotune_plan` build it on copies of the network and optimizer; the plain step on the objects
themselves, restored after its trial). Every candidate trains on the
same batches in the same order and is measured on the same held-out batches. A candidate that cannot be built,
raises during its trial or diverges is dropped with a line saying why; the trial itself never ends the run.

Multi-rank: every rank runs the same trials (the plans, the budget and the step counts depend only on values
every rank shares); the figures are then summed over the ranks by one all-reduce (:mod:`ms_boost.comm`) and
every rank decides from the same numbers, so all ranks pick the same plan. The time budget's decision before each
further candidate is taken from numbers maxed over the ranks (one small all-reduce each), for the same reason.
"""
from __future__ import annotations

import gc
import logging
import math
import time
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence

import numpy as np
from mindspore import Tensor

from ms_boost import comm
from ms_boost.autotune.candidates import Candidate, TrialContext, candidate_plan, resolve_candidates
from ms_boost.autotune.decide import (
    NO_ESTIMATE,
    Figures,
    TrialRecord,
    over_time_budget,
    pack,
    pick,
    split_budget,
    summarize,
    time_figures,
    unpack,
)
from ms_boost.autotune.options import AutotuneOptions
from ms_boost.autotune.report import AutotuneReport, CandidateResult
from ms_boost.config import AutoBoost

__all__ = ["TrialRun", "run_trials", "eval_steps", "agree", "plan_dict"]

logger = logging.getLogger("ms_boost")


class TrialRun(Protocol):
    """One candidate's train step, built fresh from the starting weights.

    Built with ``on_originals`` (see :func:`run_trials`) it trains the caller's own objects and must provide
    ``restore()`` (back to the starting state) and ``train_cell`` (handed to the run when picked).
    """

    def step(self, *batch) -> Any:
        """Train one step on ``batch``; returns the training loss (a Tensor or a number)."""

    def holdout_loss(self, batches: Sequence[tuple]) -> float:
        """Mean loss over the held-out ``batches``, the network in evaluation mode, no update."""


def eval_steps(steps: int, points: int) -> List[int]:
    """Step counts at which the held-out loss is measured: 0 and ``points`` about evenly spaced up to ``steps``."""
    return sorted({0, *(max(1, round(steps * j / points)) for j in range(1, points + 1))})


def _scalar(loss: Any) -> float:
    if isinstance(loss, (tuple, list)):  # a loss-scale cell returns (loss, overflow, scale)
        loss = loss[0]
    value = loss.asnumpy() if hasattr(loss, "asnumpy") else np.asarray(loss)
    return float(np.asarray(value, np.float64).reshape(-1)[0])


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    text = text[0] if text else ""
    return f"{type(exc).__name__}: {text[:300]}"


def _measure(run: TrialRun, batches: Sequence[tuple], holdout: Sequence[tuple], at: Sequence[int],
             wrap: Optional[Callable]) -> TrialRecord:
    """Train ``run`` on ``batches``, timing each step, measuring the held-out loss at the steps ``at``."""
    step = wrap(run.step) if wrap is not None else run.step
    where, losses, seconds = [0], [float(run.holdout_loss(holdout))], []
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
    """The figures every rank decides from: this rank's on one rank, else the mean over the ranks (one all-reduce
    of :func:`~ms_boost.autotune.decide.pack`)."""
    if ranks <= 1:
        return list(figures)
    summed = comm.AllReduce("sum")(Tensor(np.asarray(pack(figures), np.float32))).asnumpy()
    return unpack(summed.tolist(), figures, ranks)


def _time_check(done, ctx: TrialContext, options: AutotuneOptions) -> Optional[str]:
    """Why no further candidate is tried (the time budget), or None. On several ranks the three figures are
    maxed over the ranks (one all-reduce) so that every rank decides the same."""
    spent, next_cost, run = time_figures(done, ctx.planned_steps)
    if ctx.ranks > 1:
        agreed = comm.AllReduce("max")(Tensor(np.asarray([spent, next_cost, -min(run, NO_ESTIMATE)], np.float32)))
        spent, next_cost, run = (float(v) for v in agreed.asnumpy())
        run = -run
    if not over_time_budget(spent, next_cost, run, options.budget):
        return None
    return (f"not tried: the time budget ({options.budget:g} x the estimated {run:.1f} s run = "
            f"{options.budget * run:.1f} s) would be passed ({spent:.1f} s spent, about {next_cost:.1f} s more each)")


def _say(text: str) -> None:
    if comm.get_rank() == 0:
        logger.info("%s", text)


def run_trials(build: Callable[[AutoBoost, bool], TrialRun], ctx: TrialContext, options: AutotuneOptions,
               batches: Sequence[tuple], holdout: Sequence[tuple]) -> AutotuneReport:
    """Try the candidates of ``options`` and pick one.

    The first tried candidate whose plan enables no algorithm (O0) is built ``on_originals``: on the caller's
    own network and optimizer, put back at the starting state right after its trial. If it is picked, its
    compiled step is handed over (``report.train_network``), so the run does not compile it a second time.
    The other candidates train copies. With ``options.time_budget``, no further candidate is tried once one more
    would take the trial past ``budget`` times the estimated run (:func:`~ms_boost.autotune.decide.time_figures`).

    Args:
        build: ``build(boost, on_originals)`` makes a fresh :class:`TrialRun` for a resolved plan, from the
            starting weights (on the caller's objects when ``on_originals``).
        ctx: the run (ranks, batch size, planned steps, the user's algorithm sections).
        options: the validated autotune options.
        batches: the trial's training batches, in order (at least as many as a trial may take).
        holdout: the held-out batches progress is measured on.

    Returns:
        The :class:`AutotuneReport` (also saved to ``options.save_path`` by rank 0 when set).

    Raises:
        BoostConfigError: an unknown candidate name (before anything is trained).
        ValueError: no candidate can run in this setting.
    """
    started = time.perf_counter()
    candidates: List[Candidate] = resolve_candidates(options.candidates, ctx)
    plans, records, boosts = [], [], []
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
        records.append(None if reason is None else TrialRecord(error=reason))
    runnable = [i for i, b in enumerate(boosts) if b is not None]
    if not runnable:
        raise ValueError("autotune: no candidate can run here: " + "; ".join(
            f"{c.name}: {r.error}" for c, r in zip(candidates, records)))
    kept, steps = split_budget(options.budget, ctx.planned_steps, len(runnable), options.min_trial_steps,
                               options.max_trial_steps, len(batches))
    notes = []
    budget_steps = int(options.budget * ctx.planned_steps + 1e-9)
    for i in runnable[max(kept, 1):]:
        records[i] = TrialRecord(error=f"not tried: the budget ({budget_steps} steps) gives fewer than "
                                       f"{options.min_trial_steps} steps each to more candidates")
    if kept < 2:
        chosen = runnable[0]
        notes.append(f"no trial: the budget of {budget_steps} steps (budget {options.budget:g} x "
                     f"{ctx.planned_steps} planned steps) cannot give 2 candidates {options.min_trial_steps} steps "
                     f"each; {candidates[chosen].name} trains the run unmeasured")
        figures = [Figures(False, reason=r.error if r is not None else "not tried") for r in records]
        reasons = [f"dropped: {f.reason}" for f in figures]
        reasons[chosen] = "picked unmeasured: first candidate that can run"
        return _finish(candidates, plans, boosts, figures, reasons, [0.0] * len(candidates), chosen, False, 0,
                       ctx, options, notes, started)
    at = eval_steps(steps, options.eval_points)
    seconds = [0.0] * len(candidates)
    _say(f"autotune: trying {[candidates[i].name for i in runnable[:kept]]} for {steps} steps each "
         f"(budget {options.budget:g} of {ctx.planned_steps} planned steps), held-out loss on "
         f"{len(holdout)} batch(es) at steps {at}")
    tried = runnable[:kept]
    reuse = next((i for i in tried if not boosts[i].is_active), None)
    done, ready = [], None
    for n, i in enumerate(tried):
        stop = _time_check(done, ctx, options) if done and options.time_budget else None
        if stop:
            for j in tried[n:]:
                records[j] = TrialRecord(error=stop)
            _say(f"autotune: {stop}: {[candidates[j].name for j in tried[n:]]}")
            break
        cand, t0 = candidates[i], time.perf_counter()
        try:
            run = build(boosts[i], i == reuse)
        except Exception as exc:  # noqa: BLE001 - a failing candidate is dropped, never ends the run
            records[i] = TrialRecord(error=f"failed to build: {_first_line(exc)}")
        else:
            try:
                records[i] = _measure(run, batches[:steps], holdout, at, cand.wrap_step)
            finally:
                if i == reuse:
                    run.restore()  # the caller's objects are back at the start, whatever happened
            if i == reuse and not records[i].error:
                ready = run.train_cell
            del run
            gc.collect()
        seconds[i] = time.perf_counter() - t0
        done.append((seconds[i], summarize(records[i], options.divergence_ratio), i == reuse))
        if records[i].error:
            _say(f"autotune: candidate {cand.name} dropped: {records[i].error}")
    local = [summarize(r, options.divergence_ratio) for r in records]
    figures = agree(local, ctx.ranks)
    names = [c.name for c in candidates]
    fallback = _fallback(names, figures, runnable)
    decision = pick(names, figures, ctx.planned_steps, options.tolerance, fallback=fallback)
    if not decision.measured:
        notes.append(decision.reasons[decision.index])
    return _finish(candidates, plans, boosts, figures, list(decision.reasons), seconds, decision.index,
                   decision.measured, steps, ctx, options, notes, started,
                   ready if decision.index == reuse else None)


def _fallback(names: Sequence[str], figures: Sequence[Figures], runnable: Sequence[int]) -> int:
    """Who trains the run when no candidate made progress: O0 if it ran cleanly, else the first that did, else O0
    if it could be built, else the first that could."""
    kept = [i for i, f in enumerate(figures) if f.ok]
    o0 = names.index("O0") if "O0" in names else None
    if o0 is not None and o0 in kept:
        return o0
    if kept:
        return kept[0]
    return o0 if o0 is not None and o0 in runnable else runnable[0]


def plan_dict(boost: AutoBoost) -> Dict[str, Any]:
    """The resolved plan as a ``boost_config_dict``: every switch (``mode: manual``), ``common``, and the sections of
    the enabled algorithms (the others would only be noted as unused)."""
    full = boost.to_dict()
    return {key: value for key, value in full.items()
            if key in ("boost", "common") or full["boost"].get(key)}


def _finish(candidates, plans, boosts, figures, reasons, seconds, chosen, measured, steps, ctx, options, notes,
            started, ready=None) -> AutotuneReport:
    results = tuple(CandidateResult(c.name, c.description, plans[i][0], plans[i][1], figures[i],
                                    steps if figures[i].ok or (seconds[i] > 0) else 0, seconds[i], reasons[i])
                    for i, c in enumerate(candidates))
    boost = boosts[chosen]
    report = AutotuneReport(results, candidates[chosen].name, boost.level, plan_dict(boost), measured,
                            ctx.planned_steps, steps, options.budget, time.perf_counter() - started, ctx.ranks,
                            tuple(notes), train_network=ready)
    _say(report.table())
    if options.save_path and comm.get_rank() == 0:
        report = AutotuneReport(**{**report.__dict__, "saved_to": report.save(options.save_path)})
        _say(f"autotune: pick written to {report.saved_to} (pass it as boost_config_dict to skip the trial)")
    return report

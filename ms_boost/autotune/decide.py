r"""The autotune decision, as pure functions of measured numbers (no MindSpore, no communication).

For each candidate ``c`` the trial records the held-out loss :math:`L_c(s)` at a few step counts ``s``
(0 included) and the wall time of every training step. From those:

* **progress per step** (smoothed): the least-squares slope of the held-out loss against the step count,
  negated, :math:`p_c = -\frac{\sum_i (s_i-\bar s)(L_i-\bar L)}{\sum_i (s_i-\bar s)^2}`, so one noisy
  measurement moves it far less than an end-point difference would;
* **steady step time** :math:`t_c`: the mean of the steps after the first (periodic work such as THOR's
  refresh is included); **compile time** :math:`k_c`: what the first step took beyond :math:`t_c`;
* **seconds per step over the planned run** of :math:`N` steps, compile amortized:
  :math:`\tau_c = t_c + k_c / N`;
* **score** (progress per wall second): :math:`p_c / \tau_c`.

The pick is the candidate with the highest score -- unless a simpler one (earlier in the list) scores within
``tolerance`` of it, which is then preferred. A candidate that failed, whose losses are not finite, or whose
held-out loss ended above ``divergence_ratio`` times its start is dropped with the reason. On several ranks
the figures are averaged over the ranks before deciding (a candidate is kept only if it is kept on every
rank), so every rank computes the same pick from the same numbers (:func:`pack` / :func:`unpack`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

__all__ = ["TrialRecord", "Figures", "smoothed_progress", "step_times", "seconds_per_step", "summarize",
           "split_budget", "time_figures", "over_time_budget", "NO_ESTIMATE", "Pick", "pick", "pack", "unpack",
           "PACKED_FIELDS"]


@dataclass(frozen=True)
class TrialRecord:
    """What one candidate's trial measured on this rank.

    Attributes:
        eval_steps: step counts at which the held-out loss was measured (ascending, starting at 0).
        holdout_losses: the held-out loss at each of ``eval_steps``.
        step_seconds: wall seconds of each training step (the first includes compilation).
        error: why the trial stopped early (an exception, a non-finite loss), or None.
    """

    eval_steps: Tuple[int, ...] = ()
    holdout_losses: Tuple[float, ...] = ()
    step_seconds: Tuple[float, ...] = ()
    error: Optional[str] = None


@dataclass(frozen=True)
class Figures:
    """A candidate's measured figures, and whether it stays in the choice.

    Attributes:
        ok: kept (False: dropped, see ``reason``).
        progress: held-out loss decrease per step (smoothed slope).
        step_s: steady seconds per step.
        compile_s: first-step seconds beyond ``step_s``.
        loss_start, loss_end: held-out loss before the first and after the last step.
        reason: why it was dropped ("" when kept).
    """

    ok: bool
    progress: float = 0.0
    step_s: float = 0.0
    compile_s: float = 0.0
    loss_start: float = 0.0
    loss_end: float = 0.0
    reason: str = ""


def smoothed_progress(steps: Sequence[float], losses: Sequence[float]) -> float:
    """Loss decrease per step: minus the least-squares slope of ``losses`` over ``steps`` (>= 2 distinct steps)."""
    n = len(steps)
    if n != len(losses) or n < 2:
        raise ValueError(f"smoothed_progress: need >= 2 (step, loss) pairs of equal count, got {n} steps and "
                         f"{len(losses)} losses.")
    mean_s = sum(steps) / n
    mean_l = sum(losses) / n
    var = sum((s - mean_s) ** 2 for s in steps)
    if var == 0:
        raise ValueError("smoothed_progress: the steps are all equal.")
    return -sum((s - mean_s) * (v - mean_l) for s, v in zip(steps, losses)) / var


def step_times(step_seconds: Sequence[float]) -> Tuple[float, float]:
    """``(steady_seconds, compile_seconds)``: the mean of the steps after the first, and what the first took
    beyond it (never negative). Needs >= 2 steps."""
    if len(step_seconds) < 2:
        raise ValueError(f"step_times: need >= 2 timed steps, got {len(step_seconds)}.")
    steady = sum(step_seconds[1:]) / (len(step_seconds) - 1)
    return steady, max(0.0, step_seconds[0] - steady)


def seconds_per_step(step_s: float, compile_s: float, planned_steps: int) -> float:
    r"""Wall seconds per step over a run of ``planned_steps``: :math:`t + k / N`."""
    return step_s + compile_s / max(1, int(planned_steps))


def summarize(record: TrialRecord, divergence_ratio: float) -> Figures:
    """The :class:`Figures` of one trial on this rank (dropped with a reason when it failed or diverged)."""
    if record.error:
        return Figures(ok=False, reason=record.error)
    losses = record.holdout_losses
    if len(losses) < 2 or len(record.step_seconds) < 2:
        return Figures(ok=False, reason=f"too few measurements ({len(record.step_seconds)} steps, {len(losses)} "
                                        f"held-out losses)")
    if not all(math.isfinite(v) for v in losses):
        bad = next(s for s, v in zip(record.eval_steps, losses) if not math.isfinite(v))
        return Figures(ok=False, reason=f"diverged: held-out loss not finite at step {bad}")
    step_s, compile_s = step_times(record.step_seconds)
    figures = Figures(ok=True, progress=smoothed_progress(record.eval_steps, losses), step_s=step_s,
                      compile_s=compile_s, loss_start=losses[0], loss_end=losses[-1])
    if losses[-1] > divergence_ratio * losses[0]:
        return Figures(False, figures.progress, step_s, compile_s, losses[0], losses[-1],
                       f"diverged: held-out loss rose from {losses[0]:.4g} to {losses[-1]:.4g} (more than "
                       f"{divergence_ratio:g}x)")
    return figures


def split_budget(budget: float, planned_steps: int, candidates: int, min_steps: int, max_steps: int,
                 available: int) -> Tuple[int, int]:
    """How many candidates the budget can try and for how many steps each.

    The candidates together train at most ``floor(budget * planned_steps)`` steps; each gets an equal share,
    at most ``max_steps`` and at most the ``available`` batches. Candidates are dropped from the end of the
    list until each share is at least ``min_steps``.

    Returns:
        ``(kept, steps)``: the first ``kept`` candidates are tried for ``steps`` steps each; ``kept < 2`` means
        no trial fits (then ``steps`` is 0).
    """
    total = int(math.floor(budget * planned_steps + 1e-9))
    kept = candidates
    while kept >= 2:
        steps = min(max_steps, available, total // kept)
        if steps >= min_steps:
            return kept, steps
        kept -= 1
    return kept, 0


#: the estimated run time when no candidate has been measured yet (never stops the trial)
NO_ESTIMATE = 1e30


def time_figures(done: Sequence[Tuple[float, Figures, bool]], planned_steps: int) -> Tuple[float, float, float]:
    r"""What the time budget is judged on, from the candidates tried so far.

    Args:
        done: ``(trial_seconds, figures, reused)`` of each candidate tried: its wall seconds (build, compile,
            steps, held-out losses), its figures on this rank, and whether it ran on the caller's own objects
            so that its compiled step is reused by the run when it is picked (its compile is then no overhead).
        planned_steps: the planned run's steps.

    Returns:
        ``(spent, next_cost, estimated_run)``: the trial's overhead so far (wall seconds, minus the compile of a
        reused candidate), what one more candidate is expected to cost (the dearest trial so far), and the
        planned run's estimated wall seconds with the cheapest measured plan, :math:`\min_c (k_c + N t_c)`
        (:data:`NO_ESTIMATE` when nothing was measured).
    """
    spent = sum(max(0.0, t - (f.compile_s if reused and f.ok else 0.0)) for t, f, reused in done)
    next_cost = max((t for t, _, _ in done), default=0.0)
    runs = [f.compile_s + planned_steps * f.step_s for _, f, _ in done if f.ok]
    return spent, next_cost, min(runs) if runs else NO_ESTIMATE


def over_time_budget(spent: float, next_cost: float, estimated_run: float, budget: float) -> bool:
    """Whether one more candidate would take the trial past ``budget`` times the estimated run:
    ``spent + next_cost > budget * estimated_run``."""
    return spent + next_cost > budget * estimated_run


@dataclass(frozen=True)
class Pick:
    """The decision: ``index`` into the candidates, and a reason per candidate (why picked / not)."""

    index: int
    reasons: Tuple[str, ...]
    measured: bool


def pick(names: Sequence[str], figures: Sequence[Figures], planned_steps: int, tolerance: float,
         fallback: int = 0) -> Pick:
    """Choose among measured candidates (see the module docstring for the rule).

    Args:
        names: candidate names, simplest first.
        figures: their agreed figures.
        planned_steps: the planned run's steps (amortizes compile time).
        tolerance: a simpler candidate within this share of the best score wins.
        fallback: the index chosen when no candidate made progress.
    """
    scores = [f.progress / seconds_per_step(f.step_s, f.compile_s, planned_steps) if f.ok and f.step_s > 0
              else None for f in figures]
    live = [i for i, s in enumerate(scores) if s is not None and s > 0]
    reasons: List[str] = []
    if not live:
        for f in figures:
            reasons.append(f"dropped: {f.reason}" if not f.ok else "no progress on the held-out batches")
        reasons[fallback] = (f"fallback: no candidate reduced the held-out loss; {names[fallback]} trains the run"
                             + (f" (it was dropped: {figures[fallback].reason})" if not figures[fallback].ok else ""))
        return Pick(fallback, tuple(reasons), measured=False)
    best = max(scores[i] for i in live)
    chosen = next(i for i in live if scores[i] >= (1.0 - tolerance) * best)
    for i, (f, s) in enumerate(zip(figures, scores)):
        if i == chosen:
            best_name = names[max(live, key=lambda j: scores[j])]
            reasons.append("picked: best progress per second" if scores[i] == best else
                           f"picked: within {tolerance:.0%} of the best ({best_name}) and simpler")
        elif not f.ok:
            reasons.append(f"dropped: {f.reason}")
        elif s is None or s <= 0:
            reasons.append("no progress on the held-out batches")
        elif i in live and s >= (1.0 - tolerance) * best:
            reasons.append(f"within {tolerance:.0%} of the best, but {names[chosen]} is simpler")
        else:
            reasons.append(f"{s / scores[chosen]:.2f}x the pick's progress per second")
    return Pick(chosen, tuple(reasons), measured=True)


PACKED_FIELDS = ("ok", "progress", "step_s", "compile_s", "loss_start", "loss_end")


def pack(figures: Sequence[Figures]) -> List[float]:
    """This rank's figures as one flat list (:data:`PACKED_FIELDS` per candidate; a dropped one is all zeros), to
    be summed over the ranks."""
    out: List[float] = []
    for f in figures:
        out.extend([1.0, f.progress, f.step_s, f.compile_s, f.loss_start, f.loss_end] if f.ok else
                   [0.0] * len(PACKED_FIELDS))
    return out


def unpack(summed: Sequence[float], local: Sequence[Figures], ranks: int) -> List[Figures]:
    """The agreed figures from the rank sum of :func:`pack`: kept where every rank kept it, values averaged.

    A candidate dropped on another rank only gets the reason ``"dropped on another rank"``.
    """
    width = len(PACKED_FIELDS)
    if len(summed) != width * len(local):
        raise ValueError(f"unpack: {len(summed)} values for {len(local)} candidates.")
    out = []
    for i, mine in enumerate(local):
        row = [float(v) for v in summed[i * width:(i + 1) * width]]
        if round(row[0]) != ranks:
            out.append(Figures(ok=False, reason=mine.reason or f"dropped on {ranks - round(row[0])} other rank(s)"))
            continue
        out.append(Figures(True, *(v / ranks for v in row[1:])))
    return out

r"""The autotune decision, as pure functions of measured numbers (no MindSpore, no communication).

The trial has two phases (:mod:`ms_boost.autotune.engine`); their numbers feed the rule below.

**Probe** (the candidate whose priors predict the shortest run first, then the shortest run predicted from O0's
times as the probes measured them, :func:`o0_scale`, while it is predicted to save time and the budget pays): a few
training steps from the starting weights, timed. From the step times:

* **steady step time** :math:`t_c`: the mean of the steps after the first;
* **compile time** :math:`k_c`: what the first step took beyond :math:`t_c`.

**Progress** (only where the budget still pays for it, and only to compare plans that compute different
functions): the held-out loss :math:`L_c(s)` at a few step counts ``s`` (0 included) over a longer window.

* **progress per step** (smoothed): :math:`p_c = -\mathrm{slope}` of the least-squares line of :math:`L_c`
  against ``s``, so one noisy measurement moves it far less than an end-point difference would;
* **gain** :math:`g_c`: progress per step relative to O0's: :math:`p_c / p_{O0}` where both were measured
  (shrunk towards the prior for a short window, :func:`with_gains`), exactly 1 for a plan computing O0's function
  (``exact_progress``), else the candidate's ``progress_prior``.

**Prediction and pick.** To make the progress the planned run of :math:`N` steps makes with O0, candidate ``c``
needs :math:`N / g_c` steps, so its run is predicted to take

.. math:: R_c = k_c + \frac{N\, t_c}{g_c},

and its **score** is :math:`g_c / (t_c + k_c / N)` (proportional to :math:`1 / R_c`). The pick is the
highest score -- unless a simpler candidate (earlier in the candidate list) scores within ``tolerance`` of it,
which is then preferred. A candidate that failed, whose losses are not finite, or whose held-out loss ended
above ``divergence_ratio`` times its start is dropped with the reason. The pick's trial compiled the very step
the run trains with, so its compile is not paid twice.

**Budget** (:func:`trial_waste`, :func:`over_time_budget`): the trial's *waste* is its wall time minus the
compile of the plan that would be picked now (reused by the run). Before each further probe or progress
measurement, the trial stops when ``waste + next > budget x R``, with ``R`` the predicted run of the best plan so
far and ``next`` what one more is expected to cost. A further probe is also made only when the candidate's whole
predicted run is shorter than what the best plan so far still needs once its compile is paid (:func:`best_left`):
otherwise it cannot save time, whatever the budget. On several ranks the figures are averaged over the ranks
before deciding (a candidate is kept only if it is kept on every rank), so every rank computes the same pick
from the same numbers (:func:`pack` / :func:`unpack`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import List, Optional, Sequence, Tuple

__all__ = ["TrialRecord", "Figures", "smoothed_progress", "step_times", "seconds_per_step", "summarize",
           "with_gains", "PRIOR_STEPS", "predicted_run", "best_run", "best_left", "o0_scale", "prior_figures",
           "trial_waste", "over_time_budget",
           "NO_ESTIMATE", "Pick", "pick", "pack", "unpack", "PACKED_FIELDS"]


@dataclass(frozen=True)
class TrialRecord:
    """What one candidate's trial measured on this rank.

    Attributes:
        eval_steps: step counts at which the held-out loss was measured (ascending, starting at 0; empty when
            only its step time was probed).
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
    """A candidate's figures, and whether it stays in the choice.

    Attributes:
        ok: kept (False: dropped, see ``reason``).
        progress: held-out loss decrease per step (smoothed slope; 0 when not measured).
        step_s: steady seconds per step.
        compile_s: first-step seconds beyond ``step_s``.
        loss_start: held-out loss before the first step (0 when not measured).
        loss_end: held-out loss after the last step (0 when not measured).
        gain: progress per step relative to O0's, as the decision uses it (measured, exact or prior).
        measured: whether ``progress`` was measured.
        reason: why it was dropped ("" when kept).
    """

    ok: bool
    progress: float = 0.0
    step_s: float = 0.0
    compile_s: float = 0.0
    loss_start: float = 0.0
    loss_end: float = 0.0
    gain: float = 1.0
    measured: bool = False
    reason: str = ""


def smoothed_progress(steps: Sequence[float], losses: Sequence[float]) -> float:
    """Loss decrease per step: minus the least-squares slope of ``losses`` over ``steps`` (>= 2 distinct steps).

    Raises:
        ValueError: fewer than 2 pairs, unequal counts, or all steps equal.
    """
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
    """``(steady_seconds, compile_seconds)``: the mean of the steps after the first, and what the first took beyond it.

    The compile is never negative.

    Raises:
        ValueError: fewer than 2 timed steps.
    """
    if len(step_seconds) < 2:
        raise ValueError(f"step_times: need >= 2 timed steps, got {len(step_seconds)}.")
    steady = sum(step_seconds[1:]) / (len(step_seconds) - 1)
    return steady, max(0.0, step_seconds[0] - steady)


def seconds_per_step(step_s: float, compile_s: float, planned_steps: int) -> float:
    r"""Wall seconds per step over a run of ``planned_steps``: :math:`t + k / N`."""
    return step_s + compile_s / max(1, int(planned_steps))


def summarize(record: TrialRecord, divergence_ratio: float, prior: float = 1.0) -> Figures:
    """The :class:`Figures` of one trial on this rank (dropped with a reason when it failed or diverged).

    Args:
        record: the trial's measurements (a probe has no held-out losses: its progress stays unmeasured).
        divergence_ratio: dropped when the held-out loss ends above this multiple of its start.
        prior: the candidate's progress prior, its ``gain`` until :func:`with_gains` sets the measured one.
    """
    if record.error:
        return Figures(ok=False, reason=record.error)
    if len(record.step_seconds) < 2:
        return Figures(ok=False, reason=f"too few measurements ({len(record.step_seconds)} timed steps)")
    step_s, compile_s = step_times(record.step_seconds)
    losses = record.holdout_losses
    if not losses:
        return Figures(ok=True, step_s=step_s, compile_s=compile_s, gain=prior)
    if len(losses) < 2:
        return Figures(ok=False, reason=f"too few measurements ({len(losses)} held-out losses)")
    if not all(math.isfinite(v) for v in losses):
        bad = next(s for s, v in zip(record.eval_steps, losses) if not math.isfinite(v))
        return Figures(ok=False, reason=f"diverged: held-out loss not finite at step {bad}")
    figures = Figures(ok=True, progress=smoothed_progress(record.eval_steps, losses), step_s=step_s,
                      compile_s=compile_s, loss_start=losses[0], loss_end=losses[-1], gain=prior, measured=True)
    if losses[-1] > divergence_ratio * losses[0]:
        return replace(figures, ok=False, reason=f"diverged: held-out loss rose from {losses[0]:.4g} to "
                                                 f"{losses[-1]:.4g} (more than {divergence_ratio:g}x)")
    return figures


#: a progress window of this many steps weighs as much as the progress prior (see :func:`with_gains`)
PRIOR_STEPS = 20


def with_gains(figures: Sequence[Figures], exact: Sequence[bool], priors: Sequence[float],
               window: int = 0) -> List[Figures]:
    r"""``figures`` with the ``gain`` the decision uses: progress per step relative to O0's.

    The reference is the progress measured on a plan computing O0's function (``exact``; all such plans share
    it). An exact plan's gain is 1. Where the reference was measured and positive, a measured candidate's ratio
    :math:`m = p_c / p_{ref}` is combined with its prior :math:`q` in log space, weighted by the window's length
    ``w`` against :data:`PRIOR_STEPS`: :math:`g = \exp(a \ln m + (1 - a) \ln q)`, :math:`a = w / (w + 20)` -- a few
    early steps say little about a whole run (LessBN and freezing start slower and catch up), a long window
    decides. A measured ratio <= 0 (no progress) is the gain as it is. An unmeasured candidate keeps its prior;
    without a positive reference every gain is the prior: measured progress cannot be put on O0's scale.
    """
    refs = [f.progress for f, e in zip(figures, exact) if e and f.ok and f.measured]
    ref = sum(refs) / len(refs) if refs else 0.0
    weight = window / (window + PRIOR_STEPS) if window > 0 else 1.0
    out = []
    for f, e, prior in zip(figures, exact, priors):
        if e:
            gain = 1.0
        elif f.measured and ref > 0:
            ratio = f.progress / ref
            gain = ratio if ratio <= 0 else math.exp(weight * math.log(ratio) + (1 - weight) * math.log(prior))
        else:
            gain = float(prior)
        out.append(replace(f, gain=gain))
    return out


def predicted_run(f: Figures, planned_steps: int) -> Optional[float]:
    r"""Predicted wall seconds of the planned run with this plan, :math:`k + N t / g` (None: dropped or no gain)."""
    if not f.ok or f.gain <= 0:
        return None
    return f.compile_s + planned_steps * f.step_s / f.gain


#: the predicted run time when no candidate has been measured yet (never stops the trial)
NO_ESTIMATE = 1e30


def best_run(figures: Sequence[Figures], planned_steps: int) -> Tuple[Optional[int], float]:
    """``(index, seconds)`` of the smallest :func:`predicted_run` (``(None, NO_ESTIMATE)`` when none)."""
    runs = [(r, i) for i, f in enumerate(figures) if (r := predicted_run(f, planned_steps)) is not None]
    if not runs:
        return None, NO_ESTIMATE
    seconds, index = min(runs)
    return index, seconds


def o0_scale(figures: Sequence[Figures], compile_priors: Sequence[float],
             step_priors: Sequence[float]) -> Optional[Tuple[float, float]]:
    r"""O0's compile and steady step time as the probes so far measured them: ``(K, T)`` or None (none probed).

    Each probed candidate ``c`` (kept, with a step time) says :math:`K = k_c / \kappa_c` and :math:`T = t_c / \tau_c`
    through its compile and step priors; the estimate is the mean over them. Scaled by a candidate's priors it
    predicts that candidate's figures before it is probed (:func:`prior_figures`).
    """
    pairs = [(f.compile_s / kappa, f.step_s / tau) for f, kappa, tau in zip(figures, compile_priors, step_priors)
             if f.ok and f.step_s > 0 and kappa > 0 and tau > 0]
    if not pairs:
        return None
    return sum(k for k, _ in pairs) / len(pairs), sum(t for _, t in pairs) / len(pairs)


def prior_figures(compile_prior: float, step_prior: float, progress_prior: float,
                  scale: Tuple[float, float]) -> Figures:
    """The figures a candidate is predicted to measure: its priors times O0's ``(compile, step)`` ``scale``."""
    return Figures(ok=True, compile_s=compile_prior * scale[0], step_s=step_prior * scale[1], gain=progress_prior)


def best_left(figures: Sequence[Figures], planned_steps: int) -> float:
    """What the best plan so far still needs once its compile is paid: its predicted run minus its compile.

    A probe of another plan saves time only when that plan's whole predicted run (its compile included) is shorter:
    the best plan's step is already compiled. :data:`NO_ESTIMATE` when nothing is scored.
    """
    index, seconds = best_run(figures, planned_steps)
    return NO_ESTIMATE if index is None else seconds - figures[index].compile_s


def trial_waste(seconds_spent: float, figures: Sequence[Figures], planned_steps: int) -> float:
    """The trial's overhead so far: its wall seconds minus the compile of the best plan so far.

    That plan's trial compiled the step the run would train with, so its compile is not lost.
    """
    index, _ = best_run(figures, planned_steps)
    return max(0.0, seconds_spent - (figures[index].compile_s if index is not None else 0.0))


def over_time_budget(waste: float, next_cost: float, estimated_run: float, budget: float) -> bool:
    """Whether one more probe or measurement would take the waste past ``budget`` x the run.

    The test is ``waste + next_cost > budget * estimated_run``.
    """
    return waste + next_cost > budget * estimated_run


@dataclass(frozen=True)
class Pick:
    """The decision: ``index`` into the candidates, and a reason per candidate (why picked / not)."""

    index: int
    reasons: Tuple[str, ...]
    measured: bool


def _score(f: Figures, planned_steps: int) -> Optional[float]:
    if not f.ok or f.step_s <= 0:
        return None
    return f.gain / seconds_per_step(f.step_s, f.compile_s, planned_steps)


def pick(names: Sequence[str], figures: Sequence[Figures], planned_steps: int, tolerance: float,
         fallback: int = 0) -> Pick:
    """Choose among measured candidates (see the module docstring for the rule).

    Args:
        names: candidate names, simplest first.
        figures: their agreed figures, gains set (:func:`with_gains`).
        planned_steps: the planned run's steps (amortizes compile time).
        tolerance: a simpler candidate within this share of the best score wins.
        fallback: the index chosen when no candidate can be scored.
    """
    scores = [_score(f, planned_steps) for f in figures]
    live = [i for i, s in enumerate(scores) if s is not None and s > 0]
    reasons: List[str] = []
    if not live:
        for f in figures:
            reasons.append(f"dropped: {f.reason}" if not f.ok else "no progress on the held-out batches")
        reasons[fallback] = (f"fallback: no candidate could be scored; {names[fallback]} trains the run"
                             + (f" (it was dropped: {figures[fallback].reason})" if not figures[fallback].ok else ""))
        return Pick(fallback, tuple(reasons), measured=False)
    best = max(s for s in scores if s is not None)
    chosen = next(i for i in live if (scores[i] or 0.0) >= (1.0 - tolerance) * best)
    chosen_score = scores[chosen] or best
    best_name = names[max(live, key=lambda j: scores[j] or 0.0)]
    for i, (f, s) in enumerate(zip(figures, scores)):
        if i == chosen:
            reasons.append("picked: best predicted time" if s == best else
                           f"picked: within {tolerance:.0%} of the best ({best_name}) and simpler")
        elif not f.ok:
            reasons.append(f"dropped: {f.reason}")
        elif s is None or s <= 0:
            reasons.append("no progress on the held-out batches")
        elif s >= (1.0 - tolerance) * best:
            reasons.append(f"within {tolerance:.0%} of the best, but {names[chosen]} is simpler")
        else:
            reasons.append(f"{s / chosen_score:.2f}x the pick's progress per second")
    return Pick(chosen, tuple(reasons), measured=True)


PACKED_FIELDS = ("ok", "progress", "step_s", "compile_s", "loss_start", "loss_end", "gain", "measured")


def pack(figures: Sequence[Figures]) -> List[float]:
    """This rank's figures as one flat list (:data:`PACKED_FIELDS` per candidate; a dropped one all zeros).

    The lists of the ranks are summed by one all-reduce.
    """
    out: List[float] = []
    for f in figures:
        out.extend([1.0, f.progress, f.step_s, f.compile_s, f.loss_start, f.loss_end, f.gain, float(f.measured)]
                   if f.ok else [0.0] * len(PACKED_FIELDS))
    return out


def unpack(summed: Sequence[float], local: Sequence[Figures], ranks: int) -> List[Figures]:
    """The agreed figures from the rank sum of :func:`pack`: kept where every rank kept it, values averaged.

    A candidate dropped on another rank only gets the reason ``"dropped on N other rank(s)"``.

    Raises:
        ValueError: ``summed`` does not hold :data:`PACKED_FIELDS` for each of ``local``.
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
        progress, step_s, compile_s, start, end, gain = (v / ranks for v in row[1:7])
        out.append(Figures(True, progress, step_s, compile_s, start, end, gain, round(row[7]) == ranks))
    return out

"""The autotune report: every candidate's figures, the pick, the reason for each drop; as a table and a YAML."""
from __future__ import annotations

import datetime
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

import yaml

from ms_boost.autotune.decide import Figures, predicted_run, seconds_per_step

__all__ = ["CandidateResult", "AutotuneReport", "plain_data"]


@dataclass(frozen=True)
class CandidateResult:
    """One candidate in the report.

    Attributes:
        name: the candidate's name.
        description: what the plan is, one line.
        level: the boost level of its plan.
        boost_config_dict: its plan's ``boost_config_dict`` in this run.
        figures: the figures agreed over the ranks (:class:`~ms_boost.autotune.decide.Figures`).
        steps: steps it trained in the trial (0: not tried).
        trial_seconds: wall seconds its trial took on this rank (build, compile, steps, held-out losses).
        reason: why it was picked, not picked, or dropped.
        gain_from: where its gain (progress per step relative to O0's) comes from: ``measured``, ``exact`` (it
            computes O0's function), ``prior`` (its progress prior), or ``-`` (dropped).
    """

    name: str
    description: str
    level: str
    boost_config_dict: Dict[str, Any]
    figures: Figures
    steps: int
    trial_seconds: float
    reason: str
    gain_from: str = "-"

    def score(self, planned_steps: int) -> Optional[float]:
        """Progress per wall second over the planned run, in O0's progress per step (None when dropped)."""
        f = self.figures
        if not f.ok or f.step_s <= 0:
            return None
        return f.gain / seconds_per_step(f.step_s, f.compile_s, planned_steps)

    def run_seconds(self, planned_steps: int) -> Optional[float]:
        """Predicted wall seconds of the planned run with this plan (:func:`~ms_boost.autotune.decide.predicted_run`).

        Its compile plus the steps that make the planned run's progress.
        """
        return predicted_run(self.figures, planned_steps)


@dataclass(frozen=True)
class AutotuneReport:
    """What an autotune trial measured and chose.

    Attributes:
        candidates: every candidate considered, in list order.
        pick: name of the chosen candidate.
        level: the chosen plan's boost level.
        boost_config_dict: the chosen plan, fully resolved (``boost.mode: manual`` with every switch), so
            ``Model(..., boost_level=level, boost_config_dict=...)`` -- or the saved YAML file -- reproduces it
            without a trial.
        measured: False when the pick was not decided by measurement (budget too small, nothing could be scored).
        planned_steps: steps of the planned run.
        trial_steps: training steps the whole trial took (probes and progress measurements).
        budget: the share of the planned run the trial could spend.
        trial_seconds: wall seconds of the whole trial on this rank.
        ranks: ranks that agreed on the pick.
        notes: lines about the trial as a whole (budget, progress measurement, fallback).
        saved_to: path of the YAML written, if any.
        trial_run: the pick's :class:`~ms_boost.autotune.engine.TrialRun` put back at the starting state (its
            ``train_cell`` was compiled by the trial: the run trains with it instead of compiling the same step
            again); None when the pick was not built by the trial.
    """

    candidates: Tuple[CandidateResult, ...]
    pick: str
    level: str
    boost_config_dict: Dict[str, Any]
    measured: bool
    planned_steps: int
    trial_steps: int
    budget: float
    trial_seconds: float
    ranks: int = 1
    notes: Tuple[str, ...] = ()
    saved_to: Optional[str] = field(default=None, compare=False)
    trial_run: Any = field(default=None, compare=False, repr=False)

    @property
    def overhead_seconds(self) -> float:
        """The trial's cost to the run: its wall time minus the pick's compile when the run reuses the pick's step."""
        if self.trial_run is None:
            return self.trial_seconds
        pick = self.candidate(self.pick).figures
        return max(0.0, self.trial_seconds - (pick.compile_s if pick.ok else 0.0))

    @property
    def train_network(self) -> Any:
        """The pick's train cell compiled by the trial (None when the trial did not build it)."""
        return None if self.trial_run is None else self.trial_run.train_cell

    def candidate(self, name: str) -> CandidateResult:
        """The result of candidate ``name``."""
        for result in self.candidates:
            if result.name == name:
                return result
        raise KeyError(f"no candidate {name!r} in this report; candidates: {[c.name for c in self.candidates]}.")

    def table(self) -> str:
        """The candidates' figures as a text table, with a heading line stating the budget."""
        n = self.planned_steps
        head = (f"autotune: {len(self.candidates)} candidate(s), {self.trial_steps} trial steps in all; budget "
                f"{self.budget:.1%} of the {n} planned steps = {int(self.budget * n + 1e-9)} steps; trial took "
                f"{self.trial_seconds:.1f} s on {self.ranks} rank(s)")
        run = self.candidate(self.pick).run_seconds(n)
        if run:
            head += f" ({self.trial_seconds / run:.1%} of the pick's predicted {run:.0f} s run)"
        rows = [("candidate", "step ms", "compile s", "gain", "held-out loss", "run pred. s", "trial s", "result")]
        for c in self.candidates:
            f = c.figures
            run_s = c.run_seconds(n)
            rows.append((c.name, f"{f.step_s * 1e3:.1f}" if f.ok else "-", f"{f.compile_s:.2f}" if f.ok else "-",
                         f"{f.gain:.2f} ({c.gain_from})" if f.ok else "-",
                         f"{f.loss_start:.4f} -> {f.loss_end:.4f}" if f.ok and f.measured else "-",
                         f"{run_s:.1f}" if run_s is not None else "-", f"{c.trial_seconds:.1f}", c.reason))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
        lines = [head] + ["  " + "  ".join(v.ljust(w) for v, w in zip(r[:-1], widths)) + "  " + r[-1] for r in rows]
        lines += [f"  note: {note}" for note in self.notes]
        lines.append(f"  pick: {self.pick} -> boost_level {self.level}")
        return "\n".join(lines)

    def to_yaml(self) -> str:
        """The pick as a ``boost_config_dict`` YAML, the table above it as comments."""
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        header = [f"ms_boost autotune pick: {self.pick} (boost_level {self.level}), measured {stamp}",
                  f"Reuse without a trial: Model(..., boost_level=\"{self.level}\", boost_config_dict=<this file>)",
                  "or the model zoo's train.py --boost_level auto --autotune.plan <this file>.", ""]
        header += self.table().splitlines()
        body = yaml.safe_dump(plain_data(self.boost_config_dict), sort_keys=False, default_flow_style=False)
        return "".join(f"# {line}".rstrip() + "\n" for line in header) + body

    def save(self, path: str) -> str:
        """Write :meth:`to_yaml` to ``path`` (a temporary name renamed into place); returns the path."""
        path = os.fspath(path)
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".autotune-", suffix=".yaml", dir=folder)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(self.to_yaml())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return path


def plain_data(value: Any) -> Any:
    """``value`` with tuples turned into lists and mappings into dicts (what ``yaml.safe_dump`` writes)."""
    if isinstance(value, dict):
        return {k: plain_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_data(v) for v in value]
    return value

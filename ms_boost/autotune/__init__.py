"""Autotune: pick the boost plan from a short measured trial (``boost_level="auto"``).

Layout (math apart from plumbing, as the rest of ms_boost):

* :mod:`~ms_boost.autotune.options` -- the ``autotune`` options (budget, candidates, ...), validated;
* :mod:`~ms_boost.autotune.candidates` -- the named plans a trial can try, and :func:`register_candidate`;
* :mod:`~ms_boost.autotune.decide` -- pure decision logic: smoothed progress, step and compile time, budget
  split, the pick, packing the figures for the ranks' agreement;
* :mod:`~ms_boost.autotune.engine` -- the trial (:func:`run_trials`), given a ``build(plan)`` function;
* :mod:`~ms_boost.autotune.cells` -- Cell plumbing: copies of the starting objects, batches, the held-out loss;
* :mod:`~ms_boost.autotune.report` -- :class:`AutotuneReport` (table, YAML).

Users call ``Model(..., boost_level="auto")`` or :func:`ms_boost.autotune_plan`; see ``docs/autotune.md``.
"""
from __future__ import annotations

from ms_boost.autotune.candidates import (
    Candidate,
    TrialContext,
    candidate_names,
    default_candidates,
    register_candidate,
    unregister_candidate,
)
from ms_boost.autotune.cells import (
    CellTrialRun,
    TrialBatches,
    batch_size_of,
    clone_for_trial,
    count_conv2d,
    take_batches,
)
from ms_boost.autotune.decide import Figures, TrialRecord
from ms_boost.autotune.engine import TrialRun, run_trials
from ms_boost.autotune.options import AutotuneOptions, parse_options
from ms_boost.autotune.report import AutotuneReport, CandidateResult

__all__ = [
    "AutotuneOptions", "parse_options", "Candidate", "TrialContext", "candidate_names", "default_candidates",
    "register_candidate", "unregister_candidate", "CellTrialRun", "clone_for_trial", "take_batches",
    "TrialBatches", "batch_size_of", "count_conv2d", "Figures", "TrialRecord", "TrialRun", "run_trials",
    "AutotuneReport", "CandidateResult",
]

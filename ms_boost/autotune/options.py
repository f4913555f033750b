"""The ``autotune`` options: how long the trial may take, which plans it tries, where it writes the pick.

Given as the ``autotune`` section of ``boost_config_dict`` with ``boost_level="auto"`` (or as a dict to
:func:`ms_boost.autotune_plan`). Every value is checked here; a bad one raises naming ``autotune.<key>``,
the value and what is allowed.
"""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass, fields
from typing import Any, Dict, Mapping, Optional, Tuple

from ms_boost.autotune.candidates import get_candidate
from ms_boost.validation import (
    BoostConfigError,
    check_bool,
    check_float,
    check_int,
    check_optional_path,
    load_mapping_file,
    short_repr,
)

__all__ = ["AutotuneOptions", "parse_options", "split_auto_config", "AUTO_LEVEL"]


@dataclass(frozen=True)
class AutotuneOptions:
    """Options of one autotune trial.

    Attributes:
        budget: share of the planned run's training steps the trial may spend, in (0, 1) (default 0.05: the
            candidates together train at most 5% of the run's steps).
        candidates: names of the plans to try, in order of preference (simplest first); empty: the default
            list for the run (:func:`ms_boost.autotune.candidates.default_candidates`).
        holdout_batches: batches kept out of the trial's training, on which progress is measured (>= 1).
        eval_points: how many times during a progress measurement the held-out loss is measured (>= 2; the loss
            before the first step is measured too).
        probe_steps: steps of each candidate's probe, which measures its compile and step time (>= 2: the first
            step compiles).
        min_trial_steps: fewest steps of a progress measurement (>= 2); progress is measured only when the
            budget gives at least this many to the reference and one more candidate.
        max_trial_steps: most steps of a progress measurement (the trial's batches are kept in memory).
        tolerance: a simpler candidate (earlier in the list) within this share of the best score is picked
            instead of the best, in [0, 1) (measurement noise should not buy complexity).
        divergence_ratio: a candidate whose held-out loss ends above this multiple of its start is dropped as
            diverged (> 1).
        save_path: where the pick is written as a ``boost_config_dict`` YAML (None: not written).
        time_budget: also stop when one more probe or progress measurement would take the trial's waste past
            ``budget`` times the predicted run (:func:`~ms_boost.autotune.decide.over_time_budget`); False: only
            the step budget bounds the trial.
        measure_progress: measure held-out progress to compare plans computing different functions when the
            budget pays for it; False: step times and the candidates' progress priors decide.
    """

    budget: float = 0.05
    candidates: Tuple[str, ...] = ()
    holdout_batches: int = 2
    eval_points: int = 4
    probe_steps: int = 3
    min_trial_steps: int = 4
    max_trial_steps: int = 50
    tolerance: float = 0.02
    divergence_ratio: float = 1.5
    save_path: Optional[str] = None
    time_budget: bool = True
    measure_progress: bool = True

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "budget", check_float("autotune.budget", self.budget, low=0.0, high=1.0, low_open=True,
                                         high_open=True))
        set_(self, "candidates", _names(self.candidates))
        set_(self, "holdout_batches", check_int("autotune.holdout_batches", self.holdout_batches, low=1))
        set_(self, "eval_points", check_int("autotune.eval_points", self.eval_points, low=2))
        set_(self, "probe_steps", check_int("autotune.probe_steps", self.probe_steps, low=2))
        set_(self, "min_trial_steps", check_int("autotune.min_trial_steps", self.min_trial_steps, low=2))
        set_(self, "max_trial_steps", check_int("autotune.max_trial_steps", self.max_trial_steps,
                                                low=self.min_trial_steps))
        set_(self, "tolerance", check_float("autotune.tolerance", self.tolerance, low=0.0, high=1.0, high_open=True))
        set_(self, "divergence_ratio", check_float("autotune.divergence_ratio", self.divergence_ratio, low=1.0,
                                                   low_open=True))
        set_(self, "save_path", check_optional_path("autotune.save_path", self.save_path))
        if self.save_path is not None and os.path.isdir(self.save_path):  # found only when the pick is written
            raise BoostConfigError(f"boost config autotune.save_path={short_repr(self.save_path)} is a folder; "
                                   f"allowed: the path of a file to write the pick to, e.g. "
                                   f"{short_repr(os.path.join(self.save_path, 'autotune.yaml'))}.")
        set_(self, "time_budget", check_bool("autotune.time_budget", self.time_budget))
        set_(self, "measure_progress", check_bool("autotune.measure_progress", self.measure_progress))


def _names(value: Any) -> Tuple[str, ...]:
    if isinstance(value, str) and "," in value:  # "O0, O1": one string, not the list it looks like
        names = [name.strip() for name in value.split(",")]
        raise TypeError(f"boost config autotune.candidates={short_repr(value)} is one string; give a list of candidate "
                        f"names, e.g. {names!r}.")
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        raise TypeError(f"boost config autotune.candidates={short_repr(value)} must be a list of candidate names.")
    if len(set(value)) != len(value):
        raise BoostConfigError(f"boost config autotune.candidates={short_repr(list(value))} names a candidate twice.")
    for name in value:
        get_candidate(name)  # an unknown name raises, listing the allowed ones
    return tuple(value)


_KEYS = tuple(f.name for f in fields(AutotuneOptions))


def parse_options(section: Any) -> AutotuneOptions:
    """:class:`AutotuneOptions` from the ``autotune`` section (None or a mapping; an options object as is).

    Raises:
        BoostConfigError: an unknown key (the allowed ones are listed) or a value out of range.
        TypeError: the section is not a mapping, or a value of the wrong type.
    """
    if isinstance(section, AutotuneOptions):
        return section
    if section is None:
        return AutotuneOptions()
    if not isinstance(section, Mapping):
        raise TypeError(f"boost config section 'autotune' must be a dict, got {short_repr(section)}.")
    unknown = sorted(str(k) for k in section if k not in _KEYS)
    if unknown:
        raise BoostConfigError(f"unknown boost config key(s) {['autotune.' + k for k in unknown]}; allowed keys: "
                               f"{list(_KEYS)}.")
    return AutotuneOptions(**dict(section))


AUTO_LEVEL = "auto"


_SAVED_PICK = ("; a saved pick (its 'boost' section is manual, with every switch) is reused without a trial as "
               "Model(..., boost_level='O0', boost_config_dict=<the file>), in the model zoo --boost_level auto "
               "--autotune.plan <the file>")


def split_auto_config(boost_config_dict: Any) -> Tuple[AutotuneOptions, Dict[str, Any]]:
    """The ``boost_config_dict`` of ``boost_level="auto"``: ``(options, algorithm sections)``.

    It may hold an ``autotune`` section (:class:`AutotuneOptions`) and algorithm sections, whose values every
    candidate enabling that algorithm uses (e.g. ``grad_freeze.param_groups``). The candidates choose the
    switches, so a ``boost`` section may only say ``mode: auto``.

    Args:
        boost_config_dict: None, a mapping, or a path to a YAML/JSON file.

    Raises:
        BoostConfigError: a ``boost`` section with switches or another mode; a bad ``autotune`` value.
        TypeError: not a mapping or a path.
    """
    if boost_config_dict is None or boost_config_dict == "":
        raw: Dict[str, Any] = {}
    elif isinstance(boost_config_dict, (str, os.PathLike)):
        raw = load_mapping_file(boost_config_dict, "boost_config_dict file")
    elif isinstance(boost_config_dict, Mapping):
        raw = copy.deepcopy(dict(boost_config_dict))
    else:
        raise TypeError(f"boost_config_dict must be a dict, a path to a YAML/JSON file, or None; got "
                        f"{short_repr(boost_config_dict)} ({type(boost_config_dict).__name__}).")
    boost = raw.pop("boost", None) or {}
    if not isinstance(boost, Mapping) or any(k != "mode" for k in boost) or boost.get("mode", "auto") != "auto":
        hint = _SAVED_PICK if isinstance(boost, Mapping) and boost.get("mode") == "manual" else ""
        raise BoostConfigError(f"boost config 'boost'={short_repr(boost)} is not allowed with boost_level='auto': "
                               f"the autotune chooses the switches (allowed: no 'boost' section, or "
                               f"{{'mode': 'auto'}}); give a fixed boost_level to set them yourself{hint}.")
    return parse_options(raw.pop("autotune", None)), raw

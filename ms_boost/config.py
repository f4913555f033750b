"""Boost configuration: the one place that parses and validates what the user asked for.

``AutoBoost(level, boost_config_dict)`` merges the level's defaults with the user's dict (or a YAML /
JSON file) into an immutable, typed configuration. Every key is checked: an unknown level, mode,
section or key, a wrong type or an out-of-range value raises ``ValueError`` (``TypeError`` for a
wrong type) naming the path (``dim_reduce.n_components``), the value, and what is allowed.

Unlike upstream ``mindspore.boost.AutoBoost`` this is not a singleton: two instances with different
levels coexist, and nothing here is mutated after construction. The plan applies nothing: the pipeline
(:mod:`ms_boost.pipeline`) builds the rewrites and the train step from it, and ``ms_boost.AutoBoost``
(:mod:`ms_boost.compat`) adds upstream's ``network_auto_process_train`` / ``network_auto_process_eval``.
This module imports the registry, the spec types, the topology and validation only.
"""
from __future__ import annotations

import copy
import os
import warnings
import weakref
from types import MappingProxyType
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from ms_boost import registry
from ms_boost.spec import AlgorithmSpec, BuildContext, CommonConfig, build_section, call_hook, section_dict, single_hook
from ms_boost.topology import Topology
from ms_boost.validation import BoostConfigError, check_bool, load_mapping_file, short_repr

# LEVELS and SWITCHES are read from the registry on access (module __getattr__ below)
__all__ = ["AutoBoost", "BoostConfigError", "MODES", "CommonConfig", "describe_steps", "resolve"]

MODES = ("auto", "manual", "enable_all", "disable_all")
_LEVEL_NAMES = ("O0", "O1", "O2")


def __getattr__(name: str) -> Any:
    """``SWITCHES`` and ``LEVELS``, read from the registry when asked (never dependent on import order).

    ``SWITCHES``: the built-in switches, in upstream's order (registered algorithms add their own names).
    ``LEVELS``: the built-in switches each level turns on, a read-only view (a registered spec lists its own
    levels).
    """
    builtins = registry.builtin_specs()
    if name == "SWITCHES":
        return tuple(spec.name for spec in builtins)
    if name == "LEVELS":
        return MappingProxyType({level: MappingProxyType({spec.name: level in spec.levels for spec in builtins})
                                 for level in _LEVEL_NAMES})
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _load_dict(boost_config_dict: Any) -> Dict[str, Any]:
    """Accept None/"" (nothing), a mapping, or a path to a YAML / JSON file."""
    if boost_config_dict is None or boost_config_dict == "":
        return {}
    if isinstance(boost_config_dict, (str, os.PathLike)):
        return copy.deepcopy(load_mapping_file(boost_config_dict, "boost_config_dict file"))
    if isinstance(boost_config_dict, Mapping):
        return copy.deepcopy(dict(boost_config_dict))
    raise TypeError(f"boost_config_dict must be a dict, a path to a YAML/JSON file, or None; "
                    f"got {short_repr(boost_config_dict)} ({type(boost_config_dict).__name__}).")


class AutoBoost:
    """Resolved boost plan for one training run.

    Args:
        level: ``"O0"`` (nothing), ``"O1"`` (LessBN + gradient freezing) or ``"O2"`` (O1 + AdaSum).
        boost_config_dict: dict, path to a YAML/JSON file, or None. Sections: ``boost`` (``mode`` and the
            switches ``less_bn``, ``grad_freeze``, ``adasum``, ``grad_accumulation``, ``dim_reduce``,
            ``loss_scale_group``, ``thor``), ``common``, and one section per algorithm.

    Modes: ``auto`` takes the switches from ``level``; ``manual`` starts from the level and applies the
    user's switches; ``enable_all`` turns on every combinable algorithm; ``disable_all`` turns all off.

    Exclusivity: ``dim_reduce`` and ``thor`` each replace the optimizer and run alone; when one is on,
    the others are switched off with a warning naming them (dim_reduce wins over thor).

    Attributes:
        level: the boost level.
        mode: the boost mode.
        boost_config: switch name -> bool (upstream's attribute name), a read-only mapping.
        common, less_bn, grad_freeze, grad_accumulation, adasum, dim_reduce, loss_scale_group, thor:
            frozen section dataclasses.

    Raises:
        ValueError: unknown level, mode, section or key; a value out of range.
        TypeError: a value of the wrong type.
    """

    def __init__(self, level: str = "O0", boost_config_dict: Any = None):
        if not isinstance(level, str):
            raise TypeError(f"boost_level must be a str, one of {list(_LEVEL_NAMES)}; got {short_repr(level)} "
                            f"({type(level).__name__}).")
        if level not in _LEVEL_NAMES:
            raise BoostConfigError(f"boost_level={short_repr(level)} is not a boost level; allowed: "
                                   f"{list(_LEVEL_NAMES)}, or 'auto' for ms_boost.Model (a measured trial picks "
                                   f"the plan).")
        self.specs: Tuple[AlgorithmSpec, ...] = registry.specs()  # snapshot: later registrations change nothing
        self._by_name = {spec.name: spec for spec in self.specs}
        names = tuple(self._by_name)
        raw = _load_dict(boost_config_dict)
        self._raw = raw
        unknown = sorted((k for k in raw if k not in self._by_name and k not in ("boost", "common")), key=str)
        if unknown:
            raise BoostConfigError(f"unknown boost config section(s) {short_repr(unknown)}; allowed sections: "
                                   f"{['boost', 'common', *names]}.")
        boost_section = raw.get("boost") or {}
        if not isinstance(boost_section, Mapping):
            raise TypeError(f"boost config section 'boost' must be a dict, got {short_repr(boost_section)}.")
        mode = boost_section.get("mode", "auto")
        if not isinstance(mode, str) or mode not in MODES:
            raise BoostConfigError(f"boost config 'boost.mode'={short_repr(mode)} is not allowed; allowed: "
                                   f"{list(MODES)}.")
        user_switches = {}
        for key, value in boost_section.items():
            if key == "mode":
                continue
            if key not in self._by_name:
                shown = key if isinstance(key, str) and len(key) <= 80 else short_repr(key)
                raise BoostConfigError(f"unknown boost config key 'boost.{shown}'; allowed keys: "
                                       f"{['mode', *names]}.")
            user_switches[key] = check_bool(f"boost.{key}", value)

        self.level = level
        self.mode = mode
        self.notes: List[str] = []  # human-readable record of every adjustment made while resolving
        switches = {spec.name: level in spec.levels for spec in self.specs}
        if mode == "manual":
            switches.update(user_switches)
        elif user_switches:
            # Not silently ignored: the user's switches only act in manual mode, as upstream documents.
            self._note(f"boost.mode={mode!r} ignores the switches {sorted(user_switches)}; set "
                       f"boost.mode='manual' to use them", warn=True)
        if mode == "enable_all":
            switches = {spec.name: spec.in_enable_all for spec in self.specs}
            left = [spec.name for spec in self.specs if not spec.in_enable_all]
            self._note(f"enable_all turns on every combinable algorithm; {left} must be enabled in manual mode")
        elif mode == "disable_all":
            switches = dict.fromkeys(names, False)
        self._apply_exclusivity(switches, explicit=user_switches if mode == "manual" else {})
        self._switches: Dict[str, bool] = dict(switches)
        #: switch name -> bool (upstream's attribute name); a read-only view: the plan never changes after __init__
        self.boost_config: Mapping[str, bool] = MappingProxyType(self._switches)

        self.common = build_section("common", CommonConfig, raw.get("common"))
        self.sections: Dict[str, Any] = {}
        for spec in self.specs:
            section = build_section(spec.name, spec.section, raw.get(spec.name))
            self.sections[spec.name] = section
            setattr(self, spec.name, section)
            if spec.name in raw and not switches[spec.name]:
                self._note(f"section '{spec.name}' is given but the '{spec.name}' algorithm is off; its values "
                           f"are validated and unused", warn=False)
        for spec in self.specs:
            if switches[spec.name] and spec.warn_config is not None:
                text = spec.warn_config(self.sections[spec.name])
                if text:
                    self._note(text, warn=True)

    # -- resolution helpers ------------------------------------------------------------------------
    def _note(self, text: str, warn: bool = True) -> None:
        """Record a note for :meth:`summary` (logged when training starts).

        ``warn``: also warn now (the user asked for something that does not happen).
        """
        self.notes.append(text)
        if warn:
            warnings.warn(f"ms_boost: {text}", UserWarning, stacklevel=3)

    def _apply_exclusivity(self, switches: Dict[str, bool], explicit: Mapping[str, bool]) -> None:
        """Switch off what the enabled specs exclude.

        A spec that runs alone (dim_reduce before thor: lower order first) switches every other off; a spec's
        ``excludes`` switch those off. Switching off what the user asked for explicitly warns; switching off what
        only came from the level's defaults is noted in the summary.
        """
        ordered = sorted(self.specs, key=lambda spec: spec.order)
        for spec in ordered:
            if switches.get(spec.name) and spec.runs_alone:
                self._switch_off(switches, explicit, spec.name, [k for k, v in switches.items()
                                                                 if v and k != spec.name], "runs alone")
                return
        for spec in ordered:
            if switches.get(spec.name) and spec.excludes:
                self._switch_off(switches, explicit, spec.name, [k for k in spec.excludes if switches.get(k)],
                                 f"excludes {list(spec.excludes)}")

    def _switch_off(self, switches, explicit, name: str, others, why: str) -> None:
        others = sorted(others)
        for k in others:
            switches[k] = False
        asked = [k for k in others if explicit.get(k)]
        if asked:
            self._note(f"'{name}' {why}: switched off {asked} (requested in boost_config_dict)", warn=True)
        if len(asked) < len(others):
            self._note(f"'{name}' {why}: switched off {sorted(set(others) - set(asked))} "
                       f"(level {self.level} defaults)", warn=False)

    # -- queries -----------------------------------------------------------------------------------
    def enabled(self, name: str) -> bool:
        """Whether the algorithm ``name`` (a registered algorithm, :data:`SWITCHES` for the built-ins) runs."""
        if name not in self.boost_config:
            raise BoostConfigError(f"unknown boost algorithm {short_repr(name)}; known: {list(self.boost_config)}.")
        return bool(self.boost_config[name])

    def enabled_specs(self) -> Tuple[AlgorithmSpec, ...]:
        """The specs of the enabled algorithms, in pipeline order."""
        return tuple(sorted((s for s in self.specs if self._switches[s.name]), key=lambda s: s.order))

    def section(self, name: str):
        """The validated section of algorithm ``name``."""
        if name not in self.sections:
            raise BoostConfigError(f"unknown boost algorithm {short_repr(name)}; known: {list(self.sections)}.")
        return self.sections[name]

    @property
    def is_active(self) -> bool:
        """True when at least one algorithm runs."""
        return any(self.boost_config.values())

    def to_dict(self) -> Dict[str, Any]:
        """The fully resolved configuration as plain data (what would reproduce this plan)."""
        out: Dict[str, Any] = {"boost": {"mode": "manual", **self.boost_config}, "common": section_dict(self.common)}
        for name, section in self.sections.items():
            out[name] = section_dict(section)
        return out

    def summary(self, ranks: Optional[int] = None) -> str:
        """A readable summary of the resolved plan: which stages run, with which values.

        The pipeline line is derived from the enabled specs (:func:`ms_boost.pipeline.describe_steps`), the
        same list the train cell is built from.

        Args:
            ranks: the number of data-parallel ranks the plan runs on; ``None`` reads it from MindSpore's
                parallel context (1 when communication is not initialised or not in data-parallel mode).
                The gradient-reduction step is described for that many ranks (AdaSum needs more than one
                server; ``common.device_number`` is capped at the rank count, as the train cell does).
        """
        if ranks is None:
            here = Topology.current(self.common.device_number)
            ranks = here.degree if here.data_parallel else 1
        if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
            raise ValueError(f"summary(ranks={short_repr(ranks)}): ranks must be an int >= 1.")
        topology = Topology.current(self.common.device_number, size=ranks)
        on = [spec.name for spec in self.specs if self._switches[spec.name]]
        lines = [f"ms_boost plan: level={self.level} mode={self.mode} -> "
                 f"{', '.join(on) if on else 'no boost algorithm (plain training step)'}"]
        lines.append(f"  common: {section_dict(self.common)}")
        for name in on:
            values = section_dict(self.sections[name])
            lines.append(f"  {name}: {values if values else '(no options)'}")
        lines.append("  pipeline: " + describe_steps(self, topology))
        notes = list(self.notes)
        if topology.note and any(spec.reducer is not None for spec in self.enabled_specs()):  # servers matter
            notes.append(topology.note)
        for note in notes:
            lines.append(f"  note: {note}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        on = [name for name, value in self.boost_config.items() if value]
        return f"AutoBoost(level={self.level!r}, mode={self.mode!r}, enabled={on})"


# The plan each network returned by ``AutoBoost.network_auto_process_train`` was prepared with (weakly held): a
# BoostTrainOneStepCell built on that network without a plan takes it, where upstream's cell read the AutoBoost the
# script had just configured (a process-wide singleton; ms_boost keeps none).
_PREPARED_WITH: weakref.WeakKeyDictionary[Any, AutoBoost] = weakref.WeakKeyDictionary()


def remember_prepared(network: Any, plan: AutoBoost) -> None:
    """Record that ``network`` was returned by ``plan.network_auto_process_train``."""
    _PREPARED_WITH[network] = plan


def _prepared_with(cell: Any) -> Optional[AutoBoost]:
    try:
        return _PREPARED_WITH.get(cell)
    except TypeError:  # not weakly referenceable: never recorded
        return None


def prepared_plan(network: Any) -> Optional[AutoBoost]:
    """The plan whose ``network_auto_process_train`` returned ``network`` or one of its sub-cells, or None.

    A sub-cell counts because scripts wrap what the rewrite returned (``WithLossCell(net, loss)`` around a backbone
    prepared alone); where sub-cells were prepared by different plans, the first in ``cells_and_names`` order wins.
    """
    found = _prepared_with(network)
    cells_and_names = getattr(network, "cells_and_names", None)
    if found is None and callable(cells_and_names):
        for _, cell in cells_and_names():
            found = _prepared_with(cell)
            if found is not None:
                break
    return found


def resolve(boost: Union[AutoBoost, str, None], boost_config_dict: Any = None) -> AutoBoost:
    """An :class:`AutoBoost` from an instance, a level string, or None (O0)."""
    if isinstance(boost, AutoBoost):
        if boost_config_dict:
            raise BoostConfigError("pass either an AutoBoost instance or boost_config_dict, not both.")
        return boost
    return AutoBoost("O0" if boost is None else boost, boost_config_dict)



def _default_reduction(topology: Topology) -> str:
    if topology.size == 1:
        return "no gradient reduction (1 rank)"
    return f"mean all-reduce across {topology.size} ranks (data parallel)"


def describe_steps(boost: AutoBoost, topology: Topology) -> str:
    """The summary's pipeline line in the order the train step runs.

    The gradient reduction (the reducer spec's text, else the data-parallel mean; it runs in the train cell
    before every stage), the stages of the enabled specs in ``order``, the apply step, then what stages do with
    the update (``describe``'s ``after`` texts, outermost last): read from the same ordered specs
    :mod:`ms_boost.pipeline` builds the train step from.
    """
    ctx = BuildContext(common=boost.common, topology=topology, level=boost.level)
    specs = boost.enabled_specs()
    reducer = single_hook(specs, "reducer")
    reduction, steps, after_apply = None, [], []
    for spec in specs:
        if spec.describe is None:
            continue
        text = call_hook(spec, "describe", boost.section(spec.name), ctx)
        before, after = text if isinstance(text, tuple) else (text, None)  # (before, after): see spec.py
        if spec is reducer:
            reduction = before
        elif before:
            steps.append(before)
        if after:
            after_apply.append(after)
    apply_texts = [s.apply_text for s in specs if s.apply_text]
    apply = apply_texts[-1] if apply_texts else "optimizer"
    return " -> ".join([reduction or _default_reduction(topology), *steps, apply, *after_apply[::-1]])

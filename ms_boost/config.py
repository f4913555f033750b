"""Boost configuration: the one place that parses and validates what the user asked for.

``AutoBoost(level, boost_config_dict)`` merges the level's defaults with the user's dict (or a YAML /
JSON file) into an immutable, typed configuration. Every key is checked: an unknown level, mode,
section or key, a wrong type or an out-of-range value raises ``ValueError`` (``TypeError`` for a
wrong type) naming the path (``dim_reduce.n_components``), the value, and what is allowed.

Unlike upstream ``mindspore.boost.AutoBoost`` this is not a singleton: two instances with different
levels coexist, and nothing here is mutated after construction.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
import warnings
from dataclasses import dataclass, fields
from typing import Any, Dict, Mapping, Optional, Tuple, Union

import yaml

logger = logging.getLogger("ms_boost")

__all__ = [
    "AutoBoost", "BoostConfigError", "LEVELS", "MODES", "SWITCHES",
    "CommonConfig", "LessBNConfig", "GradFreezeConfig", "GradAccumulationConfig", "AdaSumConfig",
    "DimReduceConfig", "LossScaleGroupConfig", "ThorConfig",
]

SWITCHES = ("less_bn", "grad_freeze", "adasum", "grad_accumulation", "dim_reduce", "loss_scale_group", "thor")
MODES = ("auto", "manual", "enable_all", "disable_all")
LEVELS: Dict[str, Dict[str, bool]] = {
    "O0": dict.fromkeys(SWITCHES, False),
    "O1": {**dict.fromkeys(SWITCHES, False), "less_bn": True, "grad_freeze": True},
    "O2": {**dict.fromkeys(SWITCHES, False), "less_bn": True, "grad_freeze": True, "adasum": True},
}
# What "enable_all" turns on: every algorithm that can run together with the others. dim_reduce and
# thor each replace the optimizer and so cannot be combined; enable_all picks neither (they would be
# switched off again by the exclusivity rule below) and says so.
_ENABLE_ALL_EXCLUDES = ("dim_reduce", "thor", "loss_scale_group")


class BoostConfigError(ValueError):
    """A boost configuration value is not allowed. Subclass of ``ValueError``."""


# --------------------------------------------------------------------------------------------------
# value checkers: each returns the normalised value or raises naming the path
# --------------------------------------------------------------------------------------------------
def _type_name(value: Any) -> str:
    return type(value).__name__


def _check_bool(path: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"boost config '{path}' must be a bool (True/False), got {value!r} ({_type_name(value)}).")
    return value


def _check_int(path: str, value: Any, low: Optional[int] = None, high: Optional[int] = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"boost config '{path}' must be an int, got {value!r} ({_type_name(value)}).")
    if (low is not None and value < low) or (high is not None and value > high):
        raise BoostConfigError(f"boost config '{path}'={value!r} is out of range; allowed: "
                               f"{_range_text(low, high)}.")
    return value


def _check_float(path: str, value: Any, low: Optional[float] = None, high: Optional[float] = None,
                 low_open: bool = False, high_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"boost config '{path}' must be a number, got {value!r} ({_type_name(value)}).")
    value = float(value)
    bad_low = low is not None and (value <= low if low_open else value < low)
    bad_high = high is not None and (value >= high if high_open else value > high)
    if bad_low or bad_high or value != value:
        lo = "" if low is None else ("(" if low_open else "[") + f"{low}"
        hi = "" if high is None else f"{high}" + (")" if high_open else "]")
        raise BoostConfigError(f"boost config '{path}'={value!r} is out of range; allowed: {lo or '(-inf'}, "
                               f"{hi or 'inf)'}.")
    return value


def _range_text(low, high) -> str:
    if low is not None and high is not None:
        return f"{low} <= value <= {high}"
    if low is not None:
        return f"value >= {low}"
    return f"value <= {high}"


def _check_optional_path(path: str, value: Any) -> Optional[str]:
    if value is None or value == "":
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"boost config '{path}' must be a path string or None, got {value!r} ({_type_name(value)}).")
    return os.fspath(value)


def _check_int_list(path: str, value: Any, low: int = 0) -> Tuple[int, ...]:
    if isinstance(value, bool):
        raise TypeError(f"boost config '{path}' must be a list of ints, got {value!r}.")
    if isinstance(value, int):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"boost config '{path}' must be a list of ints, got {value!r} ({_type_name(value)}).")
    out = []
    for i, item in enumerate(value):
        out.append(_check_int(f"{path}[{i}]", item, low=low))
    if out != sorted(out) or len(set(out)) != len(out):
        raise BoostConfigError(f"boost config '{path}'={list(value)!r} must be strictly increasing.")
    return tuple(out)


def _check_damping(path: str, value: Any):
    if isinstance(value, (list, tuple)):
        if not value:
            raise BoostConfigError(f"boost config '{path}' must not be an empty list.")
        return tuple(_check_float(f"{path}[{i}]", v, low=0.0, low_open=True) for i, v in enumerate(value))
    return _check_float(path, value, low=0.0, low_open=True)


# --------------------------------------------------------------------------------------------------
# sections
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CommonConfig:
    """``common`` section.

    Attributes:
        gradient_split_groups: parameter indices where gradient groups are split (fused all-reduce
            boundaries and LessBN parameter groups). Upstream default ``[50, 100]``.
        device_number: devices per server; AdaSum combines across servers, a mean is taken inside one.
            Upstream also spells it ``device_num``.
    """

    gradient_split_groups: Tuple[int, ...] = (50, 100)
    device_number: int = 8

    _aliases = {"device_num": "device_number"}
    _checks = {
        "gradient_split_groups": lambda p, v: _check_int_list(p, v, low=1),
        "device_number": lambda p, v: _check_int(p, v, low=1),
    }


@dataclass(frozen=True)
class LessBNConfig:
    """``less_bn`` section: ``fn_flag`` replaces the last Dense by a feature-normalised head,
    ``gc_flag`` applies gradient centralization."""

    fn_flag: bool = True
    gc_flag: bool = True

    _aliases = {}
    _checks = {"fn_flag": _check_bool, "gc_flag": _check_bool}


@dataclass(frozen=True)
class GradFreezeConfig:
    """``grad_freeze`` section (upstream's schedules, seeded).

    Attributes:
        param_groups: number of parameter groups the network is split into (>= 1).
        freeze_type: 0 = upstream's continuous schedule (``'00001234'``), 1 = its interval schedule
            (``'01020304'``); both freeze groups from the input side.
        freeze_p: share of steps on which every group trains, in [0, 1] (0.7: something is frozen on 30%).
        total_steps: the schedule's length; every group trains again before it ends.
        seed: seed of the schedule (ms_boost addition; upstream used unseeded numpy randomness).
    """

    param_groups: int = 10
    freeze_type: int = 1
    freeze_p: float = 0.7
    total_steps: int = 65536
    seed: int = 0

    _aliases = {}
    _checks = {
        "param_groups": lambda p, v: _check_int(p, v, low=1),
        "freeze_type": lambda p, v: _check_int(p, v, low=0, high=1),
        "freeze_p": lambda p, v: _check_float(p, v, low=0.0, high=1.0),
        "total_steps": lambda p, v: _check_int(p, v, low=1),
        "seed": lambda p, v: _check_int(p, v, low=0),
    }


@dataclass(frozen=True)
class GradAccumulationConfig:
    """``grad_accumulation`` section: ``grad_accumulation_step`` micro-steps per weight update."""

    grad_accumulation_step: int = 1

    _aliases = {"max_accumulation_step": "grad_accumulation_step"}
    _checks = {"grad_accumulation_step": lambda p, v: _check_int(p, v, low=1)}


@dataclass(frozen=True)
class AdaSumConfig:
    """``adasum`` section (no keys yet: the hierarchy comes from ``common.device_number``)."""

    _aliases = {}
    _checks = {}


@dataclass(frozen=True)
class DimReduceConfig:
    """``dim_reduce`` section (stage 2 of dimension-reduce training).

    Attributes:
        rho: line-search step shrink factor in (0, 1): trial steps are ``rho**m``.
        gamma: residual-momentum decay in [0, 1).
        alpha: learning rate of the residual (out-of-subspace) momentum, >= 0.
        sigma: Armijo sufficient-decrease constant in (0, 1).
        n_components: PCA dimension k (upstream sample spelling: ``n_component``).
        pca_mat_path: existing ``k x M`` PCA matrix (``.npy``); computed from ``weight_load_dir`` if None
            or missing, then saved there when a path is given.
        weight_load_dir: folder of stage-1 weight checkpoints.
        timeout: seconds a rank waits for the PCA matrix before a clear error.
        max_search_time: line-search trials per step (ms_boost addition; upstream hard-codes 2).
    """

    rho: float = 0.55
    gamma: float = 0.9
    alpha: float = 0.001
    sigma: float = 0.4
    n_components: int = 32
    pca_mat_path: Optional[str] = None
    weight_load_dir: Optional[str] = None
    timeout: int = 1800
    max_search_time: int = 2

    _aliases = {"n_component": "n_components"}
    _checks = {
        "rho": lambda p, v: _check_float(p, v, low=0.0, high=1.0, low_open=True, high_open=True),
        "gamma": lambda p, v: _check_float(p, v, low=0.0, high=1.0, high_open=True),
        "alpha": lambda p, v: _check_float(p, v, low=0.0),
        "sigma": lambda p, v: _check_float(p, v, low=0.0, high=1.0, low_open=True, high_open=True),
        "n_components": lambda p, v: _check_int(p, v, low=1),
        "pca_mat_path": _check_optional_path,
        "weight_load_dir": _check_optional_path,
        "timeout": lambda p, v: _check_int(p, v, low=1),
        "max_search_time": lambda p, v: _check_int(p, v, low=1, high=64),
    }


@dataclass(frozen=True)
class LossScaleGroupConfig:
    """``loss_scale_group`` section (no keys: groups come from the ``GroupLossScaleManager``)."""

    _aliases = {}
    _checks = {}


@dataclass(frozen=True)
class ThorConfig:
    """``thor`` section: second-order THOR replacing the user's optimizer (learning rate kept).

    Attributes:
        damping: damping lambda (float, or one value per step).
        frequency: steps between recomputations of the factor inverses.
        momentum: None takes the user's optimizer momentum (0.9 if it has none).
        weight_decay: None takes the user's optimizer weight decay.
        loss_scale: static loss scale the gradients carry.
        batch_size: accepted for upstream compatibility; factors use the real sample counts.
        use_nesterov: Nesterov momentum.
        split_indices: layer indices splitting the fused all-reduce of factors (0 is valid).
        enable_clip_grad: clip each preconditioned update tensor to norm 1.
        kl_clip: trust-region bound c of the preconditioned step (None or 0: off); see docs/thor.md.
    """

    damping: Union[float, Tuple[float, ...]] = 0.03
    frequency: int = 100
    momentum: Optional[float] = None
    weight_decay: Optional[float] = None
    loss_scale: float = 1.0
    batch_size: int = 32
    use_nesterov: bool = False
    split_indices: Optional[Tuple[int, ...]] = None
    enable_clip_grad: bool = False
    kl_clip: Optional[float] = 1e-3

    _aliases = {}
    _checks = {
        "damping": _check_damping,
        "frequency": lambda p, v: _check_int(p, v, low=1),
        "momentum": lambda p, v: None if v is None else _check_float(p, v, low=0.0, high=1.0, high_open=True),
        "weight_decay": lambda p, v: None if v is None else _check_float(p, v, low=0.0),
        "loss_scale": lambda p, v: _check_float(p, v, low=0.0, low_open=True),
        "batch_size": lambda p, v: _check_int(p, v, low=1),
        "use_nesterov": _check_bool,
        "split_indices": lambda p, v: None if v is None else _check_int_list(p, v, low=0),
        "enable_clip_grad": _check_bool,
        "kl_clip": lambda p, v: None if v is None else _check_float(p, v, low=0.0),
    }


SECTIONS = {
    "common": CommonConfig,
    "less_bn": LessBNConfig,
    "grad_freeze": GradFreezeConfig,
    "grad_accumulation": GradAccumulationConfig,
    "adasum": AdaSumConfig,
    "dim_reduce": DimReduceConfig,
    "loss_scale_group": LossScaleGroupConfig,
    "thor": ThorConfig,
}


def _field_names(cls) -> Tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


def _build_section(name: str, raw: Any):
    cls = SECTIONS[name]
    if raw is None:
        return cls()
    if not isinstance(raw, Mapping):
        raise TypeError(f"boost config section '{name}' must be a dict, got {raw!r} ({_type_name(raw)}).")
    allowed = _field_names(cls)
    aliases = cls._aliases
    values: Dict[str, Any] = {}
    for key, value in raw.items():
        canonical = aliases.get(key, key)
        if canonical not in allowed:
            spelled = sorted(allowed) + sorted(aliases)
            raise BoostConfigError(f"unknown boost config key '{name}.{key}'; allowed keys: {spelled or 'none'}.")
        if canonical in values:
            raise BoostConfigError(f"boost config '{name}.{canonical}' is given twice (as '{canonical}' and "
                                   f"its alias); give it once.")
        values[canonical] = cls._checks[canonical](f"{name}.{key}", value)
    return cls(**values)


def _load_dict(boost_config_dict: Any) -> Dict[str, Any]:
    """Accept None/"" (nothing), a mapping, or a path to a YAML / JSON file."""
    if boost_config_dict is None or boost_config_dict == "":
        return {}
    if isinstance(boost_config_dict, (str, os.PathLike)):
        path = os.fspath(boost_config_dict)
        if not os.path.isfile(path):
            raise BoostConfigError(f"boost_config_dict path '{path}' does not exist or is not a file.")
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        try:
            data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
        except (json.JSONDecodeError, yaml.YAMLError) as exc:
            raise BoostConfigError(f"boost_config_dict file '{path}' is not valid JSON/YAML: {exc}") from exc
        if data is None:
            return {}
        if not isinstance(data, Mapping):
            raise BoostConfigError(f"boost_config_dict file '{path}' must hold a mapping of sections, "
                                   f"got {_type_name(data)}.")
        return copy.deepcopy(dict(data))
    if isinstance(boost_config_dict, Mapping):
        return copy.deepcopy(dict(boost_config_dict))
    raise TypeError(f"boost_config_dict must be a dict, a path to a YAML/JSON file, or None; "
                    f"got {boost_config_dict!r} ({_type_name(boost_config_dict)}).")


# --------------------------------------------------------------------------------------------------
# AutoBoost
# --------------------------------------------------------------------------------------------------
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
        boost_config: dict switch name -> bool (upstream's attribute name).
        common, less_bn, grad_freeze, grad_accumulation, adasum, dim_reduce, loss_scale_group, thor:
            frozen section dataclasses.

    Raises:
        ValueError: unknown level, mode, section or key; a value out of range.
        TypeError: a value of the wrong type.
    """

    def __init__(self, level: str = "O0", boost_config_dict: Any = None):
        if not isinstance(level, str):
            raise TypeError(f"boost_level must be a str, one of {sorted(LEVELS)}; got {level!r} "
                            f"({_type_name(level)}).")
        if level not in LEVELS:
            raise BoostConfigError(f"boost_level={level!r} is not a boost level; allowed: {sorted(LEVELS)}.")
        raw = _load_dict(boost_config_dict)
        self._raw = raw
        unknown = sorted(set(raw) - set(SECTIONS) - {"boost"})
        if unknown:
            raise BoostConfigError(f"unknown boost config section(s) {unknown}; allowed sections: "
                                   f"{['boost', *SECTIONS]}.")
        boost_section = raw.get("boost") or {}
        if not isinstance(boost_section, Mapping):
            raise TypeError(f"boost config section 'boost' must be a dict, got {boost_section!r}.")
        mode = boost_section.get("mode", "auto")
        if mode not in MODES:
            raise BoostConfigError(f"boost config 'boost.mode'={mode!r} is not allowed; allowed: {list(MODES)}.")
        user_switches = {}
        for key, value in boost_section.items():
            if key == "mode":
                continue
            if key not in SWITCHES:
                raise BoostConfigError(f"unknown boost config key 'boost.{key}'; allowed keys: "
                                       f"{['mode', *SWITCHES]}.")
            user_switches[key] = _check_bool(f"boost.{key}", value)

        self.level = level
        self.mode = mode
        self.notes = []  # human-readable record of every adjustment made while resolving
        switches = dict(LEVELS[level])
        if mode == "manual":
            switches.update(user_switches)
        elif user_switches:
            # Not silently ignored: the user's switches only act in manual mode, as upstream documents.
            self._note(f"boost.mode={mode!r} ignores the switches {sorted(user_switches)}; set "
                       f"boost.mode='manual' to use them", warn=True)
        if mode == "enable_all":
            switches = {k: k not in _ENABLE_ALL_EXCLUDES for k in SWITCHES}
            self._note(f"enable_all turns on every combinable algorithm; {list(_ENABLE_ALL_EXCLUDES)} must be "
                       f"enabled in manual mode")
        elif mode == "disable_all":
            switches = dict.fromkeys(SWITCHES, False)
        self._apply_exclusivity(switches, explicit=user_switches if mode == "manual" else {})
        self.boost_config: Dict[str, bool] = switches

        for name in SECTIONS:
            section = _build_section(name, raw.get(name))
            setattr(self, name, section)
            if name in raw and name != "common" and not switches.get(name, False):
                self._note(f"section '{name}' is given but the '{name}' algorithm is off; its values are "
                           f"validated and unused", warn=False)
        if switches["grad_accumulation"] and self.grad_accumulation.grad_accumulation_step == 1:
            self._note("grad_accumulation is on with grad_accumulation.grad_accumulation_step=1: every step "
                       "updates the weights (no accumulation)", warn=True)

    # -- resolution helpers ------------------------------------------------------------------------
    def _note(self, text: str, warn: bool = True) -> None:
        self.notes.append(text)
        if warn:
            warnings.warn(f"ms_boost: {text}", UserWarning, stacklevel=3)
        else:
            logger.info("ms_boost: %s", text)

    def _apply_exclusivity(self, switches: Dict[str, bool], explicit: Mapping[str, bool]) -> None:
        """dim_reduce, then thor, run alone. Switching off what the user asked for explicitly warns;
        switching off what only came from the level's defaults is noted in the summary."""
        for solo in ("dim_reduce", "thor"):
            if switches.get(solo):
                others = sorted(k for k, v in switches.items() if v and k != solo)
                for k in others:
                    switches[k] = False
                asked = [k for k in others if explicit.get(k)]
                if asked:
                    self._note(f"'{solo}' runs alone: switched off {asked} (requested in boost_config_dict)",
                               warn=True)
                if len(asked) < len(others):
                    self._note(f"'{solo}' runs alone: switched off {sorted(set(others) - set(asked))} "
                               f"(level {self.level} defaults)", warn=False)
                return

    # -- queries -----------------------------------------------------------------------------------
    def enabled(self, name: str) -> bool:
        """Whether the algorithm ``name`` (one of :data:`SWITCHES`) runs."""
        if name not in SWITCHES:
            raise BoostConfigError(f"unknown boost algorithm {name!r}; known: {list(SWITCHES)}.")
        return bool(self.boost_config[name])

    @property
    def is_active(self) -> bool:
        """True when at least one algorithm runs."""
        return any(self.boost_config.values())

    def to_dict(self) -> Dict[str, Any]:
        """The fully resolved configuration as plain data (what would reproduce this plan)."""
        out: Dict[str, Any] = {"boost": {"mode": "manual", **self.boost_config}}
        for name in SECTIONS:
            section = getattr(self, name)
            out[name] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(section).items()}
        return out

    def summary(self, ranks: Optional[int] = None) -> str:
        """A readable summary of the resolved plan: which stages run, with which values.

        Args:
            ranks: the number of data-parallel ranks the plan runs on; ``None`` reads it from MindSpore's
                parallel context (1 when communication is not initialised or not in data-parallel mode).
                The gradient-reduction step is described for that many ranks (AdaSum needs more than one
                server; ``common.device_number`` is capped at the rank count, as the train cell does).
        """
        from ms_boost import comm

        if ranks is None:
            reduce, _, degree = comm.data_parallel_reduce_config()
            ranks = degree if reduce else 1
        if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
            raise ValueError(f"summary(ranks={ranks!r}): ranks must be an int >= 1.")
        on = [k for k in SWITCHES if self.boost_config[k]]
        lines = [f"ms_boost plan: level={self.level} mode={self.mode} -> "
                 f"{', '.join(on) if on else 'no boost algorithm (plain training step)'}"]
        lines.append(f"  common: {dataclasses.asdict(self.common)}")
        for name in on:
            values = dataclasses.asdict(getattr(self, name))
            lines.append(f"  {name}: {values if values else '(no options)'}")
        order = []
        if self.boost_config["grad_accumulation"]:
            order.append(f"accumulate x{self.grad_accumulation.grad_accumulation_step}")
        per_server = comm.server_size(self.common.device_number, ranks)
        servers = -(-ranks // per_server)
        if ranks == 1:
            inactive = "; AdaSum inactive" if self.boost_config["adasum"] else ""
            order.append(f"no gradient reduction (1 rank){inactive}")
        elif self.boost_config["adasum"] and servers > 1:
            order.append(f"mean within server ({per_server} of {ranks} ranks) -> AdaSum across {servers} servers")
        elif self.boost_config["adasum"]:
            order.append(f"mean all-reduce across {ranks} ranks (one server of common.device_number="
                         f"{self.common.device_number}: AdaSum inactive)")
        else:
            order.append(f"mean all-reduce across {ranks} ranks (data parallel)")
        if self.boost_config["dim_reduce"]:
            order.append("DimReduce (PCA subspace BFGS + line search)")
        elif self.boost_config["thor"]:
            order.append("THOR preconditioned optimizer")
        elif self.boost_config["grad_freeze"]:
            order.append("optimizer on this step's unfrozen groups")
        else:
            order.append("optimizer")
        lines.append("  pipeline: " + " -> ".join(order))
        for note in self.notes:
            lines.append(f"  note: {note}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        on = [k for k in SWITCHES if self.boost_config[k]]
        return f"AutoBoost(level={self.level!r}, mode={self.mode!r}, enabled={on})"

    # -- upstream API: network / optimizer transformations ---------------------------------------------
    def network_auto_process_train(self, network, optimizer):
        """Apply the network and optimizer transformations of the enabled algorithms for training.

        Returns:
            ``(network, optimizer)``: the (possibly wrapped) network and optimizer.
        """
        if self.enabled("dim_reduce"):
            from mindspore.nn import SGD

            # As upstream: the DimReduce stage computes the whole update itself; a plain SGD with
            # learning rate 1 stands in as the optimizer holding the trainable parameters.
            return network, SGD(network.trainable_params(), learning_rate=1.0)
        if self.enabled("thor"):
            from ms_boost.thor import apply_boost_thor

            return apply_boost_thor(network, optimizer, self.thor)
        if self.enabled("less_bn"):
            from ms_boost.less_bn import apply_less_bn

            network, optimizer = apply_less_bn(network, optimizer, self.less_bn, self.common)
        if self.enabled("grad_freeze"):
            from ms_boost.grad_freeze import apply_grad_freeze

            network, optimizer = apply_grad_freeze(network, optimizer, self.grad_freeze)
        return network, optimizer

    def network_auto_process_eval(self, network):
        """Apply the transformations the evaluation network needs (LessBN's head)."""
        if self.enabled("less_bn"):
            from ms_boost.less_bn import apply_less_bn_eval

            return apply_less_bn_eval(network, self.less_bn)
        return network


def resolve(boost: Union[AutoBoost, str, None], boost_config_dict: Any = None) -> AutoBoost:
    """An :class:`AutoBoost` from an instance, a level string, or None (O0)."""
    if isinstance(boost, AutoBoost):
        if boost_config_dict:
            raise BoostConfigError("pass either an AutoBoost instance or boost_config_dict, not both.")
        return boost
    return AutoBoost("O0" if boost is None else boost, boost_config_dict)


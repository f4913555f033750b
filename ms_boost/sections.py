"""The configuration sections of the built-in algorithms: frozen dataclasses that validate themselves.

Each section checks every field in ``__post_init__`` (through :mod:`ms_boost.validation`) and stores the
normalised value (lists become tuples, ints become floats where a float is meant). The boost config
(:class:`~ms_boost.config.AutoBoost`), the pipeline and the upstream-style constructors
(``GradientFreeze(...)``, ``GradientAccumulation(...)``, ``AdaSum(...)``, ``DimReduce(...)``) all build
these same objects, so each value has one rule and one message.

A user's algorithm defines its own section beside its code (see ``docs/adding_an_algorithm.md``);
:class:`Section` is an optional base giving the per-field rules below.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Any, Callable, ClassVar, Dict, Mapping, Optional, Tuple, Union

from ms_boost.validation import (
    INT32_MAX,
    BoostConfigError,
    check_bool,
    check_float,
    check_float_or_list,
    check_int,
    check_int_list,
    check_optional_path,
    short_repr,
)

__all__ = [
    "Section", "build_section", "CommonConfig", "LessBNConfig", "GradFreezeConfig", "GradAccumulationConfig",
    "AdaSumConfig", "DimReduceConfig", "LossScaleGroupConfig", "ThorConfig",
]

Rule = Callable[[str, Any], Any]


@dataclass(frozen=True)
class Section:
    """Base of a self-validating section: ``RULES`` maps a field to ``rule(path, value) -> normalised``.

    Class attributes:
        SECTION: the section's name in the boost config (used in messages: ``SECTION.field``).
        ALIASES: other spellings accepted by :func:`build_section` (``{"n_component": "n_components"}``).
        RULES: per-field checker; a field without a rule is taken as is.
    """

    SECTION: ClassVar[str] = ""
    ALIASES: ClassVar[Dict[str, str]] = {}
    RULES: ClassVar[Dict[str, Rule]] = {}

    def __post_init__(self):
        for f in fields(self):
            rule = self.RULES.get(f.name)
            if rule is not None:
                object.__setattr__(self, f.name, rule(f"{self.SECTION}.{f.name}", getattr(self, f.name)))


def build_section(name: str, cls: type, raw: Any):
    """The section ``cls`` from the user's mapping ``raw`` (None: defaults), with aliases resolved.

    Raises:
        TypeError: ``raw`` is not a mapping (or a value has the wrong type).
        BoostConfigError: an unknown key, a key given under two spellings, a value out of range.
    """
    if raw is None:
        return cls()
    if not isinstance(raw, Mapping):
        raise TypeError(f"boost config section '{name}' must be a dict, got {short_repr(raw)} "
                        f"({type(raw).__name__}).")
    allowed = tuple(f.name for f in fields(cls))
    aliases = dict(getattr(cls, "ALIASES", {}) or {})
    values: Dict[str, Any] = {}
    for key, value in raw.items():
        canonical = aliases.get(key, key)
        if canonical not in allowed:
            spelled = sorted(allowed) + sorted(aliases)
            shown = key if isinstance(key, str) and len(key) <= 80 else short_repr(key)
            raise BoostConfigError(f"unknown boost config key '{name}.{shown}'; allowed keys: {spelled or 'none'}.")
        if canonical in values:
            raise BoostConfigError(f"boost config '{name}.{canonical}' is given twice (as '{canonical}' and "
                                   f"its alias); give it once.")
        values[canonical] = value
    return cls(**values)


def section_dict(section) -> Dict[str, Any]:
    """A section's values as plain data (tuples as lists)."""
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(section).items()}


def _int(low=None, high=INT32_MAX, holder=""):
    return lambda p, v: check_int(p, v, low=low, high=high, holder=holder)


def _optional(rule: Rule) -> Rule:
    return lambda p, v: None if v is None else rule(p, v)


@dataclass(frozen=True)
class CommonConfig(Section):
    """``common`` section.

    Attributes:
        gradient_split_groups: parameter indices where gradient groups are split (fused all-reduce
            boundaries and LessBN parameter groups). Upstream default ``[50, 100]``.
        device_number: devices per server; AdaSum combines across servers, a mean is taken inside one.
            Capped at the number of ranks (:class:`~ms_boost.topology.Topology`). Upstream also spells it
            ``device_num``.
    """

    gradient_split_groups: Tuple[int, ...] = (50, 100)
    device_number: int = 8

    SECTION: ClassVar[str] = "common"
    ALIASES: ClassVar[Dict[str, str]] = {"device_num": "device_number"}
    RULES: ClassVar[Dict[str, Rule]] = {
        "gradient_split_groups": lambda p, v: check_int_list(p, v, low=1),
        "device_number": _int(low=1),
    }


@dataclass(frozen=True)
class LessBNConfig(Section):
    """``less_bn`` section: ``fn_flag`` replaces the last Dense by a feature-normalised head,
    ``gc_flag`` applies gradient centralization."""

    fn_flag: bool = True
    gc_flag: bool = True

    SECTION: ClassVar[str] = "less_bn"
    RULES: ClassVar[Dict[str, Rule]] = {"fn_flag": check_bool, "gc_flag": check_bool}


@dataclass(frozen=True)
class GradFreezeConfig(Section):
    """``grad_freeze`` section (upstream's schedules, seeded).

    Attributes:
        param_groups: number of parameter groups the network is split into (>= 1; more groups than
            trainable parameters are clamped to the parameter count when the optimizer is built).
        freeze_type: 0 = upstream's continuous schedule (``'00001234'``), 1 = its interval schedule
            (``'01020304'``); both freeze groups from the input side.
        freeze_p: share of steps on which every group trains, in [0, 1] (0.7: something is frozen on 30%).
        total_steps: the schedule's length; every group trains again before it ends (int64).
        seed: seed of the schedule (ms_boost addition; upstream used unseeded numpy randomness).
    """

    param_groups: int = 10
    freeze_type: int = 1
    freeze_p: float = 0.7
    total_steps: int = 65536
    seed: int = 0

    SECTION: ClassVar[str] = "grad_freeze"
    RULES: ClassVar[Dict[str, Rule]] = {
        "param_groups": _int(low=1),
        "freeze_type": _int(low=0, high=1),
        "freeze_p": lambda p, v: check_float(p, v, low=0.0, high=1.0),
        "total_steps": lambda p, v: check_int(p, v, low=1, holder="the schedule position is an int64"),
        "seed": lambda p, v: check_int(p, v, low=0),
    }


@dataclass(frozen=True)
class GradAccumulationConfig(Section):
    """``grad_accumulation`` section: ``grad_accumulation_step`` micro-steps per weight update (upstream:
    ``max_accumulation_step``); at most ``2**31 - 1``, what the int32 micro-step counter holds."""

    grad_accumulation_step: int = 1

    SECTION: ClassVar[str] = "grad_accumulation"
    ALIASES: ClassVar[Dict[str, str]] = {"max_accumulation_step": "grad_accumulation_step"}
    RULES: ClassVar[Dict[str, Rule]] = {
        "grad_accumulation_step": _int(low=1, holder="the micro-step counter is an int32"),
    }


@dataclass(frozen=True)
class AdaSumConfig(Section):
    """``adasum`` section (no keys yet: the hierarchy comes from ``common.device_number``)."""

    SECTION: ClassVar[str] = "adasum"


@dataclass(frozen=True)
class DimReduceConfig(Section):
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
        max_search_time: line-search trials per step (ms_boost addition; upstream hard-codes 2), <= 64.
        carry_search: start each line search where the previous one stopped (ms_boost addition, off by default:
            upstream restarts at step 1 every time, so a failed search repeats forever; see docs/dim_reduce.md).
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
    carry_search: bool = False

    SECTION: ClassVar[str] = "dim_reduce"
    ALIASES: ClassVar[Dict[str, str]] = {"n_component": "n_components"}
    RULES: ClassVar[Dict[str, Rule]] = {
        "rho": lambda p, v: check_float(p, v, low=0.0, high=1.0, low_open=True, high_open=True),
        "gamma": lambda p, v: check_float(p, v, low=0.0, high=1.0, high_open=True),
        "alpha": lambda p, v: check_float(p, v, low=0.0),
        "sigma": lambda p, v: check_float(p, v, low=0.0, high=1.0, low_open=True, high_open=True),
        "n_components": _int(low=1),
        "pca_mat_path": check_optional_path,
        "weight_load_dir": check_optional_path,
        "timeout": _int(low=1),
        "max_search_time": _int(low=1, high=64),
        "carry_search": check_bool,
    }


@dataclass(frozen=True)
class LossScaleGroupConfig(Section):
    """``loss_scale_group`` section (no keys: groups come from the ``GroupLossScaleManager``)."""

    SECTION: ClassVar[str] = "loss_scale_group"


@dataclass(frozen=True)
class ThorConfig(Section):
    """``thor`` section: second-order THOR replacing the user's optimizer (learning rate kept).

    Attributes:
        damping: damping lambda (float, or one value per step).
        frequency: steps between recomputations of the factor inverses (int32 step counter).
        momentum: None takes the user's optimizer momentum (0.9 if it has none).
        weight_decay: None takes the user's optimizer weight decay.
        loss_scale: static loss scale the gradients carry.
        batch_size: accepted for upstream compatibility; factors use the real sample counts.
        use_nesterov: Nesterov momentum.
        split_indices: layer indices splitting the fused all-reduce of factors (0 is valid).
        enable_clip_grad: clip each preconditioned update tensor to norm 1.
        kl_clip: trust-region bound c of the preconditioned step (None or 0: off); see docs/thor.md.
        refresh_threshold: adaptive per-layer refresh: a layer's inverses are recomputed at a refresh only when
            the trace of one of its factors moved by more than this fraction since its last inversion (None or
            0: every layer at every refresh); see docs/thor.md.
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
    refresh_threshold: Optional[float] = None

    SECTION: ClassVar[str] = "thor"
    RULES: ClassVar[Dict[str, Rule]] = {
        "damping": check_float_or_list,
        "frequency": _int(low=1, holder="the step counter is an int32"),
        "momentum": _optional(lambda p, v: check_float(p, v, low=0.0, high=1.0, high_open=True)),
        "weight_decay": _optional(lambda p, v: check_float(p, v, low=0.0)),
        "loss_scale": lambda p, v: check_float(p, v, low=0.0, low_open=True),
        "batch_size": _int(low=1),
        "use_nesterov": check_bool,
        "split_indices": _optional(lambda p, v: check_int_list(p, v, low=0)),
        "enable_clip_grad": check_bool,
        "kl_clip": _optional(lambda p, v: check_float(p, v, low=0.0)),
        "refresh_threshold": _optional(lambda p, v: check_float(p, v, low=0.0)),
    }

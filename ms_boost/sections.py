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

from dataclasses import dataclass
from typing import ClassVar, Dict, Optional, Tuple, Union

from ms_boost.spec import CommonConfig, Rule, Section, build_section, section_dict
from ms_boost.spec import int_rule as _int
from ms_boost.spec import optional_rule as _optional
from ms_boost.validation import (
    check_bool,
    check_float,
    check_float_or_list,
    check_int,
    check_int_list,
    check_optional_path,
)

__all__ = [
    "Section", "build_section", "section_dict", "CommonConfig", "LessBNConfig", "GradFreezeConfig",
    "GradAccumulationConfig", "AdaSumConfig", "DimReduceConfig", "LossScaleGroupConfig", "ThorConfig",
]


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

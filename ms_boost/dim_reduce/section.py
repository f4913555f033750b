"""The ``dim_reduce`` section and ``PLAN``, the algorithm's place in the boost plan (its spec without hooks).

No MindSpore here: the boost plan is checked from these alone (:mod:`ms_boost.plans`, the launchers' check);
``spec.py`` adds the hooks that build cells.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Dict, Optional

from ms_boost.spec import AlgorithmSpec, Rule, Section, int_rule
from ms_boost.validation import check_bool, check_float, check_optional_path

__all__ = ["DimReduceConfig", "PLAN", "STEP_RULES"]

#: The rules of the stage's hyper-parameters, the ones of the ``dim_reduce`` section (one rule, one message).
STEP_RULES: Dict[str, Rule] = {
    "rho": lambda p, v: check_float(p, v, low=0.0, high=1.0, low_open=True, high_open=True),
    "gamma": lambda p, v: check_float(p, v, low=0.0, high=1.0, high_open=True),
    "alpha": lambda p, v: check_float(p, v, low=0.0),
    "sigma": lambda p, v: check_float(p, v, low=0.0, high=1.0, low_open=True, high_open=True),
    "n_components": int_rule(low=1),
    "max_search_time": int_rule(low=1, high=64),
    "carry_search": check_bool,
}


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
        **STEP_RULES,  # the stage's hyper-parameters: one rule each, shared with DimReduceUpdate(...)
        "pca_mat_path": check_optional_path,
        "weight_load_dir": check_optional_path,
        "timeout": int_rule(low=1),
    }


#: the ``dim_reduce`` algorithm's place in the plan (name, section, order, levels, exclusivity)
PLAN = AlgorithmSpec(name="dim_reduce", section=DimReduceConfig, order=60, runs_alone=True,
                     branches_on_device=True)  # the line search's later trials write the weights under `if`

"""Dimension-reduce training (stage 2) as the pipeline sees it: its ``dim_reduce`` section and its ``SPEC``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Dict, Optional

from mindspore.nn import SGD

from ms_boost.dim_reduce.stage import STEP_RULES, build_dim_reduce_update
from ms_boost.spec import AlgorithmSpec, BuildContext, Rule, Section, int_rule
from ms_boost.validation import check_optional_path

__all__ = ["DimReduceConfig", "SPEC"]


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


def _rewrite_train(network, optimizer, cfg: DimReduceConfig, ctx: BuildContext):
    # As upstream: the DimReduce stage computes the whole update itself; a plain SGD with learning rate 1
    # stands in as the optimizer holding the trainable parameters.
    return network, SGD(network.trainable_params(), learning_rate=1.0)


def _apply(network, optimizer, weights, cfg: DimReduceConfig, ctx: BuildContext):
    return build_dim_reduce_update(network, weights, cfg, ctx.common)


#: DimReduce replaces the optimizer step and runs alone.
SPEC = AlgorithmSpec(name="dim_reduce", section=DimReduceConfig, order=60, runs_alone=True,
                     rewrite_train=_rewrite_train, apply=_apply,
                     apply_text="DimReduce (PCA subspace BFGS + line search)")

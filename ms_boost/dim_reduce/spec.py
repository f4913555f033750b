"""Dimension-reduce training (stage 2) as the pipeline sees it."""
from __future__ import annotations

from mindspore.nn import SGD

from ms_boost.dim_reduce.stage import build_dim_reduce_update
from ms_boost.sections import DimReduceConfig
from ms_boost.spec import AlgorithmSpec, BuildContext

__all__ = ["SPEC"]


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

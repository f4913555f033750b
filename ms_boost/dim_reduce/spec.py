"""Dimension-reduce training (stage 2) as the pipeline sees it: its ``dim_reduce`` section and its ``SPEC``."""
from __future__ import annotations

import dataclasses

from mindspore.nn import SGD

from ms_boost.dim_reduce.section import PLAN, DimReduceConfig
from ms_boost.dim_reduce.stage import build_dim_reduce_update
from ms_boost.spec import BuildContext

__all__ = ["DimReduceConfig", "SPEC"]


def _rewrite_train(network, optimizer, cfg: DimReduceConfig, ctx: BuildContext):
    # As upstream: the DimReduce stage computes the whole update itself; a plain SGD with learning rate 1
    # stands in as the optimizer holding the trainable parameters.
    return network, SGD(network.trainable_params(), learning_rate=1.0)


def _apply(network, optimizer, weights, cfg: DimReduceConfig, ctx: BuildContext):
    return build_dim_reduce_update(network, weights, cfg, ctx.common)


#: DimReduce replaces the optimizer step and runs alone.
SPEC = dataclasses.replace(PLAN, rewrite_train=_rewrite_train, apply=_apply,
                           apply_text="DimReduce (PCA subspace BFGS + line search)")

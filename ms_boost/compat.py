"""Upstream ``mindspore.boost`` / ``mindspore.nn`` names, gathered at the top of the house.

Everything here is a name users of upstream already know, re-exported from the layer that implements
it; nothing below imports this module. ``ms_boost/__init__.py`` exports these names.

* ``network_auto_process_train`` / ``network_auto_process_eval`` -- the pipeline's network and optimizer
  rewrites (``AutoBoost`` methods of the same names delegate to them);
* ``LessBN``, ``GradientFreeze``, ``FreezeOpt``, ``freeze_cell``, ``GradientAccumulation``, ``AdaSum``,
  ``DimReduce``, ``GroupLossScaleManager``, ``OptimizerProcess``, ``ParameterProcess``;
* THOR: the ``thor`` factory, ``DenseThor``, ``Conv2dThor``, ``EmbeddingThor``, ``ConvertNetUtils``,
  ``ConvertModelUtils``.
"""
from __future__ import annotations

from ms_boost.adasum import AdaSum
from ms_boost.config import AutoBoost
from ms_boost.dim_reduce import DimReduce
from ms_boost.grad_accumulation import GradientAccumulation
from ms_boost.grad_freeze import FreezeOpt, GradientFreeze, freeze_cell
from ms_boost.grad_process import OptimizerProcess, ParameterProcess
from ms_boost.less_bn import LessBN
from ms_boost.loss_scale import GroupLossScaleManager
from ms_boost.pipeline import rewrite_eval, rewrite_train
from ms_boost.thor import Conv2dThor, ConvertModelUtils, ConvertNetUtils, DenseThor, EmbeddingThor, thor

__all__ = [
    "network_auto_process_train", "network_auto_process_eval", "LessBN", "GradientFreeze", "FreezeOpt",
    "freeze_cell", "GradientAccumulation", "AdaSum", "DimReduce", "GroupLossScaleManager", "OptimizerProcess",
    "ParameterProcess", "thor", "DenseThor", "Conv2dThor", "EmbeddingThor", "ConvertNetUtils",
    "ConvertModelUtils",
]


def network_auto_process_train(boost: AutoBoost, network, optimizer):
    """Upstream ``AutoBoost.network_auto_process_train``: ``(network, optimizer)`` after every enabled
    algorithm's training rewrite."""
    return rewrite_train(boost, network, optimizer)


def network_auto_process_eval(boost: AutoBoost, network):
    """Upstream ``AutoBoost.network_auto_process_eval``: the evaluation network after every enabled
    algorithm's evaluation rewrite."""
    return rewrite_eval(boost, network)

"""Upstream ``mindspore.boost`` / ``mindspore.nn`` names, gathered at the top of the house.

Everything here is a name users of upstream already know, re-exported from the layer that implements
it; nothing below imports this module. ``ms_boost/__init__.py`` exports these names.

* ``AutoBoost`` -- the resolved plan (:class:`ms_boost.config.AutoBoost`) with upstream's methods
  ``network_auto_process_train`` / ``network_auto_process_eval``, which run the pipeline's rewrites
  (the plan itself applies nothing);
* ``LessBN``, ``GradientFreeze``, ``FreezeOpt``, ``freeze_cell``, ``GradientAccumulation``, ``AdaSum``,
  ``DimReduce``, ``GroupLossScaleManager``, ``OptimizerProcess``, ``ParameterProcess``;
* THOR: the ``thor`` factory, ``DenseThor``, ``Conv2dThor``, ``EmbeddingThor``, ``ConvertNetUtils``,
  ``ConvertModelUtils``.
"""
from __future__ import annotations

from typing import Any, Tuple

from mindspore import nn

from ms_boost import config
from ms_boost.adasum import AdaSum
from ms_boost.dim_reduce import DimReduce
from ms_boost.grad_accumulation import GradientAccumulation
from ms_boost.grad_freeze import FreezeOpt, GradientFreeze, freeze_cell
from ms_boost.grad_process import OptimizerProcess, ParameterProcess
from ms_boost.less_bn import LessBN
from ms_boost.loss_scale_group import GroupLossScaleManager
from ms_boost.pipeline import rewrite_eval, rewrite_train
from ms_boost.thor import Conv2dThor, ConvertModelUtils, ConvertNetUtils, DenseThor, EmbeddingThor, thor

__all__ = [
    "AutoBoost", "LessBN", "GradientFreeze", "FreezeOpt",
    "freeze_cell", "GradientAccumulation", "AdaSum", "DimReduce", "GroupLossScaleManager", "OptimizerProcess",
    "ParameterProcess", "thor", "DenseThor", "Conv2dThor", "EmbeddingThor", "ConvertNetUtils",
    "ConvertModelUtils",
]


class AutoBoost(config.AutoBoost):
    """Upstream's ``mindspore.boost.AutoBoost``: the resolved plan plus its two rewrite methods.

    Same arguments and attributes as :class:`ms_boost.config.AutoBoost`.
    """

    def network_auto_process_train(self, network: nn.Cell, optimizer: Any) -> Tuple[nn.Cell, Any]:
        """Apply the network and optimizer rewrites of the enabled algorithms for training, in pipeline order.

        Returns:
            ``(network, optimizer)``: the (possibly wrapped) network and optimizer. A
            :class:`~ms_boost.BoostTrainOneStepCell` built on this network without ``boost_config`` uses this plan.
        """
        network, optimizer = rewrite_train(self, network, optimizer)
        # a BoostTrainOneStepCell built on this network without a plan follows this one (upstream's cell read the
        # AutoBoost singleton the script had configured)
        config.remember_prepared(network, self)
        return network, optimizer

    def network_auto_process_eval(self, network: nn.Cell) -> nn.Cell:
        """Apply the rewrites the evaluation network needs (each enabled algorithm's ``rewrite_eval``)."""
        return rewrite_eval(self, network)

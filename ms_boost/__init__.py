"""ms_boost: training acceleration for MindSpore (a reimplementation of ``mindspore.boost``, plus THOR).

Quick use::

    from ms_boost import Model
    model = Model(net, loss_fn=loss, optimizer=opt, metrics={"acc"}, boost_level="O1")

Public names mirror ``mindspore.boost``: AutoBoost, BoostTrainOneStepCell,
BoostTrainOneStepWithLossScaleCell, LessBN, GradientFreeze, FreezeOpt, freeze_cell,
GradientAccumulation, AdaSum, DimReduce, GroupLossScaleManager, OptimizerProcess, ParameterProcess;
plus Model, build_train_network, the THOR optimizer ``thor`` with its layers and converters, and
the communication layer ``ms_boost.comm``. Algorithm modules load on first use.
"""
from __future__ import annotations

import importlib
import logging

from ms_boost.config import AutoBoost, BoostConfigError
from ms_boost.model import Model, build_train_network
from ms_boost.train_cell import BoostTrainOneStepCell, BoostTrainOneStepWithLossScaleCell

__version__ = "0.1.0"

_logger = logging.getLogger("ms_boost")
if not _logger.handlers:
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("[ms_boost] %(message)s"))
    _logger.addHandler(_handler)
    _logger.setLevel(logging.INFO)
    _logger.propagate = False

# name -> module that defines it (imported lazily: each algorithm module loads only when used)
_LAZY = {
    "LessBN": "ms_boost.less_bn",
    "GradientFreeze": "ms_boost.grad_freeze",
    "FreezeOpt": "ms_boost.grad_freeze",
    "freeze_cell": "ms_boost.grad_freeze",
    "GradientAccumulation": "ms_boost.grad_accumulation",
    "GroupLossScaleManager": "ms_boost.loss_scale",
    "OptimizerProcess": "ms_boost.grad_process",
    "ParameterProcess": "ms_boost.grad_process",
    "AdaSum": "ms_boost.adasum",
    "DimReduce": "ms_boost.dim_reduce",
    "thor": "ms_boost.thor",
    "DenseThor": "ms_boost.thor",
    "Conv2dThor": "ms_boost.thor",
    "EmbeddingThor": "ms_boost.thor",
    "ConvertNetUtils": "ms_boost.thor",
    "ConvertModelUtils": "ms_boost.thor",
}

__all__ = ["AutoBoost", "BoostConfigError", "Model", "build_train_network", "BoostTrainOneStepCell",
           "BoostTrainOneStepWithLossScaleCell", *_LAZY]


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ms_boost' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value

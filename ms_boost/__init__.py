"""ms_boost: training acceleration for MindSpore (a reimplementation of ``mindspore.boost``, plus THOR).

Quick use::

    from ms_boost import Model
    model = Model(net, loss_fn=loss, optimizer=opt, metrics={"acc"}, boost_level="O1")

Public names mirror ``mindspore.boost``: AutoBoost, BoostTrainOneStepCell,
BoostTrainOneStepWithLossScaleCell, LessBN, GradientFreeze, FreezeOpt, freeze_cell,
GradientAccumulation, AdaSum, DimReduce, GroupLossScaleManager, OptimizerProcess, ParameterProcess;
plus Model (``boost_level="auto"`` picks the plan by a measured trial: :func:`autotune_plan`),
build_train_network, the THOR optimizer ``thor`` with its layers and converters, and
the communication layer ``ms_boost.comm``; ``register_algorithm`` plugs in a user's algorithm
(``docs/adding_an_algorithm.md``).
"""
from __future__ import annotations

import logging
import sys

from ms_boost import builtins  # noqa: F401 -- registers the built-in algorithms first
from ms_boost.compat import (
    AdaSum,
    AutoBoost,
    Conv2dThor,
    ConvertModelUtils,
    ConvertNetUtils,
    DenseThor,
    DimReduce,
    EmbeddingThor,
    FreezeOpt,
    GradientAccumulation,
    GradientFreeze,
    GroupLossScaleManager,
    LessBN,
    OptimizerProcess,
    ParameterProcess,
    freeze_cell,
)
from ms_boost.model import Model, autotune_plan, build_train_network
from ms_boost.registry import register_algorithm, registered, unregister_algorithm
from ms_boost.source_pin import pin_loaded_sources
from ms_boost.spec import AlgorithmSpec, BuildContext
from ms_boost.thor.convert import set_model_class
from ms_boost.train_cell import BoostTrainOneStepCell, BoostTrainOneStepWithLossScaleCell
from ms_boost.validation import BoostConfigError

__version__ = "0.1.0"

# THOR's ConvertModelUtils builds ms_boost.Model: the face hands it down (ms_boost.thor never imports upward, and
# model.py knows no algorithm)
set_model_class(Model)

# MindSpore compiles graphs from the source text, read when a graph is compiled: keep ms_boost's text as loaded
# (a checkout edited during a long run would otherwise compile other lines; ms_boost.source_pin)
pin_loaded_sources()

_logger = logging.getLogger("ms_boost")
if not _logger.handlers:
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("[ms_boost] %(message)s"))
    _logger.addHandler(_handler)
    _logger.setLevel(logging.INFO)
    _logger.propagate = False

# ``ms_boost.thor`` is the THOR package, and it is callable: ``ms_boost.thor(net, ...)`` builds the optimizer
# (upstream's ``mindspore.nn.thor``) while ``ms_boost.thor.ConvertModelUtils`` and ``import ms_boost.thor.layers``
# reach the package (ms_boost/thor/__init__.py). Bound explicitly: the package, not the factory function.
thor = sys.modules["ms_boost.thor"]

__all__ = [
    "AutoBoost", "BoostConfigError", "Model", "build_train_network", "autotune_plan", "BoostTrainOneStepCell",
    "BoostTrainOneStepWithLossScaleCell", "AlgorithmSpec", "BuildContext", "register_algorithm",
    "unregister_algorithm", "registered", "LessBN", "GradientFreeze", "FreezeOpt", "freeze_cell",
    "GradientAccumulation", "GroupLossScaleManager", "OptimizerProcess", "ParameterProcess", "AdaSum", "DimReduce",
    "thor", "DenseThor", "Conv2dThor", "EmbeddingThor", "ConvertNetUtils", "ConvertModelUtils",
]

"""Conversion of a network to THOR layers and of a Model to a THOR training Model.

:class:`ConvertNetUtils` replaces ``nn.Dense``, ``nn.Conv2d`` and ``nn.Embedding`` cells -- chosen by exact
type, never by name -- with :class:`DenseThor`, :class:`Conv2dThor`, :class:`EmbeddingThor`. The user's
network is **not** modified: every cell on the path from the root to a converted layer is shallow-copied
(its child table replaced, everything else shared), cells without converted descendants are reused as
they are, and the new layers take the original weight and bias **Parameter objects**. So the converted
network and the original share all their Parameters: training one trains the other, checkpoints of
either load into both, and the original keeps its structure for evaluation and export.

:class:`ConvertModelUtils` builds the Model that trains the converted network with the THOR optimizer.
"""
from __future__ import annotations

import copy
import logging
import time
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence

from mindspore import Parameter, nn
from mindspore import log as logger
from mindspore.train import Model as _MsModel

from ms_boost.mindspore_api import cells_compile_cache, copy_recompute
from ms_boost.stages import OptimizerHooks, learning_rate_parameters
from ms_boost.thor.call_sites import forward_calls
from ms_boost.thor.layers import Conv2dThor, DenseThor, EmbeddingThor, ThorLayer
from ms_boost.thor.optimizer import THOR

_log = logging.getLogger("ms_boost")  # what a user must see (MindSpore's own log hides INFO by default)

__all__ = ["ConvertNetUtils", "ConvertModelUtils", "ConvertedLayer", "register_convertible", "thor_train_network",
           "set_thor_frequency", "set_model_class", "ThorModelHooks"]


@dataclass(frozen=True)
class ConvertedLayer:
    """One entry of the conversion report.

    Attributes:
        path: the cell's attribute path in the network (``"layer1.0.conv1"``).
        source: class name of the original cell.
        target: class name of the THOR cell, or ``""`` when skipped.
        reason: why a candidate was skipped (empty when converted).
    """

    path: str
    source: str
    target: str
    reason: str = ""


def _shallow_copy_cell(cell: nn.Cell) -> nn.Cell:
    """A new Cell object of the same class sharing everything with ``cell`` except its own child/parameter tables.

    Compilation caches are not shared (a copy is compiled on its own), Parameters and primitives are. A cell the
    script recomputes (``cell.recompute(...)``) gets a PyNative recompute wrapper of its own (the shared one would
    call the original's ``construct``). The non-reentrant form (``use_reentrant=False``) gets ``early_stop=False``
    here and on THOR layers: its early stop ends the recomputation by raising inside the forward pass, and when that
    lands in a THOR layer's output-gradient hook (a Cell call) MindSpore 2.10's PyNative executor fails ("Stack
    input_args_info_stack_ is empty"); without it the whole forward is recomputed, with the same numbers.
    """
    new = copy.copy(cell)  # Cell.__setstate__ adopts the *same* __dict__: give the copy its own
    state = dict(cell.__dict__)
    for key in ("_cells", "_params", "_params_list", "_buffers"):
        if isinstance(state.get(key), dict):
            state[key] = type(state[key])(state[key])
    state.pop("current_phase", None)
    state.update(_compile_cache=None, _phase_cache=None, _compile_phase=None, _compiled=False, arguments_key="",
                 _create_time=int(time.time() * 1e9))
    object.__setattr__(new, "__dict__", state)
    nn.Cell.total_instance_count += 1  # balanced by Cell.__del__ of the copy
    registry = cells_compile_cache()
    if registry is not None:  # as Cell.__init__ does, so ms_memory_recycle also frees the copy's graphs
        registry[id(new)] = new.compile_cache
    copy_recompute(new, cell, early_stop=False)  # PyNative's recompute wrapper calls the original's construct
    return new


def _unshared(cell: nn.Cell, original: set, memo: dict) -> nn.Cell:
    """``cell``'s tree with every cell of the original network (``id`` in ``original``) replaced by a shallow copy.

    A cell reached twice (one block called twice) gets one copy, so shared weights stay shared.
    """
    if id(cell) in memo:
        return memo[id(cell)]
    new = _shallow_copy_cell(cell) if id(cell) in original else cell
    memo[id(cell)] = new
    for name, child in list(new._cells.items()):  # pylint: disable=protected-access
        if child is not None:
            copied = _unshared(child, original, memo)
            if copied is not child:
                new._cells[name] = copied  # pylint: disable=protected-access
    if isinstance(new, nn.SequentialCell):
        new.cell_list = list(new._cells.values())  # pylint: disable=protected-access
    return new


def _dense_to_thor(cell: nn.Dense, factor_decay: float) -> DenseThor:
    new = DenseThor(cell.in_channels, cell.out_channels, weight_init="zeros", bias_init="zeros",
                    has_bias=cell.has_bias, activation=cell.activation if cell.activation_flag else None,
                    factor_decay=factor_decay)
    new.weight = cell.weight
    if cell.has_bias:
        new.bias = cell.bias
    return new


def _conv_to_thor(cell: nn.Conv2d, factor_decay: float) -> Conv2dThor:
    new = Conv2dThor(cell.in_channels, cell.out_channels, tuple(cell.kernel_size), stride=tuple(cell.stride),
                     pad_mode=cell.pad_mode, padding=cell.padding, dilation=tuple(cell.dilation), group=cell.group,
                     has_bias=cell.has_bias, weight_init="zeros", bias_init="zeros", factor_decay=factor_decay)
    new.weight = cell.weight
    if cell.has_bias:
        new.bias = cell.bias
    return new


def _embedding_to_thor(cell: nn.Embedding, factor_decay: float) -> EmbeddingThor:
    new = EmbeddingThor(cell.vocab_size, cell.embedding_size, use_one_hot=cell.use_one_hot,
                        embedding_table="zeros", dtype=cell.dtype, factor_decay=factor_decay)
    new.padding_idx = cell.padding_idx
    new.embedding_table = cell.embedding_table
    return new


#: the flags ``Cell.to_float`` sets (MindSpore casts a flagged cell's inputs to that type)
_PRECISION_FLAGS = ("fp16", "fp32", "bf16")

_CONVERTERS = {nn.Dense: _dense_to_thor, nn.Conv2d: _conv_to_thor, nn.Embedding: _embedding_to_thor}
_BUILT_IN = tuple(_CONVERTERS)


def register_convertible(cls: type, as_type: type) -> None:
    """Convert cells of type ``cls`` to THOR layers as if they were ``as_type``.

    ``as_type`` is ``nn.Dense``, ``nn.Conv2d`` or ``nn.Embedding``.

    Conversion is by exact type so that a subclass computing something else is never replaced silently; a
    subclass that computes the very same function (another kernel for the same convolution, say) declares
    it here. Its cells are converted from the attributes ``as_type`` defines (channels, kernel, stride,
    padding, ...) and keep their weight Parameters. Registering the same pair again is a no-op.

    Raises:
        TypeError: ``cls`` is not a subclass of ``as_type``, or ``as_type`` is not one of the three.
        ValueError: ``cls`` is already registered as another type.
    """
    if as_type not in _BUILT_IN:
        raise TypeError(f"register_convertible: as_type={as_type!r} must be one of "
                        f"{', '.join(t.__module__ + '.' + t.__name__ for t in _BUILT_IN)}.")
    if not isinstance(cls, type) or not issubclass(cls, as_type):
        raise TypeError(f"register_convertible: cls={cls!r} must be a subclass of {as_type.__name__}.")
    if cls in _CONVERTERS and _CONVERTERS[cls] is not _CONVERTERS[as_type]:
        raise ValueError(f"register_convertible: {cls.__name__} is already registered as another layer type.")
    _CONVERTERS[cls] = _CONVERTERS[as_type]


def _skip_reason(cell: nn.Cell, calls: int = 1) -> str:
    """Why a Dense/Conv2d/Embedding called ``calls`` times per forward pass cannot be converted ('' if it can)."""
    weight = cell.embedding_table if isinstance(cell, nn.Embedding) else cell.weight
    if not weight.requires_grad:
        return "frozen weight"
    if calls == 0:
        return ("never called in the forward pass (its parent computes with its weight directly, as "
                "nn.MultiheadAttention does with out_proj): THOR would capture no statistic for it, so it is trained "
                "by THOR's first-order update")
    if calls > 1:
        return (f"called {calls} times in one forward pass (shared weights): a THOR layer's factors hold the "
                "statistics of one call, so it is trained by THOR's first-order update")
    if isinstance(cell, nn.Conv2d) and getattr(cell, "data_format", "NCHW") != "NCHW":
        return f"data_format {cell.data_format} (only NCHW)"
    return ""


class ConvertNetUtils:
    """Convert a network's Dense / Conv2d / Embedding layers to THOR layers (without touching the original).

    After :meth:`convert_to_thor_net`, :attr:`report` lists every converted layer and every candidate that
    was skipped (frozen weight, NHWC convolution) with the reason.
    """

    def __init__(self):
        self.report: list = []
        self._calls: dict = {}

    def convert_to_thor_net(self, net: nn.Cell, factor_decay: float = 0.0) -> nn.Cell:
        """Return ``net`` with THOR layers, as a new network sharing all Parameters with ``net``.

        Conversion is by exact type (``nn.Dense``, ``nn.Conv2d``, ``nn.Embedding``, plus the subclasses declared
        with :func:`register_convertible`; other subclasses with their own ``construct`` are left alone),
        keeps the very weight and bias Parameters, activation, stride, padding and pad mode, dilation and
        groups. Cells that are already THOR layers are not converted again. Every cell of the result but the new
        THOR layers is a shallow copy of ``net``'s (same class and Parameters, its own child table and flags; a
        THOR layer ``net`` already had included), so what is later done to the
        converted network's cells in place -- amp's ``to_float`` casts by ``Model(..., amp_level="O2")`` --
        leaves ``net`` as it was. When nothing needs converting, ``net`` itself is returned.

        Args:
            net: the network (not modified).
            factor_decay: running-average decay of the new layers' factors, in [0, 1).

        Returns:
            The converted network (``net`` itself if nothing was converted).
        """
        if not isinstance(net, nn.Cell):
            raise TypeError(f"convert_to_thor_net: net must be a mindspore.nn.Cell, got {type(net).__name__}.")
        self.report = []
        self._calls = forward_calls(net)
        memo: dict = {}
        if type(net) in _CONVERTERS:
            converted = self._convert_leaf(net, "", factor_decay)
            result = converted if converted is not None else net
        else:
            result = self._convert(net, "", factor_decay, memo)
            for entry in self.report:
                line = f"thor: {entry.path}: {entry.source} -> {entry.target or 'kept (' + entry.reason + ')'}"
                if entry.reason.startswith(("called ", "never called")):  # not preconditioned: say so where users look
                    _log.warning(line)
                else:
                    logger.info(line)
        if result is net:
            return net
        return _unshared(result, {id(cell) for _, cell in net.cells_and_names()}, {})

    def _convert_leaf(self, cell: nn.Cell, path: str, factor_decay: float) -> Optional[nn.Cell]:
        reason = _skip_reason(cell, self._calls.get(id(cell), 1))
        if reason:
            self.report.append(ConvertedLayer(path, type(cell).__name__, "", reason))
            return None
        new = _CONVERTERS[type(cell)](cell, factor_decay)
        new.set_train(cell.training)
        # the precision `cell.to_float(...)` set (amp casts the same way): its inputs stay cast as they were
        precision = {k: v for k, v in cell.get_flags().items() if k in _PRECISION_FLAGS}
        if precision:
            new.add_flags_recursive(**precision)
        copy_recompute(new, cell, early_stop=False)  # the recomputation set on the layer or on a block around it
        prefix = f"{path}." if path else ""
        for local, param in new.thor_parameters().items():
            param.name = prefix + local
        self.report.append(ConvertedLayer(path, type(cell).__name__, type(new).__name__))
        return new

    def _convert(self, cell: nn.Cell, path: str, factor_decay: float, memo: dict) -> nn.Cell:
        """Converted version of ``cell`` (the same object when none of its descendants changes)."""
        if id(cell) in memo:
            return memo[id(cell)]
        replaced = OrderedDict()
        for name, child in cell._cells.items():  # pylint: disable=protected-access
            child_path = f"{path}.{name}" if path else name
            if child is None or isinstance(child, ThorLayer):
                continue
            if type(child) in _CONVERTERS:
                new = memo.get(id(child)) or self._convert_leaf(child, child_path, factor_decay)
                if new is not None:
                    memo[id(child)] = new
                    replaced[name] = new
            else:
                new = self._convert(child, child_path, factor_decay, memo)
                if new is not child:
                    replaced[name] = new
        if not replaced:
            memo[id(cell)] = cell
            return cell
        new_cell = _shallow_copy_cell(cell)
        for name, child in replaced.items():
            new_cell._cells[name] = child  # pylint: disable=protected-access
        if isinstance(new_cell, nn.SequentialCell):
            new_cell.cell_list = list(new_cell._cells.values())  # pylint: disable=protected-access
        memo[id(cell)] = new_cell
        return new_cell


class ConvertModelUtils:
    """Build the Model that trains a THOR network (upstream API).

    Attributes:
        model_class: the Model class built: :class:`ms_boost.Model`, which the package face hands down with
            :func:`set_model_class` (this module never imports upward; ``import ms_boost`` always runs the face
            first). MindSpore's Model otherwise.
    """

    model_class: type = _MsModel

    @staticmethod
    def convert_to_thor_model(model, network: nn.Cell, loss_fn=None, optimizer=None, metrics=None, amp_level="O0",
                              loss_scale_manager=None, keep_batchnorm_fp32=False):
        """Return a Model whose ``train`` runs THOR and whose ``eval`` works.

        With a THOR optimizer, the returned :attr:`model_class` (:class:`ms_boost.Model`) trains
        ``optimizer.thor_network`` (the
        converted copy of ``network``, sharing its Parameters) with ``loss_fn``, ``optimizer``, ``metrics``,
        ``amp_level``, ``loss_scale_manager`` and ``keep_batchnorm_fp32``; ``model`` is returned unchanged
        for any other optimizer. ``network`` may also be a ``TrainOneStepCell`` built around the THOR
        optimizer. When the train cell keeps its loss scale in a Parameter (``scale_sense``: loss-scale cells,
        dynamic or not), the optimizer is bound to it, so the captured output gradients are unscaled by the
        scale that the backward pass actually used.

        Args:
            model: the Model built by the user (returned as is, with a warning, when ``optimizer`` is not THOR).
            network, loss_fn, optimizer, metrics, amp_level, loss_scale_manager, keep_batchnorm_fp32: as
                given to that Model.
        """
        if isinstance(network, nn.TrainOneStepCell) and isinstance(network.optimizer, THOR):
            return ConvertModelUtils.model_class(network)
        if not isinstance(optimizer, THOR):  # upstream's behaviour, said: the user asked for THOR
            warnings.warn(f"convert_to_thor_model: the optimizer is {type(optimizer).__name__}, not THOR, so the model "
                          f"is returned unchanged and trains with it; build the optimizer with "
                          f"ms_boost.thor.thor(net, lr, damping, momentum, ...) to train THOR.", UserWarning,
                          stacklevel=2)
            return model
        train_net = optimizer.thor_network
        if network is not None and network is not train_net and not _shares_parameters(network, train_net):
            raise ValueError("convert_to_thor_model: `network` is not the network the THOR optimizer was built "
                             "for (they share no parameter); pass the net given to thor().")
        kwargs = {"metrics": metrics, "amp_level": amp_level, "keep_batchnorm_fp32": keep_batchnorm_fp32}
        if loss_scale_manager is not None:
            kwargs["loss_scale_manager"] = loss_scale_manager
        thor_model = ConvertModelUtils.model_class(train_net, loss_fn=loss_fn, optimizer=optimizer, **kwargs)
        scale = getattr(getattr(thor_model, "_train_network", None), "scale_sense", None)
        if isinstance(scale, Parameter):
            optimizer.bind_loss_scale(scale)
        return thor_model


def set_model_class(model_class: type) -> None:
    """Set the Model class :meth:`ConvertModelUtils.convert_to_thor_model` builds.

    The package face passes :class:`ms_boost.Model`.

    Raises:
        TypeError: ``model_class`` is not a subclass of ``mindspore.train.Model``.
    """
    if not (isinstance(model_class, type) and issubclass(model_class, _MsModel)):
        raise TypeError(f"set_model_class: expected a subclass of mindspore.train.Model, got {model_class!r}.")
    ConvertModelUtils.model_class = model_class


class ThorModelHooks(OptimizerHooks):
    """What ``Model`` asks a :class:`THOR` optimizer (:class:`~ms_boost.stages.OptimizerHooks`).

    Registered for THOR by :mod:`ms_boost.builtins`: the network whose THOR layers capture statistics,
    ``frequency=``, a plan note, the guard callback, the loss scale and the damping schedule.

    Args:
        optimizer: the THOR optimizer.
    """

    def __init__(self, optimizer: THOR):
        self.optimizer = optimizer

    def train_network(self, network: nn.Cell, has_loss_fn: bool) -> nn.Cell:
        """The THOR copy of ``network`` when ``network`` is the net ``thor()`` was built from."""
        return thor_train_network(network, self.optimizer, has_loss_fn)

    def check_train_cell(self, train_cell: nn.Cell) -> None:
        """A train step cell holding this THOR must call its THOR layers (:func:`check_thor_train_cell`)."""
        check_thor_train_cell(train_cell, self.optimizer)

    def set_frequency(self, frequency: object) -> None:
        """Set THOR's refresh interval."""
        set_thor_frequency(self.optimizer, frequency)

    def plan_note(self) -> str:
        """The optimizer line of the plan summary."""
        opt = self.optimizer
        return (f"optimizer: THOR from thor() over {opt.n_layers} THOR layers, factors and inverses refreshed every "
                f"{opt.frequency} steps")

    def is_first_order(self) -> bool:
        """THOR is a second-order method (``Model(boost_level="auto")`` refuses it: THOR is one of its candidates)."""
        return False

    def callbacks(self) -> List[Any]:
        """THOR's guard callback."""
        return [self.optimizer.training_guard()]

    def own_loss_scale(self) -> float:
        """THOR's static ``loss_scale``."""
        return float(self.optimizer.loss_scale)

    def schedule_parameters(self) -> Sequence[Parameter]:
        """The learning-rate Parameters and the damping schedule's."""
        return (*learning_rate_parameters(self.optimizer), *self.optimizer.damping.get_parameters())

    def damping_parameters(self) -> Optional[Sequence[Parameter]]:
        """THOR's damping values (None for a ``LearningRateSchedule`` damping: no Parameter to raise)."""
        return self.optimizer.damping_parameters()

    def optimizer_name(self) -> str:
        """The optimizer's class name."""
        return type(self.optimizer).__name__


def thor_train_network(network: nn.Cell, optimizer, has_loss_fn: bool) -> nn.Cell:
    """The network a Model given a THOR ``optimizer`` must train: the one whose THOR layers capture statistics.

    ``thor(net, ...)`` converts a copy of ``net`` (:attr:`THOR.thor_network`, sharing ``net``'s Parameters) and
    leaves ``net`` as it is, so ``Model(net, loss_fn, optimizer=thor(net, ...))`` -- the tutorial's call
    without :meth:`ConvertModelUtils.convert_to_thor_model` -- would train layers that capture nothing, and
    THOR would precondition with factors that never change. This picks the right network:

    * any other optimizer, or a network holding the optimizer's THOR layers: ``network`` unchanged;
    * ``network`` is the network ``thor()`` was built from (same trainable Parameters) and ``loss_fn`` is
      given: :attr:`THOR.thor_network`, logged;
    * otherwise a ``ValueError`` that says what to pass.

    Args:
        network: the ``network`` argument of Model.
        optimizer: the ``optimizer`` argument of Model.
        has_loss_fn: whether Model was given a ``loss_fn`` (``network`` is then the bare network).
    """
    if not isinstance(optimizer, THOR):
        return network
    train_net = optimizer.thor_network
    if network is train_net:
        return network
    if optimizer.built_from(network):  # the net given to thor(): a bare net (loss_fn given) or a loss network
        _log.info("Model: training the THOR copy of the network (optimizer.thor_network, same Parameters), "
                  "whose layers capture the statistics THOR needs.")
        return train_net
    if holds_thor_layers(network, optimizer):
        return network  # e.g. a loss cell wrapped around optimizer.thor_network
    mine = {id(p) for p in network.trainable_params()}
    theirs = {id(p) for p in train_net.trainable_params()}
    if not mine & theirs:
        raise ValueError("Model: the network is not the one the THOR optimizer was built for (they share no "
                         "parameter); pass the net given to thor(), or opt.thor_network.")
    if has_loss_fn and mine == theirs:
        _log.info("Model: training the THOR copy of the network (optimizer.thor_network, same Parameters), "
                  "whose layers capture the statistics THOR needs.")
        return train_net
    raise ValueError(
        "Model: the network shares parameters with the THOR optimizer's network but does not contain its THOR "
        "layers, so no curvature statistics would be captured. Build the optimizer on the network you pass "
        "(thor(net, ...) then Model(net, loss_fn=..., optimizer=opt), or thor(loss_net, ...) then "
        "Model(loss_net, optimizer=opt)), pass opt.thor_network, or use ConvertModelUtils.convert_to_thor_model.")


def holds_thor_layers(network: nn.Cell, optimizer: THOR) -> bool:
    """Whether ``network`` holds every THOR layer of ``optimizer.thor_network``.

    Cells inside an optimizer of ``network`` are not counted: a train step cell holds the optimizer, which reads the
    layers' flags.
    """
    layers = [cell for _, cell in optimizer.thor_network.cells_and_names() if isinstance(cell, ThorLayer)]
    found: set = set()
    pending = [network]
    while pending:
        cell = pending.pop()
        if id(cell) in found or isinstance(cell, nn.Optimizer):
            continue
        found.add(id(cell))
        pending.extend(child for child in cell._cells.values() if child is not None)  # pylint: disable=W0212
    return bool(layers) and all(id(layer) in found for layer in layers)


def check_thor_train_cell(train_cell: nn.Cell, optimizer: THOR) -> None:
    """A train step cell given to ``Model`` (no optimizer argument) that holds ``optimizer`` must train its layers.

    A THOR without layers (a network with nothing to convert: THOR warns that it reduces to Momentum) passes.

    Raises:
        ValueError: ``train_cell`` does not call the THOR layers of ``optimizer.thor_network``: it would train
            without capturing any statistic, THOR preconditioning with factors that never change.
    """
    if not optimizer.thor_layers or holds_thor_layers(train_cell, optimizer):
        return  # no THOR layer (THOR warned that it reduces to Momentum): nothing to capture
    raise ValueError(
        f"Model: the train cell {type(train_cell).__name__} holds a THOR optimizer but does not call its THOR "
        f"layers, so no curvature statistics would be captured: thor(net, ...) converts a copy of net "
        f"(opt.thor_network) and leaves net as it is. Build the cell on that copy, e.g. "
        f"nn.TrainOneStepCell(nn.WithLossCell(opt.thor_network, loss), opt), or give Model the net, loss_fn and "
        f"optimizer (Model(net, loss_fn=loss, optimizer=opt)).")


def set_thor_frequency(optimizer, frequency) -> None:
    """``Model(..., frequency=N)`` (the THOR tutorial's Model argument): the refresh interval of ``optimizer``.

    Raises:
        ValueError: ``optimizer`` is not THOR, or ``frequency`` is not an int >= 1.
    """
    if not isinstance(optimizer, THOR):
        raise ValueError(f"Model: frequency={frequency!r} is THOR's refresh interval; the optimizer is "
                         f"{type(optimizer).__name__}, not THOR (allowed: a THOR optimizer from ms_boost.thor).")
    if isinstance(frequency, bool) or not isinstance(frequency, int) or frequency < 1:
        raise ValueError(f"Model: frequency={frequency!r} must be an int >= 1.")
    if frequency != optimizer.frequency:
        _log.info(f"Model: frequency={frequency} sets the THOR optimizer's refresh interval "
                  f"(thor() had {optimizer.frequency}).")
        optimizer.frequency = frequency


def _shares_parameters(a: nn.Cell, b: nn.Cell) -> bool:
    ids = {id(p) for p in a.get_parameters()}
    return any(id(p) in ids for p in b.get_parameters())

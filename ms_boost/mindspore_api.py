"""What ms_boost needs from MindSpore's mixed-precision code, on every MindSpore release setup.py allows.

``ms_boost.model`` builds its training network the way ``mindspore.amp.build_train_network`` does, which
upstream does with three private helpers of ``mindspore.train.amp`` (``_config_level``,
``_auto_mixed_precision_process``, ``_add_loss_network``). Private names may change between releases, so
this module offers the same three steps through public API:

* :func:`amp_level_config` - the per-level defaults documented for ``build_train_network``
  (``keep_batchnorm_fp32``, ``cast_model_type``, ``loss_scale_manager``), a fresh loss-scale manager per call;
* :func:`apply_amp_level` - the network cast for a level, with public ``mindspore.amp.auto_mixed_precision``
  (``O2`` keeps the black-list cells such as BatchNorm in float32, ``O3`` casts everything);
* :func:`with_loss` - the loss network, casting the backbone's output (and the label) to float32 before the
  loss when the backbone runs in float16/bfloat16.

:func:`apply_amp_level` takes ``leaf_types``: cells that MindSpore's amp rewrite (level ``O1``, and ``O2``/``O3``
under ``MS_AMP_BY_REWRITE``) calls as they are instead of regenerating their source, through the rewrite's
private ``mindspore.rewrite.common.namespace._subtree_black_list`` (ignored where a release lacks it).

Also :func:`cells_compile_cache`: MindSpore's registry of per-cell compile caches, which moved from
``mindspore.common.api`` (2.7.x) to ``mindspore.graph.api`` (2.10); ``ms_boost.thor.convert`` needs it;
:func:`graph_compiled`, whether a cell's graph of a phase is compiled (the train cells' phase setter); and
:func:`copy_recompute`, which gives a copied cell its own PyNative recompute wrapper (``Cell.recompute()``).

``use_private=True`` (default ``None``: automatic) selects the private helpers where the installed
MindSpore still has them with the expected signature, so results are identical to upstream's
``build_train_network``; ``False`` forces the public path.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
from typing import Any, Iterator, Optional, Sequence

import mindspore as ms
from mindspore import nn, ops
from mindspore.amp import DynamicLossScaleManager, auto_mixed_precision

__all__ = ["AMP_LEVELS", "amp_level_config", "apply_amp_level", "cells_compile_cache", "copy_recompute",
           "graph_compiled", "has_private_amp", "rewrite_leaves", "with_loss"]

AMP_LEVELS = ("O0", "O1", "O2", "O3", "auto")
_LOW = (ms.float16, ms.bfloat16)


def _private_amp() -> Optional[Any]:
    """``mindspore.train.amp`` when it has the three private helpers with the expected arguments, else None."""
    try:
        from mindspore.train import amp as private  # noqa: PLC0415
    except ImportError:  # pragma: no cover - a MindSpore without mindspore.train.amp
        return None
    expected = {"_auto_mixed_precision_process": ["network", "config", "level"],
                "_add_loss_network": ["network", "loss_fn", "cast_model_type"]}
    for name, params in expected.items():
        func = getattr(private, name, None)
        if func is None or list(inspect.signature(func).parameters) != params:
            return None
    table = getattr(private, "_config_level", None)
    if not isinstance(table, dict) or not set(AMP_LEVELS) <= set(table):
        return None
    return private


def has_private_amp() -> bool:
    """Whether the installed MindSpore has the private ``mindspore.train.amp`` helpers ms_boost can use."""
    return _private_amp() is not None


def _check_level(level: str) -> None:
    if not isinstance(level, str) or level not in AMP_LEVELS:
        raise ValueError(f"amp_level={level!r} is not allowed; allowed: {list(AMP_LEVELS)}.")


def _select(use_private: Optional[bool]):
    private = _private_amp()
    if use_private and private is None:
        raise RuntimeError(f"MindSpore {ms.__version__} lacks the private mindspore.train.amp helpers "
                           "(_config_level, _auto_mixed_precision_process, _add_loss_network); use_private=False "
                           "uses the public API.")
    return private if use_private is not False else None


def amp_level_config(level: str) -> dict:
    """Defaults of an amp level, as ``build_train_network`` documents them.

    Args:
        level: ``O0``, ``O1``, ``O2``, ``O3`` or ``auto``.

    Returns:
        ``{"keep_batchnorm_fp32": bool, "cast_model_type": dtype, "loss_scale_manager": manager or None}``;
        ``O2`` gets a new ``DynamicLossScaleManager()`` on every call (never shared between networks).
    """
    _check_level(level)
    low = level in ("O2", "O3")
    return {"keep_batchnorm_fp32": level == "O2",
            "cast_model_type": ms.float16 if low else ms.float32,
            "loss_scale_manager": DynamicLossScaleManager() if level == "O2" else None}


@contextlib.contextmanager
def rewrite_leaves(leaf_types: Sequence[type]) -> Iterator[None]:
    """While open, MindSpore's source rewrite calls cells of ``leaf_types`` as they are (no regenerated source).

    The rewrite regenerates every sub-cell's class from its source into a new module, which loses the names that
    source reads from its own module (module-level helpers): such a cell fails with a NameError when the rewritten
    network is built. A leaf keeps its own class; the rewrite inserts no cast inside it.
    """
    try:
        namespace = importlib.import_module("mindspore.rewrite.common.namespace")
    except ImportError:  # pragma: no cover - a MindSpore without the rewrite package
        yield
        return
    black_list = getattr(namespace, "_subtree_black_list", None)
    if not isinstance(black_list, list):  # a release without it: the rewrite parses every cell
        yield
        return
    added = [t for t in leaf_types if t not in black_list]
    black_list.extend(added)
    try:
        yield
    finally:
        for t in added:
            black_list.remove(t)


def apply_amp_level(network: nn.Cell, config: dict, level: str, use_private: Optional[bool] = None,
                    leaf_types: Sequence[type] = ()) -> nn.Cell:
    """Cast ``network`` for an amp level, as ``build_train_network`` does.

    Args:
        network: the backbone (or loss network).
        config: :func:`amp_level_config` of ``level``, possibly with user overrides.
        level: the amp level.
        use_private: see the module docstring.
        leaf_types: cell classes the amp rewrite calls as they are (:func:`rewrite_leaves`).

    Returns:
        The processed network (may be a new cell).
    """
    with rewrite_leaves(leaf_types):
        return _apply_amp_level(network, config, level, use_private)


def _apply_amp_level(network: nn.Cell, config: dict, level: str, use_private: Optional[bool]) -> nn.Cell:
    _check_level(level)
    private = _select(use_private)
    if private is not None:
        return private._auto_mixed_precision_process(network, config, level)  # pylint: disable=protected-access
    cast = config["cast_model_type"]
    if cast == ms.float16 or (level == "O2" and not config["keep_batchnorm_fp32"]):
        return auto_mixed_precision(network, "O2" if config["keep_batchnorm_fp32"] else "O3")
    if cast == ms.float32 and level in ("O2", "O3"):
        return network  # cast_model_type=float32 overrides the level: stays float32
    return auto_mixed_precision(network, level)


class _Float32LossCell(nn.Cell):
    """Loss on a low-precision backbone: output and label cast to float32 before the loss."""

    def __init__(self, backbone: nn.Cell, loss_fn: nn.Cell):
        super().__init__(auto_prefix=False)
        self._backbone = backbone
        self._loss_fn = loss_fn

    def construct(self, data, label):
        out = ops.cast(self._backbone(data), ms.float32)
        if label.dtype in (ms.float16, ms.bfloat16):
            label = ops.cast(label, ms.float32)
        return self._loss_fn(out, label)


def with_loss(network: nn.Cell, loss_fn: nn.Cell, cast_model_type, use_private: Optional[bool] = None) -> nn.Cell:
    """Loss network on top of ``network``, as ``build_train_network`` adds it.

    Args:
        network: the (amp-processed) backbone.
        loss_fn: the loss cell.
        cast_model_type: the level's ``cast_model_type``.
        use_private: see the module docstring.

    Returns:
        ``nn.WithLossCell`` for a float32 backbone; for a float16/bfloat16 one (or one processed at amp level
        O2/O3/auto) a loss cell computing ``loss_fn(float32(backbone(x)), label)``.
    """
    if not isinstance(loss_fn, nn.Cell):
        raise TypeError(f"loss_fn must be a mindspore.nn.Cell, got {type(loss_fn).__name__}.")
    private = _select(use_private)
    if private is not None:
        return private._add_loss_network(network, loss_fn, cast_model_type)  # pylint: disable=protected-access
    if cast_model_type in _LOW or getattr(network, "_amp_level", None) in ("O2", "O3", "auto"):
        return _Float32LossCell(network, loss_fn)
    return nn.WithLossCell(network, loss_fn)


def _graph_api_attribute(name: str, accept) -> Any:
    """``name`` of MindSpore's graph API module when ``accept(value)``, else None.

    Looked up in ``mindspore.graph.api`` (MindSpore 2.10), then ``mindspore.common.api`` (2.7.x).
    """
    for module in ("mindspore.graph.api", "mindspore.common.api"):
        try:
            api = importlib.import_module(module)
        except ImportError:
            continue
        value = getattr(api, name, None)
        if value is not None and accept(value):
            return value
    return None


@functools.cache
def _graph_executor():
    """MindSpore's cell graph executor (``_cell_graph_executor``), or None if absent; looked up once."""
    return _graph_api_attribute("_cell_graph_executor", lambda e: callable(getattr(e, "has_compiled", None)))


def graph_compiled(cell, phase: str) -> bool:
    """Whether ``cell``'s graph of the full ``phase`` is compiled and kept (so a call runs it without compiling).

    False when it cannot be told (a MindSpore without the executor's ``has_compiled``).
    """
    executor = _graph_executor()
    cache = getattr(cell, "compile_cache", None)
    if executor is None or not isinstance(cache, set) or phase not in cache:
        return False
    return bool(executor.has_compiled(phase))


def cells_compile_cache() -> Optional[dict]:
    """MindSpore's ``id(cell) -> compile cache`` registry (``cells_compile_cache``), or None if absent.

    Looked up in ``mindspore.graph.api`` (MindSpore 2.10), then ``mindspore.common.api`` (2.7.x).
    """
    return _graph_api_attribute("cells_compile_cache", lambda r: isinstance(r, dict))


def copy_recompute(new: nn.Cell, original: nn.Cell, early_stop: Optional[bool] = None) -> None:
    """Give ``new`` (a shallow copy of ``original``, or the cell replacing it) ``original``'s recomputation.

    A cell inside a recomputed parent (the private ``_has_config_recompute`` set, no wrapper of its own) is marked
    as the parent's ``recompute()`` marks its children (``Cell._recompute(False, True)``: Graph mode recomputes
    its operators); a copy has the mark already.

    ``Cell.recompute()`` stores in the private ``_recompute_cell`` a wrapper of the cell's bound ``construct``,
    which PyNative mode calls instead of ``construct``; a copy sharing it would run the original's children (not
    the copy's) and in the original's training mode. The wrapper is built again through the public
    ``new.recompute(...)`` with the original's options: ``use_reentrant=True`` stores a Cell (a child in
    ``_cells``), ``False`` a closure (an attribute) over ``output_recompute``, ``early_stop`` and ``context_fn``,
    read from it. Graph mode does not use the wrapper (it compiles ``construct`` with the recompute flags, shared
    by the copy).

    Args:
        new: the copy or the replacing cell.
        original: the script's cell.
        early_stop: for the non-reentrant form, ``early_stop`` to give ``new`` (None: the original's).

    Raises:
        TypeError: the wrapper has a form this release of MindSpore does not make (the message says what to do).
    """
    wrapper = getattr(original, "_recompute_cell", None)
    if wrapper is None:
        if getattr(original, "_has_config_recompute", False) and not getattr(new, "_has_config_recompute", False):
            new._recompute(False, True)  # pylint: disable=protected-access  # as a recomputed parent marks a child
        return
    if isinstance(wrapper, nn.Cell):
        options = {"use_reentrant": True}
    else:
        free = inspect.getclosurevars(wrapper).nonlocals if inspect.isfunction(wrapper) else {}
        keys = ("output_recompute", "early_stop", "context_fn")
        if not all(key in free for key in keys):
            raise TypeError(f"{type(original).__name__}.recompute(): its wrapper ({type(wrapper).__name__}) has a form "
                            f"this MindSpore release did not make, so a copy of the cell cannot recompute as it does; "
                            f"call recompute() on the cells after converting the network.")
        options = {"use_reentrant": False, **{key: free[key] for key in keys}}
        if early_stop is not None:
            options["early_stop"] = early_stop
    new.__dict__.pop("_recompute_cell", None)
    new._cells.pop("_recompute_cell", None)  # pylint: disable=protected-access
    object.__setattr__(new, "_recompute_cell", None)
    new.recompute(**options)

"""Load THOR checkpoints written with another factor layout (whole factors, another block size).

A THOR layer stores a factor up to ``block_size`` wide whole, ``(groups, d, d)``, and a wider one as its diagonal
blocks, ``(groups, n_b, b, b)``, the last block completed with the identity
(:func:`~ms_boost.thor.assignment.factor_shape`). Checkpoints written before the factors were captured as blocks hold
the whole ``(groups, d, d)`` factor of every layer (and, for a layer whose bias is not trained, A with the bias
column, ``d + 1`` wide); ``mindspore.load_param_into_net`` refuses them with its shape error.
:func:`convert_thor_checkpoint` rewrites such entries into the layout of the network they are loaded into:

* **Factors** (``matrix_a_batch``, ``matrix_g_batch`` and the running averages ``matrix_a``, ``matrix_g``): a whole
  factor, or blocks of a larger block size that hold every new block, gives exactly the blocks the layer would
  have captured (the diagonal blocks, the last one padded with the identity; a bias column the layer no longer
  captures dropped). A factor never captured (all zeros) stays all zeros, as a fresh buffer. Blocks of a *smaller*
  block size (or blocks loaded into a whole factor) lack the off-diagonal entries the new blocks need: a scratch
  factor (``*_batch``) is then left out (the next capture rewrites it before anything reads it, see the forced
  refresh below) and a running average is refused (its missing entries would enter the next fold).
* **Inverses** (``thor_a_inverse.*``, ``thor_g_inverse.*``, always block-diagonal ``(groups, n_b, b, b)``): the
  block inverses of one block size are not those of another (a block of an inverse is not the inverse of the
  block), so an inverse of another block size is left out and the optimizer is marked to refresh at its first
  step (``thor_refresh_next`` and every layer's ``thor_capture`` set, the adaptive rule's last trace of that layer
  cleared): the first step captures, folds the converted running average, inverts in the new layout and then
  preconditions with those inverses, exactly as a run configured so from the start would at a refresh step. A
  checkpoint with the same block size needs none of this: its inverses already have the layer's layout (they
  were always block-diagonal) and load as they are.
* **Written-out inverses** (``thor_a_dense.*``, ``thor_g_dense.*``: a factor of a few blocks also keeps its
  block-diagonal inverse as one ``(groups, d, d)`` matrix, :attr:`~ms_boost.thor.optimizer.THOR.dense_inverse_blocks`):
  a checkpoint written before they existed lacks them; they are filled from the checkpoint's block inverse of the
  same factor (exact: the blocks placed on the diagonal, zeros elsewhere), as is one that disagrees with its blocks
  (the blocks decide). Where that inverse was left out, the forced refresh rebuilds them. Loaded by
  ``mindspore.load_param_into_net`` alone, such a checkpoint leaves them as they were (MindSpore lists them as not
  loaded); the optimizer then rewrites them from the loaded blocks before its next step
  (:meth:`~ms_boost.thor.optimizer.THOR.sync_dense_inverses`).

Any other shape is a ``ValueError`` naming the parameter, both shapes and the layouts allowed.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from ms_boost.thor.assignment import block_layout, factor_shape
from ms_boost.thor.layers import ThorLayer
from ms_boost.thor.optimizer import THOR, written_out_inverse

__all__ = ["convert_thor_checkpoint", "load_thor_checkpoint", "stored_factor_layout", "factor_to_layout",
           "layout_holds"]

_log = logging.getLogger("ms_boost")

_FACTORS = ("matrix_a_batch", "matrix_g_batch", "matrix_a", "matrix_g")


# ----------------------------------------------------------------------------------------------- layouts (numpy)
def stored_factor_layout(shape: Sequence[int], groups: int, dims: Sequence[int]) -> Optional[Tuple[int, int]]:
    """``(dim, block)`` of a stored Kronecker factor (or block inverse) of ``shape``, or None when it is no layout.

    ``(groups, d, d)`` is the whole factor, ``(d, d)``, for ``d`` in ``dims``; ``(groups, n_b, b, b)`` the
    diagonal blocks of a ``d``-wide factor (``d`` in ``dims``, ``n_b = ceil(d / b) > 1``; the first of ``dims`` that
    fits); ``(groups, 1, d, d)`` (an inverse up to ``b`` wide) is whole.
    """
    shape = tuple(int(s) for s in shape)
    if len(shape) == 3 and shape[0] == groups and shape[1] == shape[2] and shape[1] in dims:
        return shape[1], shape[1]
    if len(shape) == 4 and shape[0] == groups and shape[2] == shape[3]:
        n_blocks, block = shape[1], shape[2]
        if n_blocks == 1 and block in dims:
            return block, block
        for dim in dims:
            if n_blocks > 1 and block_layout(dim, block) == (n_blocks, block):
                return dim, block
    return None


def layout_holds(old: Tuple[int, int], dim: int, block: int) -> bool:
    """Whether a factor stored as ``old = (dim, block)`` holds the diagonal blocks of ``block`` of its first ``dim``.

    True when each new block (of the first ``dim`` rows and columns) lies inside one old block.
    """
    old_block = old[1]
    for start in range(0, dim, block):
        stop = min(start + block, dim) - 1
        if start // old_block != stop // old_block:
            return False
    return True


def _block_diagonal(value: np.ndarray, dim: int, block: int) -> np.ndarray:
    """``(groups, dim, dim)`` from a factor stored whole or as diagonal blocks (zeros off the blocks)."""
    if value.ndim == 3:
        return value
    groups = value.shape[0]
    full = np.zeros((groups, dim, dim), value.dtype)
    for k, start in enumerate(range(0, dim, block)):
        size = min(block, dim - start)
        full[:, start:start + size, start:start + size] = value[:, k, :size, :size]
    return full


def factor_to_layout(value: np.ndarray, old: Tuple[int, int], dim: int, block_size: int) -> np.ndarray:
    """A factor stored as ``old = (dim, block)`` in the layout of a ``dim``-wide factor at ``block_size``.

    Keeps the first ``dim`` rows and columns (a bias column no longer captured is the last), takes the diagonal
    blocks, and completes a last block narrower than ``block_size`` with the identity, as the layer's capture does
    (:func:`~ms_boost.thor.math.block_gram`). A factor that is all zeros (never captured) stays all zeros. The
    caller checks :func:`layout_holds` first: entries outside the old blocks come out as zeros.
    """
    full = _block_diagonal(np.asarray(value), *old)[:, :dim, :dim]
    shape = factor_shape(full.shape[0], dim, block_size)
    if len(shape) == 3:
        return np.ascontiguousarray(full)
    n_blocks, block = shape[1], shape[2]
    out = np.zeros(shape, full.dtype)
    for k in range(n_blocks):
        start, size = k * block, min(block, dim - k * block)
        out[:, k, :size, :size] = full[:, start:start + size, start:start + size]
        if size < block and full.any():
            out[:, k, range(size, block), range(size, block)] = 1
    return out


# ------------------------------------------------------------------------------------------------- conversion
def _as_array(entry: Any) -> np.ndarray:
    return entry.asnumpy() if isinstance(entry, Tensor) else np.asarray(entry)


def _find_optimizers(network: nn.Cell, optimizer: Optional[THOR]) -> List[THOR]:
    found = [cell for _, cell in network.cells_and_names() if isinstance(cell, THOR)]
    if optimizer is not None and all(cell is not optimizer for cell in found):
        found.append(optimizer)
    return found


def _allowed(groups: int, dims: Sequence[int], block_size: int) -> str:
    dim = dims[0]
    bias = f" or {(groups, dims[1], dims[1])} with the bias column" if len(dims) > 1 else ""
    return (f"the layer's layout {factor_shape(groups, dim, block_size)} (block size {block_size}), the whole factor "
            f"{(groups, dim, dim)}{bias}, or its diagonal blocks (groups, ceil({dim} / b), b, b) of a block size b it "
            f"can be cut from")


class _Converter:
    """One conversion: the entries rewritten, the ones left out, and whether the optimizer must refresh."""

    def __init__(self, parameter_dict: Mapping[str, Any]):
        self.entries: Dict[str, Any] = dict(parameter_dict)
        self.refresh_layers: List[Tuple[THOR, int]] = []

    def factor(self, layer: ThorLayer, param: Parameter, slot: str) -> None:
        entry = self.entries.get(param.name)
        if entry is None or tuple(entry.shape) == tuple(param.shape):
            return
        a_factor = slot.startswith("matrix_a")
        if a_factor and layer.kind == "embedding":
            raise ValueError(self._refusal(param, entry, f"the embedding's token frequencies {tuple(param.shape)}"))
        dim = layer.a_dim if a_factor else layer.g_dim
        dims = [dim]
        if a_factor and layer.bias_in_factor and not layer.a_bias:
            dims.append(dim + 1)  # written before A left out the column of a bias not trained with the weight
        old = stored_factor_layout(entry.shape, layer.groups, dims)
        if old is None:
            raise ValueError(self._refusal(param, entry, _allowed(layer.groups, dims, layer.block_size)))
        if not layout_holds(old, dim, layer.block_size):
            if slot.endswith("_batch"):  # rewritten by the forced refresh's capture before it is read
                del self.entries[param.name]
                _log.info("THOR checkpoint: %s %s -> left out (blocks of size %d lack the off-diagonal entries of "
                          "block size %d); the layer captures it again at the first step", param.name,
                          tuple(entry.shape), old[1], layer.block_size)
                return
            raise ValueError(self._refusal(
                param, entry, f"{_allowed(layer.groups, dims, layer.block_size)}; this running average holds blocks "
                f"of size {old[1]}, which lack the entries of the layer's blocks of size {layer.block_size}: load it "
                f"with thor(..., block_size={old[1]}) or leave the '.matrix_' entries out (choice_func) to restart "
                f"the running averages"))
        value = factor_to_layout(_as_array(entry), old, dim, layer.block_size)
        self.entries[param.name] = Parameter(Tensor(value.astype(np.float32)), name=param.name, requires_grad=False)
        _log.info("THOR checkpoint: %s %s -> %s (%s, block size %d)", param.name, tuple(entry.shape), value.shape,
                  "whole factor" if old[0] == old[1] else f"blocks of size {old[1]}", layer.block_size)

    def inverse(self, opt: THOR, index: int, param: Parameter, slot: str) -> None:
        entry = self.entries.get(param.name)
        if entry is None or tuple(entry.shape) == tuple(param.shape):
            return
        layer = opt.thor_layers[index]
        if len(param.shape) != 4:  # an embedding's diagonal A: its shape never changes
            raise ValueError(self._refusal(param, entry, f"the embedding's diagonal inverse {tuple(param.shape)}"))
        dim = layer.a_dim if slot == "a" else layer.g_dim
        if stored_factor_layout(entry.shape, layer.groups, [dim]) is None or len(entry.shape) != 4:
            raise ValueError(self._refusal(
                param, entry, f"the block inverse {tuple(param.shape)} (block size {opt.block_size}) or the block "
                f"inverse of this {dim}-wide factor at another block size, (groups, ceil({dim} / b), b, b)"))
        del self.entries[param.name]
        self.refresh_layers.append((opt, index))
        _log.info("THOR checkpoint: %s %s -> left out (block inverses of size %d are not those of size %d); the "
                  "optimizer refreshes every layer at its first step", param.name, tuple(entry.shape),
                  int(entry.shape[-1]), int(param.shape[-1]))

    def dense(self, param: Parameter, blocks: Parameter, dim: int) -> None:
        """Write a written-out inverse from the checkpoint's block inverse (same layout only): the blocks decide."""
        entry = self.entries.get(blocks.name)
        if entry is None or tuple(entry.shape) != tuple(blocks.shape):
            return
        full = written_out_inverse(_as_array(entry).astype(np.float32), dim)
        old = self.entries.get(param.name)
        if old is not None and tuple(old.shape) == full.shape and np.array_equal(_as_array(old), full):
            return
        self._set(param, full)
        _log.info("THOR checkpoint: %s filled from %s %s", param.name, blocks.name, tuple(entry.shape))

    def force_refresh(self) -> None:
        """Mark each optimizer that lost an inverse to capture and refresh every layer at its first step."""
        for opt in {id(opt): opt for opt, _ in self.refresh_layers}.values():
            self._set(opt.refresh_next, np.array(True))
            for flag in opt.capture_flags:
                self._set(flag, np.array(True))
            traces = getattr(opt, "inverted_traces", None)
            if traces is not None:  # the adaptive rule inverts a layer whose last trace is 0 (its first inversion)
                entry = self.entries.get(traces.name)
                value = (_as_array(entry) if entry is not None else traces.asnumpy()).copy()
                for owner, index in self.refresh_layers:
                    if owner is opt:
                        value[2 * index:2 * index + 2] = 0.0
                self._set(traces, value)

    def _set(self, param: Parameter, value: np.ndarray) -> None:
        self.entries[param.name] = Parameter(Tensor(value.astype(param.asnumpy().dtype).reshape(param.shape)),
                                             name=param.name, requires_grad=False)

    @staticmethod
    def _refusal(param: Parameter, entry: Any, allowed: str) -> str:
        return (f"THOR checkpoint: {param.name} has shape {tuple(entry.shape)} in the checkpoint and "
                f"{tuple(param.shape)} in the network; allowed: {allowed}.")


def convert_thor_checkpoint(parameter_dict: Mapping[str, Any], network: nn.Cell,
                            optimizer: Optional[THOR] = None) -> Dict[str, Any]:
    """The checkpoint entries of ``network``'s THOR state rewritten into its factor layout (see the module doc).

    Args:
        parameter_dict: ``{name: Parameter}`` as ``mindspore.load_checkpoint`` returns it (not modified).
        network: the cell the checkpoint is loaded into: a network holding THOR layers (``opt.thor_network``) or a
            train network holding them and the THOR optimizer (``model.train_network``).
        optimizer: the THOR optimizer, when ``network`` does not hold it (its inverses are converted too).

    Returns:
        A new dict: the entries that fit unchanged, those converted (one INFO line each on the ``ms_boost``
        logger), without those left out, and with the refresh flags set when an inverse was left out.

    Raises:
        ValueError: an entry of a THOR factor or inverse has a shape that is neither the network's layout nor one
            it can be converted from (the message names the parameter, both shapes and what is allowed).
    """
    converter = _Converter(parameter_dict)
    for _, cell in network.cells_and_names():
        if isinstance(cell, ThorLayer):
            for slot in _FACTORS:
                param = getattr(cell, slot, None)
                if isinstance(param, Parameter):
                    converter.factor(cell, param, slot)
    for opt in _find_optimizers(network, optimizer):
        for index in range(len(opt.thor_layers)):
            converter.inverse(opt, index, opt.a_inverses[index], "a")
            converter.inverse(opt, index, opt.g_inverses[index], "g")
        for k, dense in enumerate(opt.dense_inverses):
            layer = opt.dense_layer[k]
            blocks = opt.a_inverses[layer] if opt.dense_slot[k] == 0 else opt.g_inverses[layer]
            converter.dense(dense, blocks, opt.dense_dims[k])
    converter.force_refresh()
    return converter.entries


def load_thor_checkpoint(ckpt_file_name: str, net: nn.Cell, strict_load: bool = False,
                         optimizer: Optional[THOR] = None, **kwargs) -> tuple:
    """``mindspore.load_checkpoint`` + :func:`convert_thor_checkpoint` + ``mindspore.load_param_into_net``, in place.

    An entry of its Parameter's shape and dtype is written into the Parameter's own memory (``ops.assign``) and
    passed on as the Parameter itself, so ``load_param_into_net`` keeps that memory (its ``set_data`` would replace
    it); the others, and what it returns or raises, are ``load_param_into_net``'s. In place, a network whose train
    step is already compiled keeps its graphs: the compiled PyNative THOR step is not compiled again, and a Graph-mode
    step reads the loaded values also where only a refresh reads them (after ``set_data`` MindSpore 2.10's graph
    kept the memory it was compiled with there: docs/thor.md "PyNative recompiles").

    Args:
        ckpt_file_name: the checkpoint file.
        net: the network (or train network) to load into.
        strict_load: passed to ``load_param_into_net``.
        optimizer: the THOR optimizer when ``net`` does not hold it.
        **kwargs: passed to ``mindspore.load_checkpoint`` (``choice_func``, ``dec_key``, ...).

    Returns:
        What ``load_param_into_net`` returns: ``(params not loaded, checkpoint entries not loaded)``.
    """
    entries = convert_thor_checkpoint(ms.load_checkpoint(ckpt_file_name, **kwargs), net, optimizer)
    params = {p.name: p for p in net.get_parameters()}
    for name, value in entries.items():
        param = params.get(name)
        if (param is not None and param is not value and isinstance(value, Tensor)
                and tuple(value.shape) == tuple(param.shape) and value.dtype == param.dtype):
            ops.assign(param, value)
            entries[name] = param
    return ms.load_param_into_net(net, entries, strict_load=strict_load)

"""AdaSum cells.

:class:`AdaSumReduce` (combine per-tensor deltas across servers) and the update stage :class:`AdaSumUpdate` the pipeline
builds (see :mod:`ms_boost.adasum` for the algorithm and transport).
"""
from __future__ import annotations

import math
import warnings
from typing import Optional, Sequence

import mindspore as ms
import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

from ms_boost import comm
from ms_boost.adasum.layout import DEFAULT_BUCKET_SIZE, DEFAULT_CHUNK, adasum_schedule, plan_buckets
from ms_boost.adasum.math import adasum_tree_reduce
from ms_boost.flat_buffers import assign_all, flat_layout, pad_and_flatten, split_flat
from ms_boost.stages import UpdateStage
from ms_boost.topology import Topology

__all__ = ["AdaSumReduce", "AdaSumUpdate", "check_weights"]


class AdaSumReduce(nn.Cell):
    """Combine this server's per-tensor deltas with every other server's by the AdaSum tree.

    Input: a tuple of delta tensors (one per parameter, any float dtype), identical on the ranks of a
    server. Output: the tuple of combined deltas, float32, identical on every rank. On one server the
    output is the input in float32.

    Per bucket of consecutive tensors (:func:`plan_buckets`): the tensors are fused in float32; device
    ``d`` of each server contributes shard ``d`` of the bucket to one world AllGather, which gives every
    rank the whole bucket of every server; every rank evaluates :func:`adasum_tree_reduce` on it and
    the result is split back into the tensors.

    Args:
        shapes: the shape of each delta tensor, in order.
        device_number: devices per server (``common.device_number``).
        bucket_size: elements per fused AllGather bucket (tensors are never split across buckets).
        chunk: elements per chunk of the fused layout (each tensor is padded to whole chunks).

    Attributes:
        buckets: the :class:`FusedBucket` layouts.
        layouts: per bucket, the constants the compiled steps take: ``(first, stop, packing layout,
            shard begin, shard length, unpacking layout)``.
        tree: ``(plan, chunk, num_servers)`` of :func:`adasum_tree_reduce`.
        active: more than one server (else the Cell only casts to float32).

    Raises:
        TypeError/ValueError: bad ``device_number``, ``bucket_size`` or ``chunk``.
    """

    def __init__(self, shapes: Sequence[Sequence[int]], device_number: int,
                 bucket_size: int = DEFAULT_BUCKET_SIZE, chunk: int = DEFAULT_CHUNK,
                 topology: Optional[Topology] = None):
        super().__init__()
        for name, value in (("bucket_size", bucket_size), ("chunk", chunk)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"AdaSumReduce: {name}={value!r} must be an int >= 1.")
        topology = Topology.current(device_number) if topology is None else topology
        self.num_servers, local_index = topology.num_servers, topology.local_rank
        self.shapes = tuple(tuple(int(d) for d in s) for s in shapes)
        sizes = tuple(math.prod(s) for s in self.shapes)
        self.active = self.num_servers > 1
        self.chunk = chunk
        self.buckets = plan_buckets(sizes, bucket_size, topology.server_size, chunk)
        # per bucket, as constants for construct: tensor range, packing layout, shard range, unpacking layout
        self.layouts = tuple(
            (b.first, b.stop, (tuple(p - n for p, n in zip(b.padded, sizes[b.first:b.stop])), b.tail),
             local_index * b.shard, b.shard, flat_layout(self.shapes[b.first:b.stop], b.starts))
            for b in self.buckets)
        self.indicators = tuple(Tensor(b.indicator()) for b in self.buckets) if self.active else ()
        self.tree = (tuple(level.plan for level in adasum_schedule(self.num_servers)), chunk, self.num_servers)
        self.gather = comm.AllGather()

    def construct(self, deltas):
        """The AdaSum combination of every server's per-tensor deltas (the same on every rank)."""
        if not self.active:
            return _MAP(_to_float32, deltas)
        out = ()
        for b in range(len(self.layouts)):
            first, stop, pack, begin, shard, unpack = self.layouts[b]
            flat = _pack(pack, *deltas[first:stop])
            gathered = self.gather(flat[begin:begin + shard])
            out = out + _unpack(unpack, _tree_of_gathered(gathered, self.indicators[b], self.tree))
        return out


# The fused-layout steps are compiled functions (``ms.jit``), so that in PyNative mode each runs as one
# graph instead of dozens of small operations (inside a Graph-mode construct they are inlined). Layouts
# are Python constants; every Tensor is a separate argument (a tuple of Tensors would be frozen into the
# graph as a constant).
@ms.jit
def _pack(layout, *tensors):
    """Fuse ``tensors`` in float32: each padded with zeros to whole chunks, then the bucket's tail."""
    pads, tail = layout
    return pad_and_flatten(tensors, pads, tail)


@ms.jit
def _unpack(layout, flat):
    """Split a fused bucket back into float32 tensors (``layout``: a :func:`~ms_boost.flat_buffers.flat_layout`)."""
    return split_flat(flat, layout)


@ms.jit
def _tree_of_gathered(gathered, indicator, tree):
    """Rows = servers of the gathered bucket, reduced by the AdaSum tree."""
    plan, chunk, num_servers = tree
    return adasum_tree_reduce(ops.reshape(gathered, (num_servers, -1)), plan, indicator, chunk)


@ms.jit
def _save_packed(layout, saved, *weights):
    """``saved = pack(weights)``: the float32 copy of a bucket's weights before the step."""
    return ops.assign(saved, _pack(layout, *weights))


@ms.jit
def _delta_shard(layout, begin, shard, saved, *weights):
    """This device's shard of ``pack(weights) - saved``: its part of the server's delta."""
    return (_pack(layout, *weights) - saved)[begin:begin + shard]


@ms.jit
def _write_combined(layout, tree, gathered, indicator, saved, *weights):
    """``weights = unpack(saved + AdaSum tree of the gathered deltas)``, cast to each weight's dtype."""
    return assign_all(weights, _unpack(layout, saved + _tree_of_gathered(gathered, indicator, tree)))


_MAP = ops.HyperMap()
_to_float32 = ops.MultitypeFuncGraph("adasum_to_float32")


@_to_float32.register("Tensor")
def _to_float32_tensor(tensor):
    return ops.cast(tensor, ms.float32)


def check_weights(weights, where: str) -> ParameterTuple:
    """``weights`` as a ParameterTuple of float Parameters; ``where`` names the caller in messages."""
    weights = tuple(weights)
    if not weights or not all(isinstance(w, Parameter) for w in weights):
        raise TypeError(f"{where}: weights must be a non-empty sequence of Parameters "
                        f"(e.g. optimizer.parameters), got {[type(w).__name__ for w in weights]}.")
    return ParameterTuple(weights)


class AdaSumUpdate(UpdateStage):
    r"""Update stage: run ``inner``, then replace each server's weight delta by the AdaSum of all of them.

    ``construct(loss, grads, *inputs)``: save the weights (fused in float32, one buffer per bucket),
    call ``inner(loss, grads, *inputs)`` (normally the optimizer step), form
    :math:`\Delta = w_{new} - w_{old}` on the fused buffers, combine the deltas across servers
    (one world AllGather of shards per bucket, as :class:`AdaSumReduce`) and assign
    :math:`w = w_{old} + \operatorname{AdaSum}(\Delta)`.

    The stage is a plain wrapper around ``inner`` (with one warning at construction) when there is only
    one server: one rank, ``device_number`` >= the number of ranks, or no data-parallel context
    (MindSpore's ``parallel_mode`` is not data/hybrid parallel).

    Args:
        inner: update stage with ``construct(self, loss, grads, *inputs)``.
        weights: the parameters the optimizer updates (in gradient order).
        device_number: devices per server (``common.device_number``); 1 runs AdaSum across every rank.
        bucket_size: elements per fused AllGather bucket.
        topology: the ranks (default: :meth:`Topology.current` with ``device_number``).

    Returns from ``construct``: ``inner``'s result, after the weights are written.
    """

    def __init__(self, inner: nn.Cell, weights, device_number: int, bucket_size: int = DEFAULT_BUCKET_SIZE,
                 topology: Optional[Topology] = None):
        if not isinstance(inner, nn.Cell):
            raise TypeError(f"AdaSumUpdate: inner must be an update stage (nn.Cell), got {type(inner).__name__}.")
        super().__init__(inner)
        topology = Topology.current(device_number) if topology is None else topology
        self.weights = check_weights(weights, "AdaSumUpdate")
        self.reduce = AdaSumReduce([w.shape for w in self.weights], device_number, bucket_size, topology=topology)
        data_parallel = topology.data_parallel
        self.active = self.reduce.active and data_parallel
        if not self.active:
            why = ("parallel_mode is not data parallel" if self.reduce.active else
                   f"{comm.get_size()} rank(s) with common.device_number={device_number} make one server")
            warnings.warn(f"AdaSum is a no-op: {why}; the update is the plain inner step.", UserWarning,
                          stacklevel=2)
            return
        self.saved = ParameterTuple(
            Parameter(Tensor(np.zeros(b.length, np.float32)), name=f"adasum_saved.bucket{k}", requires_grad=False)
            for k, b in enumerate(self.reduce.buckets))

    def construct(self, loss, grads, *inputs):
        """Run ``inner``, then replace each weight by its value before the step plus the servers' AdaSum delta."""
        if not self.active:
            return self.inner(loss, grads, *inputs)
        layouts = self.reduce.layouts
        saved = ()
        for b in range(len(layouts)):
            first, stop, pack = layouts[b][0], layouts[b][1], layouts[b][2]
            saved = saved + (_save_packed(pack, self.saved[b], *self.weights[first:stop]),)
        grads = ops.depend(grads, saved)
        done = self.inner(loss, grads, *inputs)
        stepped = ops.depend(self.weights, done)
        written = ()
        for b in range(len(layouts)):
            first, stop, pack, begin, shard, unpack = layouts[b]
            gathered = self.reduce.gather(_delta_shard(pack, begin, shard, self.saved[b], *stepped[first:stop]))
            written = written + _write_combined(unpack, self.reduce.tree, gathered, self.reduce.indicators[b],
                                                self.saved[b], *self.weights[first:stop])
        return ops.depend(done, written)


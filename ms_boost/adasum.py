r"""AdaSum: adaptive summation of the per-server weight updates (Maleki et al., 2020).

Two update vectors are combined, per parameter tensor, as

.. math::

    \operatorname{AdaSum}(g_1, g_2) = \Bigl(1 - \frac{g_1^\top g_2}{2\lVert g_1\rVert^2}\Bigr) g_1
                                    + \Bigl(1 - \frac{g_1^\top g_2}{2\lVert g_2\rVert^2}\Bigr) g_2 ,

so orthogonal updates add (:math:`g_1 + g_2`) and identical ones average (:math:`g`). Over :math:`n`
servers the pairs form a tree over contiguous blocks of ranks (the tutorial's
:math:`\operatorname{AdaSum}(g_{[0,n)}) = \operatorname{AdaSum}(\operatorname{AdaSum}(g_{[0,n/2)}),
\operatorname{AdaSum}(g_{[n/2,n)}))`): servers 0 and 1 pair first, then {0,1} with {2,3}, and so on.

**Any number of servers.** Level by level, neighbouring blocks pair up; when a level has an odd
number of blocks, the last one (the *leftover*) is carried up unchanged and pairs at a later level.
Equivalently, :math:`[a, b)` splits at :math:`a + p` with :math:`p` the largest power of two below
:math:`b - a`, and equivalently again, the count is padded to the next power of two with zero updates,
since :math:`\operatorname{AdaSum}(g, 0) = g`. For powers of two this is exactly the tutorial's tree.
Three servers give :math:`\operatorname{AdaSum}(\operatorname{AdaSum}(g_0, g_1), g_2)`.

**What is combined.** As in the tutorial (and unlike the paper's gradients), the combined vectors are
the *weight deltas* of the local optimizer step, :math:`\Delta = w_{\text{after}} - w_{\text{before}}`,
so every optimizer works (SGD, Momentum, LARS, Adam, ...). Each server keeps its own optimizer state
(moments are built from its own gradients, as in Horovod's delta AdaSum); every rank ends the step with
the same weights :math:`w_{\text{before}} + \operatorname{AdaSum}(\Delta_0, \dots, \Delta_{n-1})`.

**Hierarchy and transport.** The ranks are split into servers of ``device_number`` consecutive ranks
(:func:`ms_boost.comm.server_groups`); the train cell averages gradients inside a server, so every rank
of a server holds the same delta. The deltas are fused (in fp32) into buckets; for each bucket, rank
``d`` of every server contributes the ``d``-th of ``device_number`` equal shards to one world
``AllGather``, which hands every rank the full delta of every server (no byte is sent twice, and only
world collectives are needed -- MindSpore's CPU backend has AllGather on the world group only). Every
rank then evaluates the same tree, in fp32, in the same order, so the result is identical everywhere.
Each tensor starts on a chunk boundary of the fused buffer, so the per-tensor inner products and norms
of all pairs of a level are chunk sums times a 0/1 chunk-to-tensor matrix: a fixed number of
operations per level, however many tensors, and no atomics (deterministic on every backend).

Numerical safety: a zero-norm delta (frozen layer, zero gradient) is neutral
(:math:`\operatorname{AdaSum}(0, g) = g`, :math:`\operatorname{AdaSum}(0, 0) = 0`), never NaN; fp16
deltas are formed and combined in fp32.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import mindspore as ms
import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

from ms_boost import comm

__all__ = [
    "AdaSumLevel", "adasum_schedule", "adasum_coefficients", "adasum_rows", "adasum_pair",
    "adasum_rows_segmented", "adasum_tree_reduce", "FusedBucket", "plan_buckets", "server_layout",
    "AdaSumReduce", "AdaSumUpdate", "AdaSum", "DEFAULT_BUCKET_SIZE", "DEFAULT_CHUNK",
]

#: Elements per fused AllGather bucket: bounds the gathered buffer to ``servers * 4 * 2**22`` bytes.
DEFAULT_BUCKET_SIZE = 2 ** 22
#: Elements per chunk of a fused bucket; per-tensor sums are chunk sums gathered by a 0/1 matrix product.
DEFAULT_CHUNK = 128


# --------------------------------------------------------------------------------------------------
# the tree schedule (pure Python, computed at build time)
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AdaSumLevel:
    """One level of the AdaSum tree.

    Attributes:
        merges: for each pair combined at this level, in order, ``(left_ranks, right_ranks)``; the
            result stands for ``left_ranks + right_ranks`` at the next level.
        carried: the leftover block passed up unchanged when the level has an odd number of blocks
            (always the last block), else ``None``.
    """

    merges: Tuple[Tuple[Tuple[int, ...], Tuple[int, ...]], ...]
    carried: Optional[Tuple[int, ...]]

    @property
    def num_nodes(self) -> int:
        """Number of blocks entering this level."""
        return 2 * len(self.merges) + (self.carried is not None)

    @property
    def plan(self) -> Tuple[int, int, bool]:
        """``(num_nodes, num_pairs, has_carry)``: the level as constants usable inside ``construct``."""
        return self.num_nodes, len(self.merges), self.carried is not None


def adasum_schedule(num_servers: int) -> Tuple[AdaSumLevel, ...]:
    """The AdaSum reduction tree over ``num_servers`` contiguous blocks, level by level.

    At each level, blocks ``(2i, 2i+1)`` merge; with an odd count the last block is carried up.
    ``adasum_schedule(4)`` pairs ``(0,1)`` and ``(2,3)``, then ``(0,1)`` with ``(2,3)``;
    ``adasum_schedule(3)`` pairs ``(0,1)`` (carrying ``2``), then ``(0,1)`` with ``(2,)``.
    There are :math:`\\lceil \\log_2 n \\rceil` levels and :math:`n - 1` merges in all.

    Args:
        num_servers: number of leaves (servers), >= 1.

    Returns:
        The levels, first to last; empty for one server.

    Raises:
        TypeError: ``num_servers`` is not an int.
        ValueError: ``num_servers`` < 1.
    """
    if not isinstance(num_servers, int) or isinstance(num_servers, bool):
        raise TypeError(f"adasum_schedule: num_servers must be an int, got {type(num_servers).__name__}.")
    if num_servers < 1:
        raise ValueError(f"adasum_schedule: num_servers={num_servers} must be >= 1.")
    blocks = [(r,) for r in range(num_servers)]
    levels = []
    while len(blocks) > 1:
        merges = tuple((blocks[i], blocks[i + 1]) for i in range(0, len(blocks) - 1, 2))
        carried = blocks[-1] if len(blocks) % 2 else None
        levels.append(AdaSumLevel(merges, carried))
        blocks = [left + right for left, right in merges] + ([carried] if carried is not None else [])
    return tuple(levels)


@dataclass(frozen=True)
class FusedBucket:
    """Layout of one fused AllGather bucket (consecutive tensors, built at build time).

    Every tensor starts on a chunk boundary: tensor ``i`` occupies ``[starts[k], starts[k] + size_i)``
    of the bucket (``k = i - first``) and is followed by zeros up to the next multiple of ``chunk``; the
    bucket is then padded with whole zero chunks until it splits into ``device_number`` equal shards.

    Attributes:
        first: index of the first tensor.
        stop: one past the last tensor.
        starts: start of each tensor in the bucket.
        padded: each tensor's length rounded up to a multiple of ``chunk``.
        tail: zeros appended after the last tensor's padded length.
        chunk: elements per chunk (segment sums run on whole chunks).
        shard: elements each device of a server contributes (``length / device_number``).
        chunk_owner: for each chunk, the index ``k`` of the tensor it belongs to, or -1 (padding).
    """

    first: int
    stop: int
    starts: Tuple[int, ...]
    padded: Tuple[int, ...]
    tail: int
    chunk: int
    shard: int
    chunk_owner: Tuple[int, ...]

    @property
    def length(self) -> int:
        """Elements in the bucket, padding included."""
        return sum(self.padded) + self.tail

    def indicator(self) -> np.ndarray:
        """``(chunks, tensors)`` float32 0/1 matrix: chunk ``j`` belongs to tensor ``k``."""
        owner = np.asarray(self.chunk_owner)
        out = np.zeros((owner.size, self.stop - self.first), np.float32)
        mine = owner >= 0
        out[np.nonzero(mine)[0], owner[mine]] = 1.0
        return out


def plan_buckets(sizes: Sequence[int], bucket_size: int, device_number: int,
                 chunk: int = DEFAULT_CHUNK) -> Tuple[FusedBucket, ...]:
    """Group consecutive tensors into fused buckets of about ``bucket_size`` elements.

    A bucket closes before the tensor that would take it past ``bucket_size``; a tensor larger than
    ``bucket_size`` gets a bucket of its own. See :class:`FusedBucket` for the padding.

    Args:
        sizes: element count of each tensor, in order.
        bucket_size: target elements per bucket, >= 1.
        device_number: devices per server (shards per bucket), >= 1.
        chunk: elements per chunk, >= 1.

    Returns:
        The buckets, covering every tensor once, in order.
    """
    groups = []
    first, total = 0, 0
    for i, size in enumerate(sizes):
        if i > first and total + size > bucket_size:
            groups.append((first, i))
            first, total = i, 0
        total += int(size)
    if len(sizes) > first:
        groups.append((first, len(sizes)))
    buckets = []
    for first, stop in groups:
        padded = tuple(-(-int(sizes[i]) // chunk) * chunk for i in range(first, stop))
        starts = tuple(sum(padded[:k]) for k in range(len(padded)))
        chunks = sum(padded) // chunk
        all_chunks = -(-chunks // device_number) * device_number
        owner = tuple(k for k, p in enumerate(padded) for _ in range(p // chunk)) + (-1,) * (all_chunks - chunks)
        buckets.append(FusedBucket(first, stop, starts, padded, (all_chunks - chunks) * chunk, chunk,
                                   all_chunks * chunk // device_number, owner))
    return tuple(buckets)


def server_layout(device_number: int) -> Tuple[int, int]:
    """``(num_servers, local_index)`` of this rank for servers of ``device_number`` consecutive ranks.

    Server ``s`` holds world ranks ``[s * device_number, (s + 1) * device_number)`` (the layout of
    :func:`ms_boost.comm.server_groups`). With ``device_number`` >= the world size, all ranks form one
    server. Without communication (one process) the answer is ``(1, 0)``.

    Raises:
        TypeError: ``device_number`` is not an int.
        ValueError: ``device_number`` < 1, or smaller than the world size without dividing it.
    """
    if not isinstance(device_number, int) or isinstance(device_number, bool):
        raise TypeError(f"common.device_number must be an int, got {device_number!r}.")
    if device_number < 1:
        raise ValueError(f"common.device_number={device_number} must be >= 1.")
    size, rank = comm.get_size(), comm.get_rank()
    if size <= device_number:
        return 1, rank
    if size % device_number:
        raise ValueError(f"common.device_number={device_number} must divide the number of ranks ({size}) "
                         f"(servers of device_number consecutive ranks).")
    return size // device_number, rank % device_number


# --------------------------------------------------------------------------------------------------
# the math (functions of tensors, usable in PyNative and inside construct in Graph mode)
# --------------------------------------------------------------------------------------------------
#: Smallest normal float32: a squared norm below it counts as zero in the AdaSum coefficients.
_TINY = 1.1754944e-38


def _ratio(dot: Tensor, norm: Tensor) -> Tensor:
    r""":math:`a^\top b / (2\lVert a\rVert^2)` where :math:`\lVert a\rVert^2 \ge \tau`, else 0."""
    return ops.where(norm >= _TINY, dot / (2.0 * ops.maximum(norm, _TINY)), ops.zeros_like(dot))


def adasum_coefficients(dot: Tensor, norm_a: Tensor, norm_b: Tensor) -> Tuple[Tensor, Tensor]:
    r"""The two AdaSum coefficients from the inner product and the squared norms.

    .. math::

        c_a = 1 - \frac{a^\top b}{2\lVert a\rVert^2}, \qquad c_b = 1 - \frac{a^\top b}{2\lVert b\rVert^2},

    where a fraction whose squared norm is below :math:`\tau` (the smallest normal float32, so in
    particular 0) is taken as 0. A zero vector then has coefficient 1 and contributes nothing:
    :math:`\operatorname{AdaSum}(0, b) = b`, :math:`\operatorname{AdaSum}(0, 0) = 0`, never NaN. A
    vector whose squares underflow (:math:`\lVert a\rVert < \sqrt{\tau} \approx 10^{-19}`) is added
    as is, an error below :math:`10^{-19}`.

    Args:
        dot: :math:`a^\top b`.
        norm_a: :math:`\lVert a\rVert^2`.
        norm_b: :math:`\lVert b\rVert^2`.

    Returns:
        ``(c_a, c_b)``, broadcast like the inputs.
    """
    return 1.0 - _ratio(dot, norm_a), 1.0 - _ratio(dot, norm_b)


def adasum_rows(left: Tensor, right: Tensor) -> Tensor:
    r"""Row-wise AdaSum of two ``(P, n)`` matrices: row :math:`i` is :math:`\operatorname{AdaSum}(l_i, r_i)`.

    .. math::

        \operatorname{AdaSum}(l, r) = \Bigl(1 - \frac{l^\top r}{2\lVert l\rVert^2}\Bigr) l
                                   + \Bigl(1 - \frac{l^\top r}{2\lVert r\rVert^2}\Bigr) r

    Args:
        left: ``(P, n)`` float32.
        right: ``(P, n)`` float32.

    Returns:
        ``(P, n)`` float32.
    """
    dot = ops.sum(left * right, 1, keepdim=True)
    norm_l = ops.sum(left * left, 1, keepdim=True)
    norm_r = ops.sum(right * right, 1, keepdim=True)
    c_l, c_r = adasum_coefficients(dot, norm_l, norm_r)
    return c_l * left + c_r * right


def adasum_pair(a: Tensor, b: Tensor) -> Tensor:
    r"""AdaSum of two update tensors of the same shape, computed in float32.

    .. math::

        \operatorname{AdaSum}(a, b) = \Bigl(1 - \frac{a^\top b}{2\lVert a\rVert^2}\Bigr) a
                                   + \Bigl(1 - \frac{a^\top b}{2\lVert b\rVert^2}\Bigr) b

    where the inner product and norms run over all elements. Orthogonal inputs give :math:`a + b`,
    identical inputs give :math:`a`, a zero input gives the other one.

    Args:
        a: update tensor (any float dtype).
        b: update tensor of the same shape.

    Returns:
        float32 tensor of the shape of ``a``.
    """
    a32 = ops.reshape(ops.cast(a, ms.float32), (1, -1))
    b32 = ops.reshape(ops.cast(b, ms.float32), (1, -1))
    return ops.reshape(adasum_rows(a32, b32), a.shape)


def adasum_rows_segmented(left: Tensor, right: Tensor, indicator: Tensor, chunk: int) -> Tensor:
    r"""Row-wise AdaSum of two ``(P, m)`` matrices, separately on each segment (parameter tensor).

    Each row is a fused buffer of ``m = C * chunk`` elements: ``C`` chunks, chunk :math:`j` belonging to
    segment :math:`t` when :math:`E_{jt} = 1` (``indicator``, ``(C, T)``; padding chunks hold zeros).
    With :math:`\sigma_t(x) = \sum_j E_{jt} \sum_{e \in \text{chunk } j} x_e` the segment sum,

    .. math::

        \operatorname{AdaSum}(l, r)|_t = \Bigl(1 - \frac{\sigma_t(l \odot r)}{2\sigma_t(l \odot l)}\Bigr) l|_t
                                      + \Bigl(1 - \frac{\sigma_t(l \odot r)}{2\sigma_t(r \odot r)}\Bigr) r|_t .

    All segments of all rows are done with a fixed number of operations (chunk sums, one product
    with :math:`E` for the segment sums, one with :math:`E^\top` to spread the coefficients back),
    deterministic on every backend.

    Args:
        left: ``(P, m)`` float32.
        right: ``(P, m)`` float32.
        indicator: ``(C, T)`` float32 0/1.
        chunk: elements per chunk (``m / C``).

    Returns:
        ``(P, m)`` float32.
    """
    pairs = left.shape[0]
    left3 = ops.reshape(left, (pairs, -1, chunk))
    both = ops.concat((left3, ops.reshape(right, (pairs, -1, chunk))), 0)  # (2P, C, chunk): lefts, rights
    products = ops.concat((left3 * both[pairs:], both * both), 0)  # l.r, l.l, r.r
    sums = ops.matmul(ops.sum(products, -1), indicator)  # (3P, T) segment sums
    # the coefficients of lefts and rights together: 1 - dot / (2 norm), rows as in `both`
    coefficients = 1.0 - _ratio(ops.tile(sums[:pairs], (2, 1)), sums[pairs:])
    spread = ops.expand_dims(ops.matmul(coefficients, indicator.T), -1)  # (2P, C, 1) per chunk
    weighted = spread * both
    return ops.reshape(weighted[:pairs] + weighted[pairs:], (pairs, -1))


def adasum_tree_reduce(nodes: Tensor, plan: Tuple[Tuple[int, int, bool], ...], indicator: Optional[Tensor] = None,
                       chunk: int = 1) -> Tensor:
    r"""Reduce the rows of ``nodes`` (one update per server, in server order) with the AdaSum tree.

    At each level rows :math:`2i` and :math:`2i+1` are combined; with an odd number of rows the last
    one moves up unchanged:
    :math:`\operatorname{AdaSum}(g_{[0,n)}) = \operatorname{AdaSum}(\operatorname{AdaSum}(g_{[0,p)}),
    \operatorname{AdaSum}(g_{[p,n)}))`, :math:`p` the largest power of two below :math:`n`.

    Args:
        nodes: ``(n, m)`` float32, row ``s`` the update of server ``s``.
        plan: ``tuple(level.plan for level in adasum_schedule(n))``.
        indicator: ``None`` to treat each row as one vector (:func:`adasum_rows`), or the ``(C, T)``
            chunk-to-segment matrix of a fused buffer (:func:`adasum_rows_segmented`).
        chunk: elements per chunk when ``indicator`` is given.

    Returns:
        ``(m,)`` float32.
    """
    for num_nodes, num_pairs, has_carry in plan:
        left, right = nodes[0:2 * num_pairs:2], nodes[1:2 * num_pairs:2]
        if indicator is None:
            merged = adasum_rows(left, right)
        else:
            merged = adasum_rows_segmented(left, right, indicator, chunk)
        if has_carry:
            merged = ops.concat((merged, nodes[num_nodes - 1:num_nodes]), 0)
        nodes = merged
    return nodes[0]


# --------------------------------------------------------------------------------------------------
# Cells
# --------------------------------------------------------------------------------------------------
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
                 bucket_size: int = DEFAULT_BUCKET_SIZE, chunk: int = DEFAULT_CHUNK):
        super().__init__()
        for name, value in (("bucket_size", bucket_size), ("chunk", chunk)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"AdaSumReduce: {name}={value!r} must be an int >= 1.")
        self.num_servers, local_index = server_layout(device_number)
        self.shapes = tuple(tuple(int(d) for d in s) for s in shapes)
        sizes = tuple(math.prod(s) for s in self.shapes)
        self.active = self.num_servers > 1
        self.chunk = chunk
        self.buckets = plan_buckets(sizes, bucket_size, comm.server_size(device_number), chunk)
        # per bucket, as constants for construct: tensor range, packing layout, shard range, unpacking layout
        self.layouts = tuple(
            (b.first, b.stop, (sizes[b.first:b.stop], b.padded, b.tail), local_index * b.shard, b.shard,
             (b.starts, sizes[b.first:b.stop], self.shapes[b.first:b.stop]))
            for b in self.buckets)
        self.indicators = tuple(Tensor(b.indicator()) for b in self.buckets) if self.active else ()
        self.tree = (tuple(level.plan for level in adasum_schedule(self.num_servers)), chunk, self.num_servers)
        self.gather = comm.AllGather()

    def construct(self, deltas):
        out = ()
        if not self.active:
            for delta in deltas:
                out = out + (ops.cast(delta, ms.float32),)
            return out
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
    sizes, padded, tail = layout
    parts = ()
    for k in range(len(tensors)):
        parts = parts + (ops.reshape(ops.cast(tensors[k], ms.float32), (-1,)),)
        if padded[k] > sizes[k]:
            parts = parts + (ops.zeros((padded[k] - sizes[k],), ms.float32),)
    if tail > 0:
        parts = parts + (ops.zeros((tail,), ms.float32),)
    return ops.concat(parts, 0)


@ms.jit
def _unpack(layout, flat):
    """Split a fused bucket back into float32 tensors of the given shapes."""
    starts, sizes, shapes = layout
    out = ()
    for k in range(len(sizes)):
        out = out + (ops.reshape(flat[starts[k]:starts[k] + sizes[k]], shapes[k]),)
    return out


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
    new = _unpack(layout, saved + _tree_of_gathered(gathered, indicator, tree))
    out = ()
    for k in range(len(weights)):
        out = out + (ops.assign(weights[k], ops.cast(new[k], weights[k].dtype)),)
    return out


def _check_weights(weights, where: str) -> ParameterTuple:
    weights = tuple(weights)
    if not weights or not all(isinstance(w, Parameter) for w in weights):
        raise TypeError(f"{where}: weights must be a non-empty sequence of Parameters "
                        f"(e.g. optimizer.parameters), got {[type(w).__name__ for w in weights]}.")
    return ParameterTuple(weights)


class AdaSumUpdate(nn.Cell):
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

    Returns from ``construct``: ``inner``'s result, after the weights are written.
    """

    def __init__(self, inner: nn.Cell, weights, device_number: int, bucket_size: int = DEFAULT_BUCKET_SIZE):
        super().__init__(auto_prefix=False)
        if not isinstance(inner, nn.Cell):
            raise TypeError(f"AdaSumUpdate: inner must be an update stage (nn.Cell), got {type(inner).__name__}.")
        self.inner = inner
        self.weights = _check_weights(weights, "AdaSumUpdate")
        self.reduce = AdaSumReduce([w.shape for w in self.weights], device_number, bucket_size)
        data_parallel = comm.data_parallel_reduce_config()[0]
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


class AdaSum(nn.Cell):
    """Upstream-named AdaSum Cell (``mindspore.boost.AdaSum`` API), on :class:`AdaSumReduce`.

    ``construct(delta_weights, parameters, old_parameters)`` follows upstream's convention
    ``delta = old - new``: it combines ``delta_weights`` across servers and assigns
    ``parameters[i] = old_parameters[i] - AdaSum(delta)[i]``, returning the tuple of parameters.
    Unlike upstream it takes any ``device_number`` and any number of servers (not only 8 devices and
    powers of two), and needs no backend-specific group name.

    Args:
        rank: this process's global rank (checked against the communication layer).
        device_number: devices per server.
        group_number: number of servers (checked: ``device_number * group_number`` = number of ranks).
        parameter_tuple: the parameters whose deltas are combined (sets the shapes).

    Raises:
        ValueError: ``rank`` or ``group_number`` disagree with the running job.
    """

    def __init__(self, rank: int, device_number: int, group_number: int, parameter_tuple):
        super().__init__()
        if rank != comm.get_rank():
            raise ValueError(f"AdaSum: rank={rank!r} is not this process's rank ({comm.get_rank()}).")
        num_servers, _ = server_layout(device_number)
        if group_number != num_servers:
            raise ValueError(f"AdaSum: group_number={group_number!r} must be the number of servers "
                             f"({comm.get_size()} ranks / device_number={device_number} -> {num_servers}).")
        self.rank, self.device_number, self.group_number = rank, device_number, group_number
        self.parameter_tuple = _check_weights(parameter_tuple, "AdaSum")
        self.reduce = AdaSumReduce([p.shape for p in self.parameter_tuple], device_number)

    def construct(self, delta_weights, parameters, old_parameters):
        combined = self.reduce(delta_weights)
        out = ()
        for i in range(len(self.parameter_tuple)):
            value = ops.cast(old_parameters[i], ms.float32) - combined[i]
            out = out + (ops.assign(parameters[i], ops.cast(value, parameters[i].dtype)),)
        return out

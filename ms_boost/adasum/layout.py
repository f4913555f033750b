"""AdaSum layout: the tree schedule over servers, fused buckets, and this rank's place among the servers.

Pure Python, computed when the stage is built (see :mod:`ms_boost.adasum` for the algorithm).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

from ms_boost.topology import Topology

__all__ = ["AdaSumLevel", "adasum_schedule", "FusedBucket", "plan_buckets", "server_layout",
           "DEFAULT_BUCKET_SIZE", "DEFAULT_CHUNK"]

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
    r"""The AdaSum reduction tree over ``num_servers`` contiguous blocks, level by level.

    At each level, blocks ``(2i, 2i+1)`` merge; with an odd count the last block is carried up.
    ``adasum_schedule(4)`` pairs ``(0,1)`` and ``(2,3)``, then ``(0,1)`` with ``(2,3)``;
    ``adasum_schedule(3)`` pairs ``(0,1)`` (carrying ``2``), then ``(0,1)`` with ``(2,)``.
    There are :math:`\lceil \log_2 n \rceil` levels and :math:`n - 1` merges in all.

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
    blocks: List[Tuple[int, ...]] = [(r,) for r in range(num_servers)]
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

    The rule is :class:`~ms_boost.topology.Topology`'s: ``device_number`` is capped at the number of ranks
    (all ranks on one server), and must otherwise divide it. Without communication the answer is ``(1, 0)``.

    Raises:
        TypeError: ``device_number`` is not an int.
        ValueError: ``device_number`` < 1, or smaller than the world size without dividing it.
    """
    topology = Topology.current(device_number)
    return topology.num_servers, topology.local_rank

"""Static plan of THOR's factor work across ranks: all-reduce groups, inversion owners, broadcasts, batches.

Pure Python (no MindSpore import): the optimizer computes this once at build time from the layers' factor
shapes and turns it into its compiled step; the plan is tested on its own (``tests/test_thor_assignment.py``).

Factor *job* ``2i`` is the input factor :math:`A` of layer ``i``, job ``2i + 1`` its output factor :math:`G`.

* The factors are mean-all-reduced across data-parallel ranks in fused buffers, one per group of layers
  (``split_indices``: the layer index closing each group, upstream's fusion hint).
* Each job is inverted on one rank, the owner, chosen to balance the cubic inversion cost (largest job first
  to the least loaded rank, as KAISA assigns its work), then broadcast from it in one fused buffer per owner.
* This rank's Kronecker jobs (not the diagonal input factor of an embedding) are batched by block size, so all
  ``(b, b)`` blocks of one size are inverted by one batched call.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

__all__ = [
    "DEFAULT_BLOCK_SIZE", "LayerFactors", "InversionPlan", "block_layout", "factor_shape", "inverse_layout",
    "split_groups", "balance", "plan_inversions",
]


#: Default largest diagonal block of a factor (``thor(..., block_size=)``, the ``thor`` section's ``block_size``).
#: Half upstream's ``split_dim`` (128): about an eighth cheaper per step on CPU and as accurate, see docs/thor.md
#: "Block size, measured"; checkpoints of block size 128 load (``ms_boost.thor.checkpoint``).
DEFAULT_BLOCK_SIZE = 64


def block_layout(dim: int, block_size: int) -> Tuple[int, int]:
    """``(blocks, block)``: one block if ``dim <= block_size``, else ``ceil(dim / block_size)`` blocks of that size."""
    if dim <= block_size:
        return 1, dim
    return int(math.ceil(dim / block_size)), block_size


def factor_shape(groups: int, dim: int, block_size: int) -> Tuple[int, ...]:
    """Stored shape of a ``dim``-wide Kronecker factor: ``(groups, dim, dim)``, or its diagonal blocks.

    A factor wider than ``block_size`` is only ever used through its diagonal blocks, so only those are computed
    and stored: ``(groups, n_b, b, b)`` with :func:`block_layout`'s ``(n_b, b)``, the last block completed with
    the identity where ``dim`` is not a multiple of ``b``.
    """
    n_blocks, block = block_layout(dim, block_size)
    return (groups, dim, dim) if n_blocks == 1 else (groups, n_blocks, block, block)


def split_groups(split_indices: Optional[Sequence[int]], n_layers: int) -> List[List[int]]:
    """Layer groups whose factors are all-reduced together: boundaries after each index of ``split_indices``.

    Indices at or past the last layer end the last group (the upstream ResNet-50 value ``[26, 53]`` works
    for smaller nets too). ``split_indices`` must already be validated (non-negative, strictly increasing:
    the ``thor.split_indices`` rule).
    """
    if split_indices is None:
        return [list(range(n_layers))] if n_layers else []
    groups, start = [], 0
    for bound in split_indices:
        end = min(bound, n_layers - 1)
        if end >= start:
            groups.append(list(range(start, end + 1)))
            start = end + 1
    if start < n_layers:
        groups.append(list(range(start, n_layers)))
    return groups


def balance(costs: Sequence[float], size: int) -> List[int]:
    """Owner rank of each job: largest job first to the least loaded rank (ties: lowest rank, lowest job)."""
    load = [0.0] * size
    owner = [0] * len(costs)
    for job in sorted(range(len(costs)), key=lambda j: (-costs[j], j)):
        rank = min(range(size), key=lambda r: (load[r], r))
        owner[job] = rank
        load[rank] += costs[job]
    return owner


@dataclass(frozen=True)
class LayerFactors:
    """What the plan needs to know of one THOR layer.

    Attributes:
        embedding: the input factor is diagonal (an embedding's token frequencies).
        a_shape: shape of the captured input factor: ``(groups, d_in, d_in)``, its diagonal blocks
            ``(groups, n_b, b, b)`` (:func:`factor_shape`), or ``(vocab,)``.
        g_shape: shape of the output factor, ``(groups, d_out, d_out)`` or ``(groups, n_b, b, b)``.
        groups: convolution groups (each group has its own factors); 1 for dense and embedding layers.
        trim_a: the last row/column of a ``(groups, d_in, d_in)`` A (a bias captured but not trained) is dropped
            before inverting (the optimizer's layers capture A without that column instead).
    """

    embedding: bool
    a_shape: Tuple[int, ...]
    g_shape: Tuple[int, ...]
    groups: int = 1
    trim_a: bool = False


@dataclass(frozen=True)
class InversionPlan:  # pylint: disable=too-many-instance-attributes
    """The static layout of one rank's factor work (all tuples indexed by job unless said otherwise).

    Attributes:
        inverse_shapes: shape of each stored inverse: ``(groups, n_b, b, b)``, or ``(vocab,)`` for a diagonal A.
        costs: cubic inversion cost of each job (``groups * n_b * b**3``; the vocabulary for a diagonal A).
        factor_sizes, inverse_sizes: element counts of each factor and of each inverse.
        reduce_jobs: per all-reduce group, its jobs in buffer order (empty on one rank).
        reduce_slot: per job, ``(group, offset)`` in its fused all-reduce buffer (``(-1, 0)`` on one rank).
        owner: per job, the rank that inverts it.
        broadcast_ranks: the owners broadcasting (empty when every rank inverts everything).
        broadcast_jobs, broadcast_sizes: per broadcast, its jobs in buffer order and its element count.
        broadcast_slot: per job, ``(broadcast, offset)``; ``(-1, 0)`` when not broadcast.
        batches: per block size (ascending), this rank's Kronecker jobs of that size.
        batch_block_layer: per batch, the layer of each of its blocks.
        batch_job_groups, batch_job_blocks: per batch, per job: its groups and its blocks per group.
        job_specs: per job ``(mode, layer, slot, batch, first block, block count, whole batch, inverse shape)``;
            mode 0: another rank inverts it, 1: diagonal, 2: Kronecker (batched); slot 0 is A, 1 is G.
    """

    inverse_shapes: Tuple[Tuple[int, ...], ...]
    costs: Tuple[float, ...]
    factor_sizes: Tuple[int, ...]
    inverse_sizes: Tuple[int, ...]
    reduce_jobs: Tuple[Tuple[int, ...], ...]
    reduce_slot: Tuple[Tuple[int, int], ...]
    owner: Tuple[int, ...]
    broadcast_ranks: Tuple[int, ...]
    broadcast_jobs: Tuple[Tuple[int, ...], ...]
    broadcast_sizes: Tuple[int, ...]
    broadcast_slot: Tuple[Tuple[int, int], ...]
    batches: Tuple[Tuple[int, ...], ...]
    batch_block_layer: Tuple[Tuple[int, ...], ...]
    batch_job_groups: Tuple[Tuple[int, ...], ...]
    batch_job_blocks: Tuple[Tuple[int, ...], ...]
    job_specs: Tuple[tuple, ...]


def _kronecker_inverse(shape: Tuple[int, ...], groups: int, trim: bool, block_size: int) -> Tuple[int, ...]:
    """Inverse shape ``(groups, n_b, b, b)`` of a Kronecker factor stored as ``shape`` (full, or already blocks)."""
    if len(shape) == 4:
        return tuple(shape)
    nb, b = block_layout(shape[-1] - int(trim), block_size)
    return groups, nb, b, b


def inverse_layout(layers: Sequence[LayerFactors], block_size: int) -> tuple:
    """``(inverse shapes, costs)`` per job: block-diagonal ``(groups, n_b, b, b)`` or diagonal ``(vocab,)``."""
    shapes, costs = [], []
    for layer in layers:
        if layer.embedding:
            shapes.append(tuple(layer.a_shape))
        else:
            shapes.append(_kronecker_inverse(layer.a_shape, layer.groups, layer.trim_a, block_size))
        shapes.append(_kronecker_inverse(layer.g_shape, layer.groups, False, block_size))
    for shape in shapes:
        costs.append(float(shape[0]) if len(shape) == 1 else float(shape[0] * shape[1] * shape[-1] ** 3))
    return tuple(shapes), tuple(costs)


def _fused_slots(jobs_per_buffer: Sequence[Sequence[int]], sizes: Sequence[int], n_jobs: int) -> tuple:
    """``(slot per job, size per buffer)``: each job's ``(buffer, offset)`` when buffers hold jobs back to back."""
    slots, totals = [(-1, 0)] * n_jobs, []
    for k, jobs in enumerate(jobs_per_buffer):
        offset = 0
        for j in jobs:
            slots[j] = (k, offset)
            offset += sizes[j]
        totals.append(offset)
    return tuple(slots), tuple(totals)


def plan_inversions(layers: Sequence[LayerFactors], block_size: int, rank: int = 0, size: int = 1,
                    distributed: bool = False, split_indices: Optional[Sequence[int]] = None,
                    distribute_inverses: bool = True) -> InversionPlan:
    """The factor work of rank ``rank`` out of ``size`` (see the module docstring).

    Args:
        layers: the THOR layers in network order.
        block_size: factors larger than this are split into diagonal blocks of this size.
        rank, size: this rank and the data-parallel group size.
        distributed: the factors are all-reduced across ranks (data parallel).
        split_indices: validated ``thor.split_indices`` (None: one all-reduce group).
        distribute_inverses: each factor is inverted on one rank and broadcast (else every rank inverts all).
    """
    n_jobs = 2 * len(layers)
    inverse_shapes, costs = inverse_layout(layers, block_size)
    factor_shapes = [s for layer in layers for s in (layer.a_shape, layer.g_shape)]
    factor_sizes = tuple(math.prod(s) for s in factor_shapes)
    inverse_sizes = tuple(math.prod(s) for s in inverse_shapes)
    reduce_jobs: Tuple[Tuple[int, ...], ...] = ()
    if distributed:
        reduce_jobs = tuple(tuple(j for i in group for j in (2 * i, 2 * i + 1))
                            for group in split_groups(split_indices, len(layers)))
    reduce_slot, _ = _fused_slots(reduce_jobs, factor_sizes, n_jobs)
    spread = distributed and distribute_inverses and size > 1
    owner = tuple(balance(costs, size)) if spread else (rank,) * n_jobs
    broadcast_ranks = tuple(sorted(set(owner))) if spread else ()
    broadcast_jobs = tuple(tuple(j for j in range(n_jobs) if owner[j] == root) for root in broadcast_ranks)
    broadcast_slot, broadcast_sizes = _fused_slots(broadcast_jobs, inverse_sizes, n_jobs)

    def diagonal(job: int) -> bool:
        return job % 2 == 0 and layers[job // 2].embedding

    by_size: dict = {}
    for j in range(n_jobs):
        if owner[j] == rank and not diagonal(j):
            by_size.setdefault(inverse_shapes[j][-1], []).append(j)
    batches = tuple(tuple(by_size[b]) for b in sorted(by_size))
    slots = [(-1, 0, 0)] * n_jobs
    block_layer = []
    for k, jobs in enumerate(batches):
        offset, layer_of_block = 0, []
        for j in jobs:
            count = inverse_shapes[j][0] * inverse_shapes[j][1]
            slots[j] = (k, offset, count)
            layer_of_block += [j // 2] * count
            offset += count
        block_layer.append(tuple(layer_of_block))
    specs = []
    for j in range(n_jobs):
        k, first, count = slots[j]
        mode = 0 if owner[j] != rank else (1 if diagonal(j) else 2)
        specs.append((mode, j // 2, j % 2, k, first, count, k >= 0 and len(batches[k]) == 1, inverse_shapes[j]))
    return InversionPlan(
        inverse_shapes=inverse_shapes, costs=costs, factor_sizes=factor_sizes, inverse_sizes=inverse_sizes,
        reduce_jobs=reduce_jobs, reduce_slot=reduce_slot, owner=owner, broadcast_ranks=broadcast_ranks,
        broadcast_jobs=broadcast_jobs, broadcast_sizes=broadcast_sizes, broadcast_slot=broadcast_slot,
        batches=batches, batch_block_layer=tuple(block_layer),
        batch_job_groups=tuple(tuple(layers[j // 2].groups for j in jobs) for jobs in batches),
        batch_job_blocks=tuple(tuple(slots[j][2] // layers[j // 2].groups for j in jobs) for jobs in batches),
        job_specs=tuple(specs))

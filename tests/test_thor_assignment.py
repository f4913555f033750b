"""THOR's static work plan (``ms_boost/thor/assignment.py``), loaded and tested without MindSpore.

The module is loaded from its file with ``mindspore`` made unimportable, so an import of MindSpore (or of any
module needing it) fails here. The plan is checked against brute-force references and its invariants: every
factor is inverted by exactly one rank, the fused buffers hold each job once at consecutive offsets, the
batches hold exactly this rank's Kronecker jobs of one block size.
"""
from __future__ import annotations

import importlib.util
import itertools
import math
import sys
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[1] / "ms_boost" / "thor" / "assignment.py"


@pytest.fixture(scope="module")
def assignment():
    saved = {k: sys.modules.get(k) for k in ("mindspore", "ms_boost")}
    sys.modules["mindspore"] = None  # import mindspore -> ImportError
    sys.modules["ms_boost"] = None
    try:
        spec = importlib.util.spec_from_file_location("thor_assignment_alone", PATH)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop("thor_assignment_alone", None)
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    return module


def test_block_layout_and_split_groups(assignment):
    assert assignment.block_layout(100, 128) == (1, 100)
    assert assignment.block_layout(300, 128) == (3, 128)  # padded to 384
    assert assignment.block_layout(256, 128) == (2, 128)
    assert assignment.split_groups(None, 4) == [[0, 1, 2, 3]]
    assert assignment.split_groups(None, 0) == []
    assert assignment.split_groups([1, 4], 8) == [[0, 1], [2, 3, 4], [5, 6, 7]]
    assert assignment.split_groups([26, 53], 13) == [list(range(13))]  # upstream's ResNet-50 value, small net
    assert assignment.split_groups([0, 2, 9], 3) == [[0], [1, 2]]


def _best_makespan(costs, size):
    return min(max(sum(c for c, r in zip(costs, owners) if r == rank) for rank in range(size))
               for owners in itertools.product(range(size), repeat=len(costs)))


@pytest.mark.parametrize("costs,size", [([8.0, 7, 6, 5, 4], 2), ([1.0, 1, 1, 1, 1, 1, 9], 3),
                                        ([27.0, 8, 8, 1, 64, 1], 2), ([5.0], 4)])
def test_balance_is_greedy_longest_first_within_the_lpt_bound(assignment, costs, size):
    owner = assignment.balance(costs, size)
    loads = [sum(c for c, r in zip(costs, owner) if r == rank) for rank in range(size)]
    # Graham's bound for longest-processing-time-first: makespan <= (4/3 - 1/(3m)) * optimum
    assert max(loads) <= (4 / 3 - 1 / (3 * size)) * _best_makespan(costs, size) + 1e-9
    # the largest job goes to rank 0, the next to rank 1 (least loaded, ties to the lowest rank)
    order = sorted(range(len(costs)), key=lambda j: (-costs[j], j))
    assert owner[order[0]] == 0
    if size > 1 and len(costs) > 1:
        assert owner[order[1]] == 1


LAYERS = [  # dense 300 -> 10 with bias in A; conv 3x3x3 -> 8 in 2 groups; embedding 50 x 6; dense 6 -> 4, bias trimmed
    dict(embedding=False, a_shape=(1, 301, 301), g_shape=(1, 10, 10)),
    dict(embedding=False, a_shape=(2, 14, 14), g_shape=(2, 4, 4), groups=2),
    dict(embedding=True, a_shape=(50,), g_shape=(1, 6, 6)),
    dict(embedding=False, a_shape=(1, 7, 7), g_shape=(1, 4, 4), trim_a=True),
]


def _layers(assignment):
    return [assignment.LayerFactors(**layer) for layer in LAYERS]


def test_inverse_shapes_and_costs(assignment):
    shapes, costs = assignment.inverse_layout(_layers(assignment), 128)
    assert shapes == ((1, 3, 128, 128), (1, 1, 10, 10), (2, 1, 14, 14), (2, 1, 4, 4), (50,), (1, 1, 6, 6),
                      (1, 1, 6, 6), (1, 1, 4, 4))
    assert costs == (3 * 128.0 ** 3, 10.0 ** 3, 2 * 14.0 ** 3, 2 * 4.0 ** 3, 50.0, 6.0 ** 3, 6.0 ** 3, 4.0 ** 3)


def _check_fused(jobs_per_buffer, slots, sizes, totals=None):
    for k, jobs in enumerate(jobs_per_buffer):
        offset = 0
        for j in jobs:
            assert slots[j] == (k, offset)
            offset += sizes[j]
        if totals is not None:
            assert totals[k] == offset


@pytest.mark.parametrize("size", [1, 2, 3])
def test_plan_covers_every_job_once_across_ranks(assignment, size):
    layers = _layers(assignment)
    plans = [assignment.plan_inversions(layers, 128, rank, size, distributed=size > 1, split_indices=[1])
             for rank in range(size)]
    n_jobs = 2 * len(layers)
    owner = plans[0].owner
    assert all(p.owner == owner for p in plans)  # every rank computes the same assignment
    assert owner == tuple(assignment.balance(plans[0].costs, size)) if size > 1 else (0,) * n_jobs
    factor_sizes = [math.prod(s) for layer in LAYERS for s in (layer["a_shape"], layer["g_shape"])]
    assert list(plans[0].factor_sizes) == factor_sizes
    kronecker = {j for j in range(n_jobs) if not (j % 2 == 0 and LAYERS[j // 2]["embedding"])}
    batched = []
    for rank, plan in enumerate(plans):
        if size > 1:  # two all-reduce groups: layers 0-1, then 2-3
            assert plan.reduce_jobs == ((0, 1, 2, 3), (4, 5, 6, 7))
            _check_fused(plan.reduce_jobs, plan.reduce_slot, plan.factor_sizes)
            assert plan.broadcast_ranks == tuple(sorted(set(owner)))
            assert sorted(j for jobs in plan.broadcast_jobs for j in jobs) == list(range(n_jobs))
            _check_fused(plan.broadcast_jobs, plan.broadcast_slot, plan.inverse_sizes, plan.broadcast_sizes)
        else:
            assert plan.reduce_jobs == () and plan.broadcast_ranks == ()
        for k, jobs in enumerate(plan.batches):
            block = {plan.inverse_shapes[j][-1] for j in jobs}
            assert len(block) == 1  # one block size per batch
            assert all(owner[j] == rank and j in kronecker for j in jobs)
            blocks = [plan.inverse_shapes[j][0] * plan.inverse_shapes[j][1] for j in jobs]
            assert plan.batch_block_layer[k] == tuple(j // 2 for j, n in zip(jobs, blocks) for _ in range(n))
            assert plan.batch_job_blocks[k] == tuple(plan.inverse_shapes[j][1] for j in jobs)
        sizes = [plan.inverse_shapes[jobs[0]][-1] for jobs in plan.batches]
        assert sizes == sorted(sizes)
        batched += [j for jobs in plan.batches for j in jobs]
        for j, spec in enumerate(plan.job_specs):
            mode, layer, slot, batch, first, count, whole, shape = spec
            assert (layer, slot, shape) == (j // 2, j % 2, plan.inverse_shapes[j])
            assert mode == (0 if owner[j] != rank else (2 if j in kronecker else 1))
            if mode == 2:
                assert j in plan.batches[batch] and whole == (len(plan.batches[batch]) == 1)
                assert count == shape[0] * shape[1]
    assert sorted(batched) == sorted(kronecker)  # each Kronecker job inverted on exactly one rank


def test_without_distribution_every_rank_inverts_everything(assignment):
    plan = assignment.plan_inversions(_layers(assignment), 4, 1, 2, distributed=True, distribute_inverses=False)
    assert plan.owner == (1,) * 8 and plan.broadcast_ranks == ()
    assert plan.reduce_jobs == (tuple(range(8)),)  # still averaged across ranks, one group

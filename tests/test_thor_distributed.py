"""Data-parallel THOR on 2-3 simulated ranks (tests/helpers/loopback.py): identical weights on every rank, equal to
one process on the concatenated batch (factors are mean-all-reduced before inversion; inverses split across
ranks and broadcast). Graph mode under a real msrun job: tests/test_msrun_e2e.py."""
from __future__ import annotations

import numpy as np
import pytest
from mindspore import nn

from tests.helpers.loopback import run_ranks
from tests.helpers.nets import dataset, learnable_data
from tests.workers.common import make_plain_net, rank_rows

STEPS, BATCH, WORKERS = 4, 4, 2  # also the msrun job's THOR steps (tests/workers/e2e_graph.py, test_msrun_e2e.py)


def build_thor_model(split_indices, distribute_inverses: bool = True, loss_scale: bool = False,
                     stat_fraction: float = 1.0):
    """The plain conv net (no BatchNorm) trained by THOR through ConvertModelUtils and ms_boost.Model
    (with ``loss_scale``: a fixed loss scale of 8 divided out by the optimizer)."""
    from ms_boost.thor import THOR, ConvertModelUtils, ConvertNetUtils

    net = make_plain_net()
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    thor_net = ConvertNetUtils().convert_to_thor_net(net)
    opt = THOR(thor_net, 0.1, 0.05, 0.9, weight_decay=1e-3, loss_scale=8.0 if loss_scale else 1.0, frequency=2,
               split_indices=split_indices, distribute_inverses=distribute_inverses, block_size=16,
               stat_fraction=stat_fraction)
    import mindspore as ms

    from ms_boost import Model

    kwargs = {"loss_scale_manager": ms.FixedLossScaleManager(8.0, drop_overflow_update=False)} if loss_scale else {}
    model = ConvertModelUtils().convert_to_thor_model(Model(net, loss, opt, **kwargs), net, loss, opt, **kwargs)
    return net, opt, model


def single_process_reference(size: int = WORKERS):
    x, y = learnable_data(STEPS * BATCH * size, seed=1)
    net, opt, model = build_thor_model(None)
    # op by op like the loopback ranks (no compile; compiled == op by op:
    # test_thor_optimizer.py::test_pynative_compiled_step_equals_op_by_op_and_follows_set_data)
    opt.compile_pynative_step = False
    model.train(1, dataset(x, y, batch_size=BATCH * size), dataset_sink_mode=False)
    return [p.asnumpy().copy() for p in net.trainable_params()], opt


def train_rank(rank: int, size: int, split, distribute: bool, stat_fraction: float = 1.0) -> dict:
    """One rank of the data-parallel THOR training (tests/workers/e2e_graph.py does the same under msrun)."""
    x, y = rank_rows(rank, size, STEPS, BATCH)
    net, opt, model = build_thor_model(split, distribute, stat_fraction=stat_fraction)
    model.train(1, dataset(x, y, batch_size=BATCH), dataset_sink_mode=False)
    owned = sum(1 for owner in opt.inverse_owner if owner == rank)
    return {"owned": np.array(owned), "step": opt.global_step.asnumpy(),
            **{f"w{i}": p.asnumpy() for i, p in enumerate(net.trainable_params())},
            **{f"a_inv{i}": p.asnumpy() for i, p in enumerate(opt.a_inverses)},
            **{f"g_inv{i}": p.asnumpy() for i, p in enumerate(opt.g_inverses)}}


@pytest.mark.parametrize("size,split,distribute", [(3, [0], True), (2, None, False)])
def test_loopback_ranks_equal_one_process_on_the_concatenated_batch(size, split, distribute):
    """PyNative on simulated ranks (tests/helpers/loopback.py): factors mean-all-reduced (fused in two split
    groups, or one), inverses split across 3 ranks and broadcast from their owner, or all computed everywhere.
    The msrun job of tests/test_msrun_e2e.py runs the split case on 2 ranks in Graph mode."""
    ranks = run_ranks(size, lambda rank: train_rank(rank, size, split, distribute))
    check_ranks(ranks, size, distribute)


def check_ranks(ranks: list, size: int, distribute: bool) -> None:
    ref, ref_opt = single_process_reference(size)
    jobs = 2 * len(ref_opt.thor_layers)
    assert [int(r["step"][0]) for r in ranks] == [STEPS] * size
    if distribute:  # the inversion work is split: every rank owned some factors, each factor one owner
        assert all(int(r["owned"]) > 0 for r in ranks)
        assert sum(int(r["owned"]) for r in ranks) == jobs
    else:
        assert all(int(r["owned"]) == jobs for r in ranks)
    for rank in range(1, size):
        for key in ranks[0]:
            if key != "owned":
                np.testing.assert_array_equal(ranks[0][key], ranks[rank][key], err_msg=key)
    for i, w in enumerate(ref):
        np.testing.assert_allclose(ranks[0][f"w{i}"], w, rtol=1e-4, atol=2e-5, err_msg=f"w{i}")
    for i, p in enumerate(ref_opt.a_inverses):
        np.testing.assert_allclose(ranks[0][f"a_inv{i}"], p.asnumpy(), rtol=1e-3, atol=1e-4)


def test_loopback_ranks_take_the_statistics_of_each_ranks_sub_batch():
    """stat_fraction 0.5 on 2 simulated ranks of 4 samples: each rank's factors come from its first 2 samples and are
    mean-all-reduced, which equals one process whose batch of 8 starts with those 4 samples (same per-sample
    normalisation: G = N^2/k sum delta delta^T on both sides) and holds the other 4 after them (same mean gradient),
    and not the whole batches' statistics."""
    size, half = 2, BATCH // 2
    ranks = run_ranks(size, lambda rank: train_rank(rank, size, None, True, stat_fraction=0.5))
    x, y = learnable_data(STEPS * BATCH * size, seed=1)
    order = [s * BATCH * size + r * BATCH + i for s in range(STEPS)
             for part in (range(half), range(half, BATCH)) for r in range(size) for i in part]
    net, opt, model = build_thor_model(None, stat_fraction=0.5)
    opt.compile_pynative_step = False  # op by op like the loopback ranks
    model.train(1, dataset(x[order], y[order], batch_size=BATCH * size), dataset_sink_mode=False)
    for key in ranks[0]:
        if key != "owned":
            np.testing.assert_array_equal(ranks[0][key], ranks[1][key], err_msg=key)
    for i, w in enumerate(net.trainable_params()):
        np.testing.assert_allclose(ranks[0][f"w{i}"], w.asnumpy(), rtol=1e-4, atol=2e-5, err_msg=f"w{i}")
    for i, p in enumerate(opt.a_inverses):
        np.testing.assert_allclose(ranks[0][f"a_inv{i}"], p.asnumpy(), rtol=1e-3, atol=1e-4)
    for i, p in enumerate(opt.g_inverses):
        np.testing.assert_allclose(ranks[0][f"g_inv{i}"], p.asnumpy(), rtol=1e-3, atol=1e-4)
    # the sub-batch mattered: the whole batches' statistics give other inverses
    _, whole_opt, whole_model = build_thor_model(None)
    whole_opt.compile_pynative_step = False
    whole_model.train(1, dataset(x[order], y[order], batch_size=BATCH * size), dataset_sink_mode=False)
    assert not np.allclose(ranks[0]["a_inv0"], whole_opt.a_inverses[0].asnumpy(), rtol=1e-3, atol=1e-4)

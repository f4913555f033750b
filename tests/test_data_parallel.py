"""Data parallelism: the gradient reducer against numpy and whole trainings equal to one process on the
concatenated batch, on 2-4 simulated ranks in one process (tests/helpers/loopback.py, PyNative); the same
training under a real 2-worker msrun job in Graph mode, together with the other end-to-end scenarios
(tests/test_msrun_e2e.py)."""
from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn

from ms_boost import Model, comm
from tests.helpers.loopback import run_ranks
from tests.helpers.nets import dataset, learnable_data, weights
from tests.workers.common import make_plain_net, rank_rows
from tests.workers.e2e_graph import overflow_scenario

STEPS, BATCH = 3, 4
SHAPES = ((3, 2), (4,), (1,))


def rank_grads(rank: int) -> list:
    rng = np.random.default_rng(100 + rank)
    return [rng.normal(0, 1, s).astype(np.float32) for s in SHAPES]


@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize("mean", [True, False])
def test_grad_reducer_world_and_server_groups_match_numpy(size, mean):
    """comm.GradReducer over the world (degree = world size or a given one) and over server groups of 2."""
    def rank_fn(rank):
        params = [Parameter(Tensor(np.zeros(s, np.float32)), name=f"p{i}") for i, s in enumerate(SHAPES)]
        grads = tuple(Tensor(g) for g in rank_grads(rank))
        out = {"world": comm.GradReducer(params, mean)(grads),
               "degree": comm.GradReducer(params, mean, degree=8)(grads),
               "off": comm.GradReducer(params, mean, enabled=False)(grads)}
        if size % 2 == 0:
            group, _ = comm.server_groups(2)
            out["server"] = comm.GradReducer(params, mean, 2, group)(grads)
        return {k: [t.asnumpy() for t in v] for k, v in out.items()}

    results = run_ranks(size, rank_fn)
    every = [rank_grads(r) for r in range(size)]
    for rank, res in enumerate(results):
        for i in range(len(SHAPES)):
            total = np.sum([g[i] for g in every], axis=0)
            np.testing.assert_allclose(res["world"][i], total / size if mean else total, rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(res["degree"][i], total / 8 if mean else total, rtol=1e-6, atol=1e-6)
            np.testing.assert_array_equal(res["off"][i], every[rank][i])
            if size % 2 == 0:
                server = every[rank - rank % 2:rank - rank % 2 + 2]
                part = np.sum([g[i] for g in server], axis=0)
                np.testing.assert_allclose(res["server"][i], part / 2 if mean else part, rtol=1e-6, atol=1e-6)


def single_process_reference(size: int, boost=None) -> list:
    x, y = learnable_data(STEPS * BATCH * size, seed=1)
    net = make_plain_net()
    model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                  nn.Momentum(net.trainable_params(), 0.1, 0.9), boost_config_dict=boost)
    model.train(1, dataset(x, y, batch_size=BATCH * size), dataset_sink_mode=False)
    return weights(net)


def train_rank(rank: int, size: int, boost=None) -> list:
    """One rank of the data-parallel training (tests/workers/e2e_graph.py does the same under msrun)."""
    x, y = rank_rows(rank, size, STEPS, BATCH)
    net = make_plain_net()
    model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                  nn.Momentum(net.trainable_params(), 0.1, 0.9), boost_config_dict=boost)
    model.train(1, dataset(x, y, batch_size=BATCH), dataset_sink_mode=False)
    return weights(net)


@pytest.mark.parametrize("size", [2, 3])
def test_mean_reducer_training_equals_concatenated_batch(size):
    ranks = run_ranks(size, lambda rank: train_rank(rank, size))
    ref = single_process_reference(size)
    for r in range(1, size):
        for i in range(len(ref)):
            np.testing.assert_array_equal(ranks[0][i], ranks[r][i])
    for i, w in enumerate(ref):
        np.testing.assert_allclose(ranks[0][i], w, rtol=0, atol=1e-5)


def test_overflow_on_one_rank_skips_the_step_on_every_rank():
    """Rank 1's inf loss on step 2 makes every rank skip that step (the overflow flag is all-reduced)."""
    def rank_fn(rank):
        out = overflow_scenario(rank)  # the scenario the Graph-mode msrun job runs too
        return bool(out["of1"]), bool(out["of2"]), float(out["changed"]), out["w"]

    ranks = run_ranks(2, rank_fn)
    for of1, of2, changed, _ in ranks:
        assert not of1 and of2
        assert changed == 0.0
    np.testing.assert_array_equal(ranks[0][3], ranks[1][3])
    assert ms.get_context("mode") == ms.PYNATIVE_MODE


def _train_alone() -> list:
    """A Model with a dynamic loss-scale manager trained by one rank on its own (a few steps of a fixed batch)."""
    from mindspore.train import DynamicLossScaleManager

    x, y = learnable_data(STEPS * BATCH, seed=2)
    net = make_plain_net()
    model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                  nn.Momentum(net.trainable_params(), 0.1, 0.9),
                  loss_scale_manager=DynamicLossScaleManager(2.0 ** 10, 2, 10))
    model.train(1, dataset(x, y, batch_size=BATCH), dataset_sink_mode=False)
    return weights(net)


def test_stand_alone_ranks_decide_overflow_alone_and_need_no_peer():
    """``init()`` without DATA_PARALLEL (ranks that each train a model of their own under msrun): the loss-scale cell
    runs no collective, as MindSpore's. Rank 1's inf loss skips only rank 1's step, and rank 0 alone trains a Model
    with a loss-scale manager while rank 1 trains nothing, as one process would. (Third round of user scripts: the
    overflow flag was all-reduced over every rank whatever the parallel mode, so rank 0 skipped rank 1's overflow
    step, and under msrun the rank-0-only run failed after the collective timeout, "AllReduceCPUKernelMod launch
    failed".)"""
    def rank_fn(rank):
        out = overflow_scenario(rank)  # rank 1's loss is inf on the second step
        return bool(out["of2"]), float(out["changed"]), out["w"], _train_alone() if rank == 0 else None

    ranks = run_ranks(2, rank_fn, parallel_mode="stand_alone")
    (of_0, changed_0, w_0, alone), (of_1, changed_1, w_1, _) = ranks
    assert not of_0 and changed_0 > 0  # rank 0's step is its own: applied
    assert of_1 and changed_1 == 0.0  # rank 1 skips its overflow step
    assert np.abs(w_0 - w_1).max() > 0
    for got, ref in zip(alone, _train_alone()):  # one process, no world: the same numbers
        np.testing.assert_array_equal(got, ref)


def test_data_parallel_context_without_init_trains_alone_with_a_warning():
    """``set_auto_parallel_context(parallel_mode=DATA_PARALLEL)`` in a script that never called ``init()`` (or was
    run with python instead of msrun): the process trains alone, as one process would, and says so (before: nothing
    said; plain MindSpore's Model crashes in this case on CPU). Third round of user scripts."""
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    try:
        assert not comm.is_initialized()
        with pytest.warns(UserWarning, match=r"parallel_mode='data_parallel' is set but communication is not "
                                             r"initialised: this process trains alone"):
            got = single_process_reference(1)
    finally:
        ms.reset_auto_parallel_context()
    np.testing.assert_array_equal(np.concatenate([w.ravel() for w in got]),
                                  np.concatenate([w.ravel() for w in single_process_reference(1)]))

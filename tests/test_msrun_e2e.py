"""End-to-end under a real msrun job (2 CPU workers, MCCL, Graph mode): one job runs every scenario of
tests/workers/e2e_graph.py (one msrun start instead of one per scenario), as the last stage of the tutorials'
job (tests/test_tutorials.py ``distributed_job``: one start for both files); the tests below check each against
numpy or the one-process reference. The same code paths on 2-4 simulated ranks in PyNative mode are tested
on the loopback world (tests/test_comm.py, test_data_parallel.py, test_dim_reduce_msrun.py,
test_thor_distributed.py)."""
from __future__ import annotations

import os

import numpy as np
import pytest

from tests.test_comm import rank_vector
from tests.test_dim_reduce_msrun import numpy_row_block
from tests.test_tutorials import distributed_job
from tests.workers import e2e_graph as e2e

WORKERS = 2


@pytest.fixture(scope="module")
def job(data_path, tmp_path_factory):
    """The scenarios' WORK_DIR and each rank's values: the last stage of the tutorials' msrun job
    (tests/test_tutorials.py ``distributed_job``, run once a session for both files)."""
    folder, stages = distributed_job(data_path, tmp_path_factory)
    return folder / "e2e", stages["e2e"]


def scenario(ranks, name: str) -> list:
    return [{k[len(name) + 1:]: v for k, v in r.items() if k.startswith(name + "/")} for r in ranks]


@pytest.mark.msrun
def test_comm_collectives(job):
    assert e2e.comm_vector(1).tolist() == rank_vector(1).tolist()
    xs = np.stack([rank_vector(r) for r in range(WORKERS)])
    for out in scenario(job[1], "comm"):
        np.testing.assert_allclose(out["sum"], xs.sum(0))
        np.testing.assert_allclose(out["mean"], xs.mean(0))
        np.testing.assert_allclose(out["max"], xs.max(0))
        np.testing.assert_allclose(out["min"], xs.min(0))
        np.testing.assert_allclose(out["prod"], xs.prod(0))
        np.testing.assert_allclose(out["gather"], xs.reshape(-1))
        np.testing.assert_allclose(out["bcast"], xs[WORKERS - 1])
        np.testing.assert_allclose(out["server_mean"], xs.mean(0))
        np.testing.assert_allclose(out["server_gather"], xs.reshape(-1))
        np.testing.assert_array_equal(out["servers"], [[0, 1]])


@pytest.mark.msrun
def test_data_parallel_mean_reducer_equals_concatenated_batch(job):
    from tests.test_data_parallel import BATCH, STEPS, single_process_reference

    assert (STEPS, BATCH) == (e2e.DP_STEPS, e2e.DP_BATCH)
    ranks = scenario(job[1], "dp")
    ref = single_process_reference(WORKERS)
    for i, w in enumerate(ref):
        np.testing.assert_array_equal(ranks[0][f"w{i}"], ranks[1][f"w{i}"])
        np.testing.assert_allclose(ranks[0][f"w{i}"], w, rtol=0, atol=1e-5)


@pytest.mark.msrun
def test_overflow_on_one_rank_skips_the_step_on_every_rank(job):
    ranks = scenario(job[1], "overflow")
    for out in ranks:
        assert not bool(out["of1"]) and bool(out["of2"])
        assert float(out["changed"]) == 0.0
    np.testing.assert_array_equal(ranks[0]["w"], ranks[1]["w"])


@pytest.mark.msrun
def test_group_loss_scale_overflow_on_one_rank_skips_every_rank(job):
    from tests.test_loss_scale import check_overflow_on_one_rank

    check_overflow_on_one_rank(scenario(job[1], "group_overflow"))


@pytest.mark.msrun
def test_light_o1_two_ranks_equal_one_process_on_the_big_batch(job):
    from tests.test_data_parallel import BATCH, STEPS
    from tests.test_o1_o2 import check_light_o1_ranks, light_o1_reference

    ranks = [[r[f"w{i}"] for i in range(len(r))] for r in scenario(job[1], "light_o1")]
    check_light_o1_ranks(ranks, light_o1_reference(STEPS, BATCH, WORKERS))


@pytest.mark.msrun
def test_dim_reduce_two_ranks_equal_one_process(job):
    from tests.test_dim_reduce_msrun import BATCH, STEPS, K, _one_process_reference

    assert (STEPS, BATCH, K) == (e2e.DIM_STEPS, e2e.DIM_BATCH, e2e.DIM_K)
    work, ranks = job[0], scenario(job[1], "dim_reduce")
    pca_path = str(work / "pca_mat.npy")
    assert os.path.isfile(pca_path)
    full = np.load(pca_path, allow_pickle=False)
    assert full.shape[0] == e2e.DIM_K
    for rank, res in enumerate(ranks):  # rank 0 keeps rows 0-1, rank 1 row 2 plus one zero padding row
        np.testing.assert_array_equal(res["pca_rows"], numpy_row_block(full, rank, WORKERS))
    for name in ranks[0]:
        if name != "pca_rows":
            np.testing.assert_array_equal(ranks[0][name], ranks[1][name], err_msg=name)
    assert np.abs(ranks[0]["step_last"]).max() > 0  # a step was accepted in the subspace
    ref_weights, ref_stage = _one_process_reference(str(work / "stage1"), pca_path, e2e.DIM_K, WORKERS)
    for i, ref in enumerate(ref_weights):
        np.testing.assert_allclose(ranks[0][f"w{i}"], ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ranks[0]["inv_hessian"], ref_stage.inv_hessian.asnumpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.msrun
def test_thor_two_ranks_equal_one_process(job):
    from tests.test_thor_distributed import BATCH, STEPS, check_ranks

    assert (STEPS, BATCH) == (e2e.THOR_STEPS, e2e.THOR_BATCH)
    check_ranks(scenario(job[1], "thor"), WORKERS, distribute=True)


@pytest.mark.msrun
def test_thor_two_workers_skip_the_same_nonfinite_step(job):
    """NaN inputs on rank 1 at one step only: both ranks skip that step (mean-reduced gradients are NaN), stay
    bit-identical, and equal one process on the concatenated batches; Graph without a loss scale (the ``thor``
    scenario's model going on after its clean steps: the skip mid-training) and PyNative (the compiled THOR step,
    a fresh model) with one. The reference runs op by op."""
    import mindspore.dataset as ds

    from tests.helpers.nets import learnable_data
    from tests.test_thor_distributed import build_thor_model
    from tests.workers.thor_nonfinite import BATCH, CASES, STEPS, poisoned_data

    ranks = scenario(job[1], "thor_nonfinite")
    assert sorted(ranks[0]) == sorted(ranks[1])
    for key in ranks[0]:
        np.testing.assert_array_equal(ranks[0][key], ranks[1][key], err_msg=key)
    x, y = poisoned_data(WORKERS)
    for exec_mode, loss_scale in CASES:
        got = {k[len(exec_mode) + 2:]: v for k, v in ranks[0].items() if k.startswith(f"{exec_mode}{loss_scale}_")}
        assert got, (exec_mode, loss_scale)
        net, opt, model = build_thor_model(None, loss_scale=bool(loss_scale))
        opt.compile_pynative_step = False
        clean_steps = e2e.THOR_STEPS if exec_mode == "graph" else 0  # Graph goes on from the thor scenario
        if clean_steps:
            cx, cy = learnable_data(clean_steps * e2e.THOR_BATCH * WORKERS, seed=1)  # rank_rows' data set
            model.train(1, ds.NumpySlicesDataset({"x": cx, "y": cy}, shuffle=False).batch(e2e.THOR_BATCH * WORKERS),
                        dataset_sink_mode=False)
        assert int(got["step"][0]) == clean_steps + STEPS - 1, exec_mode
        assert int(got["skipped"]) == (0 if loss_scale else 1)  # with a loss scale the cell skips first
        data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(BATCH * WORKERS)
        model.train(1, data, dataset_sink_mode=False)
        assert int(opt.global_step.asnumpy()[0]) == clean_steps + STEPS - 1, exec_mode
        for i, p in enumerate(net.trainable_params()):
            assert np.isfinite(p.asnumpy()).all()
            np.testing.assert_allclose(got[f"w{i}"], p.asnumpy(), rtol=1e-4, atol=2e-5, err_msg=f"{exec_mode} w{i}")


@pytest.mark.msrun
def test_autotune_pick_and_figures_are_identical_on_every_rank(job):
    """Model(boost_level="auto") on 2 Graph-mode ranks with their own shards: one all-reduce of the figures, one
    pick on every rank (tests/workers/autotune_scenario.py); the data-parallel run after it keeps the ranks equal."""
    ranks = scenario(job[1], "autotune")
    assert int(ranks[0]["ranks"]) == WORKERS and int(ranks[0]["trial_steps"]) == 2 * 2 + 2 * 3
    assert int(ranks[0]["pick"]) == int(ranks[1]["pick"])
    np.testing.assert_array_equal(ranks[0]["figures"], ranks[1]["figures"])
    assert ranks[0]["figures"][:, 0].all() and ranks[0]["figures"][:, 7].all()  # both kept, progress measured
    for key in (k for k in ranks[0] if k.startswith("w")):
        np.testing.assert_array_equal(ranks[0][key], ranks[1][key], err_msg=key)


@pytest.mark.msrun
def test_msrun_graph_ranks_roll_back_together(job):
    """DivergenceRollback (tests/test_divergence.py) on 2 Graph-mode ranks (MCCL): only rank 1's lr spikes, and both
    ranks roll back at the same step to the same snapshot through the one collective, then finish with finite
    weights. (It was a 2-worker msrun job of its own.)"""
    results = scenario(job[1], "divergence")
    assert results[0]["rollbacks"].tolist() == results[1]["rollbacks"].tolist()
    (step, restored), = results[0]["rollbacks"].tolist()  # one rollback, to the state before the spiked step 5
    assert restored == 4 and step in (6, 7)  # (the spiked update shows in the loss of step 6 or 7 on rank 1)
    assert all(not result["failed"] and result["finite"] for result in results)


@pytest.mark.msrun
def test_a_stuck_rank_is_named_within_the_handshake_timeout(job):
    """Issue 12 item 8: a rank alive but stuck before the handshake; the other fails after dim_reduce.timeout
    (not the backend's ~60 s collective timeout) with an error naming it. (Rank 0, serving the store, stuck gives
    rank 1 "rank 0 did not reach the PCA handshake within dim_reduce.timeout=2 s"; checked by hand, left out to
    keep the suite short.) The last scenario of the job (it was a 2-worker msrun job of its own)."""
    from tests.workers.handshake_stuck import STUCK, TIMEOUT

    assert STUCK == 1  # rank 0 serves the store: it names rank 1 as never having arrived
    ranks = scenario(job[1], "handshake_stuck")
    error, elapsed = str(ranks[0]["error"]), float(ranks[0]["elapsed"])
    assert error.startswith("TimeoutError: "), error
    assert ("rank 0: rank(s) [1] never reached the PCA handshake (dead, or alive but stuck) within "
            f"dim_reduce.timeout={TIMEOUT:g} s") in error
    assert TIMEOUT - 0.5 < elapsed < TIMEOUT + 4, elapsed  # bounded by dim_reduce.timeout
    late = str(ranks[STUCK]["error"])  # the late rank does not hang either: it is told
    assert late.startswith(("TimeoutError: ", "RuntimeError: ")) and "handshake" in late, late

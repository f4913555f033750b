"""DimReduce on 2-4 simulated ranks (tests/helpers/loopback.py): PCA handshake, ceil(k/R) row blocks, identical
weights = one process on the full batch; Graph mode under a real msrun job in tests/test_msrun_e2e.py, which also
runs the handshake with a rank alive but stuck (test_a_stuck_rank_is_named_within_the_handshake_timeout)."""
from __future__ import annotations

import os

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor

from tests.helpers.loopback import run_ranks
from tests.helpers.nets import dataset, learnable_data, weights
from tests.workers.common import make_plain_net, rank_rows
from tests.workers.dim_reduce_worker import dim_reduce_stage, stage2_model

STEPS, BATCH, K = 3, 8, 3  # K = 3 rows over 2 ranks: blocks of 2 rows, the last one padded


def _stage1_checkpoints(folder, num, seed=0):
    """A random-walk weight trajectory around the plain net's initial weights, saved like ModelCheckpoint."""
    net = make_plain_net()
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    walk = [np.zeros(p.shape, np.float32) for p in net.trainable_params()]
    for i in range(num):
        walk = [v + 0.02 * rng.standard_normal(v.shape).astype(np.float32) for v in walk]
        items = [{"name": p.name, "data": Tensor(p.asnumpy() + v)} for p, v in zip(net.trainable_params(), walk)]
        ms.save_checkpoint(items, os.path.join(folder, f"plain-{i + 1}_1.ckpt"))
    return folder


def _one_process_reference(ckpt_dir, pca_path, k, size=2):
    """The same training in this process on the concatenated batch of both ranks."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    x, y = learnable_data(STEPS * BATCH * size, seed=1)
    net = make_plain_net()
    model = stage2_model(net, ckpt_dir, pca_path, k)
    model.train(1, dataset(x, y, batch_size=BATCH * size), dataset_sink_mode=False)
    return weights(net), dim_reduce_stage(model)


def numpy_row_block(full: np.ndarray, rank: int, size: int) -> np.ndarray:
    """Rows [rank*h, rank*h + h) of the (k, M) matrix with h = ceil(k / size), zero rows past k."""
    height = -(-full.shape[0] // size)
    padded = np.concatenate([full, np.zeros((height * size - full.shape[0], full.shape[1]), full.dtype)])
    return padded[rank * height:(rank + 1) * height]


def train_rank(rank: int, size: int, ckpt_dir: str, pca_path: str) -> dict:
    """One rank of the stage-2 training (tests/workers/e2e_graph.py does the same under msrun)."""
    x, y = rank_rows(rank, size, STEPS, BATCH)
    net = make_plain_net()
    model = stage2_model(net, ckpt_dir, pca_path, K)
    model.train(1, dataset(x, y, batch_size=BATCH), dataset_sink_mode=False)
    stage = dim_reduce_stage(model)
    result = {f"w{i}": w for i, w in enumerate(weights(net))}
    result.update(pca_rows=stage.pca_rows.asnumpy(), inv_hessian=stage.inv_hessian.asnumpy(),
                  step_last=stage.step_last.asnumpy())
    return result


@pytest.mark.parametrize("size", [4])
def test_loopback_ranks_equal_one_process(tmp_path, size):
    """PyNative on simulated ranks (tests/helpers/loopback.py): K = 3 rows over 4 ranks (blocks of 1, the last rank
    holds only padding). K = 3 rows over 2 ranks (blocks of 2, the last padded) runs the same code (the row blocks
    are numpy, the stage's step is the same in both modes) under a real msrun job in Graph mode:
    tests/test_msrun_e2e.py::test_dim_reduce_two_ranks_equal_one_process."""
    ckpt_dir = _stage1_checkpoints(str(tmp_path / "stage1"), 6)
    pca_path = str(tmp_path / "pca_mat.npy")  # does not exist yet: rank 0 computes it, the others wait
    results = run_ranks(size, lambda rank: train_rank(rank, size, ckpt_dir, pca_path))
    _check_ranks(results, ckpt_dir, pca_path, size)


def _check_ranks(results, ckpt_dir, pca_path, size):
    assert os.path.isfile(pca_path)
    full = np.load(pca_path, allow_pickle=False)
    assert full.shape[0] == K
    for rank, res in enumerate(results):  # each rank keeps its ceil(K / size) rows, zero-padded
        np.testing.assert_array_equal(res["pca_rows"], numpy_row_block(full, rank, size))
    # identical weights and BFGS state on every rank
    for rank in range(1, size):
        for name in sorted(results[0]):
            if name != "pca_rows":
                np.testing.assert_array_equal(results[0][name], results[rank][name], err_msg=name)
    assert np.abs(results[0]["step_last"]).max() > 0  # a step was accepted in the subspace
    ref_weights, ref_stage = _one_process_reference(ckpt_dir, pca_path, K, size)
    for i, ref in enumerate(ref_weights):
        np.testing.assert_allclose(results[0][f"w{i}"], ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(results[0]["inv_hessian"], ref_stage.inv_hessian.asnumpy(), rtol=1e-4, atol=1e-5)


def test_failure_on_root_is_a_clear_error_on_every_rank(tmp_path):
    ckpt_dir = _stage1_checkpoints(str(tmp_path / "stage1"), 3)  # 3 checkpoints: too few for K = 3

    def rank_fn(rank):
        net = make_plain_net()
        with pytest.raises(Exception) as info:  # noqa: B017 -- each rank's own message is checked below
            stage2_model(net, ckpt_dir, str(tmp_path / "p.npy"), K)
        return str(info.value)

    messages = run_ranks(2, rank_fn)
    assert "needs at least 4 stage-1 checkpoints" in messages[0]  # rank 0's own error
    assert "could not be prepared by server root rank(s) [0]" in messages[1]  # rank 1 told, not left hanging
    assert not os.path.exists(tmp_path / "p.npy")


def test_per_rank_checkpoint_folders_are_a_clear_error(tmp_path):
    """A data-parallel script that saved its stage-1 checkpoints per rank (``"./checkpoint_pca_" + str(rank)``) and
    gives each rank its own folder: the root computes the matrix into its folder only, so rank 1 must be told that
    every rank of a server has to name the same path (upstream waits for a sentinel file that never comes)."""
    folders = [_stage1_checkpoints(str(tmp_path / f"stage1_{r}"), 6) for r in range(2)]

    def rank_fn(rank):
        net = make_plain_net()
        with pytest.raises(Exception) as info:  # noqa: B017 -- each rank's own message is checked below
            stage2_model(net, folders[rank], None, K)
        return str(info.value)

    messages = run_ranks(2, rank_fn)
    assert os.path.isfile(os.path.join(folders[0], "pca_mat.npy"))  # the root did its part
    assert not os.path.exists(os.path.join(folders[1], "pca_mat.npy"))
    assert "every rank of a server must name the same" in messages[1]
    assert "server's root rank 0" in messages[1] and "weight_load_dir" in messages[1]
    assert "could not read the PCA matrix" in messages[0]  # rank 0 told, not left hanging

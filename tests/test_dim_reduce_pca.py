"""Streaming PCA of a weight trajectory (ms_boost/dim_reduce/pca.py) against numpy's SVD."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor

from ms_boost.dim_reduce.pca import (
    compute_pca_matrix,
    infer_parameter_specs,
    list_checkpoints,
    open_pca_matrix,
    read_flat_weights,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (name, shape) of the "network's" trainable parameters, in network order
SPECS = [("conv.weight", (4, 3, 2, 2)), ("bn.gamma", (4,)), ("bn.beta", (4,)), ("fc.weight", (3, 16)),
         ("fc.bias", (3,))]
M = sum(int(np.prod(s)) for _, s in SPECS)


def _trajectory(num, seed=0):
    """A drifting weight trajectory: low-rank drift plus noise, as rows of a (num, M) matrix."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal(M)
    drift = rng.standard_normal((5, M)) * np.array([3.0, 2.0, 1.5, 1.0, 0.7])[:, None]
    coef = np.cumsum(rng.standard_normal((num, 5)), axis=0)
    return (base + coef @ drift + 0.05 * rng.standard_normal((num, M))).astype(np.float32)


def _save(folder, rows, specs=SPECS, extra=True, names=None):
    """One checkpoint per row, with BatchNorm statistics and optimizer state interleaved like a real one."""
    os.makedirs(folder, exist_ok=True)
    for i, row in enumerate(rows):
        items, off = [], 0
        for name, shape in specs:
            size = int(np.prod(shape))
            items.append({"name": name, "data": Tensor(row[off:off + size].reshape(shape))})
            off += size
            if extra and name == "bn.beta":
                items.append({"name": "bn.moving_mean", "data": Tensor(np.full(4, i, np.float32))})
                items.append({"name": "bn.moving_variance", "data": Tensor(np.ones(4, np.float32))})
        if extra:
            items.append({"name": "moments.fc.weight", "data": Tensor(np.full((3, 16), i, np.float32))})
            items.append({"name": "global_step", "data": Tensor(np.array([i], np.int32))})
        fname = names[i] if names else f"resnet-{i + 1}_10.ckpt"
        ms.save_checkpoint(items, os.path.join(folder, fname))
    return folder


def _svd_components(rows, k):
    x = rows.astype(np.float64)
    x = x - x.mean(axis=0)
    return np.linalg.svd(x, full_matrices=False)[2][:k]


def _assert_equal_up_to_sign(got, ref, atol=1e-5):
    assert got.shape == ref.shape
    for i in range(ref.shape[0]):
        sign = np.sign(float(got[i] @ ref[i]))
        np.testing.assert_allclose(got[i], sign * ref[i], atol=atol, err_msg=f"component {i}")


@pytest.mark.parametrize("chunk_columns", [7, 1 << 19])
def test_pca_matches_numpy_svd(tmp_path, chunk_columns):
    rows = _trajectory(12)
    folder = _save(str(tmp_path / "ckpt"), rows)
    k = 4
    got = compute_pca_matrix(folder, k, SPECS, chunk_columns=chunk_columns)
    assert got.dtype == np.float32 and got.shape == (k, M)
    _assert_equal_up_to_sign(got, _svd_components(rows, k))
    np.testing.assert_allclose(got.astype(np.float64) @ got.T, np.eye(k), atol=1e-5)  # orthonormal rows


def test_pca_streamed_to_file_equals_in_memory_and_is_deterministic(tmp_path):
    rows = _trajectory(9, seed=4)
    folder = _save(str(tmp_path / "ckpt"), rows)
    messages = []
    out = str(tmp_path / "pca_mat.npy")
    mapped = compute_pca_matrix(folder, 3, SPECS, output=out, chunk_columns=10, progress=messages.append)
    in_memory = compute_pca_matrix(folder, 3, SPECS, chunk_columns=10)
    assert np.array_equal(np.asarray(mapped), in_memory)  # bitwise identical: same arithmetic
    assert np.array_equal(np.load(out, allow_pickle=False), in_memory)
    assert any("read checkpoint 9/9" in m for m in messages) and any("Gram" in m for m in messages)
    leftovers = [f for f in os.listdir(tmp_path) if f.startswith(".pca")]
    assert leftovers == []  # scratch and temporary files removed


def test_checkpoint_order_and_parameter_order(tmp_path):
    rows = _trajectory(8, seed=5)
    names = [f"net-{i}_3.ckpt" for i in (1, 2, 3, 4, 5, 6, 7, 10)]
    folder = _save(str(tmp_path / "ckpt"), rows, names=names)
    assert [os.path.basename(f) for f in list_checkpoints(folder)] == names  # natural order (10 after 7)
    # a checkpoint read in network order, ignoring BatchNorm statistics and optimizer state
    np.testing.assert_array_equal(read_flat_weights(os.path.join(folder, names[2]), SPECS), rows[2])
    assert infer_parameter_specs(os.path.join(folder, names[0])) == SPECS
    # specs inferred from the checkpoint give the same matrix as explicit network specs
    np.testing.assert_array_equal(compute_pca_matrix(folder, 2), compute_pca_matrix(folder, 2, SPECS))


def test_too_few_checkpoints(tmp_path):
    folder = _save(str(tmp_path / "ckpt"), _trajectory(4))
    with pytest.raises(ValueError, match=r"n_components=4 needs at least 5 .* found 4"):
        compute_pca_matrix(folder, 4, SPECS)


def test_missing_parameter_and_shape_mismatch(tmp_path):
    folder = _save(str(tmp_path / "ckpt"), _trajectory(4))
    with pytest.raises(ValueError, match=r"missing parameter 'head.weight'"):
        compute_pca_matrix(folder, 2, SPECS + [("head.weight", (2, 2))])
    bad = [(n, (s[0] * 2,) + s[1:]) if n == "fc.bias" else (n, s) for n, s in SPECS]
    with pytest.raises(ValueError, match=r"'fc.bias' has shape \(3,\), the network expects \(6,\)"):
        compute_pca_matrix(folder, 2, bad)


def test_degenerate_trajectory_and_missing_folder(tmp_path):
    row = _trajectory(1)[0]
    folder = _save(str(tmp_path / "ckpt"), np.stack([row, row, row + 1.0, row + 1.0]))  # rank 1 after centring
    with pytest.raises(ValueError, match="spans only 1 independent"):
        compute_pca_matrix(folder, 2, SPECS)
    with pytest.raises(ValueError, match="not an existing folder"):
        compute_pca_matrix(str(tmp_path / "nowhere"), 2, SPECS)


def test_deadline(tmp_path):
    folder = _save(str(tmp_path / "ckpt"), _trajectory(4))
    with pytest.raises(TimeoutError, match="time limit"):
        compute_pca_matrix(folder, 2, SPECS, deadline=time.monotonic() - 1.0)


def test_open_pca_matrix_checks_shape(tmp_path):
    path = str(tmp_path / "p.npy")
    np.save(path, np.zeros((4, M), np.float32))
    assert open_pca_matrix(path, 4, M).shape == (4, M)
    assert open_pca_matrix(path, 3, M).shape == (4, M)  # extra rows are allowed (the first k are used)
    with pytest.raises(ValueError, match=rf"shape \(4, {M}\), which does not fit the network"):
        open_pca_matrix(path, 5, M)
    with pytest.raises(ValueError, match="does not fit the network"):
        open_pca_matrix(path, 4, M + 1)
    np.save(path, np.zeros(M, np.float32))
    with pytest.raises(ValueError, match="1-D"):
        open_pca_matrix(path, 1, M)


def test_command_line(tmp_path):
    rows = _trajectory(7, seed=9)
    folder = _save(str(tmp_path / "ckpt"), rows)
    out = str(tmp_path / "out" / "pca.npy")
    os.makedirs(os.path.dirname(out))
    env = dict(os.environ, PYTHONPATH=REPO, GLOG_v="3")
    cmd = [sys.executable, "-m", "ms_boost.dim_reduce.pca", "--weight_load_dir", folder, "--n_components", "3",
           "--output", out]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "7 checkpoints, 5 parameters" in proc.stderr and "wrote" in proc.stderr
    _assert_equal_up_to_sign(np.load(out, allow_pickle=False), _svd_components(rows, 3))
    proc = subprocess.run(cmd[:-3] + ["7", "--output", out], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "needs at least 8" in proc.stderr

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
from ms_boost.dim_reduce.pca import main as pca_main

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


def test_command_line(tmp_path, capsys):
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
    # journeys, second round: every run of the documented command printed runpy's "RuntimeWarning: 'ms_boost.dim_reduce
    # .pca' found in sys.modules ... unpredictable behaviour" (the package imports the module first)
    assert "RuntimeWarning" not in proc.stderr, proc.stderr
    _assert_equal_up_to_sign(np.load(out, allow_pickle=False), _svd_components(rows, 3))
    # too few checkpoints: exit status 2 and the reason (``main`` in this process: the entry point above is the
    # same function; a second interpreter only imported MindSpore again, ~2 CPU-s)
    assert pca_main(cmd[3:-3] + ["7", "--output", out]) == 2
    assert "needs at least 8" in capsys.readouterr().err
    # --output naming a folder: said up front (was "[Errno 20] Not a directory: '/tmp/.pca_...npy.tmp' -> '<folder>/'"
    # after the whole computation)
    assert pca_main(cmd[3:-1] + [str(tmp_path) + os.sep]) == 2
    assert f"output='{tmp_path}{os.sep}' is a folder; give the .npy file to write, e.g. " in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------------
# issue 12 item 7: stale temporaries, errors naming the path / option, the trainable-parameter manifest
# ---------------------------------------------------------------------------------------------------------------
ALGORITHM_STATE = {  # saved beside the weights by ms_boost's own algorithms and optimizers
    "adasum_saved.bucket0": (4,), "dim_reduce.momentum.fc.weight": (3, 16), "dim_reduce.inv_hessian": (2, 2),
    "thor_a_inverse.fc": (16, 16), "fc.matrix_a": (16, 16), "fc.thor_capture": (1,), "group_loss_scales": (2,),
    "overflow_shadow.fc.weight": (3, 16), "moment1.fc.weight": (3, 16), "scale_sense": (1,),
    "grad_accumulation.conv.weight": (4, 3, 2, 2), "accumulation_step": (1,),
}


def _save_with_state(folder, rows):
    _save(folder, rows)
    for i, path in enumerate(list_checkpoints(folder)):
        items = [{"name": n, "data": v} for n, v in ms.load_checkpoint(path).items()]
        items += [{"name": n, "data": Tensor(np.full(s, i + 0.5, np.float32))} for n, s in ALGORITHM_STATE.items()]
        ms.save_checkpoint(items, path)
    return folder


def _spec_params():
    return [ms.Parameter(Tensor(np.zeros(s, np.float32)), name=n) for n, s in SPECS]


def test_manifest_selects_the_trainable_weights_and_the_default_exclude_covers_algorithm_state(tmp_path, capsys):
    from ms_boost.dim_reduce.pca import MANIFEST_NAME, read_weight_manifest, write_weight_manifest

    rows = _trajectory(6, seed=2)
    folder = _save_with_state(str(tmp_path / "ckpt"), rows)
    first = list_checkpoints(folder)[0]
    assert infer_parameter_specs(first) == SPECS  # none of ALGORITHM_STATE is taken for a weight
    assert len(infer_parameter_specs(first, exclude=r"^$")) == len(SPECS) + len(ALGORITHM_STATE) + 3
    path = write_weight_manifest(_spec_params(), folder)
    assert os.path.basename(path) == MANIFEST_NAME and read_weight_manifest(folder) == SPECS
    assert not [f for f in os.listdir(folder) if f.endswith(".tmp")]
    # the manifest beside the checkpoints wins over the regex, also for names the regex would keep
    write_weight_manifest(_spec_params()[:3], folder)
    got = compute_pca_matrix(folder, 2)
    assert got.shape == (2, sum(int(np.prod(s)) for _, s in SPECS[:3]))
    from ms_boost.dim_reduce.pca import main

    base = ["--weight_load_dir", folder, "--n_components", "2", "--output", str(tmp_path / "pca.npy")]
    assert main(base) == 0
    assert f"3 parameters ({os.path.join(folder, MANIFEST_NAME)})" in capsys.readouterr().err
    assert main(base + ["--exclude", r"^(?!conv\.weight$)"]) == 0  # the regex overrides the manifest
    assert "1 parameters (--exclude '^(?!conv\\\\.weight$)')" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "ms_boost.dim_reduce.weights_manifest", "parameters": [{"name": "x", "shape": [-1]}]}')
    with pytest.raises(ValueError, match=r"weights manifest '.*bad\.json': parameters\[0\]=.* must be"):
        read_weight_manifest(str(bad))
    bad.write_bytes(b"\xff\xfe")
    with pytest.raises(ValueError, match=r"weights manifest '.*bad\.json' cannot be read"):
        read_weight_manifest(str(bad))


def test_bad_exclude_regex_is_an_error_naming_the_option(tmp_path, capsys):
    folder = _save(str(tmp_path / "ckpt"), _trajectory(4))
    with pytest.raises(ValueError, match=r"exclude='\(\[' is not a valid regular expression"):
        infer_parameter_specs(list_checkpoints(folder)[0], exclude="([")
    from ms_boost.dim_reduce.pca import main

    assert main(["--weight_load_dir", folder, "--n_components", "2", "--output", str(tmp_path / "p.npy"),
                 "--exclude", "(["]) == 2
    err = capsys.readouterr().err
    assert "error: --exclude='([' is not a valid regular expression (unterminated character set" in err, err
    assert not (tmp_path / "p.npy").exists()


def test_stale_temporaries_of_the_target_are_removed_with_a_log_line(tmp_path):
    from ms_boost.dim_reduce import pca

    folder = _save(str(tmp_path / "ckpt"), _trajectory(5))
    out = tmp_path / "pca_mat.npy"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = pca._host()
    stale = tmp_path / f".pca_pca_mat.npy.{host}.{dead.pid}.k2j4.npy.tmp"
    legacy = tmp_path / ".pca_ab12cd34.npy.tmp"
    live = tmp_path / f".pca_pca_mat.npy.{host}.1.x9.npy.tmp"  # pid 1 runs: a computation in progress
    other_target = tmp_path / f".pca_other.npy.{host}.{dead.pid}.q.npy.tmp"
    recent_other_host = tmp_path / ".pca_pca_mat.npy.node7.123.q.npy.tmp"
    old_other_host = tmp_path / ".pca_pca_mat.npy.node8.123.q.npy.tmp"
    for f in (stale, legacy, live, other_target, recent_other_host, old_other_host):
        f.write_bytes(b"\0" * 1024)
    old = time.time() - 2 * pca.STALE_TEMP_SECONDS
    for f in (legacy, old_other_host):
        os.utime(f, (old, old))
    messages = []
    compute_pca_matrix(folder, 2, SPECS, output=str(out), progress=messages.append)
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".pca"))
    assert left == sorted([live.name, other_target.name, recent_other_host.name])
    for f in (stale, legacy, old_other_host):
        assert any(f"removed stale temporary file {f} (0.0 MiB) left by an interrupted PCA" in m for m in messages)


def test_any_exception_or_sigterm_removes_the_temporary_output(tmp_path, monkeypatch):
    import signal

    from ms_boost.dim_reduce import pca

    folder = _save(str(tmp_path / "ckpt"), _trajectory(5))
    out = tmp_path / "pca_mat.npy"

    def fail(self, start, block):
        assert any(p.name.endswith(".npy.tmp") for p in tmp_path.iterdir())  # the temporary exists now
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pca._NpyRowWriter, "write_columns", fail)
    with pytest.raises(OSError, match="No space left"):
        compute_pca_matrix(folder, 2, SPECS, output=str(out))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]

    def terminated(self, start, block):
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(pca._NpyRowWriter, "write_columns", terminated)
    with pytest.raises(SystemExit) as info:
        pca.main(["--weight_load_dir", folder, "--n_components", "2", "--output", str(out), "--quiet"])
    assert info.value.code == 128 + signal.SIGTERM
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    assert signal.getsignal(signal.SIGTERM) is not pca._terminate  # handler restored


def test_non_finite_pca_matrix_error_names_the_file(tmp_path):
    from ms_boost.dim_reduce import prepare_pca_matrix

    path = str(tmp_path / "pca_mat.npy")
    mat = np.ones((3, M), np.float32)
    mat[1, 7] = np.nan
    np.save(path, mat)
    with pytest.raises(ValueError, match=rf"PCA matrix '{path}' holds NaN or infinite values \(1 in rows 0\.\.2; "
                                         rf"first at row 1, column 7: nan\)"):
        prepare_pca_matrix(SPECS, 3, path, None, progress=None)

"""Acceptance tests: MindSpore's AdaSum, dimension-reduce and THOR tutorials, run as their readers write them.

The scripts in ``tests/tutorials/`` follow the tutorials in ``shared/references`` line by line; only the import
of ``Model`` (and of ``thor`` / ``ConvertModelUtils``) changes to ms_boost, the device is the CPU, and the
ResNet and the ImageFolder data set are tiny. Distributed tutorials run under ``msrun`` with 2 CPU workers.
Each script prints ``TUTORIAL_RESULT {json}`` (and under msrun saves the same values per rank); the tests check
exit status, finite and falling losses, accuracy above chance, where checkpoints land, and metric keys.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from model_zoo.resnet.src.synthetic_data import ensure_dataset
from tests.helpers.msrun import run_msrun

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = ROOT / "tests" / "tutorials"
NUM_CLASSES = 6
CHANCE = 1.0 / NUM_CLASSES


@pytest.fixture(scope="module")
def data_path(tmp_path_factory) -> str:
    """A tiny ImageNet-layout folder (train/ + val/, 6 classes of 32x32 JPEGs) from the built-in generator."""
    root = tmp_path_factory.mktemp("tutorial_data")
    return str(ensure_dataset(root, num_classes=NUM_CLASSES, image_size=32, train_per_class=16, val_per_class=4,
                              seed=0, verbose=False))


def _env() -> dict:
    env = dict(os.environ)
    env.update({"PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]), "GLOG_v": "3"})
    env.pop("MS_BOOST_RESULT_DIR", None)
    return env


def run_script(script: str, *args, cwd: Path, timeout: int = 600) -> dict:
    """Run ``tests/tutorials/<script>`` in one process; assert exit 0; return its ``TUTORIAL_RESULT``."""
    cmd = [sys.executable, str(TUTORIALS / script), *map(str, args)]
    proc = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    lines = [line for line in out.splitlines() if not line.startswith("[INFO]") and not line.startswith("[WARNING]")]
    errors = [line for line in lines if "Error" in line or line.startswith("  File ")]
    assert proc.returncode == 0, (f"{' '.join(cmd)} failed ({proc.returncode}):\n" + "\n".join(errors[-30:])
                                  + "\n...\n" + "\n".join(lines[-30:]))
    results = [line for line in proc.stdout.splitlines() if line.startswith("TUTORIAL_RESULT ")]
    assert results, f"{script} printed no result:\n" + "\n".join(lines[-30:])
    result = json.loads(results[-1][len("TUTORIAL_RESULT "):])
    result["stdout"] = proc.stdout
    return result


def run_distributed(script: str, *args, cwd: Path, workers: int = 2, timeout: int = 600, env=None) -> list:
    """Run ``tests/tutorials/<script>`` under msrun in ``cwd``; return each rank's saved values."""
    return run_msrun(TUTORIALS / script, workers=workers, args=args, cwd=str(cwd), timeout=timeout, env=env)


def check_losses(losses, what: str) -> np.ndarray:
    """Every loss finite, the first near ln(classes) (a fresh classifier), and training lowers the loss:
    the mean of the last third of the steps is below the mean of the first third."""
    losses = np.asarray(losses, dtype=np.float64).reshape(-1)
    assert losses.size >= 3, f"{what}: only {losses.size} losses recorded"
    assert np.all(np.isfinite(losses)), f"{what}: non-finite loss in {losses}"
    third = max(1, losses.size // 3)
    first, last = losses[:third].mean(), losses[-third:].mean()
    assert last < first, f"{what}: the loss did not fall (first third {first:.4f}, last third {last:.4f}): {losses}"
    return losses


# ---------------------------------------------------------------------------------------------------------------
# AdaSum tutorial (boost_level="O2", amp O2, FixedLossScaleManager(1024), Momentum(loss_scale=1024))
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.msrun
def test_adasum_tutorial_boost_dict_two_servers(data_path, tmp_path):
    """The tutorial's AdaSum-only boost_dict with eval_network, 2 ranks as 2 servers (AdaSum really combines)."""
    ranks = run_distributed("adasum_tutorial.py", "--data_path", data_path, "--variant", "adasum",
                            "--device_per_server", "1", "--epochs", "3", "--lr_max", "0.05", cwd=tmp_path)
    for rank, res in enumerate(ranks):
        check_losses(res["losses"], f"adasum rank {rank}")
        assert int(res["step_size"]) == NUM_CLASSES * 16 // 2 // 8
    # AdaSum hands every rank the same combined update: the ranks end with the same weights
    np.testing.assert_allclose(ranks[0]["weights_head"], ranks[1]["weights_head"], rtol=0, atol=1e-6)
    np.testing.assert_allclose(ranks[0]["weights_sum"], ranks[1]["weights_sum"], rtol=1e-9)
    np.testing.assert_allclose(ranks[0]["weights_abs_sum"], ranks[1]["weights_abs_sum"], rtol=1e-9)


@pytest.mark.msrun
def test_adasum_tutorial_boost_level_o2(data_path, tmp_path):
    """``Model(..., amp_level="O2", boost_level="O2", keep_batchnorm_fp32=False)`` exactly as written, on 2 ranks
    (fewer than the default 8 devices per server)."""
    ranks = run_distributed("adasum_tutorial.py", "--data_path", data_path, "--variant", "o2", "--epochs", "4",
                            "--lr_max", "0.05", cwd=tmp_path)
    # gradient freezing slows the descent: judge the loss averaged over the ranks
    check_losses(np.mean([res["losses"] for res in ranks], axis=0), "O2 (mean over ranks)")
    np.testing.assert_allclose(ranks[0]["weights_sum"], ranks[1]["weights_sum"], rtol=1e-9)
    np.testing.assert_allclose(ranks[0]["weights_head"], ranks[1]["weights_head"], rtol=0, atol=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# Dimension-reduce training tutorial: stage 1 (regular, saves the PCA checkpoints), stage 2 (boost dim_reduce)
# ---------------------------------------------------------------------------------------------------------------
STAGE1_EPOCHS = 5
N_COMPONENT = 4


@pytest.fixture(scope="module")
def stage1(data_path, tmp_path_factory):
    """Stage 1 under msrun in its own folder (stage 2 runs there too, as the tutorial's scripts do)."""
    workdir = tmp_path_factory.mktemp("dim_reduce")
    ranks = run_distributed("dim_reduce_stage1.py", "--data_path", data_path, "--epochs", STAGE1_EPOCHS,
                            cwd=workdir)
    return workdir, ranks


@pytest.mark.msrun
def test_dim_reduce_stage1(stage1):
    workdir, ranks = stage1
    for rank, res in enumerate(ranks):
        check_losses(res["losses"], f"stage 1 rank {rank}")
    # data parallel: both ranks hold the same weights
    np.testing.assert_allclose(ranks[0]["weights_sum"], ranks[1]["weights_sum"], rtol=1e-9)
    # rank 0 evaluated: metrics={"acc"} -> {'acc': ...} above chance
    assert set(k for k in ranks[0] if k.startswith("acc.")) == {"acc.acc"}
    assert float(ranks[0]["acc.acc"]) > CHANCE + 0.15
    assert not any(k.startswith("acc.") for k in ranks[1])
    step_size = int(ranks[0]["step_size"])
    # callback_1: the whole state at the end; callback_2: the network every epoch, for the PCA
    assert (workdir / "checkpoint_stage_1" / f"resnet-{STAGE1_EPOCHS}_{step_size}.ckpt").is_file()
    pca_dir = workdir / "checkpoint_stage_1" / "checkpoint_pca"
    assert sorted(p.name for p in pca_dir.glob("*.ckpt")) == [
        f"resnet-{e}_{step_size}.ckpt" for e in range(1, STAGE1_EPOCHS + 1)]


def _check_stage2(workdir: Path, ranks: list, stage1_ranks: list, what: str) -> None:
    for rank, res in enumerate(ranks):
        losses = np.asarray(res["losses"], dtype=np.float64)
        assert losses.size >= 2 and np.all(np.isfinite(losses)), f"{what} rank {rank}: {losses}"
        assert float(res["moved"]) > 0.0, f"{what} rank {rank}: dim_reduce did not change the weights"
    # dim_reduce is deterministic across ranks: identical weights on every rank
    np.testing.assert_allclose(ranks[0]["weights_sum"], ranks[1]["weights_sum"], rtol=1e-9)
    np.testing.assert_allclose(ranks[0]["weights_abs_sum"], ranks[1]["weights_abs_sum"], rtol=1e-9)
    # stage 2 starts where stage 1 ended: its loss is below stage 1's first steps
    start = np.mean(np.asarray(stage1_ranks[0]["losses"])[:3])
    assert np.mean(ranks[0]["losses"]) < start, f"{what}: {ranks[0]['losses']} vs stage-1 start {start}"
    assert float(ranks[0]["acc.acc"]) > CHANCE + 0.15, f"{what}: accuracy {float(ranks[0]['acc.acc'])}"
    step_size = int(ranks[0]["step_size"])
    saved = sorted(p.name for p in (workdir / "checkpoint_stage_2").glob("*.ckpt"))
    assert f"resnet-2_{step_size}.ckpt" in saved, saved


@pytest.mark.msrun
def test_dim_reduce_stage2_computes_pca(stage1, data_path):
    """pca_mat_path None: the PCA is computed from weight_load_dir="./checkpoint_stage_1/checkpoint_pca"."""
    workdir, stage1_ranks = stage1
    step_size = int(stage1_ranks[0]["step_size"])
    ranks = run_distributed("dim_reduce_stage2.py", "--data_path", data_path,
                            "--pretrained_weight_path",
                            f"./checkpoint_stage_1/resnet-{STAGE1_EPOCHS}_{step_size}.ckpt",
                            "--n_component", N_COMPONENT, "--epochs", 2, cwd=workdir)
    _check_stage2(workdir, ranks, stage1_ranks, "stage 2 (PCA computed)")
    written = list((workdir / "checkpoint_stage_1" / "checkpoint_pca").glob("*.npy"))
    assert written, "the computed PCA matrix was not saved next to the checkpoints"
    pca = np.load(written[0], allow_pickle=False)
    assert pca.shape[0] == N_COMPONENT
    np.testing.assert_allclose(pca @ pca.T, np.eye(N_COMPONENT), atol=1e-4)


# ---------------------------------------------------------------------------------------------------------------
# THOR tutorial: train (thor + ConvertModelUtils, amp O2, fixed loss scale), then eval from the checkpoint
# ---------------------------------------------------------------------------------------------------------------
THOR_EPOCHS = 3


@pytest.fixture(scope="module")
def thor_run(data_path, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("thor")
    result = run_script("thor_tutorial.py", "--data_path", data_path, "--net", "resnet18", "--epochs", THOR_EPOCHS,
                        "--save_checkpoint_path", "./train/", cwd=workdir)
    return workdir, result


def test_thor_tutorial_train(thor_run):
    workdir, result = thor_run
    check_losses(result["losses"], "thor")
    assert "loss is" in result["stdout"]
    step_size = int(result["step_size"])
    assert sorted(p.name for p in (workdir / "train").glob("*.ckpt")) == [
        f"resnet-{e}_{step_size}.ckpt" for e in range(1, THOR_EPOCHS + 1)]


@pytest.mark.parametrize("mode", ["graph", "pynative"])
def test_thor_tutorial_eval(thor_run, data_path, mode):
    workdir, train = thor_run
    ckpt = workdir / "train" / f"resnet-{THOR_EPOCHS}_{int(train['step_size'])}.ckpt"
    result = run_script("thor_eval.py", "--data_path", data_path, "--net", "resnet18", "--checkpoint_path", ckpt,
                        "--mode", mode, cwd=workdir)
    res = result["result"]
    assert set(res) == {"top_1_accuracy", "top_5_accuracy"}
    assert result["not_loaded"] == 0, "some network parameters were not in the THOR checkpoint"
    assert res["top_1_accuracy"] > CHANCE + 0.1, res
    assert res["top_5_accuracy"] >= res["top_1_accuracy"]
    assert math.isclose(result["weights_sum"], train["weights_sum"], rel_tol=1e-6), \
        "the evaluated network does not hold the trained weights"


@pytest.mark.parametrize("statement", [
    "from ms_boost import thor, ConvertModelUtils",
    "from ms_boost import ConvertModelUtils, thor",
    "from ms_boost.thor import ConvertModelUtils; from ms_boost import thor",
])
def test_thor_import_forms(statement):
    """Every way a THOR tutorial reader imports ``thor`` gives something that builds the THOR optimizer
    (``thor(net, lr, damping, momentum, weight_decay, loss_scale, batch_size, split_indices=..., frequency=...)``)."""
    code = (f"{statement}\nfrom mindspore import nn\n"
            "opt = thor(nn.Dense(4, 3), 0.1, 0.03, 0.9, 0.0, 1.0, 8, split_indices=[26, 53], frequency=2)\n"
            "assert type(opt).__name__ == 'THOR', type(opt)\n"
            "assert callable(ConvertModelUtils().convert_to_thor_model)\n")
    proc = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{statement!r}: {proc.stderr[-600:]}"

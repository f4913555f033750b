"""Acceptance tests: MindSpore's AdaSum, dimension-reduce and THOR tutorials, run as their readers write them.

The scripts in ``tests/tutorials/`` follow the tutorials in ``shared/references`` line by line; only the import
of ``Model`` (and of ``thor`` / ``ConvertModelUtils``) changes to ms_boost, the device is the CPU, and the
ResNet (``NET``: ResNet-10, one basic block a stage, width 4 -- graph compilation, not the steps, is most of a
run's CPU, and it grows with the number of layers) and the ImageFolder data set are tiny. Distributed tutorials
run under ``msrun`` with 2 CPU workers.
Each script prints ``TUTORIAL_RESULT {json}`` (and under msrun saves the same values per rank); the tests check
exit status, finite and falling losses, accuracy above chance, where checkpoints land, and metric keys.
The AdaSum tutorial and the dimension-reduce tutorial's two stages run in one msrun job (below), which goes on
with tests/test_msrun_e2e.py's scenarios; the THOR tutorial
is in ``test_tutorials_thor.py`` (a separate file so that pytest-xdist can run it on another worker).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import TUTORIAL_CLASSES
from tests.helpers.msrun import run_msrun, run_once

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = ROOT / "tests" / "tutorials"
NUM_CLASSES = TUTORIAL_CLASSES  # the data_path fixture (tests/conftest.py)
CHANCE = 1.0 / NUM_CLASSES
NET = ("--net", "resnet10")  # tests/tutorials/tutorial_common.py: resnet()


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
ADASUM_EPOCHS = 3  # 18 steps a variant: the losses fall; graph compilation, not the steps, is most of the CPU
IMAGE = ("--image_size", 16)  # 16x16 crops of the 32x32 data set: a quarter of the pixels per step


# Dimension-reduce training tutorial: stage 1 (regular, saves the PCA checkpoints), stage 2 (boost dim_reduce)
STAGE1_EPOCHS = 6  # on 16x16 crops ResNet-10 reaches ~0.6 accuracy in 6 epochs (~0.85 in 10); >= 5 for the PCA
STAGE2_EPOCHS = 1  # stage 2 starts from stage 1's weights: one epoch of 6 steps shows the subspace steps
N_COMPONENT = 4


def _stage(ranks: list, name: str) -> list:
    """Each rank's values of one stage of the job (``run_stages.py`` keeps them as ``<stage>.<key>``)."""
    return [{key[len(name) + 1:]: value for key, value in res.items() if key.startswith(name + ".")}
            for res in ranks]


def distributed_job(data_path: str, tmp_path_factory) -> tuple:
    """The distributed tutorials and tests/test_msrun_e2e.py's Graph-mode scenarios in one msrun job on 2 ranks
    (``tests/tutorials/run_stages.py``: one MindSpore start and one ``init()`` per rank for all of them, the ranks
    meeting at a barrier between two scripts; each script as written): the AdaSum tutorial (both variants:
    ``--variant o2 adasum``, each training its own network and ``Model`` in turn), then the dimension-reduce
    tutorial's stage 1 and stage 2 in the same folder (as the tutorial's scripts do; stage 2, ``pca_mat_path``
    None, computes the PCA from ``weight_load_dir="./checkpoint_stage_1/checkpoint_pca"`` and loads stage 1's last
    checkpoint), then every scenario of tests/workers/e2e_graph.py (last: its own last scenario ends with a rank
    stuck before a handshake). One job instead of three spares two msrun starts (launcher, scheduler, two imports
    of MindSpore and the cluster's start each). Run once a test session (``run_once``: the first of this file
    and test_msrun_e2e.py to ask runs it, the other reads its results). Returns the folder (``tutorials/``: the
    tutorials' working folder; ``e2e/``: the scenarios' WORK_DIR) and each rank's values by stage name."""
    from tests.test_dim_reduce_msrun import _stage1_checkpoints

    def job(folder: Path) -> list:
        workdir, e2e_dir = folder / "tutorials", folder / "e2e"
        workdir.mkdir()
        _stage1_checkpoints(str(e2e_dir / "stage1"), 6)
        _stage1_checkpoints(str(e2e_dir / "stage1_stuck"), 4)
        assert not (e2e_dir / "pca_mat.npy").exists()  # rank 0 computes it, rank 1 waits through the status exchange
        return run_distributed(
            "run_stages.py",
            "adasum", "adasum_tutorial.py", "--data_path", data_path, *NET, *IMAGE, "--variant", "o2", "adasum",
            "--device_per_server", "1", "--epochs", ADASUM_EPOCHS, "--lr_max", "0.05", "--",
            "stage1", "dim_reduce_stage1.py", "--data_path", data_path, *NET, *IMAGE, "--epochs", STAGE1_EPOCHS, "--",
            "stage2", "dim_reduce_stage2.py", "--data_path", data_path, *NET, *IMAGE, "--pretrained_weight_path",
            f"./checkpoint_stage_1/resnet-{STAGE1_EPOCHS}_{{stage1.step_size}}.ckpt", "--n_component", N_COMPONENT,
            "--epochs", STAGE2_EPOCHS, "--",
            "e2e", "../workers/e2e_graph.py", e2e_dir, cwd=workdir, timeout=1500)

    folder, ranks = run_once(tmp_path_factory, "tutorials_e2e_job", job)
    return folder, {name: _stage(ranks, name) for name in ("adasum", "stage1", "stage2", "e2e")}


@pytest.fixture(scope="module")
def tutorial_job(data_path, tmp_path_factory):
    """The tutorials' work folder and each rank's values by stage name, from :func:`distributed_job`."""
    folder, stages = distributed_job(data_path, tmp_path_factory)
    return folder / "tutorials", stages


@pytest.fixture(scope="module")
def adasum_ranks(tutorial_job):
    """Each rank's values of the AdaSum tutorial per variant: ``[{"o2": {...}, "adasum": {...}}, ...]``."""
    return [{variant: {key[len(variant) + 1:]: value for key, value in res.items() if key.startswith(variant + "_")}
             for variant in ("o2", "adasum")} for res in tutorial_job[1]["adasum"]]


@pytest.mark.msrun
def test_adasum_tutorial_boost_dict_two_servers(adasum_ranks):
    """The tutorial's AdaSum-only boost_dict with eval_network, 2 ranks as 2 servers (AdaSum really combines)."""
    ranks = [res["adasum"] for res in adasum_ranks]
    for rank, res in enumerate(ranks):
        check_losses(res["losses"], f"adasum rank {rank}")
        assert int(res["step_size"]) == NUM_CLASSES * 16 // 2 // 8
    # AdaSum hands every rank the same combined update: the ranks end with the same weights
    np.testing.assert_allclose(ranks[0]["weights_head"], ranks[1]["weights_head"], rtol=0, atol=1e-6)
    np.testing.assert_allclose(ranks[0]["weights_sum"], ranks[1]["weights_sum"], rtol=1e-9)
    np.testing.assert_allclose(ranks[0]["weights_abs_sum"], ranks[1]["weights_abs_sum"], rtol=1e-9)


@pytest.mark.msrun
def test_adasum_tutorial_boost_level_o2(adasum_ranks):
    """``Model(..., amp_level="O2", boost_level="O2", keep_batchnorm_fp32=False)`` exactly as written, on 2 ranks
    (fewer than the default 8 devices per server)."""
    ranks = [res["o2"] for res in adasum_ranks]
    assert len(ranks[0]["losses"]) == ADASUM_EPOCHS * int(ranks[0]["step_size"])
    # gradient freezing slows the descent: judge the loss averaged over the ranks
    check_losses(np.mean([res["losses"] for res in ranks], axis=0), "O2 (mean over ranks)")
    np.testing.assert_allclose(ranks[0]["weights_sum"], ranks[1]["weights_sum"], rtol=1e-9)
    np.testing.assert_allclose(ranks[0]["weights_head"], ranks[1]["weights_head"], rtol=0, atol=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# Dimension-reduce training tutorial (stages 1 and 2 of ``tutorial_job``)
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.msrun
def test_dim_reduce_stage1(tutorial_job):
    workdir, ranks = tutorial_job[0], tutorial_job[1]["stage1"]
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
    assert sorted(p.name for p in pca_dir.glob("*.ckpt")) == sorted(
        f"resnet-{e}_{step_size}.ckpt" for e in range(1, STAGE1_EPOCHS + 1))


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
    assert f"resnet-{STAGE2_EPOCHS}_{step_size}.ckpt" in saved, saved


@pytest.mark.msrun
def test_dim_reduce_stage2_computes_pca(tutorial_job):
    """pca_mat_path None: the PCA is computed from weight_load_dir="./checkpoint_stage_1/checkpoint_pca"."""
    workdir, stage1_ranks, ranks = tutorial_job[0], tutorial_job[1]["stage1"], tutorial_job[1]["stage2"]
    _check_stage2(workdir, ranks, stage1_ranks, "stage 2 (PCA computed)")
    written = list((workdir / "checkpoint_stage_1" / "checkpoint_pca").glob("*.npy"))
    assert written, "the computed PCA matrix was not saved next to the checkpoints"
    pca = np.load(written[0], allow_pickle=False)
    assert pca.shape[0] == N_COMPONENT
    np.testing.assert_allclose(pca @ pca.T, np.eye(N_COMPONENT), atol=1e-4)

"""Acceptance test: MindSpore's two-stage dimension-reduce tutorial under msrun (see test_tutorials.py)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.test_tutorials import CHANCE, NET, check_losses, run_distributed

# ---------------------------------------------------------------------------------------------------------------
# Dimension-reduce training tutorial: stage 1 (regular, saves the PCA checkpoints), stage 2 (boost dim_reduce)
# ---------------------------------------------------------------------------------------------------------------
STAGE1_EPOCHS = 6  # on 16x16 crops ResNet-10 reaches ~0.6 accuracy in 6 epochs (~0.85 in 10); >= 5 for the PCA
STAGE2_EPOCHS = 1  # stage 2 starts from stage 1's weights: one epoch of 6 steps shows the subspace steps
N_COMPONENT = 4
# 16x16 crops of the 32x32 data set (a quarter of the pixels per step)
IMAGE = ("--image_size", 16)


def _stage(ranks: list, name: str) -> list:
    """Each rank's values of one stage of the job (``run_stages.py`` keeps them as ``<stage>.<key>``)."""
    return [{key[len(name) + 1:]: value for key, value in res.items() if key.startswith(name + ".")}
            for res in ranks]


@pytest.fixture(scope="module")
def stages(data_path, tmp_path_factory):
    """Stage 1, then stage 2 in the same folder (as the tutorial's scripts do), both as written, in one msrun job
    (``tests/tutorials/run_stages.py``: one MindSpore start and one ``init()`` per rank for both stages, the
    ranks meeting at a barrier between them). Stage 2 (``pca_mat_path`` None) computes the PCA from
    ``weight_load_dir="./checkpoint_stage_1/checkpoint_pca"`` and loads stage 1's last checkpoint."""
    workdir = tmp_path_factory.mktemp("dim_reduce")
    ranks = run_distributed(
        "run_stages.py",
        "stage1", "dim_reduce_stage1.py", "--data_path", data_path, *NET, *IMAGE, "--epochs", STAGE1_EPOCHS, "--",
        "stage2", "dim_reduce_stage2.py", "--data_path", data_path, *NET, *IMAGE, "--pretrained_weight_path",
        f"./checkpoint_stage_1/resnet-{STAGE1_EPOCHS}_{{stage1.step_size}}.ckpt", "--n_component", N_COMPONENT,
        "--epochs", STAGE2_EPOCHS, cwd=workdir)
    return workdir, _stage(ranks, "stage1"), _stage(ranks, "stage2")


@pytest.mark.msrun
def test_dim_reduce_stage1(stages):
    workdir, ranks, _ = stages
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
def test_dim_reduce_stage2_computes_pca(stages):
    """pca_mat_path None: the PCA is computed from weight_load_dir="./checkpoint_stage_1/checkpoint_pca"."""
    workdir, stage1_ranks, ranks = stages
    _check_stage2(workdir, ranks, stage1_ranks, "stage 2 (PCA computed)")
    written = list((workdir / "checkpoint_stage_1" / "checkpoint_pca").glob("*.npy"))
    assert written, "the computed PCA matrix was not saved next to the checkpoints"
    pca = np.load(written[0], allow_pickle=False)
    assert pca.shape[0] == N_COMPONENT
    np.testing.assert_allclose(pca @ pca.T, np.eye(N_COMPONENT), atol=1e-4)

"""Acceptance tests: MindSpore's AdaSum, dimension-reduce and THOR tutorials, run as their readers write them.

The scripts in ``tests/tutorials/`` follow the tutorials in ``shared/references`` line by line; only the import
of ``Model`` (and of ``thor`` / ``ConvertModelUtils``) changes to ms_boost, the device is the CPU, and the
ResNet (``NET``: ResNet-10, one basic block a stage, width 4 -- graph compilation, not the steps, is most of a
run's CPU, and it grows with the number of layers) and the ImageFolder data set are tiny. Distributed tutorials
run under ``msrun`` with 2 CPU workers.
Each script prints ``TUTORIAL_RESULT {json}`` (and under msrun saves the same values per rank); the tests check
exit status, finite and falling losses, accuracy above chance, where checkpoints land, and metric keys.
The dimension-reduce and THOR tutorials are in ``test_tutorials_dim_reduce.py`` / ``test_tutorials_thor.py``
(separate files so that pytest-xdist can run them on different workers).
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
from tests.helpers.msrun import run_msrun

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


@pytest.fixture(scope="module")
def adasum_ranks(data_path, tmp_path_factory):
    """Both AdaSum-tutorial variants in one msrun job (``--variant o2 adasum``: one ``init()``, then each variant
    trains its own network and ``Model`` in turn), which spares a second msrun start (launcher, scheduler, imports).
    Returns each rank's values per variant: ``[{"o2": {...}, "adasum": {...}}, ...]``."""
    ranks = run_distributed("adasum_tutorial.py", "--data_path", data_path, *NET, *IMAGE, "--variant", "o2", "adasum",
                            "--device_per_server", "1", "--epochs", ADASUM_EPOCHS, "--lr_max", "0.05",
                            cwd=tmp_path_factory.mktemp("adasum"))
    return [{variant: {key[len(variant) + 1:]: value for key, value in res.items() if key.startswith(variant + "_")}
             for variant in ("o2", "adasum")} for res in ranks]


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

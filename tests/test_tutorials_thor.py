"""Acceptance test: MindSpore's THOR tutorial (train, then eval from the checkpoint; see test_tutorials.py)."""
from __future__ import annotations

import math
import subprocess
import sys

import pytest

from tests.test_tutorials import CHANCE, NET, _env, check_losses, run_script

# ---------------------------------------------------------------------------------------------------------------
# THOR tutorial: train (thor + ConvertModelUtils, amp O2, fixed loss scale), then eval from the checkpoint
# ---------------------------------------------------------------------------------------------------------------
THOR_EPOCHS = 6  # a THOR step costs little next to compiling the THOR graph; ResNet-10 needs the epochs


@pytest.fixture(scope="module")
def thor_run(data_path, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("thor")
    result = run_script("thor_tutorial.py", "--data_path", data_path, *NET, "--epochs", THOR_EPOCHS,
                        "--save_checkpoint_path", "./train/", cwd=workdir)
    return workdir, result


def test_thor_tutorial_train(thor_run):
    workdir, result = thor_run
    check_losses(result["losses"], "thor")
    assert "loss is" in result["stdout"]
    step_size = int(result["step_size"])
    assert sorted(p.name for p in (workdir / "train").glob("*.ckpt")) == sorted(
        f"resnet-{e}_{step_size}.ckpt" for e in range(1, THOR_EPOCHS + 1))


@pytest.mark.parametrize("mode", ["graph", "pynative"])
def test_thor_tutorial_eval(thor_run, data_path, mode):
    workdir, train = thor_run
    ckpt = workdir / "train" / f"resnet-{THOR_EPOCHS}_{int(train['step_size'])}.ckpt"
    result = run_script("thor_eval.py", "--data_path", data_path, *NET, "--checkpoint_path", ckpt,
                        "--mode", mode, cwd=workdir)
    res = result["result"]
    assert set(res) == {"top_1_accuracy", "top_5_accuracy"}
    assert result["not_loaded"] == 0, "some network parameters were not in the THOR checkpoint"
    assert res["top_1_accuracy"] > CHANCE + 0.1, res
    assert res["top_5_accuracy"] >= res["top_1_accuracy"]
    assert math.isclose(result["weights_sum"], train["weights_sum"], rel_tol=1e-6), \
        "the evaluated network does not hold the trained weights"


IMPORT_FORMS = [
    "from ms_boost import thor, ConvertModelUtils",
    "from ms_boost import ConvertModelUtils, thor",
    "from ms_boost.thor import ConvertModelUtils; from ms_boost import thor",
]


def test_thor_import_forms():
    """Every way a THOR tutorial reader imports ``thor`` gives something that builds the THOR optimizer
    (``thor(net, lr, damping, momentum, weight_decay, loss_scale, batch_size, split_indices=..., frequency=...)``).
    One interpreter for all forms (MindSpore is imported once); every ``ms_boost`` module is dropped from
    ``sys.modules`` before each form, so each one imports ms_boost afresh in its own order."""
    code = ("import sys\nfrom mindspore import nn\n"
            f"for statement in {IMPORT_FORMS!r}:\n"
            "    for name in [m for m in sys.modules if m == 'ms_boost' or m.startswith('ms_boost.')]:\n"
            "        del sys.modules[name]\n"
            "    names = {}\n"
            "    exec(statement, names)\n"
            "    thor, ConvertModelUtils = names['thor'], names['ConvertModelUtils']\n"
            "    opt = thor(nn.Dense(4, 3), 0.1, 0.03, 0.9, 0.0, 1.0, 8, split_indices=[26, 53], frequency=2)\n"
            "    assert type(opt).__name__ == 'THOR', (statement, type(opt))\n"
            "    assert callable(ConvertModelUtils().convert_to_thor_model), statement\n"
            "    print('IMPORT_OK', statement, flush=True)\n")
    proc = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-1200:]
    done = [line[len("IMPORT_OK "):] for line in proc.stdout.splitlines() if line.startswith("IMPORT_OK ")]
    assert done == IMPORT_FORMS, done

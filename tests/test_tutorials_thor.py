"""Acceptance test: MindSpore's THOR tutorial (train, then eval from the checkpoint; see test_tutorials.py)."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from tests.test_tutorials import CHANCE, NET, NUM_CLASSES, TUTORIALS, _env, check_losses, run_script

# ---------------------------------------------------------------------------------------------------------------
# THOR tutorial: train (thor + ConvertModelUtils, amp O2, fixed loss scale), then eval from the checkpoint
# ---------------------------------------------------------------------------------------------------------------
THOR_EPOCHS = 6  # a THOR step costs little next to compiling the THOR graph; ResNet-10 needs the epochs
# The THOR tutorial's own data set: twice the training images of the shared tutorial set (24 steps an epoch: the
# tutorial's decaying learning rate does most of its work in the first epochs) and 96 validation images, so that
# the accuracy bar below stands far from chance (docs/thor.md "Block size, measured": the spread over seeds).
THOR_TRAIN_PER_CLASS, THOR_VAL_PER_CLASS = 32, 16
BATCH = 8  # tests/tutorials/tutorial_common.py: base_parser's --batch_size
#: How unlikely a random guess must be to reach the bar: a guess that is right with probability 1 / classes on
#: every image, independently, reaches it with at most this probability.
GUESS_P_VALUE = 1e-3


def chance_bar(images: int, classes: int, p_value: float = GUESS_P_VALUE) -> float:
    """Smallest top-1 accuracy ``k / images`` that a random guess reaches with probability at most ``p_value``.

    The number of right guesses is binomial (``images`` trials, ``1 / classes`` each): the bar is the first ``k``
    whose upper tail ``P(X >= k)`` is at most ``p_value``, summed exactly. An untrained network that names one class
    for every image scores ``1 / classes`` on the balanced validation set, below the bar as well.
    """
    p = 1.0 / classes
    tail = 0.0
    for k in range(images, -1, -1):
        tail += math.comb(images, k) * p ** k * (1.0 - p) ** (images - k)
        if tail > p_value:
            return (k + 1) / images
    raise ValueError(f"p_value={p_value} must be below 1")


def test_chance_bar_is_the_binomial_tail():
    """The bar against scipy's binomial survival function: ``P(X >= k) <= p`` at the bar, ``> p`` one image below;
    at the test's size (96 images, 6 classes, 1e-3) it is 29 right answers, 0.302 (a random guess averages 16)."""
    from scipy.stats import binom

    for images, classes, p_value in ((96, 6, 1e-3), (24, 6, 1e-3), (50, 10, 1e-2), (7, 2, 0.2)):
        k = round(chance_bar(images, classes, p_value) * images)
        assert binom.sf(k - 1, images, 1 / classes) <= p_value < binom.sf(k - 2, images, 1 / classes)
    assert round(chance_bar(96, 6) * 96) == 29


@pytest.fixture(scope="module")
def thor_data_path(tmp_path_factory) -> str:
    """The generated ImageNet-layout set of the tutorial tests (6 classes of 32x32 JPEGs), larger (see above)."""
    from model_zoo.resnet.src.synthetic_data import ensure_dataset

    return str(ensure_dataset(tmp_path_factory.mktemp("thor_data"), num_classes=NUM_CLASSES, image_size=32,
                              train_per_class=THOR_TRAIN_PER_CLASS, val_per_class=THOR_VAL_PER_CLASS, seed=0,
                              verbose=False))


@pytest.fixture(scope="module")
def thor_run(thor_data_path, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("thor")
    result = run_script("thor_tutorial.py", "--data_path", thor_data_path, *NET, "--epochs", THOR_EPOCHS,
                        "--save_checkpoint_path", "./train/", cwd=workdir)
    return workdir, result


def test_thor_tutorial_train(thor_run):
    """The tutorial's training: losses finite and falling, a checkpoint per epoch; and what its calls built: the
    ms_boost Model from ``convert_to_thor_model``, THOR over ResNet's 13 layers (split_indices [26, 53] past the
    last layer), one optimizer step per batch, every weight moved (and finite: the losses are), every inverse
    refreshed away from zero."""
    workdir, result = thor_run
    check_losses(result["losses"], "thor")
    assert "loss is" in result["stdout"]
    step_size = int(result["step_size"])
    assert result["model_class"] == "ms_boost.model.Model", result["model_class"]
    assert step_size == NUM_CLASSES * THOR_TRAIN_PER_CLASS // BATCH
    assert result["thor_layers"] == 13 and result["global_step"] == THOR_EPOCHS * step_size
    assert result["unchanged_params"] == 0 and result["zero_inverses"] == 0
    assert math.isfinite(result["weights_abs_sum"]) and result["weights_abs_sum"] > 0
    assert sorted(p.name for p in (workdir / "train").glob("*.ckpt")) == sorted(
        f"resnet-{e}_{step_size}.ckpt" for e in range(1, THOR_EPOCHS + 1))


EVAL_MODES = ("graph", "pynative")


@pytest.fixture(scope="module")
def thor_evals(thor_run, thor_data_path):
    """``thor_eval.py`` run as ``__main__`` once per mode, one run after the other in the same interpreter
    (``runpy``, each with its own ``sys.argv``): the script is unchanged, only the second import of MindSpore is
    saved. Returns each run's ``TUTORIAL_RESULT`` by mode."""
    workdir, train = thor_run
    ckpt = workdir / "train" / f"resnet-{THOR_EPOCHS}_{int(train['step_size'])}.ckpt"
    script = TUTORIALS / "thor_eval.py"
    args = ["--data_path", thor_data_path, *NET, "--checkpoint_path", str(ckpt)]
    code = ("import runpy, sys\n"
            f"sys.path.insert(0, {str(TUTORIALS)!r})\n"
            f"for mode in {EVAL_MODES!r}:\n"
            f"    sys.argv = [{str(script)!r}, *{args!r}, '--mode', mode]\n"
            f"    runpy.run_path({str(script)!r}, run_name='__main__')\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=workdir, env=_env(), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    results = [json.loads(line[len("TUTORIAL_RESULT "):]) for line in proc.stdout.splitlines()
               if line.startswith("TUTORIAL_RESULT ")]
    assert len(results) == len(EVAL_MODES), proc.stdout[-2000:]
    return dict(zip(EVAL_MODES, results))


@pytest.mark.parametrize("mode", EVAL_MODES)
def test_thor_tutorial_eval(thor_run, thor_evals, mode):
    """The trained checkpoint, evaluated as the tutorial's ``eval.py`` does, on all 96 validation images: top-1
    accuracy at or above :func:`chance_bar` (0.302; a random guess reaches it with probability below 1e-3). Over
    seeds 0-4 at block sizes 64 and 128 the scenario scored well above it (docs/thor.md "Block size, measured")."""
    _, train = thor_run
    result = thor_evals[mode]
    res = result["result"]
    assert set(res) == {"top_1_accuracy", "top_5_accuracy"}
    assert result["not_loaded"] == 0, "some network parameters were not in the THOR checkpoint"
    images = int(result["step_size"]) * BATCH
    assert images == NUM_CLASSES * THOR_VAL_PER_CLASS  # every validation image is evaluated (drop_remainder)
    assert res["top_1_accuracy"] >= chance_bar(images, NUM_CLASSES) > CHANCE, res
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

"""A user's journey through the model zoo: train every recipe, stop, resume exactly, evaluate and export its
checkpoint, watch the metrics, and feed bad input (diverging lr, a truncated JPEG, a broken recipe file).

Runs are a width-4 ResNet-10 on 16x16 images with 2 steps per epoch, in-process through ``train.py``'s
``main`` (tests/test_zoo_journey_inputs.py runs ``train.py`` as ``__main__`` for its exit status). Each recipe
is trained once, and that one run carries every check on it: it trains (finite losses, the progress line, the
recipe's own boost pieces, see ``check_recipe``; these were tests/test_zoo_recipes.py's per-recipe tests),
resumes exactly, evaluates, exports (MINDIR and ONNX, run against the network: tests/helpers/exports.py).
"""
from __future__ import annotations

import io
import math
import re
import shutil
from contextlib import redirect_stdout
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest

from model_zoo.resnet import eval as zoo_eval
from model_zoo.resnet import train as zoo_train
from model_zoo.resnet.src import trainer
from model_zoo.resnet.src.config import parse_config
from model_zoo.resnet.src.metrics import read_metrics
from model_zoo.resnet.src.run_state import read_manifest
from tests.helpers.exports import assert_exports_match

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "model_zoo" / "resnet" / "configs"
SPE = 2  # steps per epoch


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("journey_cache")


def small(cache_dir: Path, out: Path, mode: str = "pynative", epochs: int = 2) -> list:
    """Overrides shrinking any recipe to a width-4 ResNet-10 on 16x16 images, SPE steps per epoch."""
    return ["--device_target", "CPU", "--mode", mode, "--net_name", "resnet10", "--base_width", "4",
            "--class_num", "10", "--batch_size", "8", "--eval_batch_size", "10", "--train_image_size", "16",
            "--eval_image_size", "16", "--steps_per_epoch", str(SPE), "--epoch_size", str(epochs),
            "--synthetic.cache_dir", str(cache_dir), "--synthetic.image_size", "16",
            "--synthetic.train_per_class", "4", "--synthetic.val_per_class", "1", "--num_parallel_workers", "1",
            "--output_path", str(out), "--log_interval", "1", "--run_eval", "false", "--warmup_epochs", "0",
            "--lr_max", "0.05", "--save_checkpoint_epochs", "1", "--save_checkpoint_steps", "0",
            "--eval_before_train", "false", "--save_checkpoint", "true"]


def run(recipe: str, args: list) -> dict:
    if recipe == "resnet50_imagenet_thor.yaml" and "--lr_max" in args:  # THOR's schedule is thor.*: refused there
        at = args.index("--lr_max")
        args = args[:at] + args[at + 2:]
    buffer = io.StringIO()
    with redirect_stdout(buffer):
        results = zoo_train.main(["--config", str(CONFIGS / recipe), *args])
    results["stdout"] = buffer.getvalue()
    return results


def state(path: Path) -> dict:
    return {k: v.asnumpy() for k, v in ms.load_checkpoint(str(path)).items() if not isinstance(v, str)}


def assert_same_state(a: Path, b: Path) -> None:
    left, right = state(a), state(b)
    assert sorted(left) == sorted(right)
    for name in left:
        np.testing.assert_array_equal(left[name], right[name], err_msg=name)


# (recipe, mode, extra overrides): every recipe once, in PyNative mode (cheapest: a Graph-mode run compiles the
# train, eval and export graphs anew for the straight and the resumed run) except dimension-reduce stage 1, the
# zoo's Graph-mode journey (train, guarded checkpoints, exact resume, eval, export). Each algorithm's Graph-mode
# training lives beside its PyNative one: plain Momentum (O0) in tests/test_model.py
# (test_o0_matches_mindspore_model_step_for_step) and stage 1 here; O1 (quickstart, boost_o1) and O2 in
# tests/test_o1_o2.py::test_boost_level_trains_small_resnet; AdaSum in tests/test_adasum.py and the msrun job of
# tests/test_msrun_e2e.py; DimReduce in tests/test_dim_reduce_stage.py; THOR in tests/test_thor_model.py.
STAGE1 = "resnet50_imagenet_dim_reduce_stage1.yaml"
CASES = [
    ("resnet18_synthetic_quickstart.yaml", "pynative", []),
    ("resnet50_imagenet_momentum.yaml", "pynative", []),
    ("resnet50_imagenet_boost_o1.yaml", "pynative", []),
    ("resnet50_imagenet_boost_o2_adasum.yaml", "pynative", ["--boost_config_dict.common.device_number", "1"]),
    ("resnet50_imagenet_thor.yaml", "pynative", ["--thor.frequency", "2", "--thor.block_size", "32",
                                                 "--steps_per_epoch", "1"]),  # slow: 1/epoch
    (STAGE1, "graph", ["--pca_checkpoint_steps", "1"]),
    ("resnet50_imagenet_dim_reduce_stage2.yaml", "pynative", ["--boost_config_dict.common.device_num", "1",
                                                              "--boost_config_dict.dim_reduce.n_component", "3"]),
]


@pytest.fixture(scope="module")
def stage1_run(cache_dir, tmp_path_factory) -> Path:
    """Dimension-reduce stage 1 (graph mode), its full and weight-only checkpoints (stage 2 starts from them)."""
    out = tmp_path_factory.mktemp("stage1")
    recipe, mode, extra = CASES[5]
    results = run(recipe, small(cache_dir, out / "straight", mode) + extra)
    return out, results


def check_recipe(recipe: str, results: dict, ckpt_dir: Path, steps: int, extra: list, pca_mat: Path) -> None:
    """What each recipe's straight run must show: it trained (``steps`` finite losses, the progress line) with
    the recipe's own pieces switched on (and the others off)."""
    assert len(results["losses"]) == steps and all(math.isfinite(v) for v in results["losses"])
    assert re.search(rf"epoch 2/2 step \d+/\d+ \(global {steps}/{steps}\) loss \d+\.\d+ \| [\d.]+ ms/step \| "
                     r"[\d.]+ img/s \| ETA", results["stdout"]), results["stdout"]
    boost, last = results["model"].boost, ckpt_dir / f"resnet-2_{steps // 2}.ckpt"
    if recipe == "resnet50_imagenet_momentum.yaml":
        assert not boost.is_active
        saved = ms.load_checkpoint(str(last))
        assert "conv1.weight" in saved and "fc.weight" in saved
    elif recipe in ("resnet50_imagenet_boost_o1.yaml", "resnet18_synthetic_quickstart.yaml"):  # quickstart: O1
        assert boost.level == "O1" and boost.enabled("less_bn") and boost.enabled("grad_freeze")
        assert boost.grad_freeze.total_steps == steps  # 0 in the recipe = the run's total steps
    elif recipe == "resnet50_imagenet_boost_o2_adasum.yaml":
        assert boost.level == "O2" and boost.enabled("adasum")
        assert not boost.enabled("less_bn") and not boost.enabled("grad_freeze")
    elif recipe == "resnet50_imagenet_thor.yaml":
        from ms_boost.thor import THOR

        assert isinstance(results["model"]._optimizer, THOR)  # pylint: disable=protected-access
        assert results["model"]._optimizer.block_size == 32  # thor.block_size, given on the command line
    elif recipe == STAGE1:
        assert ckpt_dir.name == "checkpoint_stage_1"
        weights = sorted((ckpt_dir / "checkpoint_pca").glob("resnet-*.ckpt"))
        assert len(weights) == steps  # --pca_checkpoint_steps 1: one weight-only file per step
        weight_only = ms.load_checkpoint(str(weights[0]))
        assert not any(name.startswith(("moments.", "learning_rate", "global_step")) for name in weight_only)
        assert any(name.startswith("moments.") for name in ms.load_checkpoint(str(last)))
    else:  # dimension-reduce stage 2
        assert boost.enabled("dim_reduce") and boost.dim_reduce.n_components == 3
        given = extra[extra.index("--boost_config_dict.dim_reduce.weight_load_dir") + 1]
        assert boost.dim_reduce.weight_load_dir == given
        assert np.load(pca_mat, allow_pickle=False).shape[0] == 3


def check_extension(cache_dir: Path, folder: Path, recipe: str, mode: str, extra: list, monkeypatch) -> None:
    """A finished 2-epoch run resumed with ``--epoch_size 3``: every state Parameter restored from its checkpoint,
    the learning rates (O1: one array per freezing group) those of the 3-epoch schedule, and epoch 3 trained."""
    last = folder / "checkpoint" / f"resnet-2_{SPE}.ckpt"
    saved = state(last)
    restored = {}

    def capture(cfg, model, steps_per_epoch):
        result = real_resume(cfg, model, steps_per_epoch)
        restored.update({p.name: p.asnumpy().copy() for p in model.train_network.get_parameters()})  # not a view
        restored["schedules"] = trainer.schedule_parameter_names(model.train_network)
        return result

    real_resume = trainer.resume_state
    monkeypatch.setattr(trainer, "resume_state", capture)
    longer = run(recipe, small(cache_dir, folder, mode, epochs=3) + extra + ["--resume", str(folder)])
    schedules = restored.pop("schedules")
    assert schedules and all(name.endswith("learning_rate") for name in schedules)
    new_lr = trainer.learning_rate(parse_config(["--config", str(CONFIGS / recipe), *small(cache_dir, folder, mode, 3),
                                                 *extra], CONFIGS / recipe), SPE)
    assert len(new_lr) == 3 * SPE and not np.allclose(new_lr[:2 * SPE], saved[sorted(schedules)[0]])
    for name, value in restored.items():
        np.testing.assert_array_equal(value, new_lr if name in schedules else saved[name], err_msg=name)
    assert "epoch_size 2 -> 3" in longer["stdout"] and longer["initial_epoch"] == 2
    assert len(longer["losses"]) == SPE and all(math.isfinite(v) for v in longer["losses"])
    after = state(folder / "checkpoint" / f"resnet-3_{SPE}.ckpt")
    assert all(after[name][0] == 3 * SPE for name in after if name.endswith("global_step"))
    lrs = [r["lr"] for r in read_metrics(folder) if r["kind"] == "step"]  # epochs 1-2 kept, epoch 3 appended
    np.testing.assert_allclose(lrs, np.concatenate([saved[sorted(schedules)[0]], new_lr[2 * SPE:]]), rtol=1e-6)


@pytest.mark.parametrize("recipe,mode,extra", CASES, ids=[f"{c[0].split('.')[0]}-{c[1]}" for c in CASES])
def test_recipe_resumes_exactly_and_its_checkpoint_evaluates_and_exports(cache_dir, stage1_run, tmp_path, recipe,
                                                                         mode, extra, monkeypatch):
    pca_mat = tmp_path / "pca_mat.npy"
    if recipe == STAGE1:
        out, results = stage1_run  # trained by the fixture with this very case's settings
    else:
        out = tmp_path
        if "dim_reduce_stage2" in recipe:
            stage1 = stage1_run[0] / "straight" / "checkpoint_stage_1"
            extra = extra + ["--pretrained", str(stage1 / "resnet-2_2.ckpt"),
                             "--boost_config_dict.dim_reduce.weight_load_dir", str(stage1 / "checkpoint_pca"),
                             "--boost_config_dict.dim_reduce.pca_mat_path", str(pca_mat)]
        results = run(recipe, small(cache_dir, out / "straight", mode) + extra)
    spe = int(extra[extra.index("--steps_per_epoch") + 1]) if "--steps_per_epoch" in extra else SPE
    straight = out / "straight"
    ckpt_dir = next(p for p in straight.iterdir() if p.is_dir() and p.name.startswith("checkpoint"))
    check_recipe(recipe, results, ckpt_dir, 2 * spe, extra, pca_mat)
    epoch1, epoch2 = f"resnet-1_{spe}.ckpt", f"resnet-2_{spe}.ckpt"
    assert sorted(p.name for p in ckpt_dir.glob("*.ckpt")) == [epoch1, epoch2]
    first, last = state(ckpt_dir / epoch1), state(ckpt_dir / epoch2)
    assert any(not np.array_equal(first[k], last[k]) for k in first)  # epoch 2 changed the weights
    manifest = read_manifest(ckpt_dir / epoch2)
    assert manifest["recipe"] == recipe[:-5] and manifest["global_step"] == 2 * spe
    assert manifest["steps_per_epoch"] == spe

    # stop after epoch 1 (the run folder as it was then), resume from the folder in a new run
    stopped = tmp_path / "stopped"
    (stopped / ckpt_dir.name).mkdir(parents=True)
    shutil.copy(ckpt_dir / epoch1, stopped / ckpt_dir.name)
    shutil.copy(straight / "metrics.jsonl", stopped)
    resumed = run(recipe, small(cache_dir, stopped, mode) + extra + ["--resume", str(stopped)])
    assert resumed["initial_epoch"] == 1 and len(resumed["losses"]) == spe
    assert "resumed from" in resumed["stdout"] and f"(global {spe + 1}/{2 * spe})" in resumed["stdout"]
    assert_same_state(ckpt_dir / epoch2, stopped / ckpt_dir.name / epoch2)
    # the metrics file continues where the stopped run left it: same steps, same losses as the straight run
    steps = [[(r["step"], r["loss"], r["lr"]) for r in read_metrics(d) if r["kind"] == "step"] for d in (straight,
                                                                                                     stopped)]
    assert steps[0] == steps[1] and [s[0] for s in steps[0]] == list(range(1, 2 * spe + 1))

    # the recipe's own checkpoint evaluates, and exports to MINDIR and ONNX files that give the network's outputs
    # (the network's shape comes from the checkpoint's manifest: no --net_name/--base_width/--class_num)
    args = ["--config", str(CONFIGS / recipe), *small(cache_dir, tmp_path / "eval", mode), *extra,
            "--checkpoint_file_path", str(ckpt_dir / epoch2)]
    with redirect_stdout(io.StringIO()):
        evaluated = zoo_eval.main(args)
    assert 0.0 <= evaluated["top_1_accuracy"] <= evaluated["top_5_accuracy"] <= 1.0
    assert_exports_match(["--config", str(CONFIGS / recipe), "--device_target", "CPU", "--mode", mode,
                          *extra, "--checkpoint_file_path", str(ckpt_dir / epoch2)], tmp_path, classes=10)
    if recipe == "resnet50_imagenet_boost_o1.yaml":
        check_extension(cache_dir, stopped, recipe, mode, extra, monkeypatch)
        # a LessBN checkpoint given to the plain recipe: the error names the recipe it needs
        plain = ["--config", str(CONFIGS / "resnet50_imagenet_momentum.yaml"), *args[2:]]
        with pytest.raises(ValueError, match=r"written by recipe 'resnet50_imagenet_boost_o1'.*LessBN.*"
                                             r"--config .*resnet50_imagenet_boost_o1.yaml"):
            zoo_eval.main(plain)
        with pytest.raises(ValueError, match="written by recipe 'resnet50_imagenet_boost_o1'"):
            run("resnet50_imagenet_momentum.yaml", small(cache_dir, tmp_path / "x", mode) + ["--resume", str(stopped)])
        # steps_per_epoch fixed: another batch size gives the same step counts but not the same images
        with pytest.raises(ValueError, match=r"batch_size 8, this run has 4 .*give --batch_size 8"):
            run(recipe, small(cache_dir, tmp_path / "y", mode) + extra + ["--resume", str(stopped),
                                                                         "--batch_size", "4"])


# the O2 resume under msrun: tests/test_zoo_journey_inputs.py (xdist balance between the two files)

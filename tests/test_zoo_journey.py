"""A user's journey through the model zoo: train every recipe, stop, resume exactly, evaluate and export its
checkpoint, watch the metrics, and feed bad input (diverging lr, a truncated JPEG, a broken recipe file).

Runs are a width-4 ResNet-18 on 16x16 images with 2 steps per epoch, in-process through ``train.py``'s
``main`` (one case runs ``train.py`` as a script for its exit status).
"""
from __future__ import annotations

import io
import json
import shutil
from contextlib import redirect_stdout
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from model_zoo.resnet import eval as zoo_eval
from model_zoo.resnet import export as zoo_export
from model_zoo.resnet import train as zoo_train
from model_zoo.resnet.src.metrics import read_metrics
from model_zoo.resnet.src.run_state import read_manifest

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "model_zoo" / "resnet" / "configs"
SPE = 2  # steps per epoch


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("journey_cache")


def small(cache_dir: Path, out: Path, mode: str = "pynative", epochs: int = 2) -> list:
    """Overrides shrinking any recipe to a width-4 ResNet-18 on 16x16 images, SPE steps per epoch."""
    return ["--device_target", "CPU", "--mode", mode, "--net_name", "resnet18", "--base_width", "4",
            "--class_num", "10", "--batch_size", "8", "--eval_batch_size", "10", "--train_image_size", "16",
            "--eval_image_size", "16", "--steps_per_epoch", str(SPE), "--epoch_size", str(epochs),
            "--synthetic.cache_dir", str(cache_dir), "--synthetic.image_size", "16",
            "--synthetic.train_per_class", "4", "--synthetic.val_per_class", "1", "--num_parallel_workers", "1",
            "--output_path", str(out), "--log_interval", "1", "--run_eval", "false", "--warmup_epochs", "0",
            "--lr_max", "0.05", "--save_checkpoint_epochs", "1", "--save_checkpoint_steps", "0",
            "--eval_before_train", "false", "--save_checkpoint", "true"]


def run(recipe: str, args: list) -> dict:
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


# (recipe, mode, extra overrides): every recipe, both modes across the matrix (one mode per recipe keeps the
# suite short; each pair was also run in the other mode when this was written, see docs/model_zoo.md)
STAGE1 = "resnet50_imagenet_dim_reduce_stage1.yaml"
CASES = [
    ("resnet18_synthetic_quickstart.yaml", "graph", []),
    ("resnet50_imagenet_momentum.yaml", "graph", []),
    ("resnet50_imagenet_boost_o1.yaml", "pynative", []),
    ("resnet50_imagenet_boost_o2_adasum.yaml", "pynative", ["--boost_config_dict.common.device_number", "1"]),
    ("resnet50_imagenet_thor.yaml", "pynative", ["--thor.frequency", "2", "--steps_per_epoch", "1"]),  # slow: 1/epoch
    (STAGE1, "graph", ["--pca_checkpoint_steps", "1"]),
    ("resnet50_imagenet_dim_reduce_stage2.yaml", "pynative", ["--boost_config_dict.common.device_num", "1",
                                                              "--boost_config_dict.dim_reduce.n_component", "3"]),
]


@pytest.fixture(scope="module")
def stage1_run(cache_dir, tmp_path_factory) -> Path:
    """Dimension-reduce stage 1 (graph mode), its full and weight-only checkpoints (stage 2 starts from them)."""
    out = tmp_path_factory.mktemp("stage1")
    recipe, mode, extra = CASES[5]
    run(recipe, small(cache_dir, out / "straight", mode) + extra)
    return out


@pytest.mark.parametrize("recipe,mode,extra", CASES, ids=[f"{c[0].split('.')[0]}-{c[1]}" for c in CASES])
def test_recipe_resumes_exactly_and_its_checkpoint_evaluates_and_exports(cache_dir, stage1_run, tmp_path, recipe,
                                                                         mode, extra):
    if recipe == STAGE1:
        out = stage1_run  # trained by the fixture with this very case's settings
    else:
        out = tmp_path
        if "dim_reduce_stage2" in recipe:
            extra = extra + ["--pretrained", str(stage1_run / "straight" / "checkpoint_stage_1" / "resnet-2_2.ckpt"),
                             "--boost_config_dict.dim_reduce.weight_load_dir",
                             str(stage1_run / "straight" / "checkpoint_stage_1" / "checkpoint_pca")]
        run(recipe, small(cache_dir, out / "straight", mode) + extra)
    spe = int(extra[extra.index("--steps_per_epoch") + 1]) if "--steps_per_epoch" in extra else SPE
    straight = out / "straight"
    ckpt_dir = next(p for p in straight.iterdir() if p.is_dir() and p.name.startswith("checkpoint"))
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

    # the recipe's own checkpoint evaluates and exports
    args = ["--config", str(CONFIGS / recipe), *small(cache_dir, tmp_path / "eval", mode), *extra,
            "--checkpoint_file_path", str(ckpt_dir / epoch2)]
    with redirect_stdout(io.StringIO()):
        evaluated = zoo_eval.main(args)
        exported = zoo_export.main(args + ["--export_file_name", str(tmp_path / "net")])
    assert 0.0 <= evaluated["top_1_accuracy"] <= evaluated["top_5_accuracy"] <= 1.0
    graph = nn.GraphCell(ms.load(str(exported)))
    assert graph(ms.Tensor(np.zeros((1, 3, 16, 16), np.float32))).shape == (1, 10)
    if recipe == "resnet50_imagenet_boost_o1.yaml":
        # a LessBN checkpoint given to the plain recipe: the error names the recipe it needs
        plain = ["--config", str(CONFIGS / "resnet50_imagenet_momentum.yaml"), *args[2:]]
        with pytest.raises(ValueError, match=r"written by recipe 'resnet50_imagenet_boost_o1'.*LessBN.*"
                                             r"--config .*resnet50_imagenet_boost_o1.yaml"):
            zoo_eval.main(plain)
        with pytest.raises(ValueError, match="written by recipe 'resnet50_imagenet_boost_o1'"):
            run("resnet50_imagenet_momentum.yaml", small(cache_dir, tmp_path / "x", mode) + ["--resume", str(stopped)])


@pytest.mark.msrun
def test_o2_resume_under_msrun_two_workers_is_exact(cache_dir, tmp_path):
    """O2 (AdaSum between two one-rank servers) under msrun: epoch 1 + resume == 2 epochs, on both ranks."""
    from tests.helpers.msrun import run_msrun

    worker = Path(__file__).parent / "workers" / "zoo_train.py"
    base = ["--config", str(CONFIGS / "resnet50_imagenet_boost_o2_adasum.yaml"), "--run_distribute", "true",
            "--boost_config_dict.common.device_number", "1"]
    with redirect_stdout(io.StringIO()):  # render the data set once, before two ranks race for it
        run("resnet50_imagenet_momentum.yaml", small(cache_dir, tmp_path / "warm", epochs=1) +
            ["--save_checkpoint", "false", "--steps_per_epoch", "1"])
    straight = run_msrun(worker, 2, args=[json.dumps(base + small(cache_dir, tmp_path / "straight"))])
    stopped = tmp_path / "stopped" / "checkpoint"
    (stopped / "rank_1").mkdir(parents=True)
    shutil.copy(tmp_path / "straight" / "checkpoint" / "resnet-1_2.ckpt", stopped)
    # rank 1's own state: under AdaSum each server's momentum follows its own gradients
    shutil.copy(tmp_path / "straight" / "checkpoint" / "rank_1" / "resnet-1_2.ckpt", stopped / "rank_1")
    moments = [k for k in state(stopped / "resnet-1_2.ckpt") if k.startswith("moments.")]
    assert moments and any(not np.array_equal(state(stopped / "resnet-1_2.ckpt")[k],
                                              state(stopped / "rank_1" / "resnet-1_2.ckpt")[k]) for k in moments)
    resumed = run_msrun(worker, 2, args=[json.dumps(base + small(cache_dir, tmp_path / "stopped") +
                                                    ["--resume", str(tmp_path / "stopped")])])
    assert [int(r["initial_epoch"]) for r in resumed] == [1, 1]
    for rank in (0, 1):
        np.testing.assert_array_equal(straight[rank]["losses"][SPE:], resumed[rank]["losses"])
        names = sorted(set(straight[rank]) - {"losses", "initial_epoch"})
        assert names == sorted(set(resumed[rank]) - {"losses", "initial_epoch"})
        assert any(name.startswith("adasum") for name in names), names[:10]
        for name in names:
            np.testing.assert_array_equal(straight[rank][name], resumed[rank][name], err_msg=f"rank {rank} {name}")
    assert_same_state(tmp_path / "straight" / "checkpoint" / "resnet-2_2.ckpt", stopped / "resnet-2_2.ckpt")

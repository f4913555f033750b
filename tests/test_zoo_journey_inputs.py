"""The journey's bad inputs and side roads (split from test_zoo_journey.py so pytest-xdist can run both files at
once): a mid-epoch resume, ``resume_data: fast``, a diverging run, the divergence guard, a truncated JPEG, the
metrics plot, the recipe loader's limits, and the O2 resume under a real msrun job. Same tiny runs as
test_zoo_journey.py.
"""
from __future__ import annotations

import io
import json
import runpy
import shutil
import sys
from contextlib import redirect_stdout
from pathlib import Path
from types import SimpleNamespace

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from model_zoo.resnet import plot_run
from model_zoo.resnet.src.config import MAX_NODES, load_yaml, parse_config
from model_zoo.resnet.src.data_check import check_images
from model_zoo.resnet.src.metrics import read_metrics
from model_zoo.resnet.src.run_state import MANIFEST_KEY, GuardedCheckpoint, read_manifest
from tests.test_zoo_journey import CONFIGS, ROOT, assert_same_state, run, small, state


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("journey_inputs_cache")


def test_resume_mid_epoch_is_exact_and_fast_data_mode_is_not(cache_dir, tmp_path):
    """The plain recipe (the data position does not depend on the recipe; each recipe's own state resumes exactly
    at an epoch boundary in tests/test_zoo_journey.py). The resumed epoch's record equals the straight run's; a new
    run into a folder holding a run's checkpoints is refused, or (``overwrite_output``) replaces them."""
    recipe = "resnet50_imagenet_momentum.yaml"
    run(recipe, small(cache_dir, tmp_path / "a") + ["--save_checkpoint_steps", "1", "--keep_checkpoint_max", "9"])
    middle = tmp_path / "a" / "checkpoint" / "resnet-2_1.ckpt"
    (tmp_path / "b").mkdir()  # the stopped run's metrics file (its records after step 3 are dropped on resume)
    shutil.copy(tmp_path / "a" / "metrics.jsonl", tmp_path / "b")
    resumed = run(recipe, small(cache_dir, tmp_path / "b") + ["--resume", str(middle), "--save_checkpoint_steps", "1"])
    assert len(resumed["losses"]) == 1 and "(global 4/4)" in resumed["stdout"]
    assert_same_state(tmp_path / "a" / "checkpoint" / "resnet-2_2.ckpt", tmp_path / "b" / "checkpoint" /
                      "resnet-2_2.ckpt")
    # the epoch-2 record averages both of its steps, the one before the resume included: as in the straight run
    epochs = [[{k: r[k] for k in ("epoch", "step", "loss", "steps")} for r in read_metrics(d) if r["kind"] == "epoch"]
              for d in (tmp_path / "a", tmp_path / "b")]
    assert epochs[0] == epochs[1] and [e["steps"] for e in epochs[0]] == [2, 2]
    # a new run (no --resume) into that folder is refused, naming the folder and the ways on
    with pytest.raises(ValueError, match=r"output_path='.*b' already holds a run: 1 checkpoint\(s\) in .*checkpoint' "
                                         r"\(resnet-2_2.ckpt\)\. Continue that run with --resume .*b, choose another "
                                         r"--output_path, or give --overwrite_output true"):
        run(recipe, small(cache_dir, tmp_path / "b"))
    assert [p.name for p in (tmp_path / "b" / "checkpoint").glob("*.ckpt")] == ["resnet-2_2.ckpt"]
    # --overwrite_output true: the old run's checkpoints are deleted, the metrics file starts anew
    run(recipe, small(cache_dir, tmp_path / "b", epochs=1) + ["--steps_per_epoch", "1", "--overwrite_output", "true"])
    assert [p.name for p in (tmp_path / "b" / "checkpoint").glob("*.ckpt")] == ["resnet-1_1.ckpt"]
    assert [(r["kind"], r["step"]) for r in read_metrics(tmp_path / "b")] == [("step", 1), ("epoch", 1)]
    # fast data recovery skips the pipeline instead of replaying it: other augmentations, other weights
    run(recipe, small(cache_dir, tmp_path / "c") + ["--resume", str(middle), "--resume_data", "fast",
                                                     "--summary_dir", str(tmp_path / "summary")])
    assert list((tmp_path / "summary" / "rank_0").glob("events.out.events.summary.*"))  # SummaryCollector on
    assert not (tmp_path / "summary" / "rank_0" / "ckpt_dir").exists()  # no unguarded landscape checkpoints
    with pytest.raises(AssertionError):
        assert_same_state(tmp_path / "a" / "checkpoint" / "resnet-2_2.ckpt",
                          tmp_path / "c" / "checkpoint" / "resnet-2_2.ckpt")
    with pytest.raises(ValueError, match="raise --epoch_size"):
        run(recipe, small(cache_dir, tmp_path / "d") + ["--resume", str(tmp_path / "a")])
    with pytest.raises(ValueError, match="neither a checkpoint file nor a run folder"):
        run(recipe, small(cache_dir, tmp_path / "d") + ["--resume", str(tmp_path / "missing")])


def test_diverging_run_exits_1_naming_step_and_parameter_and_keeps_only_finite_checkpoints(cache_dir, tmp_path,
                                                                                          monkeypatch, capsys):
    """lr_max 300 without loss scaling: weights and BatchNorm statistics turn non-finite. (With a loss scale
    those steps are overflow steps and are skipped whole: tests/test_overflow_step.py.)

    ``train.py`` runs as ``__main__`` (its exit status and stderr line), in this process (``runpy``: the script's
    own code, without a second interpreter importing MindSpore)."""
    args = small(cache_dir, tmp_path, epochs=4) + ["--lr_max", "300", "--save_checkpoint_steps", "1",
                                                     "--keep_checkpoint_max", "3", "--amp_level", "O0",
                                                     "--loss_scale_type", "none"]
    script = ROOT / "model_zoo" / "resnet" / "train.py"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script puts the repository first; restored after
    monkeypatch.setattr(sys, "argv", [str(script), "--config", str(CONFIGS / "resnet50_imagenet_momentum.yaml"),
                                      *args])
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr()
    assert exited.value.code == 1, out.out[-2000:] + out.err[-2000:]
    message = out.err.strip().splitlines()[-1]
    assert message.startswith("train.py: error: training diverged: at step ")
    assert "non-finite values: first " in message and "last good checkpoint is" in message
    step = int(message.split("at step ")[1].split(" ")[0])
    files = sorted((tmp_path / "checkpoint").glob("*.ckpt"), key=lambda p: p.stat().st_mtime)
    assert 1 <= len(files) <= 3
    assert str(files[-1]) in message  # the newest file is the last good one
    assert read_manifest(files[-1])["global_step"] == step - 1
    for path in files:
        for name, value in state(path).items():
            assert np.isfinite(value).all(), (path.name, name)


class _Params(SimpleNamespace):
    pass


class _Context:
    def __init__(self, params):
        self.params, self.stopped = params, False

    def original_args(self):
        return self.params

    def request_stop(self):
        self.stopped = True


def test_guard_names_first_non_finite_statistic_writes_nothing_and_never_rotates_out_last_good(tmp_path):
    net = nn.SequentialCell([nn.Dense(3, 4), nn.BatchNorm1d(4)])
    guard = GuardedCheckpoint(None, str(tmp_path), "resnet", save_steps=1, keep_max=2, check_steps=0,
                              steps_per_epoch=2, manifest={"recipe": "r"})
    params = _Params(train_network=net, cur_step_num=0)
    context = _Context(params)
    for step in (1, 2, 3):
        params.cur_step_num = step
        guard.on_train_step_end(context)
    assert sorted(p.name for p in tmp_path.glob("*.ckpt")) == ["resnet-1_2.ckpt", "resnet-2_1.ckpt"]  # rotated
    assert json.loads(ms.load_checkpoint(str(tmp_path / "resnet-2_1.ckpt"))[MANIFEST_KEY])["global_step"] == 3
    stat = next(p for p in net.get_parameters() if p.name.endswith("moving_variance"))
    value = stat.asnumpy()
    value[2] = np.inf
    stat.set_data(ms.Tensor(value))
    params.cur_step_num = 4
    guard.on_train_step_end(context)
    assert context.stopped
    assert "at step 4 (epoch 2, step 2)" in guard.failure and f"first {stat.name} (1 of 4" in guard.failure
    assert "resnet-2_1.ckpt" in guard.failure
    assert sorted(p.name for p in tmp_path.glob("*.ckpt")) == ["resnet-1_2.ckpt", "resnet-2_1.ckpt"]
    assert not list(tmp_path.glob(".*"))  # no temporary file left


def test_nan_loss_saves_nothing_at_or_after_the_failed_step_and_names_a_checkpoint_to_resume(tmp_path):
    """The loss of step s comes from the weights saved at step s - 1: that file repeats the NaN when resumed."""
    net = nn.SequentialCell([nn.Dense(3, 4), nn.BatchNorm1d(4)])
    nan, one = ms.Tensor(np.float32("nan")), ms.Tensor(np.float32(1.0))
    # checkpoints at epoch ends (3 steps); the loss turns NaN at step 2: nothing to resume from
    guard = GuardedCheckpoint(None, str(tmp_path / "a"), "resnet", save_steps=3, keep_max=5, check_steps=0,
                              steps_per_epoch=3, manifest={"recipe": "r"})
    params = _Params(train_network=net, cur_step_num=1, net_outputs=(one, ms.Tensor(False), one))
    context = _Context(params)
    guard.on_train_step_end(context)
    params.cur_step_num, params.net_outputs = 2, (nan, ms.Tensor(False), one)
    guard.on_train_step_end(context)
    guard.on_train_end(context)  # training stops after the failed step: the end must not save it
    assert context.stopped and not list((tmp_path / "a").iterdir())
    assert "at step 2 (epoch 1, step 2) loss is nan. Nothing was saved at or after this step" in guard.failure
    assert "no checkpoint was written before it, so --resume has nothing to continue from" in guard.failure
    assert guard.last_good is None
    # a checkpoint every step: the step-2 file produced the NaN of step 3, the step-1 file is the one to resume
    guard = GuardedCheckpoint(None, str(tmp_path / "b"), "resnet", save_steps=1, keep_max=5, check_steps=0,
                              steps_per_epoch=3, manifest={"recipe": "r"})
    context = _Context(params)
    for step, loss in ((1, one), (2, one), (3, nan)):
        params.cur_step_num, params.net_outputs = step, (loss, ms.Tensor(False), one)
        guard.on_train_step_end(context)
    guard.on_train_end(context)
    assert sorted(p.name for p in (tmp_path / "b").glob("*.ckpt")) == ["resnet-1_1.ckpt", "resnet-1_2.ckpt"]
    assert f"the newest checkpoint {str(tmp_path / 'b' / 'resnet-1_2.ckpt')!r} (step 2) holds the weights that " \
           f"gave this loss" in guard.failure
    assert f"the last good checkpoint is {str(tmp_path / 'b' / 'resnet-1_1.ckpt')!r}" in guard.failure
    # resumed at step 2 in a folder also holding a later step's file (an abandoned continuation): never "good"
    later = GuardedCheckpoint(None, str(tmp_path / "b"), "resnet", save_steps=0, keep_max=5, check_steps=0,
                              steps_per_epoch=3, step_offset=1, manifest={"recipe": "r"})
    assert later.last_good == tmp_path / "b" / "resnet-1_1.ckpt"


def test_truncated_jpeg_is_listed_before_training(cache_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("MS_BOOST_CACHE", str(tmp_path / "stamps"))
    with redirect_stdout(io.StringIO()):
        run("resnet50_imagenet_momentum.yaml", small(cache_dir, tmp_path / "warm", epochs=1) +
            ["--save_checkpoint", "false", "--steps_per_epoch", "1"])  # renders the set; its check passes
    source = next(p for p in cache_dir.iterdir() if p.is_dir())
    root = tmp_path / "data"
    shutil.copytree(source, root)
    assert check_images(root / "train", "auto") == 40
    assert check_images(root / "train", "auto") is None  # remembered: same file list
    victim = sorted((root / "train").rglob("*.jpg"))[7] if list((root / "train").rglob("*.jpg")) else \
        sorted((root / "train").rglob("*.JPEG"))[7]
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=rf"1 of 40 images under .*cannot be decoded.*\n  {victim}: "):
        run("resnet50_imagenet_momentum.yaml", small(cache_dir, tmp_path / "bad", epochs=1) +
            ["--data_path", str(root)])
    with pytest.raises(ValueError, match="check_data='sometimes' is not allowed"):
        check_images(root / "train", "sometimes")
    assert check_images(root / "train", "never") is None


def test_metrics_file_and_plot_render_png(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    records = [{"kind": "step", "step": s, "epoch": (s - 1) // 2 + 1, "loss": 2.3 - 0.1 * s, "lr": 0.1 / s,
                "loss_scale": 1024.0, "step_time": 0.2} for s in range(1, 5)]
    records += [{"kind": "epoch", "epoch": 1, "step": 2, "loss": 2.15, "epoch_time": 0.4},
                {"kind": "eval", "epoch": 2, "step": 4, "top_1_accuracy": 0.3, "top_5_accuracy": 0.7}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"kind": "step", "step": 1, "loss": 2.0, "lr": 0.1, "loss_scale": None}) + "\n")
    out = tmp_path / "plots" / "curves.png"
    with redirect_stdout(io.StringIO()):
        assert plot_run.main([str(run_dir), str(other), "-o", str(out), "--labels", "a,b"]) == out
    png = out.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    from PIL import Image

    with Image.open(out) as image:
        pixels = np.asarray(image.convert("L"))
    assert pixels.std() > 10  # something was drawn
    with pytest.raises(ValueError, match="does not exist"):
        plot_run.plot_runs([str(tmp_path / "nothing")], str(out))
    with pytest.raises(SystemExit):
        plot_run.main([str(tmp_path / "nothing"), "-o", str(out)])


def test_plot_labels_of_another_count_name_the_option_and_the_runs(tmp_path, capsys):
    """--labels a for two runs said 'plot_run: error: plot_run: 1 labels for 2 runs.' (the prefix twice, no option
    name); now the option, the names and the runs are named."""
    with pytest.raises(SystemExit) as exited:
        plot_run.main(["r1", "r2", "-o", str(tmp_path / "x.png"), "--labels", "a"])
    assert exited.value.code == 1
    assert capsys.readouterr().err == ("plot_run: error: --labels gives 1 name(s) ['a'] for 2 run(s) ['r1', 'r2']; "
                                       "give one name per run, comma-separated.\n")


def test_plot_without_matplotlib_names_the_extra(tmp_path, monkeypatch):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"kind": "step", "step": 1, "loss": 1.0}) + "\n")
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"pip install ms_boost\[bench\]"):
        plot_run.plot_runs([str(tmp_path)], str(tmp_path / "x.png"))


def test_recipe_loader_rejects_duplicates_bad_utf8_and_alias_bombs(tmp_path):
    dup = tmp_path / "dup.yaml"
    dup.write_text("lr: 0.1\nsection:\n  a: 1\n  b: 2\n  a: 3\n")
    with pytest.raises(ValueError, match=r"dup.yaml.*key 'a' is given twice in one mapping \(lines 3 and 5\)"):
        load_yaml(dup)
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(ValueError, match=r"latin1.yaml.*not valid UTF-8 \(byte 9"):
        load_yaml(bad)
    bomb = tmp_path / "bomb.yaml"
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, "
              f"*a{i - 1}, *a{i - 1}, *a{i - 1}]" for i in range(1, 8)]
    bomb.write_text("\n".join(lines) + "\n")
    assert bomb.stat().st_size < 600
    with pytest.raises(ValueError, match=f"more than {MAX_NODES} values") as err:
        load_yaml(bomb)
    assert len(str(err.value)) < 400
    base = tmp_path / "base.yaml"
    base.write_text("base: [" + ", ".join(["1"] * 5000) + "]\n")
    with pytest.raises(ValueError, match="'base' must be a file name") as err:
        load_yaml(base)
    assert len(str(err.value)) < 400
    ok = tmp_path / "ok.yaml"
    ok.write_text("lr: 0.1\n")
    with pytest.raises(ValueError, match="expected a float") as err:
        parse_config(["--lr", "x" * 100_000], ok)
    assert len(str(err.value)) < 400


# the O2 resume under a real msrun job, started by the CPU launcher: tests/test_scripts.py

"""``divergence_action: rollback`` in the model zoo: a run whose learning rate spikes at a known step heals itself
(one log line, one metrics record, no checkpoint of the abandoned steps or with NaN/Inf on disk) and ends in the
clean run's band, in PyNative and Graph mode; a run that keeps diverging gives up with the guard's message; bad
``divergence_*`` values are refused naming the key. The same width-4 ResNet-10 on 16x16 images as
tests/test_zoo_journey.py. The callback itself (numpy reference of the spike rule, restored state, ranks that
roll back together) is tested in tests/test_divergence.py.
"""
from __future__ import annotations

import io
import math
from contextlib import redirect_stdout
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest

from model_zoo.resnet import train as zoo_train
from model_zoo.resnet.src import trainer
from model_zoo.resnet.src.metrics import read_metrics
from model_zoo.resnet.src.run_state import checkpoint_step

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "model_zoo" / "resnet" / "configs" / "resnet50_imagenet_momentum.yaml"
SPE, EPOCHS, SPIKE = 4, 2, 5  # the learning rate of global step 5 is multiplied by 1e4


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("heal_cache")


def args(cache_dir: Path, out: Path, mode: str, *extra: str) -> list:
    return ["--config", str(RECIPE), "--device_target", "CPU", "--mode", mode, "--net_name", "resnet10",
            "--base_width", "4", "--class_num", "10", "--batch_size", "8", "--eval_batch_size", "10",
            "--train_image_size", "16", "--eval_image_size", "16", "--steps_per_epoch", str(SPE),
            "--epoch_size", str(EPOCHS), "--synthetic.cache_dir", str(cache_dir), "--synthetic.image_size", "16",
            "--synthetic.train_per_class", "4", "--synthetic.val_per_class", "2", "--num_parallel_workers", "1",
            "--output_path", str(out), "--log_interval", "1", "--run_eval", "true", "--warmup_epochs", "0",
            "--lr_max", "0.05", "--save_checkpoint", "true", "--save_checkpoint_steps", "1",
            "--keep_checkpoint_max", "20", "--eval_before_train", "false", "--divergence_action", "rollback",
            "--divergence_window", "3", "--divergence_snapshot_steps", "2", "--divergence_max_rollbacks", "2",
            *extra]


def run(argv: list, monkeypatch, spikes=(), multiplier: float = 1e4) -> dict:
    """train.py's main with the recipe's learning rate multiplied at the given global steps (1-based)."""
    real = trainer.learning_rate

    def spiked(cfg, steps_per_epoch):
        lr = np.array(real(cfg, steps_per_epoch), np.float32)
        for step in spikes:
            lr[step - 1] *= multiplier
        return lr

    monkeypatch.setattr(trainer, "learning_rate", spiked)
    buffer = io.StringIO()
    with redirect_stdout(buffer):
        try:
            results = zoo_train.main(argv)
        except trainer.TrainingDiverged as err:
            results = {"error": str(err)}
    results["stdout"] = buffer.getvalue()
    return results


def checkpoints(out: Path) -> dict:
    """Global step -> every array of that checkpoint."""
    found = {}
    for path in (out / "checkpoint").glob("resnet-*.ckpt"):
        found[checkpoint_step(path, SPE)] = {k: v.asnumpy() for k, v in ms.load_checkpoint(str(path)).items()
                                             if not isinstance(v, str)}
    return found


@pytest.fixture(scope="module")
def clean_run(cache_dir, tmp_path_factory) -> tuple:
    """The clean run (no spike), trained once in PyNative mode: the band both modes' healed runs are held to.

    Its folder and results. Measured before sharing it (2026-11-28): the Graph-mode clean run gives the same learning
    rates bit for bit, the same accuracy after training and losses within 0.2% of PyNative's at every step, against
    the band's 50% (loss) and 0.25 (accuracy); a Graph-mode clean run cost ~4.7 CPU-s (its own train and eval
    compiles). That no divergence line appears where none is due is checked in each mode by the healed run itself:
    exactly one line, at the spike's step (a line at any other step fails it).
    """
    out = tmp_path_factory.mktemp("heal_clean") / "clean"
    with pytest.MonkeyPatch.context() as monkeypatch:
        clean = run(args(cache_dir, out, "pynative"), monkeypatch)
    assert not any(line.startswith("divergence:") for line in clean["stdout"].splitlines())
    return out, clean


@pytest.mark.parametrize("mode", ["pynative", pytest.param("graph", marks=pytest.mark.slow)])
def test_lr_spike_rolls_back_once_and_ends_in_the_clean_runs_band(cache_dir, clean_run, tmp_path, monkeypatch, mode):
    clean_dir, clean = clean_run
    healed = run(args(cache_dir, tmp_path / "healed", mode), monkeypatch, spikes=[SPIKE])
    assert "error" not in healed, healed.get("error")
    # the huge update of step 5 shows in step 6's loss; snapshots at every save (every step here), the one of
    # step 5 is not confirmed: back to step 4, the batches of steps 5-6 skipped, lr halved from step 7 on
    lines = [line for line in healed["stdout"].splitlines() if line.startswith("divergence:")]
    assert len(lines) == 1 and lines[0].startswith(f"divergence: step {SPIKE + 1}: loss ")
    assert f"rolled back to the state of step {SPIKE - 1} (rollback 1/2), learning rate x 0.5" in lines[0]
    records = read_metrics(tmp_path / "healed")
    rollbacks = [r for r in records if r["kind"] == "rollback"]
    assert [(r["step"], r["restored_step"], r["skipped_steps"]) for r in rollbacks] == [(SPIKE + 1, SPIKE - 1, 2)]
    lrs = {r["step"]: r["lr"] for r in records if r["kind"] == "step"}
    clean_lrs = {r["step"]: r["lr"] for r in read_metrics(clean_dir) if r["kind"] == "step"}
    assert lrs[SPIKE + 2] == pytest.approx(clean_lrs[SPIKE + 2] * 0.5, rel=1e-5)
    # on disk: every checkpoint finite, none of the abandoned step 5 (deleted) or of the rolled-back step 6
    saved = checkpoints(tmp_path / "healed")
    assert sorted(saved) == [s for s in range(1, SPE * EPOCHS + 1) if s not in (SPIKE, SPIKE + 1)]
    assert all(np.isfinite(v).all() for state in saved.values() for v in state.values())
    # the healed run ends where the clean one does: loss of the last two steps and accuracy in its band
    last = [r["loss"] for r in records if r["kind"] == "step" and r["step"] > SPE * EPOCHS - 2]
    clean_last = [r["loss"] for r in read_metrics(clean_dir) if r["kind"] == "step"
                  and r["step"] > SPE * EPOCHS - 2]
    assert all(math.isfinite(v) for v in last) and np.mean(last) <= 1.5 * np.mean(clean_last)
    assert abs(healed["after"]["top_1_accuracy"] - clean["after"]["top_1_accuracy"]) <= 0.25


def test_a_run_that_keeps_diverging_gives_up_with_the_guards_message(cache_dir, tmp_path, monkeypatch):
    out = tmp_path / "run"
    spikes = range(SPIKE, SPE * EPOCHS + 1)  # every step from 5 on
    result = run(args(cache_dir, out, "pynative", "--divergence_max_rollbacks", "1"), monkeypatch, spikes, 1e30)
    message = result["error"]
    assert message.startswith("training diverged: at step ") and "Nothing was saved at or after this step" in message
    assert "the last good checkpoint is" in message and message.count("divergence:") == 0
    assert sum(line.startswith("divergence:") for line in result["stdout"].splitlines()) == 1
    assert all(np.isfinite(v).all() for state in checkpoints(out).values() for v in state.values())
    assert [r["kind"] for r in read_metrics(out)].count("rollback") == 1


@pytest.mark.parametrize("key,value,allowed", [
    ("divergence_action", "retry", "stop, rollback"),
    ("divergence_spike_factor", "0.5", "a float > 1, or 0 to turn spike detection off"),
    ("divergence_window", "0", "an int >= 1"),
    ("divergence_lr_factor", "2.0", "a float in (0, 1]"),
    ("divergence_damping_factor", "0.1", "a float >= 1"),
    ("divergence_snapshot_steps", "0", "an int >= 1"),
    ("divergence_max_rollbacks", "-2", "an int >= 0"),
])
def test_bad_divergence_values_are_refused_before_anything_is_built(tmp_path, key, value, allowed):
    from model_zoo.resnet.src.config import parse_config

    cfg = parse_config(["--config", str(RECIPE), f"--{key}", value], RECIPE)
    with pytest.raises(ValueError) as err:
        trainer.train(cfg.replace(output_path=str(tmp_path)))
    assert str(err.value).startswith(f"{key}=") and f"is not allowed; allowed: {allowed}" in str(err.value)

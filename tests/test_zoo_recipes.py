"""The baseline recipe's eval / export / checkpoint checks, its step against MindSpore's ``Model``, and the
main job (every recipe's own training run lives in tests/test_zoo_journey.py).

The recipes run through ``train.py``'s own code path (config file + ``--key value`` overrides), shrunk to a
width-4 ResNet-10 on 16x16 images, two steps each.
"""
from __future__ import annotations

import io
import re
from contextlib import redirect_stdout
from pathlib import Path

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
import pytest
from mindspore import nn
from mindspore.train import FixedLossScaleManager
from mindspore.train import Model as MsModel

from model_zoo.resnet import eval as zoo_eval
from model_zoo.resnet import export as zoo_export
from model_zoo.resnet import main_job
from model_zoo.resnet import train as zoo_train
from model_zoo.resnet.src import trainer
from model_zoo.resnet.src.config import parse_config

CONFIGS = Path(__file__).resolve().parents[1] / "model_zoo" / "resnet" / "configs"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("zoo_cache")


def small(cache_dir: Path, out: Path, mode: str = "pynative", steps: int = 2) -> list:
    """Overrides shrinking any recipe to a width-4 ResNet-10 on 16x16 images, ``steps`` steps."""
    return ["--device_target", "CPU", "--mode", mode, "--net_name", "resnet10", "--base_width", "4",
            "--class_num", "10", "--batch_size", "8", "--eval_batch_size", "10", "--train_image_size", "16",
            "--eval_image_size", "16", "--steps_per_epoch", str(steps), "--epoch_size", "1",
            "--synthetic.cache_dir", str(cache_dir), "--synthetic.image_size", "16",
            "--synthetic.train_per_class", "4", "--synthetic.val_per_class", "1", "--num_parallel_workers", "1",
            "--output_path", str(out), "--log_interval", "1", "--run_eval", "false", "--warmup_epochs", "0",
            "--lr_max", "0.05"]


def run_recipe(name: str, extra: list) -> dict:
    buffer = io.StringIO()
    with redirect_stdout(buffer):
        results = zoo_train.main(["--config", str(CONFIGS / name), *extra])
    results["stdout"] = buffer.getvalue()
    return results


# Each recipe's own run (momentum, boost O1, boost O2 AdaSum, THOR, dimension-reduce stage 1 then stage 2) is
# trained once in tests/test_zoo_journey.py::test_recipe_resumes_exactly_and_its_checkpoint_evaluates_and_exports,
# which checks there what this file's per-recipe tests checked (finite losses and the progress line, the recipe's
# boost pieces, rank-0 checkpoint contents, the stage-1 weight-only checkpoints, stage 2's PCA matrix), plus
# resume, eval and export. O1's chain in both modes: tests/test_o1_o2.py::test_boost_level_trains_small_resnet
# (PyNative O1; Graph O2, whose one-process chain holds O1's).


@pytest.fixture(scope="module")
def trained(cache_dir, tmp_path_factory) -> dict:
    """The baseline recipe trained 2 steps in fp32, evaluated by train.py, with its checkpoint."""
    out = tmp_path_factory.mktemp("trained")
    results = run_recipe("resnet50_imagenet_momentum.yaml",
                         small(cache_dir, out) + ["--save_checkpoint_steps", "2", "--amp_level", "O0",
                                                  "--run_eval", "true"])
    results["ckpt"] = Path(results["checkpoint_dir"]) / "resnet-1_2.ckpt"
    results["eval_args"] = ["--config", str(CONFIGS / "resnet50_imagenet_momentum.yaml"), *small(cache_dir, out),
                            "--checkpoint_file_path", str(results["ckpt"])]
    return results


def test_eval_prints_top1_top5_and_export_writes_mindir(trained, tmp_path, monkeypatch):
    buffer = io.StringIO()
    with redirect_stdout(buffer):
        evaluated = zoo_eval.main(trained["eval_args"])
    assert re.search(r"top-1 accuracy: \d\.\d{4}  top-5 accuracy: \d\.\d{4}", buffer.getvalue())
    assert 0.0 <= evaluated["top_1_accuracy"] <= evaluated["top_5_accuracy"] <= 1.0
    # the checkpoint holds the trained weights: the standalone eval reproduces train.py's own eval
    assert evaluated["top_1_accuracy"] == pytest.approx(trained["after"]["top_1_accuracy"])
    assert evaluated["top_5_accuracy"] == pytest.approx(trained["after"]["top_5_accuracy"])
    monkeypatch.chdir(tmp_path)
    with redirect_stdout(io.StringIO()):
        path = zoo_export.main(trained["eval_args"] + ["--export_file_name", str(tmp_path / "resnet_small")])
    assert path.suffix == ".mindir" and path.is_file() and path.stat().st_size > 1000
    graph = nn.GraphCell(ms.load(str(path)))
    assert graph(ms.Tensor(np.zeros((1, 3, 16, 16), np.float32))).shape == (1, 10)
    # ONNX too (the stem's max pool was MaxPool3DWithArgmax, which MindSpore cannot export to ONNX)
    with redirect_stdout(io.StringIO()):
        path = zoo_export.main(trained["eval_args"] + ["--export_file_name", str(tmp_path / "resnet_small"),
                                                       "--export_file_format", "ONNX"])
    assert path == tmp_path / "resnet_small.onnx" and path.is_file() and path.stat().st_size > 1000
    assert b"MaxPool" in path.read_bytes() and b"Conv" in path.read_bytes()


def test_eval_rejects_mismatched_checkpoint(trained, tmp_path):
    # a command-line shape that contradicts the checkpoint's manifest (tests/test_zoo_export.py has the others)
    with pytest.raises(ValueError, match=r"^--base_width 8 contradicts checkpoint .*: its run manifest \(recipe "
                                         r"'resnet50_imagenet_momentum'\) records base_width=4"):
        zoo_eval.main(trained["eval_args"] + ["--base_width", "8"])
    # a train checkpoint without the classifier: MindSpore alone would load the optimizer moment
    # "moments.fc.weight" in its place; the zoo refuses
    ms.save_checkpoint([{"name": k, "data": v} for k, v in ms.load_checkpoint(str(trained["ckpt"])).items()
                        if not k.startswith("fc.") and not isinstance(v, str)], str(tmp_path / "no_fc.ckpt"))
    with pytest.raises(ValueError, match=r"lacks 2 parameter\(s\).*fc.bias"):
        zoo_eval.main(trained["eval_args"] + ["--checkpoint_file_path", str(tmp_path / "no_fc.ckpt")])
    with pytest.raises(ValueError, match="does not exist"):
        zoo_eval.main(trained["eval_args"] + ["--checkpoint_file_path", str(tmp_path / "missing.ckpt")])


def test_o0_recipe_step_matches_mindspore_model(cache_dir, tmp_path):
    """The baseline recipe through ms_boost.Model(boost_level="O0") makes MindSpore's Model's exact step.

    Same network, optimizer (Momentum with loss_scale, FixedLossScaleManager(drop_overflow_update=False), as in
    the tutorials) and batch: the weights after one step must agree.
    """
    cfg = parse_config(small(cache_dir, tmp_path, "pynative") + ["--amp_level", "O0"],
                       CONFIGS / "resnet50_imagenet_momentum.yaml")
    trainer.setup_runtime(cfg)
    data = trainer.train_dataset(cfg, trainer.RunInfo(0, 1, "CPU"))
    batch = next(data.create_tuple_iterator(num_epochs=1))
    after = []
    for use_zoo in (True, False):
        one = ds.NumpySlicesDataset({"x": batch[0].asnumpy(), "y": batch[1].asnumpy()}, shuffle=False).batch(8)
        net = trainer.build_network(cfg)
        opt = trainer.build_optimizer(cfg, net, 2)
        if use_zoo:
            model = trainer.build_model(cfg, net, trainer.build_loss(cfg), opt, 2)
        else:
            model = MsModel(net, trainer.build_loss(cfg), opt, amp_level="O0",
                            loss_scale_manager=FixedLossScaleManager(cfg.loss_scale, drop_overflow_update=False))
        model.train(1, one, dataset_sink_mode=False)
        after.append({p.name: p.asnumpy() for p in net.trainable_params()})
    for name, value in after[1].items():
        np.testing.assert_allclose(after[0][name], value, rtol=1e-4, atol=1e-6, err_msg=name)


def test_main_job_short_run_prints_accuracy_before_and_after(cache_dir, tmp_path):
    buffer = io.StringIO()
    with redirect_stdout(buffer):
        results = main_job.main(small(cache_dir, tmp_path, "pynative") + ["--eval_before_train", "true",
                                                                        "--run_eval", "true"])
    text = buffer.getvalue()
    assert "accuracy before training: top-1" in text and "accuracy after training:  top-1" in text
    assert "wall time" in text
    assert results["model"].boost.level == "O1"
    for key in ("before", "after"):
        assert 0.0 <= results[key]["top_1_accuracy"] <= results[key]["top_5_accuracy"] <= 1.0

"""Exported models that run, and eval/export reading the network's shape from the checkpoint's run manifest.

One LessBN (boost O1) checkpoint of a width-4 ResNet-10 on 16x16 images, trained for 2 steps, serves every test
here: its MINDIR file loaded back with ``mindspore.load`` + ``nn.GraphCell`` and its ONNX file run by onnxruntime
give the MindSpore network's outputs to 1e-4, with no shape key on the command line; a contradicting one, AIR off
Ascend and an operator without an ONNX converter are clear errors. Every other recipe's checkpoint (O0, O2,
THOR, dimension reduce) gets the same export check in tests/test_zoo_journey.py, which trains each one.
"""
from __future__ import annotations

import io
import os
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from model_zoo.resnet import eval as zoo_eval
from model_zoo.resnet import export as zoo_export
from model_zoo.resnet import train as zoo_train
from model_zoo.resnet.src.config import command_line_keys, config_source, parse_config
from tests.helpers.exports import assert_exports_match

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "model_zoo" / "resnet" / "configs" / "resnet50_imagenet_boost_o1.yaml"  # resnet50 w64, 1001 classes


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp("export_run")
    data = ["--synthetic.cache_dir", str(out / "cache"), "--synthetic.image_size", "16",
            "--synthetic.train_per_class", "2", "--synthetic.val_per_class", "1", "--num_parallel_workers", "1"]
    with redirect_stdout(io.StringIO()):
        results = zoo_train.main(["--config", str(RECIPE), "--device_target", "CPU", "--mode", "pynative",
                                  "--net_name", "resnet10", "--base_width", "4", "--class_num", "10",
                                  "--batch_size", "8", "--train_image_size", "16", "--eval_image_size", "16",
                                  "--steps_per_epoch", "2", "--epoch_size", "1", "--output_path", str(out),
                                  "--run_eval", "false", "--warmup_epochs", "0", "--save_checkpoint_steps", "2",
                                  *data])
    return results["last_checkpoint"], data


def base_args(path) -> list:
    """What a user gives to export the checkpoint: the recipe and the file, no shape key."""
    return ["--config", str(RECIPE), "--device_target", "CPU", "--checkpoint_file_path", str(path)]


def test_mindir_and_onnx_give_the_networks_outputs_without_shape_keys(checkpoint, tmp_path):
    path, _ = checkpoint
    assert_exports_match(base_args(path), tmp_path, classes=10)


def test_eval_reads_the_shape_and_the_built_in_data_set_from_the_manifest_and_says_so(checkpoint, capsys):
    path, data = checkpoint
    result = zoo_eval.main(base_args(path) + ["--eval_batch_size", "10"])
    out = capsys.readouterr().out
    cache = data[data.index("--synthetic.cache_dir") + 1]
    assert (f"eval.py: from the checkpoint's run manifest: net_name='resnet10', base_width=4, class_num=10, "
            f"eval_image_size=16, synthetic.cache_dir={cache!r}, synthetic.image_size=16, "
            f"synthetic.train_per_class=2, synthetic.val_per_class=1") in out
    assert 0.0 <= result["top_1_accuracy"] <= result["top_5_accuracy"] <= 1.0
    # the eval split of the run's own set: 10 classes x 1 image, so top-1 is a multiple of 1/10
    assert round(result["top_1_accuracy"] * 10, 6) == int(round(result["top_1_accuracy"] * 10))
    # a data key given on the command line wins over the manifest's
    zoo_eval.main(base_args(path) + ["--eval_batch_size", "10", "--synthetic.val_per_class", "2"])
    assert "synthetic.val_per_class" not in capsys.readouterr().out


AGREEING = {"net_name": "resnet10", "base_width": "4", "class_num": "10"}  # the checkpoint's manifest


@pytest.fixture(scope="module")
def agreeing_export(checkpoint, tmp_path_factory) -> Path:
    """One export given every shape key with the manifest's own value (a refusal of any one would raise here, in
    each test using it): one MINDIR export instead of one per key, each ~1.8 CPU-s."""
    path, _ = checkpoint
    args = [arg for key, value in AGREEING.items() for arg in (f"--{key}", value)]
    with redirect_stdout(io.StringIO()):
        return zoo_export.main(base_args(path) + args + ["--export_file_name",
                                                         str(tmp_path_factory.mktemp("agreeing") / "net")])


def test_the_mindir_file_of_an_o1_checkpoint_holds_conv2d_operators_not_the_cpu_gemm_rewrite(agreeing_export):
    """The O1 plan's evaluation rewrite includes cpu_gemm_conv, which on CPU turned every ``nn.Conv2d`` into
    Im2Col + MatMul; export.py exported that graph to MINDIR although it promises ``Conv2D`` operators (a file
    that runs on any device). The exported MINDIR now holds one ``Conv2D`` per convolution and no ``Im2Col``."""
    blob = agreeing_export.read_bytes()
    assert b"Im2Col" not in blob
    assert b"Conv2D" in blob


@pytest.mark.parametrize("key,value,recorded", [("net_name", "resnet18", "'resnet10'"), ("base_width", "8", "4"),
                                                ("class_num", "1001", "10")])
def test_a_command_line_shape_that_contradicts_the_manifest_is_refused_naming_both(checkpoint, agreeing_export,
                                                                                  tmp_path, key, value, recorded):
    path, _ = checkpoint
    args = base_args(path) + [f"--{key}", value, "--export_file_name", str(tmp_path / "net")]
    with pytest.raises(ValueError) as err:
        zoo_export.main(args)
    message = str(err.value)
    assert message.startswith(f"--{key} ") and f"contradicts checkpoint {str(path)!r}" in message
    assert f"records {key}={recorded}" in message and "recipe 'resnet50_imagenet_boost_o1'" in message
    assert not (tmp_path / "net.mindir").exists()
    # the manifest's own value, given explicitly, is fine (the export given all three: ``agreeing_export``)
    assert key in AGREEING and agreeing_export.is_file() and agreeing_export.suffix == ".mindir"


def test_formats_that_cannot_hold_the_network_are_clear_errors(checkpoint, tmp_path, monkeypatch):
    path, _ = checkpoint
    args = base_args(path) + ["--export_file_name", str(tmp_path / "net")]
    with pytest.raises(ValueError, match=r"^export_file_format='AIR' cannot be written here: MindSpore writes AIR "
                                         r"only on an Ascend device, this process runs on CPU; export MINDIR"):
        zoo_export.main(args + ["--export_file_format", "AIR"])
    # without onnx_exportable the network holds operators without an ONNX converter: the stem's
    # MaxPool3DWithArgmax, and (O1 on CPU) Im2Col of the convolutions cpu_gemm_conv computes as GEMM
    monkeypatch.setattr(zoo_export, "onnx_exportable", lambda net: net)
    with pytest.raises(ValueError, match=r"^export_file_format='ONNX' cannot hold this network: MindSpore has no "
                                         r"ONNX converter for its operator (MaxPool3DWithArgmax|Im2Col); "
                                         r"export MINDIR"):
        zoo_export.main(args + ["--export_file_format", "ONNX"])
    assert not (tmp_path / "net.onnx").exists()
    with pytest.raises(ValueError, match=r"export_file_format='TFLITE' \(config .* or the command line\) is not "
                                         r"allowed; allowed \(any case\): MINDIR, AIR, ONNX"):
        zoo_export.main(args + ["--export_file_format", "TFLITE"])
    cfg = parse_config(args + ["--export_file_format", "onnx"], zoo_export.DEFAULT_CONFIG)  # any case
    assert cfg.export_file_format == "ONNX"


def test_command_line_keys_are_the_overrides_given():
    cfg = parse_config(["--config", str(RECIPE), "--net_name", "resnet18", "--synthetic.image_size=8",
                        "--run_eval"], RECIPE)
    assert command_line_keys(cfg) == {"net_name", "synthetic.image_size", "run_eval"}
    assert command_line_keys(cfg.replace(base_width=8)) == {"net_name", "synthetic.image_size", "run_eval"}
    assert command_line_keys(parse_config([], RECIPE)) == frozenset()


def test_without_config_eval_export_and_run_eval_take_the_recipe_the_checkpoint_names(checkpoint, tmp_path, capsys,
                                                                                      monkeypatch):
    """A user evaluates an O1 run's checkpoint giving only the file: the recipe comes from its run manifest (the
    Momentum default refused it, asking for --config). The launcher passes no --config then, and its override
    check reads the same recipe, so a key only that recipe has passes."""
    path, _ = checkpoint
    args = ["--device_target", "CPU", "--checkpoint_file_path", str(path)]
    result = zoo_eval.main(args + ["--eval_batch_size", "10"])
    said = ("no --config given: using the recipe the checkpoint was trained with (its run manifest): "
            f"{RECIPE}")
    assert f"eval.py: {said}" in capsys.readouterr().err
    assert 0.0 <= result["top_1_accuracy"] <= result["top_5_accuracy"] <= 1.0
    seen = {}
    monkeypatch.setattr(zoo_export, "export_checkpoint", lambda cfg, **_: seen.setdefault("cfg", cfg) and tmp_path)
    zoo_export.main(args)
    assert f"export.py: {said}" in capsys.readouterr().err
    assert Path(config_source(seen["cfg"])) == RECIPE and seen["cfg"].boost_level == "O1"
    # --config on the command line wins (here the Momentum recipe, which this checkpoint does not fit)
    with pytest.raises(ValueError, match="was written by recipe 'resnet50_imagenet_boost_o1'"):
        zoo_eval.main(args + ["--config", str(RECIPE.with_name("resnet50_imagenet_momentum.yaml"))])
    env = dict(os.environ, PYTHON=sys.executable, GLOG_v="3")
    env.pop("CONFIG_PATH", None)
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "run_eval.sh"), "synthetic", str(path), "--dry-run",
                           "--boost_config_dict.less_bn.fn_flag", "true"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    command = proc.stdout.strip().splitlines()[-1]
    assert "--config" not in command and f"--checkpoint_file_path {path}" in command
    # a bad override is the launcher's error alone (the check's note on the recipe it read had become its first line)
    bad = subprocess.run(["bash", str(ROOT / "scripts" / "run_eval.sh"), "synthetic", str(path), "--dry-run",
                          "--boost_level", "O7"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("error: bad override (train.py and eval.py would stop on it): "
                                                         "boost_level='O7'"), bad.stderr


def _as_momentum_run_tuned_to_o1(path: Path, out: Path) -> Path:
    """The fixture's checkpoint as the Momentum recipe run with ``--boost_level O1 --boost_config_dict.grad_freeze
    .freeze_p 0.5`` writes it: the same LessBN network, a manifest naming the Momentum recipe with that plan."""
    import json

    import mindspore as ms

    from model_zoo.resnet.src.run_state import MANIFEST_KEY
    entries = ms.load_checkpoint(str(path))
    manifest = json.loads(entries.pop(MANIFEST_KEY))
    momentum = RECIPE.with_name("resnet50_imagenet_momentum.yaml")
    manifest.update(recipe=momentum.stem, recipe_path=str(momentum))
    manifest["config"].update(boost_level="O1", boost_config_dict={"grad_freeze": {"freeze_p": 0.5}})
    ms.save_checkpoint([{"name": k, "data": v} for k, v in entries.items() if not isinstance(v, str)], str(out),
                       append_dict={MANIFEST_KEY: json.dumps(manifest)})
    return out


def test_without_config_the_boost_plan_and_the_built_in_set_are_the_runs_own(checkpoint, tmp_path, capsys):
    """Journeys, second round: the Momentum recipe tuned to O1 on the command line, then eval.py / export.py /
    run_eval.sh with only the checkpoint. The recipe came from the manifest but its plan from the file (O0), so every
    one of them refused the run's own checkpoint ('written by this recipe with another boost plan'). Now the plan is
    the manifest's too unless the command line sets it; and ``--data_path synthetic`` (what run_eval.sh passes)
    still takes the run's built-in set (its image size, split sizes), as no --data_path does."""
    from model_zoo.resnet.src.checkpoint_shape import with_checkpoint_shape

    path = _as_momentum_run_tuned_to_o1(checkpoint[0], tmp_path / "tuned.ckpt")
    args = ["--device_target", "CPU", "--checkpoint_file_path", str(path), "--eval_batch_size", "10",
            "--data_path", "synthetic"]
    result = zoo_eval.main(args)
    out = capsys.readouterr()
    assert "resnet50_imagenet_momentum.yaml" in out.err
    assert "boost_level='O1', boost_config_dict={'grad_freeze': {'freeze_p': 0.5}}" in out.out
    assert "synthetic.image_size=16" in out.out
    assert 0.0 <= result["top_1_accuracy"] <= result["top_5_accuracy"] <= 1.0
    cfg = parse_config(args, zoo_export.DEFAULT_CONFIG)
    taken = with_checkpoint_shape(cfg, plan=True)[0]
    assert taken.boost_level == "O1" and taken.boost_config_dict.to_dict() == {"grad_freeze": {"freeze_p": 0.5}}
    assert with_checkpoint_shape(cfg)[0].boost_level == "O0"  # --config given: the recipe's plan, as before
    # the command line sets the plan: it wins, and the refusal says how to get the run's own
    with pytest.raises(ValueError, match=r"another boost plan.*or give neither --config nor --boost_level"):
        zoo_eval.main(args + ["--boost_level", "O0"])


def test_a_run_folder_given_as_the_checkpoint_is_its_newest_checkpoint(checkpoint, tmp_path, capsys, monkeypatch):
    """``--checkpoint_file_path <run output folder>`` (as ``--resume`` takes one): eval/export use its newest
    ``<prefix>-<epoch>_<step>.ckpt`` and say which; a folder without one is an error naming where it looked."""
    path, _ = checkpoint
    run_folder = Path(path).parent.parent  # <output_path>/checkpoint/resnet-1_2.ckpt
    seen = {}
    monkeypatch.setattr(zoo_export, "export_checkpoint", lambda cfg, **_: seen.setdefault("cfg", cfg) and tmp_path)
    zoo_export.main(["--device_target", "CPU", "--checkpoint_file_path", str(run_folder)])
    assert Path(str(seen["cfg"].checkpoint_file_path)) == Path(path)
    err = capsys.readouterr().err
    assert f"export.py: checkpoint_file_path {str(run_folder)!r} is a run folder: exporting its newest" in err
    assert "using the recipe the checkpoint was trained with" in err  # the recipe from the newest one's manifest
    empty = tmp_path / "empty_run"
    empty.mkdir()
    with pytest.raises(ValueError, match=r"is a folder with no '<prefix>-<epoch>_<step>.ckpt' checkpoint in "):
        zoo_eval.main(["--device_target", "CPU", "--checkpoint_file_path", str(empty)])

"""A faulty checkpoint file (0 bytes, no parameter, truncated, foreign, none of the wanted names) through every
loading path of ms_boost and the model zoo: each error names the file and what is wrong with it (issue 30;
MindSpore alone says "The loaded parameter dict is empty after filter or specify" without the file's name).

Paths: ``ms_boost.checkpoint_file.read_checkpoint`` itself; DimReduce's stage-1 checkpoints (``weight_load_dir``
through ``compute_pca_matrix``, and ``infer_parameter_specs`` of the PCA command line); the zoo's
``--pretrained`` (``build_network``), ``eval.py`` and ``export.py`` (``--checkpoint_file_path``), ``--resume``
(``resume_state`` through ``restore_train_network``) and the manifest reader.
"""
from __future__ import annotations

import os
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest

from ms_boost.checkpoint_file import read_checkpoint

CONFIGS = Path(__file__).resolve().parents[1] / "model_zoo" / "resnet" / "configs"
SMALL = ["--device_target", "CPU", "--mode", "pynative", "--net_name", "resnet10", "--base_width", "4",
         "--class_num", "10", "--eval_image_size", "16", "--train_image_size", "16"]

#: fault -> what the message must say (after "<what> '<path>' ")
FAULTS = {
    "empty": r"is empty \(0 bytes\)",
    "no_parameter": r"holds no parameter \(35 bytes; only the non-tensor entries \['ms_boost_run'\]\)",
    "truncated": r"cannot be read \(\d+ bytes; truncated, corrupt, or not a MindSpore ckpt file\)",
    "foreign": r"cannot be read \(64 bytes; truncated, corrupt, or not a MindSpore ckpt file\)",
}


def write_fault(folder: Path, fault: str, name: str = "bad.ckpt") -> Path:
    """A checkpoint file with ``fault``: 0 bytes, a valid file holding no parameter (only a string entry: saving
    an empty list without one writes 0 bytes), the first half of a valid file, or bytes that are no checkpoint."""
    path = folder / name
    if fault == "empty":
        path.write_bytes(b"")
    elif fault == "no_parameter":
        ms.save_checkpoint([], str(path), append_dict={"ms_boost_run": "{}"})
    elif fault == "truncated":
        good = folder / "whole.ckpt"
        ms.save_checkpoint([{"name": "w", "data": ms.Tensor(np.arange(4096, dtype=np.float32))}], str(good))
        data = good.read_bytes()
        path.write_bytes(data[:len(data) // 2])
        good.unlink()
    elif fault == "foreign":
        path.write_bytes(np.random.default_rng(0).integers(0, 256, 64, dtype=np.uint8).tobytes())
    else:
        raise AssertionError(fault)
    return path


def expect(what: str, path: Path, fault: str) -> str:
    return f"{what} '{os.fspath(path)}' {FAULTS[fault]}"


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_read_checkpoint_names_the_file_and_the_fault(tmp_path, fault):
    path = write_fault(tmp_path, fault)
    if fault == "empty":  # what MindSpore alone says: no file name
        with pytest.raises(ValueError, match="empty after filter") as raw:
            ms.load_checkpoint(str(path))
        assert str(path) not in str(raw.value)
    if fault == "no_parameter":  # MindSpore returns it; a loader then finds no weight
        assert list(ms.load_checkpoint(str(path))) == ["ms_boost_run"]
    with pytest.raises(ValueError, match=expect("checkpoint", path, fault)):
        read_checkpoint(path)
    with pytest.raises(ValueError, match=expect("my file", path, fault)):
        read_checkpoint(str(path), choice_func=lambda name: True, what="my file")


def test_read_checkpoint_missing_folder_and_none_wanted(tmp_path):
    with pytest.raises(ValueError, match=f"checkpoint '{tmp_path / 'nope.ckpt'}' does not exist"):
        read_checkpoint(tmp_path / "nope.ckpt")
    with pytest.raises(ValueError, match=f"checkpoint '{tmp_path}' is a folder, not a file"):
        read_checkpoint(tmp_path)
    good = tmp_path / "good.ckpt"
    ms.save_checkpoint([{"name": n, "data": ms.Tensor(np.ones(2, np.float32))} for n in ("a", "b")], str(good))
    assert sorted(read_checkpoint(good)) == ["a", "b"]
    assert sorted(read_checkpoint(good, choice_func=lambda n: n == "b")) == ["b"]
    # a filter that keeps nothing: MindSpore says the same as for an empty file; here the names held are listed
    with pytest.raises(ValueError, match=rf"checkpoint '{good}' holds 2 entries but none of the parameters asked "
                                         r"for \(it holds e.g. \['a', 'b'\]\)"):
        read_checkpoint(good, choice_func=lambda n: n == "c")


def test_an_exported_model_given_as_a_checkpoint_is_named_as_such(tmp_path):
    """eval.py --checkpoint_file_path net.mindir (a user evaluating what export.py wrote) said 'cannot be read
    (...; truncated, corrupt, or not a MindSpore ckpt file)', as for a broken file; now it says the file is an
    export, asks for the .ckpt it came from and says how an exported file runs."""
    from mindspore import nn

    ms.export(nn.Dense(2, 2), ms.Tensor(np.ones((1, 2), np.float32)), file_name=str(tmp_path / "net"),
              file_format="MINDIR")
    mindir = tmp_path / "net.mindir"
    with pytest.raises(ValueError, match=rf"^checkpoint_file_path '{mindir}' is an exported model \(\.mindir file\), "
                                         r"not a checkpoint: give the \.ckpt it was exported from; a MINDIR file runs "
                                         r"with nn\.GraphCell\(mindspore\.load\(path\)\)\.$"):
        read_checkpoint(mindir, what="checkpoint_file_path")
    onnx = tmp_path / "Net.ONNX"
    onnx.write_bytes(b"\x08\x07\x12\x04onnx")
    with pytest.raises(ValueError, match=r"is an exported model \(\.onnx file\).*runs in onnxruntime"):
        read_checkpoint(onnx)


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_dim_reduce_stage1_checkpoints_name_the_bad_file(tmp_path, fault):
    """``weight_load_dir`` with one faulty file among good ones: the PCA (stage 2's ``prepare_pca_matrix`` reads
    the folder through ``compute_pca_matrix``) and the PCA command line's name inference name that file."""
    from ms_boost.dim_reduce.pca import compute_pca_matrix, infer_parameter_specs

    specs = [("w", (3,))]
    for i in range(3):
        ms.save_checkpoint([{"name": "w", "data": ms.Tensor(np.full(3, i, np.float32) + np.eye(3)[i])}],
                           str(tmp_path / f"s-{i}.ckpt"))
    bad = write_fault(tmp_path, fault, "s-3.ckpt")
    with pytest.raises(ValueError, match=expect("stage-1 checkpoint", bad, fault)):
        compute_pca_matrix(str(tmp_path), 2, specs)
    with pytest.raises(ValueError, match=expect("stage-1 checkpoint", bad, fault)):
        infer_parameter_specs(str(bad))
    # a good file holding none of the network's weights
    other = tmp_path / "s-3.ckpt"
    ms.save_checkpoint([{"name": "v", "data": ms.Tensor(np.ones(3, np.float32))}], str(other))
    with pytest.raises(ValueError, match=rf"stage-1 checkpoint '{other}' holds 1 entries but none of the parameters "
                                         r"asked for \(it holds e.g. \['v'\]\)"):
        compute_pca_matrix(str(tmp_path), 2, specs)


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_zoo_pretrained_eval_export_resume_name_the_bad_file(tmp_path, fault):
    from model_zoo.resnet import eval as zoo_eval
    from model_zoo.resnet import export as zoo_export
    from model_zoo.resnet.src import trainer
    from model_zoo.resnet.src.config import parse_config
    from model_zoo.resnet.src.run_state import read_manifest, restore_train_network

    bad = write_fault(tmp_path, fault)
    cfg = parse_config(SMALL, CONFIGS / "resnet50_imagenet_momentum.yaml")
    with pytest.raises(ValueError, match=expect("pretrained checkpoint", bad, fault)):
        trainer.build_network(cfg.replace(pretrained=str(bad)))
    with pytest.raises(ValueError, match=expect("checkpoint_file_path", bad, fault)):
        zoo_eval.main(["--config", str(CONFIGS / "resnet50_imagenet_momentum.yaml"), *SMALL,
                       "--checkpoint_file_path", str(bad)])
    with pytest.raises(ValueError, match=expect("checkpoint_file_path", bad, fault)):
        zoo_export.main(["--config", str(CONFIGS / "resnet50_imagenet_momentum.yaml"), *SMALL,
                         "--checkpoint_file_path", str(bad), "--export_file_name", str(tmp_path / "net")])
    with pytest.raises(ValueError, match=expect("resume: checkpoint", bad, fault)):  # what resume_state runs
        restore_train_network(cfg.replace(resume=str(bad)), None, 4, lambda path, manifest: None)
    with pytest.raises(ValueError, match=expect("checkpoint", bad, fault)):
        read_manifest(bad)

"""Export a checkpoint to MindIR (or ONNX; AIR on Ascend) for inference.

    python model_zoo/resnet/export.py --config model_zoo/resnet/configs/resnet50_imagenet_momentum.yaml \
        --checkpoint_file_path output/checkpoint/resnet-90_625.ckpt --export_file_name resnet50

The network's shape (``net_name``, ``base_width``, ``class_num``) and ``eval_image_size`` come from the
checkpoint's run manifest unless the command line gives them (src/checkpoint_shape.py); without ``--config`` the
boost plan too (the run's own). A MINDIR file loads
back with ``nn.GraphCell(mindspore.load(path))``, an ONNX file runs in onnxruntime; both give the network's
outputs (tests/test_zoo_export.py). A format that cannot hold the network is a ``ValueError`` saying why.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from model_zoo.resnet.src.checkpoint_shape import checkpoint_config  # noqa: E402
from model_zoo.resnet.src.config import Config, parse_config  # noqa: E402
from model_zoo.resnet.src.device import run_script  # noqa: E402
from model_zoo.resnet.src.recipe_lookup import (  # noqa: E402
    checkpoint_folder_resolved,
    config_given,
    default_recipe,
)
from model_zoo.resnet.src.resnet import onnx_exportable  # noqa: E402
from model_zoo.resnet.src.trainer import inference_network  # noqa: E402
from ms_boost.cpu_gemm_conv import restore_convolutions  # noqa: E402

DEFAULT_CONFIG = Path(__file__).resolve().parent / "configs" / "resnet50_imagenet_momentum.yaml"
_EXTENSIONS = {"MINDIR": ".mindir", "AIR": ".air", "ONNX": ".onnx"}
_NO_CONVERTER = re.compile(r"Can not find key (\w+) in convert map")


def export_checkpoint(cfg: Config, manifest_plan: bool = False) -> Path:
    """Export ``checkpoint_file_path`` with input ``(export_batch_size, 3, eval_image_size, eval_image_size)``.

    ``manifest_plan``: the boost plan is the checkpoint run's (its manifest's), unless the command line sets it (no
    ``--config`` was given).

    Returns:
        the written file.
    """
    import mindspore as ms

    if cfg.export_file_format not in _EXTENSIONS:  # parse_config checks and upper-cases it; a Config built by hand
        raise ValueError(f"export_file_format={cfg.export_file_format!r} is not allowed; allowed: "
                         f"{', '.join(_EXTENSIONS)}.")
    cfg = checkpoint_config(cfg, "export.py", plan=manifest_plan)
    net = inference_network(cfg, conv_impl="native")  # Conv2D operators in the file, portable to any device
    restore_convolutions(net)  # undo the O1/O2 plan's cpu_gemm_conv rewrite on CPU (Im2Col + MatMul in the file)
    if cfg.export_file_format == "AIR" and ms.get_context("device_target") != "Ascend":
        raise ValueError(f"export_file_format='AIR' cannot be written here: MindSpore writes AIR only on an Ascend "
                         f"device, this process runs on {ms.get_context('device_target')}; export MINDIR (loads on "
                         f"any device with mindspore.load) or ONNX instead.")
    if cfg.export_file_format == "ONNX":  # MindSpore's padded MaxPool2d has no ONNX converter
        net = onnx_exportable(net)
    size = int(cfg.eval_image_size)
    sample = ms.Tensor(np.zeros((int(cfg.export_batch_size), 3, size, size), np.float32))
    path = Path(cfg.export_file_name + _EXTENSIONS[cfg.export_file_format])
    try:
        ms.export(net, sample, file_name=cfg.export_file_name, file_format=cfg.export_file_format)
    except RuntimeError as err:
        missing = _NO_CONVERTER.search(str(err))
        if not missing:
            raise
        path.unlink(missing_ok=True)  # what MindSpore wrote before it stopped
        raise ValueError(f"export_file_format={cfg.export_file_format!r} cannot hold this network: MindSpore has no "
                         f"{cfg.export_file_format} converter for its operator {missing.group(1)}; export MINDIR "
                         f"instead (it holds every MindSpore operator).") from None
    return path


def main(argv=None) -> Path:
    """Parse the config, export, print the file written."""
    # a run folder as --checkpoint_file_path: its newest checkpoint
    argv = checkpoint_folder_resolved(sys.argv[1:] if argv is None else list(argv), "export.py")
    cfg = parse_config(argv, default_recipe(argv, DEFAULT_CONFIG, "export.py"), prog="export.py")
    path = export_checkpoint(cfg, manifest_plan=not config_given(argv))
    print(f"exported {cfg.checkpoint_file_path} -> {path}", flush=True)
    return path


if __name__ == "__main__":
    run_script(main, "export.py")

"""Run what export.py wrote: the MINDIR file through ``mindspore.load`` + ``nn.GraphCell``, the ONNX file through
onnxruntime, each on a batch, against the MindSpore network eval.py builds from the same checkpoint."""
from __future__ import annotations

import io
from contextlib import redirect_stdout
from pathlib import Path
from typing import Dict, Sequence

import mindspore as ms
import numpy as np
from mindspore import nn

from model_zoo.resnet import export as zoo_export
from model_zoo.resnet.src.checkpoint_shape import with_checkpoint_shape
from model_zoo.resnet.src.config import parse_config
from model_zoo.resnet.src.trainer import inference_network

# the journey's and tests/test_zoo_export.py's eval batch: in PyNative mode the reference network then reuses the
# convolution functions eval.py compiled for that input shape in the same process (ms_boost/gemm_conv.py compiles one
# per input shape: 11 compiles, ~2.5 CPU-s, fewer per recipe)
BATCH = 10
TOLERANCE = 1e-4


def exported_outputs(args: Sequence[str], folder: Path, seed: int = 0) -> Dict[str, np.ndarray]:
    """Export the checkpoint ``args`` name as MINDIR and ONNX (batch :data:`BATCH`) and run a random batch through
    both files and through the MindSpore inference network (``"network"``); returns the three outputs."""
    import onnxruntime

    args = [*args, "--export_batch_size", str(BATCH)]
    with redirect_stdout(io.StringIO()):
        mindir = zoo_export.main([*args, "--export_file_name", str(folder / "net"), "--export_file_format", "MINDIR"])
        onnx = zoo_export.main([*args, "--export_file_name", str(folder / "net"), "--export_file_format", "ONNX"])
    cfg, _ = with_checkpoint_shape(parse_config(args, zoo_export.DEFAULT_CONFIG, prog="export.py"))
    size = int(cfg.eval_image_size)
    batch = np.random.default_rng(seed).standard_normal((BATCH, 3, size, size)).astype(np.float32)
    network = inference_network(cfg)(ms.Tensor(batch)).asnumpy()
    graph = nn.GraphCell(ms.load(str(mindir)))(ms.Tensor(batch)).asnumpy()
    session = onnxruntime.InferenceSession(str(onnx), providers=["CPUExecutionProvider"])
    runtime = session.run(None, {session.get_inputs()[0].name: batch})[0]
    return {"network": network, "mindir": graph, "onnx": runtime}


def assert_exports_match(args: Sequence[str], folder: Path, classes: int) -> None:
    """Both exported files give the network's ``(BATCH, classes)`` outputs to :data:`TOLERANCE`."""
    outputs = exported_outputs(args, folder)
    reference = outputs.pop("network")
    assert reference.shape == (BATCH, classes) and np.isfinite(reference).all()
    assert np.ptp(reference, axis=1).max() > 0  # outputs that depend on the input (not a constant head)
    for name, value in outputs.items():
        assert value.shape == reference.shape, name
        np.testing.assert_allclose(value, reference, rtol=0, atol=TOLERANCE, err_msg=name)

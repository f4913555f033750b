"""What a tutorial reader's ``src/`` folder holds, shrunk to CPU size, for the tutorial acceptance scripts.

The MindSpore tutorials import these pieces from the ``models`` repository (``official/cv/resnet/src``):
``create_dataset`` (``dataset.py``), ``resnet`` / ``init_weight`` / ``init_group_params``, ``get_lr``,
``CrossEntropySmooth``. Here ``create_dataset`` is written out exactly as the tutorials describe it
(``ImageFolderDataset`` + RandomCropDecodeResize / Decode-Resize-CenterCrop, Normalize, HWC2CHW, TypeCast,
batch with ``drop_remainder=True``), and the network, loss and schedules come from ``model_zoo``.

Besides, every script reports what the acceptance test checks through :func:`report`: a
``TUTORIAL_RESULT {json}`` line on stdout and, under ``msrun`` (when ``MS_BOOST_RESULT_DIR`` is set), the
same values through ``tests.helpers.msrun.save_result``.
"""
from __future__ import annotations

import argparse
import json
import os
from typing import Dict, List

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore.communication import get_group_size, get_rank
from mindspore.train import Callback

from model_zoo.resnet.src.resnet import create_model

__all__ = ["base_parser", "context_mode", "create_dataset", "resnet", "LossRecorder", "report"]

_NET = {"name": "resnet18", "base_width": 4}


def base_parser(description: str) -> argparse.ArgumentParser:
    """Command-line options shared by the scripts (sizes shrunk so a run takes seconds on CPU)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--data_path", required=True, help="folder holding train/ and val/ (ImageNet layout)")
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    parser.add_argument("--net", default="resnet18",
                        help="model_zoo network name (resnet10 ... resnet152)")
    parser.add_argument("--base_width", type=int, default=4, help="channels of the first stage (64 in the paper)")
    parser.add_argument("--class_num", type=int, default=6)
    parser.add_argument("--image_size", type=int, default=32)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=2)
    return parser


def context_mode(args) -> int:
    """``GRAPH_MODE`` or ``PYNATIVE_MODE`` from ``--mode``; also records the network size for :func:`resnet`."""
    _NET.update(name=args.net, base_width=args.base_width)
    return ms.GRAPH_MODE if args.mode == "graph" else ms.PYNATIVE_MODE


def resnet(class_num: int = 1001, num_classes=None):
    """The tutorials' ``resnet(class_num=...)`` / ``resnet(num_classes=...)``, at the size chosen by the options."""
    class_num = num_classes or class_num
    return create_model(_NET["name"], class_num=class_num, base_width=_NET["base_width"])


def _get_rank_info(distribute: bool):
    """``(device_num, rank_id)`` of the data-parallel job (``(1, 0)`` when not distributed)."""
    if distribute:
        return get_group_size(), get_rank()
    return 1, 0


def create_dataset(dataset_path, do_train, batch_size=32, train_image_size=224, eval_image_size=224,
                   target="Ascend", distribute=False):
    """The ``models`` ResNet ``create_dataset`` for ImageNet, as the AdaSum / dimension-reduce tutorials use it.

    Evaluation resizes the short side to ``eval_image_size / 0.875`` (``Resize(256)`` for 224) before the
    centre crop, so small images keep the same framing as ImageNet's.
    """
    del target  # only chose the number of parallel workers upstream
    device_num, rank_id = _get_rank_info(distribute)
    if device_num == 1:
        data_set = ds.ImageFolderDataset(dataset_path, num_parallel_workers=1, shuffle=True)
    else:
        data_set = ds.ImageFolderDataset(dataset_path, num_parallel_workers=1, shuffle=True,
                                         num_shards=device_num, shard_id=rank_id)
    mean = [0.485 * 255, 0.456 * 255, 0.406 * 255]
    std = [0.229 * 255, 0.224 * 255, 0.225 * 255]
    if do_train:
        trans = [
            ds.vision.RandomCropDecodeResize(train_image_size, scale=(0.08, 1.0), ratio=(0.75, 1.333)),
            ds.vision.RandomHorizontalFlip(prob=0.5),
        ]
    else:
        trans = [
            ds.vision.Decode(),
            ds.vision.Resize(int(round(eval_image_size / 0.875))),
            ds.vision.CenterCrop(eval_image_size),
        ]
    trans_norm = [ds.vision.Normalize(mean=mean, std=std), ds.vision.HWC2CHW()]
    type_cast_op = ds.transforms.TypeCast(ms.int32)
    data_set = data_set.map(operations=trans, input_columns="image", num_parallel_workers=1)
    data_set = data_set.map(operations=trans_norm, input_columns="image", num_parallel_workers=1)
    data_set = data_set.map(operations=type_cast_op, input_columns="label", num_parallel_workers=1)
    data_set = data_set.batch(batch_size, drop_remainder=True)
    return data_set


def _loss_value(outputs) -> float:
    """The loss out of a train network's outputs (a Tensor, or a tuple whose first item is the loss)."""
    if isinstance(outputs, (tuple, list)):
        outputs = outputs[0]
    return float(np.asarray(outputs.asnumpy() if hasattr(outputs, "asnumpy") else outputs).reshape(-1)[0])


class LossRecorder(Callback):
    """Keeps the loss of every ``step_end`` call (once per sink, i.e. per epoch, in dataset sink mode)."""

    def __init__(self):
        super().__init__()
        self.losses: List[float] = []
        self.steps: List[int] = []

    def step_end(self, run_context):
        params = run_context.original_args()
        self.losses.append(_loss_value(params.net_outputs))
        self.steps.append(int(params.cur_step_num))


def flat_weights(net) -> np.ndarray:
    """Every trainable parameter of ``net`` as one float64 vector (to compare ranks)."""
    return np.concatenate([p.asnumpy().astype(np.float64).reshape(-1) for p in net.trainable_params()])


def report(**values) -> None:
    """Print ``TUTORIAL_RESULT {json}`` and, under msrun, save the values for :func:`tests.helpers.msrun.run_msrun`."""
    plain: Dict[str, object] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            value = {k: float(v) for k, v in value.items()}
        elif isinstance(value, (list, tuple, np.ndarray)):
            value = np.asarray(value, dtype=np.float64).tolist()
        plain[key] = value
    print("TUTORIAL_RESULT " + json.dumps(plain), flush=True)
    if os.environ.get("MS_BOOST_RESULT_DIR"):
        from tests.helpers.msrun import save_result

        arrays = {}
        for key, value in values.items():
            if isinstance(value, dict):
                for name, item in value.items():
                    arrays[f"{key}.{name}"] = np.asarray(float(item))
            elif value is not None:
                arrays[key] = np.asarray(value)
        save_result(**arrays)

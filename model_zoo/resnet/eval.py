"""Evaluate a checkpoint: prints top-1 and top-5 accuracy on the eval split.

    python model_zoo/resnet/eval.py --config model_zoo/resnet/configs/resnet50_imagenet_momentum.yaml \
        --data_path /data/imagenet --checkpoint_file_path output/checkpoint/resnet-90_625.ckpt

Labels are the train split's (label ``i`` = its ``i``-th sorted class folder), as in training: taken from
``<data_path>/<train_dir>``, else from the train split recorded in the checkpoint's manifest
(``config.data_path``/``train_dir``) if that folder exists here; an eval class folder the train split lacks
is an error, eval classes missing are named in a warning.

The network's shape (``net_name``, ``base_width``, ``class_num``) and ``eval_image_size`` come from the
checkpoint's run manifest unless the command line gives them (src/checkpoint_shape.py): the training run's
overrides need not be repeated. Without ``--config`` the recipe is the one the manifest names and the boost plan the
run's own (``--boost_level O1`` given to the Momentum recipe, an autotuned pick) unless the command line sets it.
Without any train split the eval split's own sorted class folders are used, with a warning (a class missing there
would shift every later label).
"""
from __future__ import annotations

import os
import sys
import time
import warnings
from pathlib import Path
from typing import List, Optional

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from model_zoo.resnet.src.checkpoint_shape import checkpoint_config  # noqa: E402
from model_zoo.resnet.src.config import Config, parse_config  # noqa: E402
from model_zoo.resnet.src.data_check import check_images  # noqa: E402
from model_zoo.resnet.src.dataset import class_folders  # noqa: E402
from model_zoo.resnet.src.device import run_script  # noqa: E402
from model_zoo.resnet.src.recipe_lookup import (  # noqa: E402
    checkpoint_folder_resolved,
    config_given,
    default_recipe,
)
from model_zoo.resnet.src.run_state import read_manifest  # noqa: E402
from model_zoo.resnet.src.trainer import (  # noqa: E402
    BUILTIN_DATA,
    build_loss,
    check_run_sizes,
    data_root,
    eval_dataset,
    eval_metrics,
    inference_network,
    split_folder,
)

DEFAULT_CONFIG = Path(__file__).resolve().parent / "configs" / "resnet50_imagenet_momentum.yaml"


def train_classes(cfg: Config) -> Optional[List[str]]:
    """The class folders of the train split the checkpoint was trained on (label ``i`` = the ``i``-th), or
    ``None`` (with a warning) when no train split is at hand. See the module doc for the order searched."""
    here = data_root(cfg) / cfg.train_dir
    if here.is_dir():
        return class_folders(here)
    path = Path(os.path.expanduser(str(cfg.checkpoint_file_path)))
    manifest = read_manifest(path, what="checkpoint_file_path") if path.is_file() else None
    recorded = (manifest or {}).get("config") or {}
    if isinstance(recorded.get("data_path"), str) and recorded["data_path"] not in BUILTIN_DATA:
        there = Path(os.path.expanduser(recorded["data_path"])) / str(recorded.get("train_dir", cfg.train_dir))
        if there.is_dir():
            return class_folders(there)
    eval_folder = split_folder(cfg, train=False)
    warnings.warn(f"no train split at hand ({str(here)!r} does not exist and the checkpoint names none that "
                  f"does): labels are the {len(class_folders(eval_folder))} sorted class folders of "
                  f"{str(eval_folder)!r} itself, which match training only if that split has every class of the "
                  f"train split (a missing one shifts every later label).", UserWarning, stacklevel=2)
    return None


def evaluate_checkpoint(cfg: Config, manifest_plan: bool = False) -> dict:
    """Load ``checkpoint_file_path`` into the recipe's inference network and return top-1/top-5 accuracy.

    The eval images are Pillow-checked first (``check_data``), as train.py does. ``manifest_plan``: the boost plan
    is the checkpoint run's (its manifest's), unless the command line sets it (no ``--config`` was given).
    """
    from mindspore.train import Model

    cfg = checkpoint_config(cfg, "eval.py", plan=manifest_plan)
    check_run_sizes(cfg)  # e.g. --eval_batch_size 0, --num_parallel_workers 0: named before anything is built
    net = inference_network(cfg)
    folder = split_folder(cfg, train=False)
    check_images(folder, cfg.check_data, workers=int(cfg.num_parallel_workers))
    data = eval_dataset(cfg, class_names=train_classes(cfg))
    model = Model(net, loss_fn=build_loss(cfg), metrics=eval_metrics(int(cfg.class_num)))
    started = time.time()
    result = model.eval(data, dataset_sink_mode=False)
    return {"top_1_accuracy": float(result["top_1_accuracy"]), "top_5_accuracy": float(result["top_5_accuracy"]),
            "seconds": time.time() - started}


def main(argv=None) -> dict:
    """Parse the config, evaluate, print ``top-1``/``top-5`` and the result dict."""
    # a run folder as --checkpoint_file_path: its newest checkpoint
    argv = checkpoint_folder_resolved(sys.argv[1:] if argv is None else list(argv), "eval.py")
    cfg = parse_config(argv, default_recipe(argv, DEFAULT_CONFIG, "eval.py"), prog="eval.py")
    result = evaluate_checkpoint(cfg, manifest_plan=not config_given(argv))
    print(f"top-1 accuracy: {result['top_1_accuracy']:.4f}  top-5 accuracy: {result['top_5_accuracy']:.4f}  "
          f"({result['seconds']:.1f} s)")
    print(f"result: {result} ckpt={cfg.checkpoint_file_path}", flush=True)
    return result


if __name__ == "__main__":
    run_script(main, "eval.py")

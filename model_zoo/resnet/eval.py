"""Evaluate a checkpoint: prints top-1 and top-5 accuracy on the eval split.

    python model_zoo/resnet/eval.py --config model_zoo/resnet/configs/resnet50_imagenet_momentum.yaml \
        --data_path /data/imagenet --checkpoint_file_path output/checkpoint/resnet-90_625.ckpt
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from model_zoo.resnet.src.config import Config, parse_config  # noqa: E402
from model_zoo.resnet.src.data_check import check_images  # noqa: E402
from model_zoo.resnet.src.trainer import (  # noqa: E402
    EVAL_METRICS,
    build_loss,
    eval_dataset,
    inference_network,
    split_folder,
)

DEFAULT_CONFIG = Path(__file__).resolve().parent / "configs" / "resnet50_imagenet_momentum.yaml"


def evaluate_checkpoint(cfg: Config) -> dict:
    """Load ``checkpoint_file_path`` into the recipe's inference network and return top-1/top-5 accuracy.

    The eval images are Pillow-checked first (``check_data``), as train.py does.
    """
    from mindspore.train import Model

    net = inference_network(cfg)
    check_images(split_folder(cfg, train=False), cfg.check_data, workers=max(1, int(cfg.num_parallel_workers)))
    model = Model(net, loss_fn=build_loss(cfg), metrics=set(EVAL_METRICS))
    started = time.time()
    result = model.eval(eval_dataset(cfg), dataset_sink_mode=False)
    return {"top_1_accuracy": float(result["top_1_accuracy"]), "top_5_accuracy": float(result["top_5_accuracy"]),
            "seconds": time.time() - started}


def main(argv=None) -> dict:
    """Parse the config, evaluate, print ``top-1``/``top-5`` and the result dict."""
    cfg = parse_config(sys.argv[1:] if argv is None else argv, DEFAULT_CONFIG, prog="eval.py")
    result = evaluate_checkpoint(cfg)
    print(f"top-1 accuracy: {result['top_1_accuracy']:.4f}  top-5 accuracy: {result['top_5_accuracy']:.4f}  "
          f"({result['seconds']:.1f} s)")
    print(f"result: {result} ckpt={cfg.checkpoint_file_path}", flush=True)
    return result


if __name__ == "__main__":
    try:
        main()
    except ValueError as err:  # a clear message and status 1, not a traceback
        print(f"eval.py: error: {err}", file=sys.stderr, flush=True)
        sys.exit(1)

"""Quick start: a short boosted ResNet training on the built-in data set, accuracy before and after.

    python -m model_zoo.resnet.main_job [--key value ...]

Renders the built-in data set on first use (10 classes of 32x32 JPEGs, about 2 MB, cached), trains a
width-reduced ResNet-18 with ``ms_boost.Model(..., boost_level="O1")`` (LessBN + gradient freezing)
for 8 epochs through the same ImageFolder pipeline ImageNet uses, and prints top-1/top-5 accuracy
before and after training and the wall time. Any key of ``configs/resnet18_synthetic_quickstart.yaml``
can be overridden (``--epoch_size 4``, ``--mode pynative``, ``--boost_level O0`` ...).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from model_zoo.resnet.src.callbacks import format_duration  # noqa: E402
from model_zoo.resnet.src.config import parse_config  # noqa: E402
from model_zoo.resnet.src.dataset import class_folders  # noqa: E402
from model_zoo.resnet.src.trainer import TrainingDiverged, split_folder, train  # noqa: E402

QUICKSTART_CONFIG = Path(__file__).resolve().parent / "configs" / "resnet18_synthetic_quickstart.yaml"


def main(argv=None) -> dict:
    """Run the quick start; returns the training results (with ``before``/``after`` accuracies)."""
    started = time.time()
    cfg = parse_config(sys.argv[1:] if argv is None else argv, QUICKSTART_CONFIG, prog="main_job")
    results = train(cfg)
    wall = time.time() - started
    if results.get("rank", 0) == 0:
        chance = 1.0 / len(class_folders(split_folder(cfg, train=True)))  # the train split's classes
        before, after = results.get("before"), results.get("after")
        print("=" * 72)
        print(f"main job: {cfg.net_name} (width {cfg.base_width}) on "
              f"{'the built-in data set' if cfg.data_path == 'synthetic' else cfg.data_path}, "
              f"boost_level {cfg.boost_level}, {results['total_steps']} steps")
        if before:
            print(f"  accuracy before training: top-1 {before['top_1_accuracy']:.3f}  "
                  f"top-5 {before['top_5_accuracy']:.3f}  (chance {chance:.3f})")
        if after:
            print(f"  accuracy after training:  top-1 {after['top_1_accuracy']:.3f}  "
                  f"top-5 {after['top_5_accuracy']:.3f}")
        print(f"  training {format_duration(results['train_seconds'])}, wall time {format_duration(wall)} "
              f"({wall:.1f} s)")
        print("=" * 72, flush=True)
    results["main_job_seconds"] = wall
    return results


if __name__ == "__main__":
    try:
        main()
    except (TrainingDiverged, ValueError) as err:  # a clear message and status 1, not a traceback
        print(f"main_job: error: {err}", file=sys.stderr, flush=True)
        sys.exit(1)

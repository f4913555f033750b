"""Train a ResNet with one of the recipes in ``configs/``.

    python model_zoo/resnet/train.py --config model_zoo/resnet/configs/resnet50_imagenet_boost_o1.yaml \
        --data_path /data/imagenet [--key value ...]

``--resume <checkpoint or run folder>`` continues a run exactly (see docs/model_zoo.md). A diverging run
stops with exit status 1 and a message naming the step and the first non-finite Parameter.
``--help`` lists every key of the chosen config with its value and meaning. Distributed runs are started
by the launchers in ``scripts/`` (which add ``--run_distribute true``).
"""
from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from model_zoo.resnet.src.config import parse_config  # noqa: E402
from model_zoo.resnet.src.device import run_script  # noqa: E402
from model_zoo.resnet.src.trainer import TrainingDiverged, train  # noqa: E402

DEFAULT_CONFIG = Path(__file__).resolve().parent / "configs" / "resnet50_imagenet_momentum.yaml"


def main(argv=None) -> dict:
    """Parse ``--config`` and overrides, train, return the results (see :func:`trainer.train`).

    Raises:
        TrainingDiverged: the run diverged (as a script: the message on stderr, exit status 1).
    """
    cfg = parse_config(sys.argv[1:] if argv is None else argv, DEFAULT_CONFIG, prog="train.py")
    try:
        return train(cfg)
    except KeyboardInterrupt:  # Ctrl-C (and SIGTERM, see run_script): say how to go on
        print(f"train.py: interrupted; the checkpoints written so far are in {str(cfg.output_path)!r}: run the same "
              f"command with --resume {cfg.output_path} to continue", file=sys.stderr, flush=True)
        raise


if __name__ == "__main__":
    run_script(main, "train.py", expected=(TrainingDiverged, ValueError))

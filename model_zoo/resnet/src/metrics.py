"""Training curves: a JSON-lines metrics file in the run folder, and optionally MindSpore's SummaryCollector.

One JSON object per line; ``"kind"`` says what it is:

* ``{"kind": "step", "step": 12, "epoch": 1, "loss": 2.31, "lr": 0.1, "loss_scale": 1024.0,
  "step_time": 0.41}`` after every training step (``loss_scale`` is ``null`` without loss scaling;
  ``step_time`` is seconds since the previous step ended, so the first step includes graph compilation);
* ``{"kind": "epoch", "epoch": 1, "step": 12, "loss": 2.2, "steps": 12, "epoch_time": 5.1}`` at every epoch end
  (``loss`` is the mean of the epoch's ``steps`` finite step losses; after a mid-epoch resume it includes the
  losses the stopped run recorded for that epoch, so it equals the uninterrupted run's; ``epoch_time`` counts
  only this process's part of the epoch);
* ``{"kind": "eval", "step": 96, "epoch": 8, "top_1_accuracy": 0.6, "top_5_accuracy": 0.95}`` when the
  run evaluates (before training: ``step`` 0).

A resumed run keeps the records up to its checkpoint's step and appends after them.
``python -m model_zoo.resnet.plot_run RUN_DIR [RUN_DIR ...] -o curves.png`` draws them.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np
from mindspore.train import Callback

from model_zoo.resnet.src.callbacks import loss_value

__all__ = ["MetricsLogger", "read_metrics", "append_record", "truncate_metrics"]


def _number(value: Any) -> Optional[float]:
    """A JSON-safe float (``None`` for NaN/Inf, which JSON cannot hold; the loss check reports those)."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def loss_scale_of(outputs) -> Optional[float]:
    """The loss scale from a loss-scaling train cell's ``(loss, overflow, scale)`` output (else ``None``)."""
    if isinstance(outputs, (tuple, list)) and len(outputs) >= 3:
        scale = outputs[2]
        if hasattr(scale, "asnumpy"):
            scale = scale.asnumpy()
        return _number(np.mean(scale))
    return None


def append_record(path: Union[str, Path], record: Dict[str, Any]) -> None:
    """Append one JSON line to ``path``."""
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, sort_keys=True) + "\n")


def read_metrics(path: Union[str, Path]) -> List[Dict[str, Any]]:
    """Records of a metrics file (a run folder is read as ``<folder>/metrics.jsonl``).

    Raises:
        ValueError: missing file, or a line that is not a JSON object (named by line number).
    """
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.is_file():
        raise ValueError(f"metrics file {str(path)!r} does not exist (train.py writes <output_path>/metrics.jsonl).")
    records = []
    with open(path, encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                raise ValueError(f"{str(path)!r} line {number} is not JSON: {line[:80]!r}") from None
            if not isinstance(record, dict):
                raise ValueError(f"{str(path)!r} line {number} is not a JSON object.")
            records.append(record)
    return records


def truncate_metrics(path: Union[str, Path], last_step: int) -> None:
    """Keep only records with ``step <= last_step`` (a resumed run rewrites what follows its checkpoint)."""
    path = Path(path)
    if not path.is_file():
        return
    kept = [r for r in read_metrics(path) if int(r.get("step", 0)) <= last_step]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in kept), encoding="utf-8")
    tmp.replace(path)


class MetricsLogger(Callback):
    """Write step and epoch records (see the module doc) to ``path``.

    Args:
        path: the metrics file (appended to).
        lr_schedule: learning rate per global step (index ``step - 1``), or one float for a constant rate.
        steps_per_epoch: steps of one epoch.
        step_offset: global step the run starts from (resumed runs: the file, already truncated to this step,
            supplies the losses of the resumed epoch's earlier steps).
    """

    def __init__(self, path: Union[str, Path], lr_schedule: Union[float, Sequence[float], np.ndarray],
                 steps_per_epoch: int, step_offset: int = 0):
        super().__init__()
        self.path = Path(path)
        self.lr = lr_schedule
        self.steps_per_epoch = max(1, int(steps_per_epoch))
        self.step_offset = int(step_offset)
        self._last = 0.0
        self._epoch_start = 0.0
        self._epoch_losses: List[float] = []
        # A run resumed inside an epoch: that epoch's earlier losses come from the step records the stopped run
        # left in the file, so the epoch record averages the whole epoch as an uninterrupted run's does.
        self._carried: List[float] = []
        first = self.step_offset - self.step_offset % self.steps_per_epoch + 1  # first step of the resumed epoch
        if self.step_offset % self.steps_per_epoch and self.path.is_file():
            earlier = {int(r["step"]): r.get("loss") for r in read_metrics(self.path)
                       if r.get("kind") == "step" and first <= int(r.get("step", 0)) <= self.step_offset}
            self._carried = [float(v) if v is not None else math.nan for _, v in sorted(earlier.items())]

    def _lr_at(self, step: int) -> Optional[float]:
        if isinstance(self.lr, (int, float)):
            return float(self.lr)
        values = np.asarray(self.lr).reshape(-1)
        return _number(values[min(step - 1, values.size - 1)]) if values.size else None

    def on_train_begin(self, run_context) -> None:
        self._last = self._epoch_start = time.time()

    def on_train_epoch_begin(self, run_context) -> None:
        self._epoch_start = time.time()
        self._epoch_losses, self._carried = self._carried, []

    def on_train_step_end(self, run_context) -> None:
        params = run_context.original_args()
        now = time.time()
        step = self.step_offset + int(params.cur_step_num)
        loss = loss_value(params.net_outputs)
        self._epoch_losses.append(loss)
        append_record(self.path, {"kind": "step", "step": step, "epoch": (step - 1) // self.steps_per_epoch + 1,
                                  "loss": _number(loss), "lr": self._lr_at(step),
                                  "loss_scale": loss_scale_of(params.net_outputs),
                                  "step_time": round(now - self._last, 6)})
        self._last = now

    def on_train_epoch_end(self, run_context) -> None:
        params = run_context.original_args()
        step = self.step_offset + int(params.cur_step_num)
        finite = [v for v in self._epoch_losses if math.isfinite(v)]
        append_record(self.path, {"kind": "epoch", "epoch": int(params.cur_epoch_num), "step": step,
                                  "loss": _number(np.mean(finite)) if finite else None, "steps": len(finite),
                                  "epoch_time": round(time.time() - self._epoch_start, 6)})

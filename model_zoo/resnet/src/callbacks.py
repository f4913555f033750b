"""Training callbacks: progress lines (loss, time per step, throughput, ETA) and rank-0-only checkpoints."""
from __future__ import annotations

import math
import os
import sys
import time
from typing import List, Optional, TextIO

import numpy as np
from mindspore import nn
from mindspore.train import Callback, CheckpointConfig, ModelCheckpoint

__all__ = ["ProgressMonitor", "format_duration", "loss_value", "checkpoint_callbacks"]


def format_duration(seconds: float) -> str:
    """``3725.2`` -> ``"1:02:05"`` (hours:minutes:seconds, hours unbounded)."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    whole = int(round(seconds))
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def loss_value(outputs) -> float:
    """Scalar loss from a train network's output (a Tensor, or ``(loss, overflow, scale)``-style tuples)."""
    while isinstance(outputs, (tuple, list)) and outputs:
        outputs = outputs[0]
    if hasattr(outputs, "asnumpy"):
        outputs = outputs.asnumpy()
    return float(np.mean(outputs))


class ProgressMonitor(Callback):
    """Print ``epoch e/E step s/S loss L | t ms/step | n img/s | ETA h:mm:ss`` every ``log_interval`` steps.

    A line is printed once at least ``log_interval`` steps have passed since the previous one (with data
    sinking the callback only sees epoch ends, which then each print), and always for the last step.

    Time per step and throughput are measured over the steps since the previous line (so data-sink
    epochs that report once per epoch are handled); the ETA extrapolates the mean time of all steps
    after the first logged one, which excludes graph compilation. A non-finite loss is reported, and
    with ``stop_on_nan`` training stops.

    Args:
        total_steps: steps of the whole run (for the ETA).
        steps_per_epoch: steps in one epoch.
        batch_size: global images per step (for the throughput).
        log_interval: steps between lines (the last step is always logged).
        rank: rank printed in the prefix when ``rank_size > 1``.
        rank_size: number of ranks.
        stream: where to print (``sys.stdout``).
        stop_on_nan: request the end of training on a NaN/Inf loss (``failure`` then says why).
        step_offset: global step the run starts from (a resumed run's checkpoint step).
    """

    def __init__(self, total_steps: int, steps_per_epoch: int, batch_size: int, log_interval: int = 10,
                 rank: int = 0, rank_size: int = 1, stream: Optional[TextIO] = None, stop_on_nan: bool = True,
                 step_offset: int = 0):
        super().__init__()
        if log_interval < 1:
            raise ValueError(f"log_interval={log_interval} must be >= 1.")
        self.total_steps = int(total_steps)
        self.steps_per_epoch = max(1, int(steps_per_epoch))
        self.batch_size = int(batch_size)
        self.log_interval = int(log_interval)
        self.prefix = f"[rank {rank}/{rank_size}] " if rank_size > 1 else ""
        self.stream = stream
        self.stop_on_nan = stop_on_nan
        self.step_offset = int(step_offset)
        self.failure: Optional[str] = None
        self.losses: List[float] = []
        self._last_time = 0.0
        self._last_step = 0
        self._anchor: Optional[tuple] = None
        self._start = 0.0

    def on_train_begin(self, run_context) -> None:
        self._start = self._last_time = time.time()
        self._last_step = self.step_offset
        self._anchor = None

    def on_train_step_end(self, run_context) -> None:
        params = run_context.original_args()
        step = self.step_offset + int(params.cur_step_num)
        loss = loss_value(params.net_outputs)
        self.losses.append(loss)
        if not math.isfinite(loss) and self.stop_on_nan:
            epoch, in_epoch = (step - 1) // self.steps_per_epoch + 1, (step - 1) % self.steps_per_epoch + 1
            self.failure = (f"training diverged: step {step} (epoch {epoch}, step {in_epoch}): loss is {loss}; "
                            f"stopped (lower lr_max or raise loss_scale)")
            self._print(self.failure + ".")
            run_context.request_stop()
            return
        if step - self._last_step < self.log_interval and step != self.total_steps:
            return
        now = time.time()
        steps = max(1, step - self._last_step)
        per_step = (now - self._last_time) / steps
        if self._anchor is None:
            self._anchor = (step, now)
            eta = per_step * (self.total_steps - step)
        else:
            mean = (now - self._anchor[1]) / max(1, step - self._anchor[0])
            eta = mean * (self.total_steps - step)
        epoch = (step - 1) // self.steps_per_epoch + 1
        in_epoch = (step - 1) % self.steps_per_epoch + 1
        epochs = max(1, math.ceil(self.total_steps / self.steps_per_epoch))
        throughput = self.batch_size / per_step if per_step > 0 else float("inf")
        self._print(f"epoch {epoch}/{epochs} step {in_epoch}/{self.steps_per_epoch} (global {step}/{self.total_steps}) "
                    f"loss {loss:.4f} | {per_step * 1000:.1f} ms/step | {throughput:.1f} img/s | "
                    f"ETA {format_duration(eta)}")
        self._last_time, self._last_step = now, step

    def on_train_end(self, run_context) -> None:
        elapsed = time.time() - self._start
        self._print(f"training done: {len(self.losses)} steps in {format_duration(elapsed)} "
                    f"({elapsed:.1f} s), last loss {self.losses[-1] if self.losses else float('nan'):.4f}")

    def _print(self, text: str) -> None:
        print(self.prefix + text, file=self.stream or sys.stdout, flush=True)


def checkpoint_callbacks(rank: int, directory: str, prefix: str, save_steps: int, keep_max: int,
                         saved_network: Optional[nn.Cell] = None) -> List[Callback]:
    """A ``ModelCheckpoint`` on rank 0 (nothing on other ranks).

    Args:
        rank: this process's rank.
        directory: output folder (created).
        prefix: file prefix (``prefix-<epoch>_<step>.ckpt``).
        save_steps: steps between checkpoints.
        keep_max: newest checkpoints kept.
        saved_network: save only this cell's weights (``None`` = the whole train network: weights plus
            optimizer and boost state).
    """
    if rank != 0:
        return []
    os.makedirs(directory, exist_ok=True)
    config = CheckpointConfig(save_checkpoint_steps=max(1, int(save_steps)), keep_checkpoint_max=max(1, int(keep_max)),
                              saved_network=saved_network)
    return [ModelCheckpoint(prefix=prefix, directory=directory, config=config)]

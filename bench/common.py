"""Shared benchmark utilities: timing with medians, result files, a small conv net."""
from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import nn

RESULTS = Path(__file__).parent / "results"


class BenchConvNet(nn.Cell):
    """A small ResNet-like conv net with BatchNorm for 3x32x32 inputs (benchmarks only)."""

    def __init__(self, num_classes: int = 10, width: int = 16):
        super().__init__()
        self.stem = nn.SequentialCell([nn.Conv2d(3, width, 3, pad_mode="same", has_bias=False),
                                       nn.BatchNorm2d(width), nn.ReLU()])
        self.block = nn.SequentialCell([nn.Conv2d(width, width, 3, pad_mode="same", has_bias=False),
                                        nn.BatchNorm2d(width), nn.ReLU(),
                                        nn.Conv2d(width, width, 3, pad_mode="same", has_bias=False),
                                        nn.BatchNorm2d(width)])
        self.down = nn.SequentialCell([nn.Conv2d(width, 2 * width, 3, stride=2, pad_mode="same", has_bias=False),
                                       nn.BatchNorm2d(2 * width), nn.ReLU()])
        self.relu = nn.ReLU()
        self.pool = nn.AvgPool2d(16, 16)
        self.flatten = nn.Flatten()
        self.head = nn.Dense(2 * width, num_classes)

    def construct(self, x):
        x = self.stem(x)
        x = self.relu(x + self.block(x))
        x = self.pool(self.down(x))
        return self.head(self.flatten(x))


def random_batches(steps: int, batch: int, num_classes: int = 10, size: int = 32, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(steps * batch, 3, size, size)).astype(np.float32)
    y = rng.integers(0, num_classes, steps * batch).astype(np.int32)
    return x, y


def median_time(fn, repeats: int) -> tuple:
    """Run ``fn`` ``repeats`` times; return (median seconds, all times)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), times


def environment() -> dict:
    return {"mindspore": ms.__version__, "numpy": np.__version__, "python": platform.python_version(),
            "cpu_count": os.cpu_count(), "machine": platform.machine()}


def write_results(name: str, payload: dict, markdown: str) -> None:
    """Write ``results/<name>.json`` and ``results/<name>.md`` atomically."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    for suffix, text in ((".json", json.dumps(payload, indent=2, sort_keys=True)), (".md", markdown)):
        target = RESULTS / f"{name}{suffix}"
        tmp = target.with_suffix(suffix + ".tmp")
        tmp.write_text(text + "\n", encoding="utf-8")
        os.replace(tmp, target)

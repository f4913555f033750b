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


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30
    except (ValueError, OSError, AttributeError):
        return float("nan")


def environment() -> dict:
    """Machine and versions, for the result pages."""
    return {"mindspore": ms.__version__, "numpy": np.__version__, "python": platform.python_version(),
            "cpu_count": os.cpu_count(), "machine": platform.machine(), "cpu_model": _cpu_model(),
            "memory_gib": round(_memory_gib(), 1), "os": platform.platform(terse=True)}


def rss_and_threads() -> tuple:
    """This process's resident memory (MiB) and thread count, from Linux ``/proc`` (0 where it is not readable)."""
    rss = 0.0
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
    except OSError:
        pass
    threads = len(os.listdir("/proc/self/task")) if Path("/proc/self/task").is_dir() else 0
    return rss, threads


def load_average() -> list:
    """1, 5 and 15 minute load averages (other jobs sharing the CPU)."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return []


def quartiles_of(values) -> list:
    """``[25th, 75th]`` percentiles (the spread of paired per-repeat ratios)."""
    values = np.asarray(list(values), dtype=np.float64)
    return [float(np.percentile(values, 25)), float(np.percentile(values, 75))] if values.size else []


def median_range(values, digits: int = 3, unit: str = "") -> str:
    """``"median [min, max]"`` of ``values`` with ``digits`` decimals, ``unit`` after the median (e.g. ``"x"``);
    ``"-"`` when there are none (the pages' one format for a spread over seeds, epochs or rounds)."""
    values = [float(v) for v in values]
    if not values:
        return "-"
    return f"{np.median(values):.{digits}f}{unit} [{min(values):.{digits}f}, {max(values):.{digits}f}]"


def paired_ratio(times: dict, a: str, b: str) -> dict:
    """Median and quartiles of the per-repeat ratios ``times[a][i] / times[b][i]`` (contenders interleaved)."""
    values = [p / q for p, q in zip(times[a], times[b])]
    return {"median": float(np.median(values)), "quartiles": quartiles_of(values)}


def page_footer(command: str, load_before: list = None) -> list:
    """Markdown lines every result page ends with: machine, versions, load, how to reproduce."""
    env = environment()
    load = load_average()
    lines = ["", "## Machine and reproduction", "",
             f"- Machine: {env['cpu_count']} CPUs ({env['cpu_model']}), {env['memory_gib']} GiB, {env['os']}; "
             f"shared with other jobs, so absolute times are indicative and only paired ratios are compared.",
             f"- Versions: MindSpore {env['mindspore']}, numpy {env['numpy']}, Python {env['python']}.",
             f"- Load average (1/5/15 min) when the page was written: {' / '.join(str(v) for v in load)}"
             + (f"; at the start: {' / '.join(str(v) for v in load_before)}" if load_before else "") + ".",
             f"- Reproduce: `{command}` (or `python -m bench` for every page)."]
    return lines


def write_results(name: str, payload: dict, markdown: str) -> None:
    """Write ``results/<name>.json`` and ``results/<name>.md`` atomically."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    for suffix, text in ((".json", json.dumps(payload, indent=2, sort_keys=True)), (".md", markdown)):
        target = RESULTS / f"{name}{suffix}"
        tmp = target.with_suffix(suffix + ".tmp")
        tmp.write_text(text + "\n", encoding="utf-8")
        os.replace(tmp, target)

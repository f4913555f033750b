"""THOR train step on CPU with Conv2dThor's im2col + GEMM convolution vs ops.Conv2D (and Momentum for scale).

Three compiled train steps on one fixed batch, alternating step by step (same machine load for all): THOR with
its layers' ``gemm`` path, THOR with ``gemm`` switched off (``ops.Conv2D``: the behaviour before), and Momentum
on the same zoo network (GemmConv2d layers). Medians over the timed steps and the paired ratios, per mode.

Usage::

    python bench/bench_thor_conv.py [--modes graph pynative] [--net resnet18] [--width 16] [--batch 32] [--quick]

Writes bench/results/thor_conv.{md,json}.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import load_average, page_footer, paired_ratio, write_results  # noqa: E402
from model_zoo.resnet.src.resnet import create_model  # noqa: E402
from ms_boost import Model  # noqa: E402
from ms_boost.thor import Conv2dThor, ConvertModelUtils, thor  # noqa: E402


def build(kind: str, args):
    ms.set_seed(0)
    net = create_model(args.net, class_num=10, base_width=args.width)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    if kind == "momentum":
        model = Model(net, loss, nn.Momentum(net.trainable_params(), 0.01, 0.9))
    else:
        opt = thor(net, 0.01, 0.03, 0.9, 1e-4, frequency=args.frequency)
        for _, cell in opt.thor_network.cells_and_names():
            if isinstance(cell, Conv2dThor):
                cell.gemm = kind == "thor_gemm"
        model = ConvertModelUtils().convert_to_thor_model(Model(net, loss, opt), net, loss, opt)
    cell = model.train_network
    cell.set_train()
    return cell


def run(mode: str, args) -> dict:
    """Time the three contenders in ``mode``; returns medians and paired ratios."""
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((args.batch, 3, args.size, args.size)).astype(np.float32))
    y = Tensor(rng.integers(0, 10, args.batch).astype(np.int32))
    cells = {}
    for kind in ("thor_gemm", "thor_conv2d", "momentum"):
        cells[kind] = build(kind, args)
        start = time.perf_counter()
        for _ in range(2):
            out = cells[kind](x, y)
        (out[0] if isinstance(out, tuple) else out).asnumpy()
        print(f"{mode} {kind}: first steps (compile) {time.perf_counter() - start:.1f} s", flush=True)
    times = {kind: [] for kind in cells}
    for _ in range(args.steps):
        for kind, cell in cells.items():  # alternating: load drift hits every contender alike
            start = time.perf_counter()
            out = cell(x, y)
            (out[0] if isinstance(out, tuple) else out).asnumpy()
            times[kind].append(time.perf_counter() - start)

    return {"mode": mode, "net": args.net, "width": args.width, "batch": args.batch, "size": args.size,
            "frequency": args.frequency, "steps": args.steps,
            "median_ms": {k: statistics.median(v) * 1e3 for k, v in times.items()},
            "conv2d_over_gemm": paired_ratio(times, "thor_conv2d", "thor_gemm"),
            "gemm_over_momentum": paired_ratio(times, "thor_gemm", "momentum")}


def render(runs, load_before) -> str:
    lines = ["# THOR on CPU: Conv2dThor with im2col + GEMM vs ops.Conv2D", "",
             "Three train steps of the zoo network on one fixed batch, alternating step by step: THOR whose "
             "`Conv2dThor` layers use `ms_boost.gemm_conv` (the CPU default), THOR with that path switched off "
             "(`ops.Conv2D`, the behaviour before), and Momentum on the same network (the zoo's `GemmConv2d` "
             "layers). THOR statistics/inverses every `frequency` steps, so a median step is mostly a plain THOR "
             "step; paired ratios are medians of per-step ratios (quartiles in brackets).", "",
             "| mode | net | batch x size | frequency | THOR (GEMM) | THOR (Conv2D) | Momentum | Conv2D / GEMM "
             "| THOR (GEMM) / Momentum |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        m, a, b = r["median_ms"], r["conv2d_over_gemm"], r["gemm_over_momentum"]
        lines.append(f"| {r['mode']} | {r['net']} width {r['width']} | {r['batch']} x {r['size']} px | "
                     f"{r['frequency']} | {m['thor_gemm']:.0f} ms | {m['thor_conv2d']:.0f} ms | "
                     f"{m['momentum']:.0f} ms | **{a['median']:.2f}x** [{a['quartiles'][0]:.2f}, "
                     f"{a['quartiles'][1]:.2f}] | {b['median']:.2f}x [{b['quartiles'][0]:.2f}, "
                     f"{b['quartiles'][1]:.2f}] |")
    return "\n".join(lines + page_footer("python bench/bench_thor_conv.py", load_before))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", nargs="+", choices=("graph", "pynative"), default=["graph", "pynative"])
    parser.add_argument("--net", default="resnet18")
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--frequency", type=int, default=10)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="8 timed steps")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps = 8
    load_before = load_average()
    runs = []
    for mode in args.modes:
        runs.append(run(mode, args))
        print(f"[bench_thor_conv] {runs[-1]}", flush=True)
    write_results("thor_conv", {"runs": runs, "load_before": load_before}, render(runs, load_before))


if __name__ == "__main__":
    main()

"""THOR train step on CPU with Conv2dThor's im2col + GEMM convolution vs ops.Conv2D (and Momentum for scale).

Three compiled train steps on one fixed batch, alternating step by step (same machine load for all): THOR with
its layers' ``gemm`` path, THOR with ``gemm`` switched off (``ops.Conv2D``: the behaviour before), and Momentum
on the same zoo network (GemmConv2d layers). Prints medians over the timed steps and the paired ratio. No results
file (a measurement for docs/thor.md).

Usage::

    python bench/bench_thor_conv.py [--mode graph|pynative] [--net resnet18] [--width 16] [--batch 32]
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


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    parser.add_argument("--net", default="resnet18")
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--frequency", type=int, default=10)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args(argv)
    ms.set_context(mode=ms.GRAPH_MODE if args.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
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
        print(f"{kind}: first steps (compile) {time.perf_counter() - start:.1f} s", flush=True)
    times = {kind: [] for kind in cells}
    for _ in range(args.steps):
        for kind, cell in cells.items():
            start = time.perf_counter()
            out = cell(x, y)
            (out[0] if isinstance(out, tuple) else out).asnumpy()
            times[kind].append(time.perf_counter() - start)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    mean = {k: statistics.fmean(v) * 1e3 for k, v in times.items()}
    ratio = statistics.median(a / b for a, b in zip(times["thor_conv2d"], times["thor_gemm"]))
    print(f"{args.mode} {args.net} w{args.width} b{args.batch} {args.size}px, {args.steps} steps, THOR frequency "
          f"{args.frequency}")
    for kind in cells:
        print(f"  {kind:12s} median {med[kind]:7.1f} ms  mean {mean[kind]:7.1f} ms")
    print(f"  paired ratio thor_conv2d / thor_gemm (median): {ratio:.2f}x; "
          f"thor_gemm / momentum: {med['thor_gemm'] / med['momentum']:.2f}x")


if __name__ == "__main__":
    main()

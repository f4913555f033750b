"""The zoo's CPU convolutions: ResNet training step and forward pass with ``nn.Conv2d`` vs ``GemmConv2d``.

Two copies of the same ResNet (same weights), one built with ``conv_impl="native"`` (MindSpore's
``nn.Conv2d``), one with ``conv_impl="gemm"`` (im2col + GEMM, ``model_zoo/resnet/src/conv.py``), each as a
plain SGD training step and as a train-mode forward pass, timed interleaved every repeat; a twin of the
native step gives the noise floor. Reported: medians and the median of the per-repeat ratios (quartiles).

Usage: python bench/bench_conv.py [--modes graph pynative] [--widths 16 32] [--pynative_widths 16] [--repeats 8]
[--quick]
Writes bench/results/conv.{md,json}.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402
from mindspore import Tensor, nn  # noqa: E402

from bench.common import load_average, page_footer, paired_ratio, write_results  # noqa: E402


def _net(impl: str, width: int, classes: int):
    from model_zoo.resnet.src.resnet import init_weight, resnet18

    ms.set_seed(0)
    return init_weight(resnet18(class_num=classes, base_width=width, conv_impl=impl), seed=1)


def run(mode: str, width: int, repeats: int, batch: int, size: int, classes: int = 10) -> dict:
    from ms_boost import build_train_network

    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    cells = {}
    for impl in ("native", "gemm"):
        net = _net(impl, width, classes)
        cells[f"{impl} step"] = build_train_network(net, nn.SGD(net.trainable_params(), 0.01), loss, level="O0")
        cells[f"{impl} forward"] = nn.WithLossCell(_net(impl, width, classes), loss)
    twin = _net("native", width, classes)
    cells["native step (twin)"] = build_train_network(twin, nn.SGD(twin.trainable_params(), 0.01), loss, level="O0")
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((batch, 3, size, size)).astype(np.float32))
    y = Tensor(rng.integers(0, classes, batch).astype(np.int32))
    for cell in cells.values():
        cell.set_train(True)
        cell(x, y).asnumpy()  # compile / warm up
    times = {name: [] for name in cells}
    for _ in range(repeats):
        for name, cell in cells.items():  # interleaved: load drift hits every contender alike
            start = time.perf_counter()
            cell(x, y).asnumpy()
            times[name].append(time.perf_counter() - start)

    return {"mode": mode, "width": width, "batch": batch, "size": size, "repeats": repeats,
            "weights": sum(int(p.size) for p in twin.trainable_params()),
            "median_ms": {name: 1e3 * statistics.median(t) for name, t in times.items()},
            "step_speedup": paired_ratio(times, "native step", "gemm step"),
            "forward_speedup": paired_ratio(times, "native forward", "gemm forward"),
            "noise": paired_ratio(times, "native step (twin)", "native step")}


def render(runs, load_before) -> str:
    lines = ["# CPU convolutions: `nn.Conv2d` vs the zoo's `GemmConv2d`", "",
             "ResNet-18 (the zoo's), random batch, plain SGD training step and train-mode forward pass, native "
             "and GEMM convolutions interleaved every repeat. *Speed-up* = median over repeats of native time / "
             "GEMM time (quartiles in brackets); *noise floor* = a twin native step / the native step. Why: "
             "MindSpore 2.10 hands CPU `Conv2D` to oneDNN's `jit_uni_ncsp` kernel (see "
             "[docs/model_zoo.md](../../docs/model_zoo.md#convolutions-on-cpu-conv_impl)).", "",
             "| mode | base width | weights | batch x size | native step | GEMM step | step speed-up | native forward "
             "| GEMM forward | forward speed-up | noise floor |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        m = r["median_ms"]
        s, f, n = r["step_speedup"], r["forward_speedup"], r["noise"]
        lines.append(f"| {r['mode']} | {r['width']} | {r['weights']:,} | {r['batch']} x {r['size']} px | "
                     f"{m['native step']:.0f} ms | {m['gemm step']:.0f} ms | **{s['median']:.2f}x** "
                     f"[{s['quartiles'][0]:.2f}, {s['quartiles'][1]:.2f}] | {m['native forward']:.0f} ms | "
                     f"{m['gemm forward']:.0f} ms | {f['median']:.2f}x | {n['median']:.2f} |")
    return "\n".join(lines + page_footer("python bench/bench_conv.py", load_before))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", nargs="+", choices=["graph", "pynative"], default=["graph", "pynative"])
    parser.add_argument("--widths", type=int, nargs="+", default=[16, 32])
    parser.add_argument("--pynative_widths", type=int, nargs="+", default=[16],
                        help="PyNative's native width-32 step takes seconds; width 16 only by default")
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--quick", action="store_true", help="width 16, 3 repeats")
    args = parser.parse_args(argv)
    if args.quick:
        args.widths, args.pynative_widths, args.repeats = [16], [16], 3
    load_before = load_average()
    runs = []
    for mode in args.modes:
        for width in (args.widths if mode == "graph" else args.pynative_widths):
            runs.append(run(mode, width, args.repeats, args.batch, args.size))
            print(f"[bench_conv] {runs[-1]}", flush=True)
    write_results("conv", {"runs": runs, "load_before": load_before}, render(runs, load_before))


if __name__ == "__main__":
    main()

"""Gradient centralization's cost by the way it is written: the 12 convolution kernels of the zoo's ResNet-10.

Each form centres the 12 kernel gradients of the GEMM ResNet-10 of ``bench/bench_o1_parts.py`` (width 8: shapes
from ``(8, 3, 7, 7)`` to ``(64, 64, 3, 3)``, 77,000 values) inside one compiled cell, whose outputs then pass
through one cheap operation each, as they pass into the optimizer's update in a train step. The baseline cell
does only that operation; a form's cost is its cell's process CPU time per call minus the baseline's, paired per
round (the cells alternate in rotating order, ``--calls`` calls a turn), so that the shared CPU's drift hits each
alike. Every form is checked against a numpy reference before it is timed.

Forms: the previous one (a mean over axes 1..r-1 of the 4-D gradient, a broadcast subtraction), ms_boost's
(:func:`ms_boost.grad_process.centralize_gradient`: the same on the gradient seen as a ``(C_out, n)`` matrix),
a sum times ``1/n``, the mean as a product with a ``(n, 1)`` column of ``1/n``, and one fused computation over
all kernels at once in one flat buffer (:mod:`ms_boost.flat_buffers`: flatten and concatenate, one segment sum
for every output channel's sum, one gather to spread the means back, one subtraction, the buffer cut back into
the kernels); the flat buffer's concatenation and cutting alone are timed too, as the floor of any form that works
on one flat buffer.

Usage::

    python bench/bench_gc_forms.py [--rounds 40] [--calls 40] [--threads 0] [--mode graph|pynative]
"""
from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mindspore as ms  # noqa: E402
from mindspore import Tensor, nn, ops  # noqa: E402

from bench.common import load_average, page_footer, quartiles_of, write_results  # noqa: E402
from ms_boost.flat_buffers import flat_layout, flatten_tensors, split_flat  # noqa: E402
from ms_boost.grad_process import centralize_gradient  # noqa: E402

#: the convolution kernels of the zoo's ResNet-10 at width 8 (the ones O1 centres; its FN head's weight is not)
SHAPES = [(8, 3, 7, 7), (8, 8, 3, 3), (8, 8, 3, 3), (16, 8, 3, 3), (16, 16, 3, 3), (16, 8, 1, 1), (32, 16, 3, 3),
          (32, 32, 3, 3), (32, 16, 1, 1), (64, 32, 3, 3), (64, 64, 3, 3), (64, 32, 1, 1)]
MAP = ops.HyperMap()
_after = ops.MultitypeFuncGraph("gc_forms_after")
_previous = ops.MultitypeFuncGraph("gc_forms_previous")
_ours = ops.MultitypeFuncGraph("gc_forms_ours")
_sum_scaled = ops.MultitypeFuncGraph("gc_forms_sum_scaled")
_matmul = ops.MultitypeFuncGraph("gc_forms_matmul")


@_after.register("Tensor")
def _after_one(grad):
    return grad * 1.0


@_previous.register("Tensor")
def _previous_one(grad):
    return grad - grad.mean(axis=tuple(range(1, len(grad.shape))), keep_dims=True)


@_ours.register("Tensor")
def _ours_one(grad):
    return centralize_gradient(grad)


@_sum_scaled.register("Tensor", "Number")
def _sum_scaled_one(grad, inverse):
    rows = grad.reshape(grad.shape[0], -1)
    return (rows - rows.sum(axis=1, keepdims=True) * inverse).reshape(grad.shape)


@_matmul.register("Tensor", "Tensor")
def _matmul_one(grad, column):
    rows = grad.reshape(grad.shape[0], -1)
    return (rows - ops.matmul(rows, column)).reshape(grad.shape)


class Baseline(nn.Cell):
    """Only the operation every form's outputs pass through."""

    def construct(self, *grads):
        return MAP(_after, grads)


class PerKernel(nn.Cell):
    """A form applied to each kernel (a HyperMap over the tuple, as the optimizer's)."""

    def __init__(self, form, extra=None):
        super().__init__()
        self.form, self.extra = form, extra

    def construct(self, *grads):
        if self.extra is None:
            return MAP(_after, MAP(self.form, grads))
        return MAP(_after, MAP(self.form, grads, self.extra))


class Fused(nn.Cell):
    """All kernels at once in one flat buffer; ``centre=False`` keeps only the concatenation and the split."""

    def __init__(self, centre: bool = True):
        super().__init__()
        self.centre = centre
        self.layout = flat_layout(SHAPES)
        counts = [int(np.prod(s[1:])) for s in SHAPES]
        self.rows = sum(s[0] for s in SHAPES)
        self.ids = Tensor(np.repeat(np.arange(self.rows), np.repeat(counts, [s[0] for s in SHAPES])).astype(np.int32))
        self.inverse = Tensor(np.repeat([1.0 / c for c in counts], [s[0] for s in SHAPES]).astype(np.float32))

    def construct(self, *grads):
        flat = flatten_tensors(grads)
        if self.centre:
            means = ops.unsorted_segment_sum(flat, self.ids, self.rows) * self.inverse
            flat = flat - ops.gather(means, self.ids, 0)
        return MAP(_after, split_flat(flat, self.layout))


def forms() -> dict:
    """name -> (cell, operations per kernel, whether it centres)."""
    inverses = tuple(1.0 / float(np.prod(s[1:])) for s in SHAPES)
    columns = tuple(Tensor(np.full((int(np.prod(s[1:])), 1), 1.0 / np.prod(s[1:]), np.float32)) for s in SHAPES)
    return {
        "baseline (no gc)": (Baseline(), "0", False),
        "4-D mean, broadcast Sub (previous)": (PerKernel(_previous), "2", True),
        "2-D mean, Sub (ms_boost)": (PerKernel(_ours), "2 (+2 Reshape)", True),
        "2-D sum x 1/n, Sub": (PerKernel(_sum_scaled, inverses), "3 (+2 Reshape)", True),
        "2-D MatMul by a 1/n column, Sub": (PerKernel(_matmul, columns), "2 (+2 Reshape)", True),
        "fused: flat buffer, segment sum, gather, Sub, cut": (Fused(), "1 slice (+4 in all)", True),
        "fused: flat buffer and cut only (no centring)": (Fused(centre=False), "1 slice (+1 in all)", False),
    }


def reference(grad: np.ndarray) -> np.ndarray:
    """Gradient centralization in numpy: the mean over every axis but the first, subtracted."""
    return grad - grad.reshape(grad.shape[0], -1).mean(axis=1).reshape((-1,) + (1,) * (grad.ndim - 1))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--calls", type=int, default=40, help="calls of a cell per turn")
    parser.add_argument("--threads", type=int, default=0, help="MindSpore's CPU kernel threads (0: its default)")
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph",
                        help="pynative: each cell's construct runs as one ms.jit graph, as the optimizers' do")
    args = parser.parse_args(argv)
    ms.set_context(mode=ms.GRAPH_MODE if args.mode == "graph" else ms.PYNATIVE_MODE)
    if args.threads > 0:
        from mindspore.device_context.cpu.op_tuning import threads_num

        threads_num(args.threads)
    load_before = load_average()
    rng = np.random.default_rng(0)
    grads = tuple(Tensor(rng.standard_normal(s).astype(np.float32) + 0.5) for s in SHAPES)
    cells = forms()
    calls = {}
    for name, (cell, _, centres) in cells.items():
        run = ms.jit(cell.construct) if args.mode == "pynative" else cell
        calls[name] = run
        out = run(*grads)
        for got, grad in zip(out, grads):
            want = reference(grad.asnumpy()) if centres else grad.asnumpy()
            np.testing.assert_allclose(got.asnumpy(), want, rtol=1e-5, atol=1e-5, err_msg=name)
    names = list(cells)
    cpu = {name: [] for name in names}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start = time.process_time()
            for _ in range(args.calls):
                out = calls[name](*grads)
            out[0].asnumpy()
            cpu[name].append(1e6 * (time.process_time() - start) / args.calls)
    base = np.asarray(cpu[names[0]])
    previous = np.asarray(cpu[names[1]]) - base
    rows = {}
    for name in names:
        extra = np.asarray(cpu[name]) - base
        rows[name] = {"call_us": float(np.median(cpu[name])), "extra_us": float(np.median(extra)),
                      "extra_quartiles": quartiles_of(extra),
                      "extra_over_previous": float(np.median(extra) / np.median(previous))}
    threads = "MindSpore's default kernel threads" if args.threads <= 0 else f"{args.threads} kernel thread(s)"
    mode_name = "Graph" if args.mode == "graph" else "PyNative (ms.jit)"
    lines = [f"# Gradient centralization's forms ({mode_name}, CPU, {threads})", "",
             "Written by `bench/bench_gc_forms.py`: the 12 convolution kernel gradients of the zoo's GEMM ResNet-10 "
             f"(width 8) centred in one compiled cell, {args.rounds} rounds of {args.calls} calls a cell, the cells "
             "alternating; process CPU time per call, extra over the baseline cell paired per round.", "",
             "| form | operations per kernel | CPU per call (us) | extra over baseline (us, median [IQR]) | "
             "extra / previous form's |", "|---|---|---|---|---|"]
    for name, (_, ops_per_kernel, _) in cells.items():
        row = rows[name]
        q = row["extra_quartiles"]
        lines.append(f"| {name} | {ops_per_kernel} | {row['call_us']:.0f} | {row['extra_us']:.0f} "
                     f"[{q[0]:.0f}, {q[1]:.0f}] | {row['extra_over_previous']:.2f} |")
    command = shlex.join(["python", "bench/bench_gc_forms.py"] + list(argv if argv is not None else sys.argv[1:]))
    lines += page_footer(command, load_before)
    page = "gc_forms" + ("" if args.mode == "graph" else "_pynative") + (f"_threads{args.threads}"
                                                                        if args.threads > 0 else "")
    write_results(page, {"args": vars(args), "rows": rows, "cpu_us": cpu}, "\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""THOR's step between refreshes on the time-to-accuracy page's gemm network: kernels launched and CPU time (issue 27).

The page's ``gemm`` cell (``bench/bench_tta.py``: the zoo's ResNet-10 width 8 on GEMM convolutions, 16 px, batch 32,
block size 64, frequency 10; its own builders), Graph mode, CPU, one fixed random batch. Several THOR train cells
differing only in :attr:`ms_boost.thor.THOR.dense_inverse_blocks` (0: every factor of several blocks multiplied as
blocks; n: the factors of 2..n blocks through their written-out block-diagonal inverse) and Momentum's are built in
one process and called alternately step by step, so all see the same machine load; reported: the median CPU time of
the process (all threads) per step, for THOR's plain steps and refresh steps, and their ratio to Momentum's.

``--profile NAME`` instead runs MindSpore's CPU profiler over 10 plain steps of one cell (``momentum`` or
``thor:<dense blocks>``) in this process and prints the kernels launched per step by type (one process per cell:
the profiler's tables are per process).

``--net bench`` times bench_thor.py's step-time network instead (the zoo's ResNet-18 width 16, 32 px, batch 32, block
size 64, its THOR settings). ``--block_sizes 32 64`` builds one THOR cell per (dense setting, block size)
(``thor:<dense blocks>:<block size>``; without it, block size 64).

Usage::

    python bench/thor_plain_kernels.py --dense 0 4 --rounds 60
    python bench/thor_plain_kernels.py --profile thor:4 --out /tmp/prof_thor4
    python bench/thor_plain_kernels.py --dense 5 --block_sizes 32 64 --rounds 60
    python bench/thor_plain_kernels.py --net bench --dense 5 --trust step off --rounds 60
"""
from __future__ import annotations

import argparse
import csv
import glob
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


NET = {"name": "tta"}  # which network: the page's ("tta") or bench_thor.py's step-time ResNet-18 ("bench")


def build(name: str, frequency: int):
    """The train cell of ``momentum`` or ``thor:<dense blocks>[:<block size>]`` (the page's network, or
    bench_thor.py's)."""
    import mindspore as ms

    from ms_boost.thor import THOR

    contender, block_size, trust = "baseline", 64, "step"
    if name.startswith("thor:"):
        parts = name.split(":")
        THOR.dense_inverse_blocks = int(parts[1])  # read when the optimizer is built
        block_size = int(parts[2]) if len(parts) > 2 else 64
        trust = parts[3] if len(parts) > 3 else "step"
        contender = "THOR"
    if NET["name"] == "bench":
        return _build_bench(contender, frequency, block_size, trust)
    if trust != "step":
        raise SystemExit("--trust: with --net bench only")
    from bench.bench_tta import RunSpec, _model, build_network

    ms.set_seed(0)
    spec = RunSpec(dataset="digits", net="gemm", contender=contender, lr=0.01, seed=0, epochs=200, image_size=16,
                   width=8, frequency=frequency, extra={"block_size": block_size} if contender == "THOR" else {})
    net = build_network(spec, 10)
    cell = _model(spec, net, 50)._train_network
    cell.set_train(True)
    return cell


def _build_bench(contender: str, frequency: int, block_size: int = 64, trust: str = "step"):
    """bench_thor.py's step-time cell: the zoo's ResNet-18 width 16, 20 classes, its THOR settings (``trust``:
    ``step``, the trust region every step, as thor()'s default; ``off``: kl_clip=0)."""
    from bench.bench_thor import build as build_bench

    args = argparse.Namespace(classes=20, width=16, epochs=8, momentum_lr=0.1, thor_lr=0.1, damping=0.3,
                              weight_decay=1e-4, block_size=block_size)
    kind = "momentum" if contender == "baseline" else f"thor_{frequency}" + {"step": "", "off": "_k0"}[trust]
    cell = build_bench(kind, args, 0, 1000, (2, 2, 2, 2), 16)[2].train_network
    cell.set_train(True)
    return cell


def _batch():
    from mindspore import Tensor

    rng = np.random.default_rng(0)
    size, classes = (32, 20) if NET["name"] == "bench" else (16, 10)
    return (Tensor(rng.standard_normal((32, 3, size, size)).astype(np.float32)),
            Tensor(rng.integers(0, classes, 32).astype(np.int32)))


def profile(name: str, out: str) -> None:
    """Kernels per plain step of one cell, by type, from MindSpore's CPU profiler."""
    from mindspore import Profiler

    x, y = _batch()
    cell = build(name, frequency=1000)  # step 0 refreshes, every later step is a plain one
    for _ in range(3):
        cell(x, y).asnumpy()
    prof = Profiler(output_path=out)
    for _ in range(10):
        cell(x, y).asnumpy()
    prof.analyse()
    table = sorted(glob.glob(os.path.join(out, "*", "FRAMEWORK", "cpu_op_type_info_0.csv")))[-1]
    with open(table, encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    counts = {r["op_type"]: int(r["type_occurrences"]) / 10 for r in rows}
    times = {r["op_type"]: float(r["total_compute_time"]) / 10 for r in rows}
    print(f"{name}: {sum(counts.values()):.0f} kernels per step, {sum(times.values()):.2f} ms of kernel time")
    for op in sorted(counts, key=lambda k: -counts[k]):
        print(f"  {op:28s} {counts[op]:6.1f} {times[op]:8.3f} ms")


def alternate(dense: list, rounds: int, frequency: int, block_sizes: tuple = (), trusts: tuple = ()) -> None:
    """CPU time per step of Momentum and THOR (one cell per dense setting, block size and trust-region setting),
    called alternately."""
    x, y = _batch()
    cells = {}
    thor_names = [f"thor:{d}:{b}" for d in dense for b in block_sizes] if block_sizes else [f"thor:{d}" for d in dense]
    if trusts:
        thor_names = [f"{n}{'' if n.count(':') > 1 else ':64'}:{t}" for n in thor_names for t in trusts]
    for name in ["momentum"] + thor_names:
        cell = build(name, frequency)
        start = time.process_time()
        cell(x, y).asnumpy()
        cell(x, y).asnumpy()
        print(f"{name}: first two calls {time.process_time() - start:.1f} CPU-s", flush=True)
        cells[name] = cell
    times: dict = {}
    for i in range(rounds):
        order = list(cells.items()) if i % 2 else list(cells.items())[::-1]
        for name, cell in order:
            key = name
            if name != "momentum":
                step = int(cell.optimizer.global_step.asnumpy().reshape(-1)[0])
                key = (name, "refresh" if step % frequency == 0 else "plain")
            start = time.process_time()
            cell(x, y).asnumpy()
            times.setdefault(key, []).append(time.process_time() - start)
    base = float(np.median(times["momentum"])) * 1e3
    print(f"Momentum {base:.2f} ms CPU per step")
    for name in thor_names:
        plain = float(np.median(times[(name, "plain")])) * 1e3
        refresh = float(np.median(times[(name, "refresh")])) * 1e3
        first = thor_names[0]  # paired: the same rounds' plain (refresh) steps of the first THOR cell
        paired = [float(np.median(np.array(times[(name, k)]) / np.array(times[(first, k)])))
                  for k in ("plain", "refresh")]
        print(f"THOR {name}: plain {plain:.2f} ms ({plain / base:.3f}x), refresh {refresh:.2f} ms "
              f"({refresh / base:.2f}x), amortized at {frequency} "
              f"{((frequency - 1) * plain + refresh) / frequency / base:.3f}x; paired to {first}: plain "
              f"{paired[0]:.3f}x, refresh {paired[1]:.3f}x")
    print("load", " ".join(open("/proc/loadavg", encoding="utf-8").read().split()[:3]))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--dense", type=int, nargs="+", default=[0, 5], help="dense_inverse_blocks of each THOR cell")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--frequency", type=int, default=10)
    parser.add_argument("--profile", default="", help="momentum or thor:<dense blocks>: profile this cell only")
    parser.add_argument("--out", default="/tmp/thor_plain_kernels_profile")
    parser.add_argument("--block_sizes", type=int, nargs="*", default=[],
                        help="THOR block sizes: one cell per dense setting and size (default: 64 only)")
    parser.add_argument("--net", choices=("tta", "bench"), default="tta",
                        help="tta: the page's gemm network; bench: bench_thor.py's step-time ResNet-18 width 16, 32 px")
    parser.add_argument("--trust", nargs="*", default=[], choices=("step", "off"),
                        help="with --net bench: one THOR cell per trust-region setting (step: thor()'s kl_clip, "
                             "off: kl_clip=0)")
    args = parser.parse_args(argv)
    if not args.profile and (args.frequency < 1 or args.rounds < args.frequency):
        parser.error(f"--rounds {args.rounds} must be at least --frequency {args.frequency} (>= 1): the timed rounds "
                     f"must hold a refresh step of every THOR cell")
    NET["name"] = args.net
    import mindspore as ms

    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    if args.profile:
        profile(args.profile, args.out)
    else:
        alternate(args.dense, args.rounds, args.frequency, tuple(args.block_sizes), tuple(args.trust))


if __name__ == "__main__":
    main()

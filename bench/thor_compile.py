"""Compile time of THOR's train step variants, each compiled in its own process (issue 27).

The benchmark's step-time network (``bench/bench_thor.py``: zoo ResNet-18 width 16, batch 32, 32 px, Graph mode,
CPU) is built in a fresh process and one train step compiled by its first call: Momentum's, THOR's refresh
variant (capture + refresh), THOR's plain variant (the state set so that the first step is a plain one), the
variant that captures without refreshing (``capture``), the graph with the device-side switches (``switch``), or
THOR's optimizer step alone on fixed gradients, refresh included (``optimizer``: the refresh path's compile without
the network's, a smaller and so less noisy figure for changes inside the optimizer).
Reported: the CPU seconds of the process (all threads) in that first call less those of a later call of the same
compiled graph (the step itself), and the wall seconds likewise. ``--child KIND --profile`` prints MindSpore's
compile profile (seconds per frontend action and pass).

``--trees A B`` compares code trees (e.g. ``/work/main`` and a worktree): every (kind, tree) pair runs in its own
process, trees alternating within each repeat so that both see the same machine load; the table gives the medians
and the load average before and after. ``--env NAME=VALUE`` runs a second set of processes with that environment
(e.g. a compile option) alongside the plain one.

Usage::

    python bench/thor_compile.py [--kinds momentum refresh plain] [--trees . /work/main] [--repeats 3]
    python bench/thor_compile.py --child refresh        # one measurement in this process, one JSON line
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("momentum", "refresh", "plain", "capture", "switch", "optimizer")


def child(kind: str, args) -> dict:
    """Build the network in this process, compile ``kind`` by its first call; CPU / wall seconds of the compile."""
    import functools

    import mindspore as ms
    import numpy as np
    from mindspore import Tensor, nn, ops

    from model_zoo.resnet.src.resnet import BasicBlock, ResNet
    from ms_boost import Model
    from ms_boost.thor import ConvertModelUtils, thor

    if args.profile:  # MindSpore's compile profile (time per frontend action and pass), printed at each compile
        from mindspore.graph._parse import compile_config
        compile_config.COMPILE_PROFILE = "1"
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    if args.jit_level:
        ms.set_context(jit_config={"jit_level": args.jit_level})
    ms.set_seed(0)
    net = ResNet(BasicBlock, tuple(args.blocks), class_num=20, base_width=args.width)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    if kind == "momentum":
        opt = nn.Momentum(net.trainable_params(), 0.1, 0.9, weight_decay=1e-4)
        model = Model(net, loss, opt)
    else:
        opt = thor(net, 0.1, 0.3, 0.9, 1e-4, frequency=10, decay_filter=lambda p: p.ndim > 1,
                   block_size=args.block_size)
        model = ConvertModelUtils().convert_to_thor_model(Model(net, loss, opt), net, loss, opt)
    cell = model.train_network
    cell.set_train()
    call = functools.partial(nn.Cell.__call__, cell) if kind == "switch" else cell
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((args.batch, 3, args.size, args.size)).astype(np.float32))
    y = Tensor(rng.integers(0, 20, args.batch).astype(np.int32))
    if kind == "optimizer":  # the optimizer alone: fixed gradients, every call refreshes (device-side switch)
        grads = tuple(Tensor(np.full(p.shape, 1e-3, np.float32)) for p in opt.parameters)

        def call(*_):
            ops.assign(opt.refresh_next, Tensor(True, ms.bool_))
            return opt(grads)

    def plain_next(capture=False):  # the next step between refreshes: initialised, step 1, capture or not
        ops.assign(opt.thor_initialised, Tensor(True, ms.bool_))
        ops.assign(opt.global_step, Tensor(np.array([1], np.int32)))
        for flag in opt.capture_flags:
            ops.assign(flag, Tensor(capture, ms.bool_))

    def refresh_next():  # the next step captures and refreshes
        ops.assign(opt.global_step, Tensor(np.array([10], np.int32)))
        for flag in opt.capture_flags:
            ops.assign(flag, Tensor(True, ms.bool_))

    def timed():
        start, cpu = time.perf_counter(), time.process_time()
        out = call(x, y)
        (out[0] if isinstance(out, tuple) else out).asnumpy()
        return time.process_time() - cpu, time.perf_counter() - start

    prepare = {"plain": plain_next, "refresh": refresh_next, "capture": lambda: plain_next(True)}.get(
        kind, lambda: None)
    prepare()
    first = timed()
    steps = []
    for _ in range(3):
        prepare()
        steps.append(timed())
    step_cpu = statistics.median(s[0] for s in steps)
    step_wall = statistics.median(s[1] for s in steps)
    return {"kind": kind, "compile_cpu_s": first[0] - step_cpu, "compile_wall_s": first[1] - step_wall,
            "step_cpu_s": step_cpu, "step_wall_s": step_wall}


def _run_child(kind: str, tree: Path, extra_env: dict, args) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), **extra_env)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", kind, "--blocks", *map(str, args.blocks),
           "--width", str(args.width), "--batch", str(args.batch), "--size", str(args.size),
           "--block_size", str(args.block_size)] + (["--jit_level", args.jit_level] if args.jit_level else [])
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        raise RuntimeError(f"{kind} in {tree} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", choices=KINDS, help="measure this kind in this process (one JSON line)")
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=["momentum", "refresh", "plain"])
    parser.add_argument("--trees", nargs="+", default=[str(ROOT)], help="code trees to compare (PYTHONPATH of each)")
    parser.add_argument("--env", nargs="*", default=[], help="NAME=VALUE: also measured with this environment")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--blocks", type=int, nargs=4, default=[2, 2, 2, 2])
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--block_size", type=int, default=128)
    parser.add_argument("--profile", action="store_true", help="with --child: print MindSpore's compile profile")
    parser.add_argument("--jit_level", default="", help="compile with this jit_config jit_level (O0, O1; '': default)")
    args = parser.parse_args(argv)
    if args.child:
        sys.path.insert(0, os.getcwd())
        print(json.dumps(child(args.child, args)), flush=True)
        return
    envs = [("", {})] + [(e, dict([e.split("=", 1)])) for e in args.env]
    setups = [(Path(t).resolve(), label, env) for t in args.trees for label, env in envs]
    results: dict = {}
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    for repeat in range(args.repeats):
        for kind in args.kinds:
            order = setups if repeat % 2 == 0 else setups[::-1]
            for tree, label, env in order:
                out = _run_child(kind, tree, env, args)
                results.setdefault((kind, str(tree), label), []).append(out)
                print(f"{kind:8s} {tree} {label}: compile {out['compile_cpu_s']:.1f} CPU-s "
                      f"({out['compile_wall_s']:.1f} s wall), step {out['step_cpu_s'] * 1e3:.0f} ms CPU; "
                      f"load {Path('/proc/loadavg').read_text().split()[0]}", flush=True)
    load_after = Path("/proc/loadavg").read_text().split()[:3]
    print(f"\nload average before {' '.join(load_before)}, after {' '.join(load_after)}")
    print("| kind | tree | env | compile CPU-s (median; all) | wall s | step CPU ms |")
    print("|---|---|---|---|---|---|")
    for (kind, tree, label), outs in results.items():
        cpu = [o["compile_cpu_s"] for o in outs]
        runs = ", ".join(f"{c:.1f}" for c in cpu)
        print(f"| {kind} | {tree} | {label or '-'} | {statistics.median(cpu):.1f} ({runs})"
              f" | {statistics.median(o['compile_wall_s'] for o in outs):.1f}"
              f" | {statistics.median(o['step_cpu_s'] for o in outs) * 1e3:.0f} |")


if __name__ == "__main__":
    main()

"""Does reading the trial's batches beside its first compile slow that compile? Paired in one process.

The autotune trial compiles its first probe's step while a background thread (``TrialBatches``) reads the rest of
the batches a progress window could use. This bench compiles the same train step (a fresh ResNet-10 O0 step each
time: a new Cell compiles anew) again and again in **one process**, the ways of reading alternating round by round
(the order rotated each round), so that every way meets the same machine:

* ``alone``: the batches read first, no data iterator alive during the compile (the trial reading three batches);
* ``open``: an iterator that read three batches stays open during the compile, unread (a fixed run's: its
  pipeline prefetches while the first step compiles);
* ``reader``: ``TrialBatches(dataset, 2, 47, ready=3)`` made and started just before the compile, its background
  thread reading the other 44 batches while it runs (the trial's way on a 940-step run before this bench's round:
  the reader started with the first probe), closed after.

Per compile: wall, the process's CPU, the main thread's CPU (wall minus it: the main thread not running), and the
CPU of the other threads (the reader and the pipeline's), with the paired differences against ``alone``.

``python bench/autotune_compile_contention.py [--cell generated/gemm] [--rounds 4] [--out NAME]`` writes
``bench/results/<out>.{json,md}``; ``--cells a,b`` runs each cell in its own process, one after the other.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TAG = "CONTENTION "
WAYS = ("alone", "open", "reader")


def measure(cell_key: str, rounds: int, seed: int) -> Dict[str, List[List[float]]]:
    """``{way: [[wall, process CPU, main-thread CPU], ...]}`` over ``rounds`` rounds (one compile per way a round)."""
    import mindspore as ms
    import mindspore.dataset as ds
    from mindspore import nn

    from bench.autotune_phases import cell_of
    from bench.bench_tta import RunSpec, build_network
    from bench.tta_autotune import data_root
    from model_zoo.resnet.src.dataset import class_folders, create_dataset
    from ms_boost import build_train_network
    from ms_boost.autotune.cells import TrialBatches, _release, take_batches

    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(seed)
    ds.config.set_seed(seed)
    cell = cell_of(cell_key, "long")
    root = data_root(cell.dataset, cell.train, cell.classes)
    train = create_dataset(root / "train", do_train=True, batch_size=32, image_size=16, num_parallel_workers=2,
                           crop_scale=(0.6, 1.0), seed=seed, hflip=False)
    classes = class_folders(root / "train")
    spec = RunSpec(dataset=cell.dataset, net=cell.net, contender="ms_boost O0", lr=cell.lr, seed=seed,
                   epochs=cell.epochs, image_size=16, width=cell.width)
    out: Dict[str, List[List[float]]] = {w: [] for w in WAYS}
    for r in range(-1, rounds):  # round -1: one compile not recorded (the process's first pays one-time set-up)
        for way in (("alone",) if r < 0 else WAYS[r % len(WAYS):] + WAYS[:r % len(WAYS)]):
            net = build_network(spec, len(classes))
            opt = nn.Momentum(net.trainable_params(), 0.01, 0.9)
            step = build_train_network(net, opt, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
            source, iterator = None, None
            if way == "alone":
                batch = take_batches(train, 3)[0]
            elif way == "open":
                iterator = train.create_tuple_iterator(num_epochs=1, output_numpy=True)
                rows = iter(iterator)
                batch = [next(rows) for _ in range(3)][0]
                batch = tuple(ms.Tensor(np.asarray(c)) for c in batch)
            else:
                source = TrialBatches(train, 2, 47, ready=3)
                source.start()  # the reader beside the compile (the trial starts it only for a second probe)
                batch = source[0]
            wall, cpu, main = time.perf_counter(), time.process_time(), time.thread_time()
            step.set_train(True)
            step(*batch).asnumpy()
            got = [time.perf_counter() - wall, time.process_time() - cpu, time.thread_time() - main]
            if source is not None:
                got.append(float(source.read))  # batches the reader had read by the compile's end
                source.close()
            if iterator is not None:
                _release(iterator)
            if r >= 0:
                out[way].append(got)
            print(f"[contention] round {r} {way}: {got}", file=sys.stderr, flush=True)
    return out


def render(payload: dict) -> str:
    """The page: per cell, each way's compile (median [min, max] over the rounds) and its paired gap to ``alone``."""
    from bench.common import median_range, page_footer

    command = (f"python bench/autotune_compile_contention.py --cells {','.join(payload['cells'])} --rounds "
               f"{payload['rounds']}")
    lines = ["# Autotune: the first compile beside the trial's batch reader (paired, one process)", "",
             f"Written by `{command}`: per cell one process compiling a fresh ResNet-10 O0 train step once per way "
             "and round after one unrecorded compile, the ways alternating (order rotated each round). `alone`: no "
             "data iterator alive during "
             "the compile; `open`: an iterator that read 3 batches open and unread (a fixed run's first step); "
             "`reader`: the trial's `TrialBatches(dataset, 2, 47, ready=3)`, its thread reading 44 batches "
             "during the compile. Other threads = process CPU minus main-thread CPU; waiting = wall minus "
             "main-thread CPU.", "",
             f"Load average (1/5/15 min) before: {payload['load_before']}; after: {payload['load_after']}.", "",
             "| cell | way | compile wall s | process CPU s | main-thread CPU s | other threads' CPU s | main thread "
             "waiting s | wall minus `alone`'s, paired | main waiting minus `alone`'s, paired |",
             "|---|---|---|---|---|---|---|---|---|"]
    for key, runs in payload["results"].items():
        base = runs["alone"]
        for way in WAYS:
            got = runs[way]
            lines.append(
                f"| {key} | {way} | {median_range([g[0] for g in got], 2)} | {median_range([g[1] for g in got], 2)} "
                f"| {median_range([g[2] for g in got], 2)} | {median_range([g[1] - g[2] for g in got], 2)} | "
                f"{median_range([g[0] - g[2] for g in got], 2)} | "
                f"{median_range([g[0] - b[0] for g, b in zip(got, base)], 2)} | "
                f"{median_range([(g[0] - g[2]) - (b[0] - b[2]) for g, b in zip(got, base)], 2)} |")
    return "\n".join(lines + page_footer(command, payload["load_before"]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="the first compile beside the trial's batch reader, paired")
    parser.add_argument("--cells", default="generated/gemm,digits/gemm")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="autotune_compile_contention")
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(TAG + json.dumps(measure(args.worker, args.rounds, args.seed)), flush=True)
        return 0
    from bench.autotune_phases import finish
    from bench.common import load_average

    cells = [c.strip() for c in args.cells.split(",") if c.strip()]
    payload = {"cells": cells, "rounds": args.rounds, "load_before": load_average(), "results": {}}
    env = dict(os.environ, GLOG_v="3", PYTHONPATH=str(ROOT))
    for key in cells:
        out = subprocess.run([sys.executable, __file__, f"--worker={key}", f"--rounds={args.rounds}",
                              f"--seed={args.seed}"], env=env, capture_output=True, text=True, check=True).stdout
        line = next(x for x in out.splitlines() if x.startswith(TAG))
        payload["results"][key] = json.loads(line[len(TAG):])
    finish(args.out, payload, render)
    return 0


if __name__ == "__main__":
    sys.exit(main())

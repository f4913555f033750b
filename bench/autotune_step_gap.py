"""Is an autotuned run's steady step slower than the same plan's fixed run? Paired, in one process.

One cell (default mnist5k/gemm with 3,000 training images, the long form's), seed by seed: in **one process** a
fixed Model of the plan auto picks (``--fixed``) and a ``boost_level="auto"`` Model, each on its own network (same
initial weights) and its own data pipeline. Auto's trial runs first (``Model.autotune``, planned over ``--epochs``);
then the two train **one epoch at a time, alternating** (the order swapped every epoch), so that each pair of epochs
shares the machine's conditions. Per epoch and Model: the median step's wall time and its CPU time (the process's,
all threads: only one Model trains at a time), each epoch's first step left out (a new data iterator's first batch,
and the fixed Model's compile). What the process holds after the trial -- live Cells, threads, resident memory -- is
recorded too. Then (``--rounds``) the two Models' train cells alone, with no data pipeline: the same 10 batches,
each cell in turn, round by round. ``--candidates O0,O1 --no-time-budget`` makes the trial probe (and compile) a
second plan that it then drops, the case where a dropped candidate's step could stay behind.

``python bench/autotune_step_gap.py [--cell mnist5k/gemm] [--train 3000] [--epochs 6] [--seeds 0 1 2]
[--candidates O0,O1] [--no-time-budget] [--rounds 30]`` writes ``bench/results/autotune_step_gap.{json,md}``
(``--out`` another stem). Each seed runs in its own process, one after the other.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.autotune_phases import TAG  # noqa: E402  (the workers' result line)

AUTO = "ms_boost auto"


def process_state() -> Dict[str, float]:
    """Live ``nn.Cell`` objects, threads and resident memory (MiB) of this process (Linux ``/proc``)."""
    from mindspore import nn

    from bench.common import rss_and_threads  # (MindSpore's import, in the worker only)

    rss, threads = rss_and_threads()
    return {"cells": float(nn.Cell.total_instance_count), "threads": float(threads), "rss_mib": rss}


def epoch_stats(walls: Sequence[float], cpus: Sequence[float]) -> Optional[List[float]]:
    """``[median wall, median CPU]`` of an epoch's steps, its first step left out (None: fewer than 2 steps)."""
    if len(walls) < 2:
        return None
    return [float(np.median(walls[1:])), float(np.median(cpus[1:]))]


def epoch_ratios(fixed: Sequence[Optional[List[float]]], auto: Sequence[Optional[List[float]]],
                  column: int) -> List[float]:
    """Per epoch, auto's statistic over the fixed Model's (``column`` 0 wall, 1 CPU), epochs both measured."""
    return [a[column] / f[column] for f, a in zip(fixed, auto) if f and a and f[column] > 0]


def measure(cell: str, train_images: int, epochs: int, seed: int, fixed_name: str, options: dict,
            rounds: int = 0) -> dict:
    """One seed, in this process: the trial, then ``epochs`` epochs of each Model, alternating; then ``rounds``
    rounds of :func:`time_cells` on the two Models' train cells."""
    import mindspore as ms
    import mindspore.dataset as ds
    from mindspore.train import Callback

    import bench.bench_tta as tta
    from bench.bench_tta import RunSpec, _model, build_network
    from bench.tta_autotune import data_root
    from model_zoo.resnet.src.dataset import class_folders, create_dataset

    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    tta.AUTOTUNE_OPTIONS.update(options)  # the auto Model's trial options (bench_tta builds it with these)
    dataset, net_name = cell.split("/")
    root = data_root(dataset, train_images)
    classes = class_folders(root / "train")
    models, data = {}, {}
    for name in (fixed_name, AUTO):
        ms.set_seed(seed)
        np.random.seed(seed)
        ds.config.set_seed(seed)
        data[name] = create_dataset(root / "train", do_train=True, batch_size=32, image_size=16,
                                    num_parallel_workers=2, crop_scale=(0.6, 1.0), seed=seed, hflip=False)
        steps = data[name].get_dataset_size()
        # the lr schedule covers the epochs and the cells' rounds (10 steps each) beyond them
        spec = RunSpec(dataset=dataset, net=net_name, contender=name, lr=0.1, seed=seed,
                       epochs=epochs + (-(-rounds * 10 // steps) if rounds else 0), image_size=16, width=8)
        models[name] = _model(spec, build_network(spec, len(classes)), steps)
    out: dict = {"state_before": process_state()}
    tick = time.perf_counter()
    report = models[AUTO].autotune(data[AUTO], epochs)
    out.update(trial_seconds=time.perf_counter() - tick, pick=report.pick,
               probed=[r.name for r in report.candidates if r.steps])
    out["state_after_trial"] = process_state()

    class Steps(Callback):
        def on_train_epoch_begin(self, run_context):
            self.walls, self.cpus = [], []

        def on_train_step_begin(self, run_context):
            self.t = (time.perf_counter(), time.process_time())

        def on_train_step_end(self, run_context):
            self.walls.append(time.perf_counter() - self.t[0])
            self.cpus.append(time.process_time() - self.t[1])

    stats: Dict[str, List[Optional[List[float]]]] = {fixed_name: [], AUTO: []}
    for epoch in range(epochs):
        order = (fixed_name, AUTO) if epoch % 2 == 0 else (AUTO, fixed_name)
        for name in order:
            timer = Steps()
            models[name].train(1, data[name], callbacks=[timer], dataset_sink_mode=False)
            stats[name].append(epoch_stats(timer.walls, timer.cpus))
    out["epochs"] = stats
    if rounds:
        out["cells"] = time_cells({name: model._train_network for name, model in models.items()}, data[fixed_name],
                                  rounds)
    out["state_end"] = process_state()
    return out


def time_cells(cells: Dict[str, object], dataset, rounds: int, batches: int = 10) -> Dict[str, List[List[float]]]:
    """The train cells alone, no data pipeline: ``batches`` batches read once, then ``rounds`` rounds in which each
    cell trains them all (the order swapped every round); per round and cell ``[median wall, median CPU]`` of a
    step (the step's output read back, so the step has finished)."""
    from mindspore import Tensor

    feed = []
    for row in dataset.create_tuple_iterator(num_epochs=1, output_numpy=True):
        feed.append(tuple(Tensor(np.asarray(col)) for col in row))
        if len(feed) >= batches:
            break
    names = list(cells)
    out: Dict[str, List[List[float]]] = {name: [] for name in names}
    for rnd in range(rounds):
        for name in names if rnd % 2 == 0 else names[::-1]:
            walls, cpus = [], []
            for batch in feed:
                t = (time.perf_counter(), time.process_time())
                loss = cells[name](*batch)
                (loss[0] if isinstance(loss, tuple) else loss).asnumpy()
                walls.append(time.perf_counter() - t[0])
                cpus.append(time.process_time() - t[1])
            out[name].append([float(np.median(walls)), float(np.median(cpus))])
    return out


def render(payload: dict) -> str:
    """The page: per seed and over the seeds, auto's median step over the fixed Model's, wall and CPU."""
    from bench.common import median_range, page_footer

    def ratios(values: Sequence[float]) -> str:
        return median_range(values, unit="x")


    fixed = payload["fixed"]
    lines = ["# Autotune: the steady step after the trial against the same plan's fixed run (paired, one process)",
             "", f"Written by `{payload['command']}`. Cell {payload['cell']} ({payload['train']} training images), "
             f"{payload['epochs']} epochs each, seeds {', '.join(str(s) for s in payload['seeds'])}; trial "
             f"options {payload['options'] or 'the defaults'}. "
             "In one process per seed: auto's trial, then the fixed Model and auto's alternating epoch by epoch "
             "(order swapped each epoch). Per epoch the median step, its first step left out; CPU is the "
             "process's (all threads), one Model training at a time.", "",
             f"Load average (1/5/15 min) before: {payload['load_before']}; after: {payload['load_after']}.", "",
             f"| seed | pick (probed) | trial s | auto / {fixed}: median step wall, median over epochs [min, max] | "
             "CPU | fixed ms (wall) | auto ms (wall) | Cells, threads, RSS MiB: before trial / after / end |",
             "|---|---|---|---|---|---|---|---|"]
    all_wall, all_cpu = [], []
    for seed, run in payload["runs"].items():
        wall = epoch_ratios(run["epochs"][fixed], run["epochs"][AUTO], 0)
        cpu = epoch_ratios(run["epochs"][fixed], run["epochs"][AUTO], 1)
        all_wall += wall
        all_cpu += cpu
        ms_fixed = np.median([e[0] for e in run["epochs"][fixed] if e]) * 1e3
        ms_auto = np.median([e[0] for e in run["epochs"][AUTO] if e]) * 1e3
        states = " / ".join(f"{s['cells']:.0f}, {s['threads']:.0f}, {s['rss_mib']:.0f}" for s in (
            run["state_before"], run["state_after_trial"], run["state_end"]))
        lines.append(f"| {seed} | {run['pick']} ({', '.join(run['probed'])}) | {run['trial_seconds']:.1f} | "
                     f"{ratios(wall)} | {ratios(cpu)} | {ms_fixed:.1f} | {ms_auto:.1f} | {states} |")
    lines += ["", f"**All epochs of all seeds** ({len(all_wall)} pairs): wall {ratios(all_wall)}, CPU "
              f"{ratios(all_cpu)}; auto's step slower in {sum(r > 1 for r in all_wall)} of {len(all_wall)} pairs "
              "(wall).", ""]
    rounds = [run["cells"] for run in payload["runs"].values() if run.get("cells")]
    if rounds:
        walls = [r for c in rounds for r in epoch_ratios(c[fixed], c[AUTO], 0)]
        cpus = [r for c in rounds for r in epoch_ratios(c[fixed], c[AUTO], 1)]
        lines += [f"**The train cells alone** (after the epochs, in the same process: the same "
                  f"{payload.get('cell_batches', 10)} batches, no data pipeline, the two cells alternating round by "
                  f"round; {len(walls)} rounds): auto's cell over the fixed Model's, median step wall "
                  f"{ratios(walls)}, CPU {ratios(cpus)}; auto's slower in {sum(r > 1 for r in walls)} (wall), "
                  f"{sum(r > 1 for r in cpus)} (CPU) of {len(walls)} rounds.", ""]
    return "\n".join(lines + page_footer(payload["command"], payload["load_before"]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="auto's steady step against its pick's fixed run, paired")
    parser.add_argument("--cell", default="mnist5k/gemm")
    parser.add_argument("--train", type=int, default=3000, help="training images (the long form's 3,000)")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--fixed", default="ms_boost O0", help="the fixed contender of the plan auto picks")
    parser.add_argument("--seeds", nargs="+", default=["0,1,2"])
    parser.add_argument("--candidates", default="", help="autotune.candidates, comma-separated (default: all)")
    parser.add_argument("--no-time-budget", dest="time_budget", action="store_false")
    parser.add_argument("--rounds", type=int, default=30,
                        help="then the two train cells alone, alternating, this many rounds of 10 batches (0: none)")
    parser.add_argument("--out", default="autotune_step_gap")
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    options: dict = {}
    if args.candidates:
        options["candidates"] = [c for c in args.candidates.split(",") if c]
    if not args.time_budget:
        options["time_budget"] = False
    if args.worker:
        got = measure(args.cell, args.train, args.epochs, int(args.worker), args.fixed, options, args.rounds)
        gc.collect()
        print(TAG + json.dumps(got), flush=True)
        return 0
    from bench.autotune_phases import finish, worker_result
    from bench.common import load_average
    from bench.tta_autotune import parse_seeds

    seeds = parse_seeds(args.seeds)
    command = "python bench/autotune_step_gap.py " + " ".join(a for a in (argv if argv is not None else sys.argv[1:]))
    payload = {"cell": args.cell, "train": args.train, "epochs": args.epochs, "seeds": seeds, "fixed": args.fixed,
               "options": options, "command": command.strip(),
               "load_before": load_average(), "runs": {}}
    env = dict(os.environ, GLOG_v="3", PYTHONPATH=str(ROOT))
    for seed in seeds:
        worker = [sys.executable, __file__, f"--worker={seed}", f"--cell={args.cell}", f"--train={args.train}",
                  f"--epochs={args.epochs}", f"--fixed={args.fixed}", f"--rounds={args.rounds}"] + (
            [f"--candidates={args.candidates}"] if args.candidates else []) + (
            [] if args.time_budget else ["--no-time-budget"])
        payload["runs"][str(seed)] = worker_result(worker, env)
        print(f"[step gap] seed {seed} done", flush=True)
    finish(args.out, payload, render)
    return 0

if __name__ == "__main__":
    sys.exit(main())

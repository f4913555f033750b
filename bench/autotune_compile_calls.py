"""Does the trial's compile do the same Python-side work as the fixed run's first step? Counted, not timed.

The pick's compile happens inside the trial (auto's first probe step) or inside a fixed run's first step. Their wall
and CPU seconds move with the machine's load from process to process; what the compile does in Python does not.
For each cell and seed this bench runs the fixed O0 run and an autotuned run (each its own process, alternating),
and during that one step counts the Python function calls (``sys.setprofile``; grouped by the package of the code
called), Python's garbage collections by generation (with their main-thread CPU) and the live objects at its start.
Equal counts mean MindSpore's front end parsed and built the same graph with the same Python work; the profiler
slows the step, so its seconds here are not the compile's.

``python bench/autotune_compile_calls.py [--cells generated/gemm,digits/gemm] [--seeds 0 1]`` writes
``bench/results/autotune_compile_calls.{json,md}`` (``--out`` another stem).
"""
from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Dict, List

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TAG = "CALLS "
AUTO = "ms_boost auto"
FIXED = "ms_boost O0"


def measure(contender: str, cell_key: str, seed: int) -> dict:
    """One run's counts during its compiling step (auto: its first probe step; fixed: epoch 1's first step)."""
    import mindspore as ms
    import mindspore.dataset as ds
    from mindspore.train import Callback

    import ms_boost.autotune.cells as cells
    from bench.autotune_phases import cell_of
    from bench.bench_tta import RunSpec, _model, build_network
    from bench.tta_autotune import data_root
    from model_zoo.resnet.src.dataset import class_folders, create_dataset

    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(seed)
    np.random.seed(seed)
    ds.config.set_seed(seed)
    cell = cell_of(cell_key, "long")
    root = data_root(cell.dataset, cell.train, cell.classes)
    train = create_dataset(root / "train", do_train=True, batch_size=32, image_size=16, num_parallel_workers=2,
                           crop_scale=(0.6, 1.0), seed=seed, hflip=False)
    spec = RunSpec(dataset=cell.dataset, net=cell.net, contender=contender, lr=cell.lr, seed=seed,
                   epochs=cell.epochs, image_size=16, width=cell.width)
    model = _model(spec, build_network(spec, len(class_folders(root / "train"))), train.get_dataset_size())
    calls: collections.Counter = collections.Counter()
    collections_: List[List[float]] = []
    out: dict = {}

    def profile(frame, event, arg):
        if event == "call":
            path = frame.f_code.co_filename
            calls[path.split("site-packages/")[-1].split("/")[0] if "site-packages/" in path else "other"] += 1

    def collected(phase, info):
        if phase == "start":
            collections_.append([info["generation"], time.thread_time()])
        elif collections_:
            collections_[-1][1] = time.thread_time() - collections_[-1][1]

    def begin():
        out["live objects at its start"] = len(gc.get_objects())
        gc.callbacks.append(collected)
        sys.setprofile(profile)

    def end():
        sys.setprofile(None)
        gc.callbacks.remove(collected)
        out["calls"] = dict(calls)
        out["collections"] = {str(g): [sum(1 for c in collections_ if c[0] == g),
                                       sum(c[1] for c in collections_ if c[0] == g)] for g in (0, 1, 2)}

    done: List[int] = []
    inner = cells.CellTrialRun.step

    def step(self, *batch):
        first = not done
        if first:
            begin()
        try:
            return inner(self, *batch)
        finally:
            if first:
                end()
                done.append(1)

    cells.CellTrialRun.step = step

    class FirstStep(Callback):
        def on_train_step_begin(self, run_context):
            if not done:
                begin()

        def on_train_step_end(self, run_context):
            if not done:
                end()
                done.append(1)
            run_context.request_stop()

    model.train(cell.epochs, train, callbacks=[FirstStep()], dataset_sink_mode=False)
    report = getattr(model, "autotune_report", None)
    out["pick"] = report.pick if report is not None else ""
    return out


def render(payload: dict) -> str:
    """The page: per cell and seed, both runs' counts side by side."""
    from bench.common import page_footer

    command = (f"python bench/autotune_compile_calls.py --cells {','.join(payload['cells'])} --seeds "
               f"{' '.join(str(s) for s in payload['seeds'])}")
    lines = ["# Autotune: the Python-side work of the trial's compile against the fixed run's first step", "",
             f"Written by `{command}`: per cell and seed the fixed O0 run and the autotuned run (auto picks O0), each "
             "its own process, counted during the step that compiles the same graph (auto: its first probe step; "
             "fixed: epoch 1's first step). Calls: Python function calls by the package of the code called; "
             "collections: Python's garbage collections by generation (count, main-thread CPU s under the profiler).",
             "", f"Load average (1/5/15 min) before: {payload['load_before']}; after: {payload['load_after']}.", "",
             "| cell | seed | run | calls, all | mindspore | asttokens | other packages | collections gen 0 / 1 / 2 "
             "| gen 2 CPU s | live objects at its start |", "|---|---|---|---|---|---|---|---|---|---|"]
    for key, by_seed in payload["results"].items():
        for seed, runs in by_seed.items():
            for name in (FIXED, AUTO):
                r = runs[name]
                c = r["calls"]
                rest = sum(v for k, v in c.items() if k not in ("mindspore", "asttokens"))
                g = r["collections"]
                lines.append(f"| {key} | {seed} | {name}{' (picked ' + r['pick'] + ')' if r['pick'] else ''} | "
                             f"{sum(c.values()):,} | {c.get('mindspore', 0):,} | {c.get('asttokens', 0):,} | {rest:,} "
                             f"| {g['0'][0]} / {g['1'][0]} / {g['2'][0]} | {g['2'][1]:.3f} | "
                             f"{r['live objects at its start']:,} |")
    return "\n".join(lines + page_footer(command, payload["load_before"]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="the compile's Python-side work, trial against fixed run")
    parser.add_argument("--cells", default="generated/gemm,digits/gemm")
    parser.add_argument("--seeds", nargs="+", default=["0"])
    parser.add_argument("--out", default="autotune_compile_calls")
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        contender, key, seed = json.loads(args.worker)
        print(TAG + json.dumps(measure(contender, key, seed)), flush=True)
        return 0
    from bench.autotune_phases import finish, worker_result
    from bench.common import load_average
    from bench.tta_autotune import parse_seeds

    cells = [c.strip() for c in args.cells.split(",") if c.strip()]
    seeds = parse_seeds(args.seeds)
    payload: Dict = {"cells": cells, "seeds": seeds, "load_before": load_average(), "results": {}}
    env = dict(os.environ, GLOG_v="3", PYTHONPATH=str(ROOT))
    for key in cells:
        for i, seed in enumerate(seeds):
            runs = payload["results"].setdefault(key, {}).setdefault(str(seed), {})
            for name in ((FIXED, AUTO) if i % 2 == 0 else (AUTO, FIXED)):
                command = [sys.executable, __file__, f"--worker={json.dumps([name, key, seed])}"]
                runs[name] = worker_result(command, env, tag=TAG)
    finish(args.out, payload, render)
    return 0


if __name__ == "__main__":
    sys.exit(main())

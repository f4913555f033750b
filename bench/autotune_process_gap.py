"""Is auto's steady step after its trial slower than a fixed O0 run's? Across processes, paired per seed.

The long form's digits/gemm (ResNet-10 width 4 on GEMM convolutions, 16 px, batch 32, 47 steps an epoch, a run
planned over 20 epochs, cosine lr from 0.1, an evaluation after each epoch) as :func:`bench.bench_tta.run_one`
trains it, each arm **in its own fresh process**, the arms of a pair (one seed) one after the other, their order
rotated by one place each pair (no arm always first). Arms:

* ``fixed``: ``ms_boost.Model(boost_level="O0")``;
* ``auto``: ``boost_level="auto"`` (its trial inside ``train``, as a user runs it);
* ``auto_collect``, ``auto_freeze``, ``auto_trim``, ``auto_all``: auto, then -- after the trial, before the run's
  first step (``on_train_begin``) -- ``gc.collect()``; ``gc.collect()`` + ``gc.freeze()``; ``gc.collect()`` +
  glibc's ``malloc_trim(0)``; all three;
* ``fixed_collect``: the fixed run with the same ``gc.collect()`` + ``gc.freeze()`` at ``on_train_begin`` (whether
  the variant's effect is the trial's or any run's);
* ``auto_rebuild``: ``model.autotune`` first, then the pick's train step built anew (the run compiles its own step,
  as a fixed run does: everything else the trial left stays);
* ``fixed_read``: the fixed run after reading the batches a trial reads and releasing their iterator
  (:class:`ms_boost.autotune.cells.TrialBatches`, the default options' sizes), no trial step.

The run is planned over the long form's 20 epochs (the lr schedule and the trial's budget are the long form's) and
stopped after ``--epochs``. Per epoch: the median step's wall and process CPU time (its first step left out), the
mean step, the Python collector's collections of each generation inside the steps and their time (``gc.callbacks``),
``gc.get_count()``, tracked objects (``len(gc.get_objects())``), resident memory, threads. And after the trial (at
``on_train_begin``): the same state.

``python bench/autotune_process_gap.py [--pairs 10] [--epochs 8] [--arms fixed,auto,auto_freeze]`` writes
``bench/results/autotune_process_gap.{json,md}`` (``--out`` another stem).
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TAG = "PROCESS_GAP "
AUTO = "ms_boost auto"
FIXED = "ms_boost O0"
#: arm -> (contender, what runs at on_train_begin)
ARMS: Dict[str, tuple] = {
    "fixed": (FIXED, ()),
    "auto": (AUTO, ()),
    "auto_collect": (AUTO, ("collect",)),
    "auto_freeze": (AUTO, ("collect", "freeze")),
    "auto_trim": (AUTO, ("collect", "trim")),
    "auto_all": (AUTO, ("collect", "freeze", "trim")),
    "fixed_collect": (FIXED, ("collect", "freeze")),
    "auto_rebuild": (AUTO, ("rebuild",)),
    "fixed_read": (FIXED, ("read",)),
}
#: actions run before ``train`` (the others at ``on_train_begin``, after the trial)
BEFORE = ("rebuild", "read")
PLANNED_EPOCHS = 20  # the long form's digits/gemm


def process_state() -> Dict[str, float]:
    """Tracked objects, the collector's counts, resident memory (MiB) and threads of this process."""
    from bench.common import rss_and_threads  # (MindSpore's import, in the worker only)

    rss, threads = rss_and_threads()
    return {"objects": float(len(gc.get_objects())), "count": list(gc.get_count()), "rss_mib": rss,
            "threads": float(threads), "frozen": float(gc.get_freeze_count())}


def after_trial(actions: Sequence[str]) -> Dict[str, float]:
    """Run ``actions`` (collect, freeze, trim); seconds each took."""
    took = {}
    for action in actions:
        if action in BEFORE:
            continue
        tick = time.perf_counter()
        if action == "collect":
            gc.collect()
        elif action == "freeze":
            gc.freeze()
        elif action == "trim":
            try:
                ctypes.CDLL("libc.so.6").malloc_trim(0)
            except OSError:
                pass
        else:
            raise ValueError(f"action={action!r} must be one of collect, freeze, trim.")
        took[action] = time.perf_counter() - tick
    return took


def before_train(model, train, actions: Sequence[str]) -> Dict[str, float]:
    """The arms' actions before ``train``: ``rebuild`` (the trial, then the pick's step built anew), ``read`` (the
    trial's batches read and released); seconds each took."""
    took = {}
    for action in actions:
        if action not in BEFORE:
            continue
        tick = time.perf_counter()
        if action == "rebuild":
            model.autotune(train, PLANNED_EPOCHS)
            jit = model._train_network._jit_config_dict
            model._build_boost_network({})
            model._train_network = model._build_train_network()
            model._train_network._jit_config_dict = jit
            model._memory_key = None
        else:
            from ms_boost.autotune.cells import TrialBatches
            from ms_boost.autotune.engine import batches_needed
            from ms_boost.autotune.options import AutotuneOptions

            options = AutotuneOptions()
            held, steps = batches_needed(options, PLANNED_EPOCHS * train.get_dataset_size())
            TrialBatches(train, held, steps, ready=options.probe_steps).close()
        took[action] = time.perf_counter() - tick
    return took


def epoch_row(walls: Sequence[float], cpus: Sequence[float]) -> Optional[Dict[str, float]]:
    """Median wall, median CPU (:func:`bench.autotune_step_gap.epoch_stats`) and mean wall of an epoch's steps, its
    first left out (None: fewer than 2)."""
    from bench.autotune_step_gap import epoch_stats

    stats = epoch_stats(walls, cpus)
    if stats is None:
        return None
    return {"wall": stats[0], "cpu": stats[1], "mean": float(np.mean(walls[1:]))}


def run_arm(arm: str, seed: int, epochs: int, width: int = 4) -> dict:
    """One arm in this process: :func:`bench.bench_tta.run_one`'s digits/gemm, planned over 20 epochs, stopped after
    ``epochs``; the per-epoch statistics of the module docstring."""
    import mindspore as ms
    import mindspore.dataset as ds
    from mindspore.train import Callback

    from bench.bench_tta import RunSpec, _model, build_network
    from bench.tta_autotune import IMAGE_SIZE, data_root
    from model_zoo.resnet.src.dataset import class_folders, create_dataset

    contender, actions = ARMS[arm]
    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(seed)
    np.random.seed(seed)
    ds.config.set_seed(seed)
    root = data_root("digits")
    classes = class_folders(root / "train")
    train = create_dataset(root / "train", do_train=True, batch_size=32, image_size=IMAGE_SIZE,
                           num_parallel_workers=2, crop_scale=(0.6, 1.0), seed=seed, hflip=False)
    val = create_dataset(root / "val", do_train=False, batch_size=100, image_size=IMAGE_SIZE,
                         num_parallel_workers=2, drop_remainder=False, class_names=classes)
    spec = RunSpec(dataset="digits", net="gemm", contender=contender, lr=0.1, seed=seed, epochs=PLANNED_EPOCHS,
                   image_size=IMAGE_SIZE, mode="graph", width=width)
    model = _model(spec, build_network(spec, len(classes)), train.get_dataset_size())
    out: dict = {"arm": arm, "seed": seed, "before": process_state(), "epochs": [], "accuracy": []}
    gc_time = {"in_step": False, "start": 0.0, "seconds": [0.0, 0.0, 0.0], "count": [0, 0, 0]}

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            gc_time["start"] = time.perf_counter()
        elif gc_time["in_step"]:
            g = int(info.get("generation", 0))
            gc_time["seconds"][g] += time.perf_counter() - gc_time["start"]
            gc_time["count"][g] += 1

    gc.callbacks.append(on_gc)
    called = time.perf_counter()
    out["before_train"] = before_train(model, train, actions)

    class Stats(Callback):
        def on_train_begin(self, run_context):
            out["trial_to_begin"] = time.perf_counter() - called  # the trial (auto) and the loop's set-up
            out["after_trial"] = process_state()
            out["actions"] = after_trial(actions)
            out["after_actions"] = process_state()

        def on_train_epoch_begin(self, run_context):
            self.walls, self.cpus = [], []
            gc_time["seconds"], gc_time["count"] = [0.0, 0.0, 0.0], [0, 0, 0]
            self.start = time.perf_counter()

        def on_train_step_begin(self, run_context):
            gc_time["in_step"] = True
            self.t = (time.perf_counter(), time.process_time())

        def on_train_step_end(self, run_context):
            self.walls.append(time.perf_counter() - self.t[0])
            self.cpus.append(time.process_time() - self.t[1])
            gc_time["in_step"] = False

        def on_train_epoch_end(self, run_context):
            row = epoch_row(self.walls, self.cpus) or {}
            row.update(seconds=time.perf_counter() - self.start, first=self.walls[0] if self.walls else 0.0,
                       gc_seconds=list(gc_time["seconds"]), gc_count=list(gc_time["count"]), **process_state())
            out["epochs"].append(row)
            out["accuracy"].append(float(model.eval(val, dataset_sink_mode=False)["acc"]))
            if len(out["epochs"]) >= epochs:
                run_context.request_stop()

    model.train(PLANNED_EPOCHS, train, callbacks=[Stats()], dataset_sink_mode=False)
    gc.callbacks.remove(on_gc)
    report = getattr(model, "autotune_report", None)
    if report is not None:
        out.update(pick=report.pick, trial_seconds=report.trial_seconds)
    return out


# ---------------------------------------------------------------------------------------------------------
# the page
def steady(run: dict, key: str = "wall") -> Optional[float]:
    """The run's steady step: the median over its epochs (the first left out) of each epoch's ``key``."""
    values = [e[key] for e in run.get("epochs", [])[1:] if e.get(key)]
    return float(np.median(values)) if values else None


def sign_test(slower: int, pairs: int) -> float:
    """Two-sided exact binomial p of ``slower`` of ``pairs`` under no difference (p = 1/2)."""
    if pairs == 0:
        return 1.0
    k = min(slower, pairs - slower)
    return min(1.0, 2 * sum(math.comb(pairs, i) for i in range(k + 1)) / 2 ** pairs)


def pair_ratios(payload: dict, arm: str, key: str = "wall", base: str = "fixed") -> List[float]:
    """Per pair, ``arm``'s steady ``key`` over ``base``'s (both measured)."""
    out = []
    for pair in payload["pairs"]:
        a, b = pair.get(arm), pair.get(base)
        if a and b and not a.get("error") and not b.get("error"):
            x, y = steady(a, key), steady(b, key)
            if x and y:
                out.append(x / y)
    return out


def later(run: dict, what: str) -> float:
    """Median over the later epochs of a per-epoch number (``gc_ms``: the collector's milliseconds inside the steps;
    ``gc2``: gen-2 collections; ``objects``, ...)."""
    rows = run.get("epochs", [])[1:]
    if what == "gc_ms":
        values = [1e3 * sum(e["gc_seconds"]) for e in rows]
    elif what == "gc2":
        values = [e["gc_count"][2] for e in rows]
    else:
        values = [e[what] for e in rows]
    return float(np.median(values)) if values else float("nan")


def render(payload: dict) -> str:
    """The page: per arm against the fixed run, per pair; then what each process held."""
    from bench.common import median_range, page_footer

    arms = payload["arms"]
    lines = ["# Autotune: auto's steady step against a fixed O0 run, across processes (digits/gemm, paired)", "",
             f"Written by `{payload['command']}`. The long form's digits/gemm (ResNet-10 width 4, 16 px, batch 32, 47 "
             f"steps an epoch, planned over {PLANNED_EPOCHS} epochs), each arm in its own fresh process, stopped "
             f"after {payload['epochs']} epochs; {len(payload['pairs'])} pairs (seed = pair index), the arms of a "
             "pair one after the other, their order rotated by one place each pair. The steady step of a run: the "
             "median over its epochs 2.. of each epoch's median step (the epoch's first step left out). CPU: the "
             "process's (all threads).", "",
             f"Load average (1/5/15 min) before: {payload['load_before']}; after: {payload['load_after']}.", "",
             "| arm | pairs | steady step / fixed's: wall, median [min, max] | slower in (wall) | sign test p | CPU "
             "ratio | slower in (CPU) | steady step ms (wall), median [min, max] over pairs |",
             "|---|---|---|---|---|---|---|---|"]
    for arm in arms:
        wall, cpu = pair_ratios(payload, arm, "wall"), pair_ratios(payload, arm, "cpu")
        ms_ = [steady(p[arm]) for p in payload["pairs"] if p.get(arm) and steady(p[arm])]
        spread = median_range([1e3 * v for v in ms_], digits=2)
        if arm == "fixed":
            lines.append(f"| fixed | {len(ms_)} | (the reference) | - | - | - | - | {spread} |")
            continue
        lines.append(f"| {arm} | {len(wall)} | {median_range(wall, unit='x')} | {sum(r > 1 for r in wall)} of "
                     f"{len(wall)} | {sign_test(sum(r > 1 for r in wall), len(wall)):.3f} | "
                     f"{median_range(cpu, unit='x')} | {sum(r > 1 for r in cpu)} of {len(cpu)} | {spread} |")
    runs = [p[a] for p in payload["pairs"] for a in arms if p.get(a) and not p[a].get("error")]
    inside = [sum(e["gc_count"][g] for r in runs for e in r["epochs"][1:]) for g in range(3)]
    lines += ["", f"Collections of Python's collector inside the steps of epochs 2.. over all {len(runs)} runs: "
              f"generation 0: {inside[0]}, 1: {inside[1]}, 2: {inside[2]}."]
    lines += ["", "Per pair: steady step ms (wall / CPU), tracked objects after the trial (at `on_train_begin`), "
              "median over epochs 2.. of the collector's milliseconds inside the steps and gen-2 collections an "
              "epoch, RSS MiB and threads at the last epoch.", "",
              "| pair | " + " | ".join(arms) + " |", "|---|" + "---|" * len(arms)]
    for i, pair in enumerate(payload["pairs"]):
        cells = []
        for arm in arms:
            run = pair.get(arm) or {}
            if not run or run.get("error"):
                cells.append("failed")
                continue
            last = run["epochs"][-1] if run.get("epochs") else {}
            cells.append(f"{1e3 * (steady(run) or 0):.2f} / {1e3 * (steady(run, 'cpu') or 0):.2f} ms; "
                         f"{run['after_trial']['objects']:.0f} obj; gc {later(run, 'gc_ms'):.1f} ms, "
                         f"{later(run, 'gc2'):.0f} gen2; {last.get('rss_mib', 0):.0f} MiB, "
                         f"{last.get('threads', 0):.0f} thr")
        lines.append(f"| {i} ({'/'.join(pair['order'])}) | " + " | ".join(cells) + " |")
    return "\n".join(lines + page_footer(payload["command"], payload["load_before"]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="auto's steady step against fixed O0, across processes, paired")
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--first_seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--arms", default="fixed,auto,auto_freeze")
    parser.add_argument("--out", default="autotune_process_gap")
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    arms = [a for a in args.arms.split(",") if a]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise ValueError(f"--arms={args.arms!r}: {unknown} are not arms; allowed: {sorted(ARMS)}.")
    if "fixed" not in arms:
        raise ValueError(f"--arms={args.arms!r} must include 'fixed' (every arm is compared with it).")
    if args.worker:
        arm, seed = args.worker.split(":")
        print(TAG + json.dumps(run_arm(arm, int(seed), args.epochs)), flush=True)
        return 0
    from bench.autotune_phases import finish, worker_result
    from bench.common import load_average

    command = "python bench/autotune_process_gap.py " + " ".join(argv if argv is not None else sys.argv[1:])
    payload = {"arms": arms, "epochs": args.epochs, "command": command.strip(), "load_before": load_average(),
               "pairs": []}
    env = dict(os.environ, GLOG_v="3", PYTHONPATH=str(ROOT))
    for i in range(args.pairs):
        seed = args.first_seed + i
        order = arms[i % len(arms):] + arms[:i % len(arms)]
        pair: dict = {"seed": seed, "order": order, "load": load_average()}
        for arm in order:
            cmd = [sys.executable, __file__, f"--worker={arm}:{seed}", f"--epochs={args.epochs}"]
            pair[arm] = worker_result(cmd, env, tag=TAG, keep_failure=True, cwd=str(ROOT))
            run = pair[arm]
            print(f"[process gap] pair {i} {arm}: " + (run["error"] if run.get("error") else
                  f"steady {1e3 * (steady(run) or 0):.2f} ms, cpu {1e3 * (steady(run, 'cpu') or 0):.2f} ms"),
                  flush=True)
        payload["pairs"].append(pair)
    finish(args.out, payload, render)
    return 0


if __name__ == "__main__":
    sys.exit(main())

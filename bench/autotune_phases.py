"""Where an autotuned run's time goes against the same plan's fixed run: per phase, wall and CPU seconds.

One cell of the autotune page (default generated/gemm, whose pick is O0), seed by seed: the fixed run of the plan auto
picks (``--fixed``, default ``ms_boost O0``; ``"ms_boost O0 + cpu_gemm_conv"`` on a conv cell) and a
``boost_level="auto"`` run, each in its own process, alternating (paired: each pair shares the machine's
conditions). Each run trains the cell's planned epochs (the trial plans for all of them) but stops after epoch 1.
Phases, each with its wall seconds and the process's CPU seconds (all threads):

* ``model``: building the Model (the fixed run builds its train step here);
* ``trial`` (auto): reading the trial's batches, building the step, the probe's first step (its compile), the probe's
  other steps, putting the weights back (``restore``), the rest (the report, the eval network);
* ``step 1`` (the fixed run's compile), ``steps 2-3`` and the rest of epoch 1, split into the time inside the
  steps and the gaps between them (waiting for data and callbacks).

``python bench/autotune_phases.py [--cell generated/gemm] [--fixed "ms_boost O0"] [--seeds 0 1 2]`` writes
``bench/results/autotune_phases.{json,md}`` (``--out`` another stem).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TAG = "PHASES "
AUTO = "ms_boost auto"
#: the phase every run has: from ``train()`` to the end of epoch 1's first step (a fixed run: its iterator and
#: compile; auto: its trial, its iterator and the run's first step)
STARTUP = "start-up: train() to the end of epoch 1's step 1"


Clock = Tuple[float, float, float]


def _clock() -> Clock:
    """Wall seconds, the process's CPU seconds (all its threads, ended ones too) and the calling thread's CPU
    seconds (every phase is timed on the main thread: its CPU is the main thread's)."""
    return time.perf_counter(), time.process_time(), time.thread_time()


def thread_cpu() -> Dict[str, float]:
    """CPU seconds of each live thread of this process, by ``name:tid`` (Linux ``/proc``; empty elsewhere)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out: Dict[str, float] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            name = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[f"{'main' if int(tid) == os.getpid() else name}:{tid}"] = (int(fields[11]) + int(fields[12])) / tick
    return out


def thread_delta(before: Dict[str, float], after: Dict[str, float]) -> Dict[str, float]:
    """CPU seconds each thread name (the same name summed; ``main``: the main thread) used from ``before`` to
    ``after`` (:func:`thread_cpu` snapshots), counting the threads alive at ``after``; names that used none left out."""
    out: Dict[str, float] = {}
    for key, cpu in after.items():
        used = cpu - before.get(key, 0.0)
        if used > 0:
            name = key.split(":")[0]
            out[name] = out.get(name, 0.0) + used
    return out


#: how an autotuned run reads its trial's batches (``--variants``), for comparing them paired in one invocation
VARIANTS = {
    "": "as the code does it",
    "eager": "the batches past the first probe's read by the background reader started at once, beside the first "
             "probe's compile (the code before it started the reader only for a second probe)",
    "upfront": "every batch the trial may use read before its first compile (no background reading)",
    "three": "only the first probe's batches read (a trial that needs no more: no held-out, no window batches)",
}


def apply_variant(variant: str, ms_model) -> None:
    """Make this process's autotuned run read its trial's batches as ``variant`` (:data:`VARIANTS`) says."""
    if variant not in VARIANTS:
        raise ValueError(f"variant={variant!r} is not one of {sorted(VARIANTS)}.")
    if variant == "eager":
        lazy = ms_model.TrialBatches

        class Eager(lazy):  # type: ignore[misc, valid-type]
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self.start()
        ms_model.TrialBatches = Eager
    elif variant == "upfront":
        inner = ms_model.TrialBatches

        class Upfront(inner):  # type: ignore[misc, valid-type]
            def __init__(self, dataset, holdout, steps, ready):
                super().__init__(dataset, holdout, steps, ready=0)
        ms_model.TrialBatches = Upfront
    elif variant == "three":
        needed = ms_model.batches_needed
        ms_model.batches_needed = lambda options, planned: (0, min(needed(options, planned)[1], options.probe_steps))


def label(contender: str, variant: str) -> str:
    """The contender's name on the page: ``ms_boost auto [variant]`` for a variant, else the contender."""
    return f"{contender} [{variant}]" if variant else contender


def cell_of(key: str, form: str = "quick"):
    """The :class:`bench.tta_autotune.Cell` ``key`` (``dataset/net``) of the autotune page's ``form`` (its data set's
    size and classes, the network's width, its epochs); a cell the form does not have: the quick form's defaults."""
    from bench.tta_autotune import FORMS, Cell

    if form not in FORMS:
        raise ValueError(f"--form {form!r} is not one of {sorted(FORMS)}.")
    dataset, net_name = key.split("/")
    return next((c for c in FORMS[form] if c.key == key), Cell(dataset, net_name, 3))


def measure(contender: str, cell, epochs: int, seed: int, variant: str = "") -> Dict[str, List[float]]:
    """One run of ``contender`` on ``cell`` (in this process): ``{phase: [wall, process CPU, main-thread CPU]}``,
    up to the end of epoch 1 (the phases of module docstring, and the data iterators' creation, first batch and
    release, each under ``trial:`` or ``run:`` by when it happened)."""
    import mindspore as ms
    import mindspore.dataset as ds
    from mindspore.dataset.engine import datasets as ds_engine
    from mindspore.dataset.engine import iterators
    from mindspore.train import Callback

    import ms_boost.autotune.cells as cells
    import ms_boost.model as ms_model

    apply_variant(variant, ms_model)
    from bench.bench_tta import RunSpec, _model, build_network
    from bench.tta_autotune import data_root
    from model_zoo.resnet.src.dataset import class_folders, create_dataset

    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(seed)
    np.random.seed(seed)
    ds.config.set_seed(seed)
    root = data_root(cell.dataset, cell.train, cell.classes)
    train = create_dataset(root / "train", do_train=True, batch_size=32, image_size=16, num_parallel_workers=2,
                           crop_scale=(0.6, 1.0), seed=seed, hflip=False)
    classes = class_folders(root / "train")
    create_dataset(root / "val", do_train=False, batch_size=100, image_size=16, num_parallel_workers=2,
                   drop_remainder=False, class_names=classes)  # as the page's runs build it (not read in epoch 1)
    spec = RunSpec(dataset=cell.dataset, net=cell.net, contender=contender, lr=cell.lr, seed=seed, epochs=epochs,
                   image_size=16, width=cell.width)
    net = build_network(spec, len(classes))
    phases: Dict[str, List[float]] = {}
    where = ["run"]  # "trial" while auto's trial runs

    def add(name: str, start: Clock, end: Optional[Clock] = None) -> None:
        got = phases.setdefault(name, [0.0, 0.0, 0.0])
        for j, (a, b) in enumerate(zip(start, end or _clock())):
            got[j] += b - a

    def timed(owner, attr: str, name: str) -> None:
        inner = getattr(owner, attr)

        def wrapper(*args, **kwargs):
            start = _clock()
            try:
                return inner(*args, **kwargs)
            finally:
                add(name, start)
        setattr(owner, attr, wrapper)

    # the data iterators: creating one starts its pipeline; its first batch waits for the pipeline's first rows;
    # releasing it stops the pipeline's threads
    create_inner, next_inner, stop_inner = (ds_engine.Dataset.create_tuple_iterator, iterators.Iterator.__next__,
                                            iterators.Iterator.stop)
    nexted: Set[int] = set()
    released: List[Dict[str, float]] = []  # thread CPU snapshots taken just before each iterator release

    def create(self, *args, **kwargs):
        begin = _clock()
        try:
            return create_inner(self, *args, **kwargs)
        finally:
            add(f"{where[0]}: iterator creation", begin)

    def next_(self):
        if id(self) in nexted:
            return next_inner(self)
        nexted.add(id(self))
        begin = _clock()
        try:
            return next_inner(self)
        finally:
            add(f"{where[0]}: iterator's first batch", begin)

    def stop(self):
        released.append(thread_cpu())  # the threads the release ends (the pipeline's): their CPU up to here
        live, begin = bool(getattr(self, "_runtime_context", None)), _clock()
        try:
            stop_inner(self)
        finally:
            if live:
                add(f"{where[0]}: iterator release", begin)

    ds_engine.Dataset.create_tuple_iterator, iterators.Iterator.__next__, iterators.Iterator.stop = create, next_, stop

    start = _clock()
    model = _model(spec, net, train.get_dataset_size())
    add("model", start)
    stepped: Set[int] = set()  # the trial runs that stepped already (each one's first step compiles)
    step_inner, restore_inner = cells.CellTrialRun.step, cells.CellTrialRun.restore

    def step(self, *batch):
        begin, first = _clock(), id(self) not in stepped
        before = thread_cpu() if first else {}
        mark = len(released)
        try:
            return step_inner(self, *batch)
        finally:
            add("trial: probe step 1 (compile)" if first else "trial: probe steps 2+", begin)
            stepped.add(id(self))
            if first:  # the compile's CPU by thread: the main thread compiles; any other is competing work
                after: Dict[str, float] = {}  # a thread that ended during the compile counts up to its end
                for snap in released[mark:]:  # (the trial's iterator, released by the reader: its pipeline)
                    after.update(snap)
                after.update(thread_cpu())
                for name, cpu in thread_delta(before, after).items():
                    add(f"trial: probe step 1 (compile), thread {name}", (0.0, 0.0, 0.0), (0.0, cpu, 0.0))

    def restore(self):
        begin = _clock()
        try:
            restore_inner(self)
        finally:
            add("trial: restore", begin)

    cells.CellTrialRun.step, cells.CellTrialRun.restore = step, restore
    if hasattr(ms_model, "TrialBatches"):  # the held-out and first probe's batches; the rest in the background
        timed(ms_model, "TrialBatches", "trial: read batches")
        timed(cells.TrialBatches, "_wait", "trial: wait for batches read in the background")
        timed(cells.TrialBatches, "close", "trial: stop the batch reader")
    else:  # the code before the background reader: every batch read before the trial
        timed(ms_model, "take_batches", "trial: read batches")
    timed(ms_model, "_build", "trial: build steps")
    if contender == AUTO:
        autotune_inner = model.autotune

        def autotune(*args, **kwargs):
            where[0], begin = "trial", _clock()
            try:
                return autotune_inner(*args, **kwargs)
            finally:
                add("trial (all)", begin)
                where[0] = "run"
        model.autotune = autotune

    class Phases(Callback):
        def on_train_epoch_begin(self, run_context):
            add("run: train() to epoch 1 (auto: its trial included)", called)
            self.steps = 0
            self.threads = thread_cpu()
            self.last = _clock()

        def on_train_step_begin(self, run_context):
            add("epoch 1: before step 1 (its first batch)" if self.steps == 0 else "epoch 1: gaps (data, callbacks)",
                self.last)
            if self.steps == 0:
                self.step1_threads = thread_cpu()
            self.begin = _clock()

        def on_train_step_end(self, run_context):
            self.steps += 1
            add("epoch 1: step 1" if self.steps == 1 else "epoch 1: steps 2-3" if self.steps <= 3 else
                "epoch 1: steps 4+", self.begin)
            if self.steps == 1:
                add(STARTUP, called)
                for name, cpu in thread_delta(self.step1_threads, thread_cpu()).items():
                    add(f"epoch 1: step 1, thread {name}", (0.0, 0.0, 0.0), (0.0, cpu, 0.0))
            self.last = _clock()

        def on_train_epoch_end(self, run_context):
            add("epoch 1: gaps (data, callbacks)", self.last)
            threads.update(thread_delta(self.threads, thread_cpu()))  # epoch 1's CPU by thread name
            run_context.request_stop()

    threads: Dict[str, float] = {}
    called = _clock()
    model.train(epochs, train, callbacks=[Phases()], dataset_sink_mode=False)
    for name, cpu in threads.items():
        phases[f"epoch 1, thread {name}"] = [0.0, cpu, 0.0]
    if "trial (all)" in phases:
        named = [v for k, v in phases.items() if k.startswith("trial: ") and ", thread " not in k
                 and "iterator" not in k]  # the iterator's phases happen inside take_batches
        phases["trial: the rest"] = [phases["trial (all)"][j] - sum(v[j] for v in named) for j in range(3)]
    report = getattr(model, "autotune_report", None)
    if report is not None:
        phases["pick: " + report.pick] = [0.0, 0.0, 0.0]
    return phases


def render(payload: dict) -> str:
    """The page: per phase, median [min, max] over the seeds of wall and CPU seconds, fixed and auto side by side."""
    from bench.common import median_range, page_footer

    runs = payload["runs"]
    fixed = payload.get("fixed", "ms_boost O0")
    contenders = (fixed, AUTO)
    names: List[str] = []
    for contender in contenders:
        for run in runs[contender].values():
            names += [n for n in run if n not in names and not n.startswith("pick: ")]
    order = sorted(names, key=lambda n: (not n.startswith("model"), not n.startswith("trial"), n))

    def cell(contender: str, name: str, j: int) -> str:
        if j != 1 and ", thread " in name:  # per-thread rows hold CPU only
            return "-"
        return median_range([run[name][j] for run in runs[contender].values() if name in run and len(run[name]) > j])

    main = any(len(v) > 2 for c in contenders for run in runs[c].values() for v in run.values())
    columns = (0, 1, 2) if main else (0, 1)  # older pages: no main-thread CPU

    picks = sorted({n[6:] for run in runs[AUTO].values() for n in run if n.startswith("pick: ")})
    form = f" --form {payload['form']}" if payload.get("form", "quick") != "quick" else ""
    lines = ["# Autotune: where the time of an autotuned run goes, per phase", "",
             f"Written by `python bench/autotune_phases.py --cell {payload['cell']}{form} --epochs {payload['epochs']} "
             f"--fixed '{fixed}'` ({payload['epochs']} planned epochs, epoch 1 measured; seeds "
             f"{', '.join(str(s) for s in payload['seeds'])}; auto picked {', '.join(picks)}). "
             + ("Each seed: the fixed run and the autotuned one, each in its own process (paired), the fixed one "
                "first on the first seed, second on the next, and so on (the order rotated each seed). "
                if payload.get("order") == "rotated" else
                "Each seed: the fixed run, then the autotuned one, each in its own process (paired). ")
             + "Median [min, max] over the seeds; CPU is the process's CPU time over all its threads, which "
             "the machine's other jobs disturb less than wall time, main-thread CPU the main thread's alone (wall "
             "minus it is the time the main thread waited: for data, a lock, or the cores); the thread rows split "
             "CPU by thread name (the data pipeline's threads run under the name `python`, with the main thread); "
             "`trial:` and `run:` iterator rows are the data iterators created, first read and released in the trial "
             "and in the run.", "",
             f"Load average (1/5/15 min) before: {payload['load_before']}; after: {payload['load_after']}.", "",
             "| phase | " + " | ".join(f"{who} {what}" for who in (fixed, "auto")
                                      for what in ("wall s", "CPU s", "main-thread CPU s")[:len(columns)]) + " |",
             "|---" * (1 + 2 * len(columns)) + "|"]
    for name in order:
        lines.append(f"| {name} | " + " | ".join(cell(who, name, j) for who in contenders for j in columns) + " |")
    lines += startup_gap(runs, fixed)
    command = (f"python bench/autotune_phases.py --cell {payload['cell']}{form} --epochs {payload['epochs']} "
               f"--fixed '{fixed}'")
    return "\n".join(lines + page_footer(command, payload["load_before"]))


def startup_gap(runs: Dict[str, Dict[str, dict]], fixed: str) -> List[str]:
    """The paired start-up lines: per seed, auto's :data:`STARTUP` minus the fixed run's (wall, process CPU,
    main-thread CPU, the main thread's waiting), beside what auto's trial trains beyond the compile (its probe steps
    2+ and restores: the part of the trial the run cannot reuse); none when no seed has both runs' start-up."""
    from bench.common import median_range

    rows, gaps, excess = [], [], []
    for seed in sorted(set(runs[fixed]) & set(runs[AUTO]), key=int):
        f, a = runs[fixed][seed].get(STARTUP), runs[AUTO][seed].get(STARTUP)
        if not f or not a or len(f) < 3 or len(a) < 3:
            continue
        diff = [a[j] - f[j] for j in range(3)]
        steps = sum(runs[AUTO][seed].get(k, [0.0])[0] for k in ("trial: probe steps 2+", "trial: restore"))
        compile_gap = (runs[AUTO][seed].get("trial: probe step 1 (compile)", [0.0])[0]
                       - runs[fixed][seed].get("epoch 1: step 1", [0.0])[0])
        gaps.append(diff[0])
        excess.append(diff[0] - steps)
        rows.append(f"| {seed} | {f[0]:.2f} | {a[0]:.2f} | {diff[0]:+.2f} | {diff[1]:+.2f} | {diff[2]:+.2f} | "
                    f"{diff[0] - diff[2]:+.2f} | {compile_gap:+.2f} | {steps:.2f} | {diff[0] - steps:+.2f} |")
    if not rows:
        return []
    return ["", "**Start-up, paired** (from `train()` to the end of epoch 1's first step: a fixed run's iterator and "
            "compile; auto's trial, the run's iterator and its first step), auto minus the fixed run per seed; the "
            "trial's own steps are its probe steps 2+ and restores (what the run cannot reuse):", "",
            f"| seed | {fixed} s | auto s | auto - fixed: wall | process CPU | main-thread CPU | main thread waiting "
            "| of it the compile (trial's probe step 1 - fixed step 1), wall | the trial's own steps s | beyond them, "
            "wall |", "|---|---|---|---|---|---|---|---|---|---|", *rows, "",
            f"Median [min, max] over {len(rows)} seed(s): auto - fixed {median_range(gaps, 2)} s wall; beyond the "
            f"trial's own steps {median_range(excess, 2)} s."]


def _compile_of(run: dict, auto: bool) -> List[float]:
    """The run's compile ``[wall, process CPU, main-thread CPU]``: auto's first probe step, a fixed run's step 1."""
    return list(run.get("trial: probe step 1 (compile)" if auto else "epoch 1: step 1", [0.0, 0.0, 0.0]))


def _threads_of(run: dict, auto: bool) -> Dict[str, float]:
    """CPU seconds by thread name during the run's compile (the ``, thread`` rows)."""
    head = ("trial: probe step 1 (compile)" if auto else "epoch 1: step 1") + ", thread "
    return {k[len(head):]: v[1] for k, v in run.items() if k.startswith(head)}


def render_variants(payload: dict) -> str:
    """The page of a ``--variants`` invocation: per way of reading the trial's batches, auto's compile, trial and
    start-up minus the fixed run's, paired per seed, with the CPU the other threads used during each compile."""
    from bench.common import median_range, page_footer

    runs, fixed = payload["runs"], payload.get("fixed", "ms_boost O0")
    autos = [label(AUTO, v) for v in ["", *payload["variants"]]]
    form = f" --form {payload['form']}" if payload.get("form", "quick") != "quick" else ""
    command = (f"python bench/autotune_phases.py --cell {payload['cell']}{form} --epochs {payload['epochs']} "
               f"--fixed '{fixed}' --variants {','.join(payload['variants'])} --seeds "
               f"{' '.join(str(s) for s in payload['seeds'])}")
    lines = ["# Autotune: the trial's compile against the fixed run's, by how the trial reads its batches", "",
             f"Written by `{command}`. Each seed: the fixed run and one autotuned run per way of reading (each "
             "its own process, one after the other, the order rotated each seed). The ways: "
             + "; ".join(f"`{label(AUTO, v)}`: {VARIANTS[v]}" for v in ["", *payload["variants"]]) + ". "
             "The compile: auto's first probe step, the fixed run's first step (each holds the same graph's "
             "compile). Waiting = wall minus the main thread's CPU; other threads = the process's CPU minus the "
             "main thread's during the compile.", "",
             f"Load average (1/5/15 min) before: {payload['load_before']}; after: {payload['load_after']}.", "",
             "| per seed, auto minus fixed: median [min, max] | " + " | ".join(a for a in autos) + " |",
             "|---" * (1 + len(autos)) + "|"]
    rows = {k: {a: [] for a in autos} for k in (
        "the compile, wall s", "the compile, main-thread CPU s", "the compile, main thread waiting s",
        "the compile, other threads' CPU s", "the trial (all) minus the fixed step 1, wall s",
        "start-up (train() to the end of epoch 1's step 1), wall s", "start-up, process CPU s")}
    per_run = []
    for a in autos:
        for seed in sorted(set(runs[fixed]) & set(runs[a]), key=int):
            f, r = runs[fixed][seed], runs[a][seed]
            fc, ac = _compile_of(f, False), _compile_of(r, True)
            fs, as_ = f.get(STARTUP, [0.0] * 3), r.get(STARTUP, [0.0] * 3)
            rows["the compile, wall s"][a].append(ac[0] - fc[0])
            rows["the compile, main-thread CPU s"][a].append(ac[2] - fc[2])
            rows["the compile, main thread waiting s"][a].append((ac[0] - ac[2]) - (fc[0] - fc[2]))
            rows["the compile, other threads' CPU s"][a].append((ac[1] - ac[2]) - (fc[1] - fc[2]))
            rows["the trial (all) minus the fixed step 1, wall s"][a].append(r.get("trial (all)", [0.0])[0] - fc[0])
            rows["start-up (train() to the end of epoch 1's step 1), wall s"][a].append(as_[0] - fs[0])
            rows["start-up, process CPU s"][a].append(as_[1] - fs[1])
            per_run.append((a, seed, ac, _threads_of(r, True), r.get("trial (all)", [0.0])[0], as_[0]))
    for seed in sorted(runs[fixed], key=int):
        f = runs[fixed][seed]
        per_run.append((fixed, seed, _compile_of(f, False), _threads_of(f, False), None, f.get(STARTUP, [0.0])[0]))
    for name, by in rows.items():
        lines.append(f"| {name} | " + " | ".join(median_range(by[a], 2) for a in autos) + " |")
    lines += ["", "Each run (the compile: wall, process CPU, main-thread CPU; the other threads' CPU during it by "
              "name; "
              "load average at the run's start):", "",
              "| run | seed | load | compile wall s | CPU s | main-thread CPU s | other threads during it (CPU s) | "
              "trial (all) s | start-up s |", "|---|---|---|---|---|---|---|---|---|"]
    for a, seed, c, threads, trial, start in sorted(per_run, key=lambda x: (int(x[1]), x[0])):
        others = ", ".join(f"{k} {v:.2f}" for k, v in sorted(threads.items(), key=lambda kv: -kv[1]) if k != "main")
        load = payload.get("loads", {}).get(f"{a} {seed}", ["-"])[0]
        lines.append(f"| {a} | {seed} | {load} | {c[0]:.2f} | {c[1]:.2f} | {c[2]:.2f} | {others or '-'} | "
                     f"{'-' if trial is None else f'{trial:.2f}'} | {start:.2f} |")
    return "\n".join(lines + page_footer(command, payload["load_before"]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="per-phase wall and CPU time, fixed O0 against auto")
    parser.add_argument("--cell", default="generated/gemm")
    parser.add_argument("--form", default="quick", help="the autotune page's form whose cell is measured (quick: "
                        "1,500 images, 10 classes; long: the --long page's data sizes, classes and width)")
    parser.add_argument("--epochs", type=int, default=None,
                        help="planned epochs (the trial plans for them; default: the cell's in its form)")
    parser.add_argument("--fixed", default="ms_boost O0", help="the fixed contender of the plan auto picks")
    parser.add_argument("--seeds", nargs="+", default=["0,1,2"], help="seeds, space- or comma-separated")
    parser.add_argument("--out", default="autotune_phases", help="results stem (bench/results/<out>.{json,md})")
    parser.add_argument("--variants", default="", help="comma-separated ways of reading the trial's batches to pair "
                        f"with the code's own and the fixed run ({', '.join(v for v in VARIANTS if v)}); the page "
                        "then compares the trial's compile and start-up paired per seed")
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    cell = cell_of(args.cell, args.form)
    args.epochs = args.epochs or cell.epochs
    if args.worker:
        contender, seed, *variant = json.loads(args.worker)
        print(TAG + json.dumps(measure(contender, cell, args.epochs, seed, *variant)), flush=True)
        return 0
    from bench.common import load_average
    from bench.tta_autotune import parse_seeds

    seeds = parse_seeds(args.seeds)
    variants = [""] + [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in variants:
        if v not in VARIANTS:
            parser.error(f"--variants: {v!r} is not one of {sorted(x for x in VARIANTS if x)}")
    runs = [(args.fixed, "")] + [(AUTO, v) for v in variants]
    payload = {"cell": args.cell, "form": args.form, "epochs": args.epochs, "seeds": seeds,
               "load_before": load_average(), "fixed": args.fixed, "variants": variants[1:],
               "runs": {label(*r): {} for r in runs}, "order": "rotated", "loads": {}}
    env = dict(os.environ, GLOG_v="3", PYTHONPATH=str(ROOT))
    from bench.bench_tta import paired_order

    for seed, order in paired_order(runs, seeds):  # none always first
        for contender, variant in order:
            name = label(contender, variant)
            payload["loads"][f"{name} {seed}"] = load_average()
            payload["runs"][name][str(seed)] = worker_result(
                [sys.executable, __file__, f"--cell={args.cell}", f"--form={args.form}", f"--epochs={args.epochs}",
                 f"--worker={json.dumps([contender, seed, variant])}"], env)
            print(f"[phases] {name} seed {seed} done", flush=True)
    finish(args.out, payload, render_variants if variants[1:] else render)
    return 0


def worker_result(command: List[str], env: Dict[str, str], tag: str = TAG, keep_failure: bool = False,
                  cwd: Optional[str] = None) -> dict:
    """Run a worker process (``command``) to its end; its result: the JSON of its stdout line tagged ``tag``.

    A worker that exits non-zero raises (``subprocess.CalledProcessError``), one that prints no tagged line raises
    ``StopIteration``; with ``keep_failure`` a worker without a tagged line gives ``{"error": "exit <status>: <the
    output's end>"}`` instead, so that a page can show the failed run among the others.
    """
    proc = subprocess.run(command, env=env, capture_output=True, text=True, check=not keep_failure, cwd=cwd)
    line = next((x for x in proc.stdout.splitlines() if x.startswith(tag)), None)
    if line is None and keep_failure:
        return {"error": f"exit {proc.returncode}: {(proc.stdout + proc.stderr)[-800:]}"}
    if line is None:
        raise StopIteration(f"no line tagged {tag!r} in the output of {command}")
    return json.loads(line[len(tag):])


def finish(out: str, payload: dict, render_page) -> None:
    """Stamp the load average after the run, render the page and write ``bench/results/<out>.{json,md}``."""
    from bench.common import load_average, write_results

    payload["load_after"] = load_average()
    page = render_page(payload)
    write_results(out, payload, page)
    print(page)


if __name__ == "__main__":
    sys.exit(main())

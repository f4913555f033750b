"""Host time of one Graph-mode train step: main-thread CPU and wall per call of the train cell, side by side.

The time-to-accuracy page's ``gemm`` network (the zoo's ResNet-10 width 8 on GEMM convolutions, 16 px, batch 32, one
fixed random batch; ``bench/bench_tta.py``'s builders) under four train cells built in one process and called in
turn, the order reversed every round: MindSpore's ``TrainOneStepCell`` (``mindspore.train.Model`` with Momentum),
ms_boost O0, ms_boost O1 and THOR (frequency 10). Per cell: the median over the rounds of the main thread's CPU time
per call (``time.thread_time``: Python, MindSpore's call path, the graph launch; the kernels run on MindSpore's own
threads) and of the wall time per call. The main thread's time is what ms_boost's train cell adds on the host; the
wall time is the step as a training loop sees it.

``--trees A B ...`` measures code trees against each other: each tree in its own process (its ``ms_boost``,
``model_zoo`` and ``bench``), the trees' processes alternating ``--repeats`` times, so that two versions of the
library are compared at the same machine load.

Usage::

    python bench/host_step.py                     # this tree, results/host_step.{md,json}
    python bench/host_step.py --trees /tmp/before . --repeats 2 --name host_step_trees
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
CELLS = ("mindspore", "ms_boost O0", "ms_boost O1", "THOR")
#: the page's contender names of the cells (bench_tta.py builds them)
CONTENDER = {"mindspore": "baseline", "ms_boost O0": "ms_boost O0", "ms_boost O1": "ms_boost O1", "THOR": "THOR"}


def measure(rounds: int, root: Path = ROOT, warmup: int = 12) -> dict:
    """``{cell: {"main_ms": [...], "wall_ms": [...]}}`` over ``rounds`` rounds of the cells of the tree ``root``."""
    sys.path.insert(0, str(root))
    import mindspore as ms
    from mindspore import Tensor

    import ms_boost
    from bench.bench_tta import RunSpec, _model, build_network

    if not Path(ms_boost.__file__).resolve().is_relative_to(root.resolve()):
        raise SystemExit(f"measuring {root}, but ms_boost was imported from {ms_boost.__file__}")
    ms.set_context(mode=ms.GRAPH_MODE)
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((32, 3, 16, 16)).astype(np.float32))
    y = Tensor(rng.integers(0, 10, 32).astype(np.int32))
    cells = {}
    for name in CELLS:
        ms.set_seed(0)
        spec = RunSpec(dataset="digits", net="gemm", contender=CONTENDER[name], lr=0.05, seed=0, epochs=200,
                       image_size=16, width=8, frequency=10)
        cell = _model(spec, build_network(spec, 10), 50)._train_network
        cell.set_train(True)
        for _ in range(warmup):  # compiles (THOR: both step variants)
            cell(x, y).asnumpy()
        cells[name] = cell
    times: dict = {name: {"main_ms": [], "wall_ms": []} for name in cells}
    for r in range(rounds):
        for name, cell in (list(cells.items()) if r % 2 else list(cells.items())[::-1]):
            wall, main = time.perf_counter(), time.thread_time()
            cell(x, y).asnumpy()
            times[name]["main_ms"].append((time.thread_time() - main) * 1e3)
            times[name]["wall_ms"].append((time.perf_counter() - wall) * 1e3)
    return times


def summary(times: dict) -> dict:
    """Medians per cell, and the wall time over MindSpore's cell's paired round by round."""
    from bench.common import paired_ratio

    walls = {name: t["wall_ms"] for name, t in times.items()}
    return {name: {"main_ms": float(np.median(t["main_ms"])), "wall_ms": float(np.median(t["wall_ms"])),
                   "wall_vs_mindspore": paired_ratio(walls, name, "mindspore")["median"]}
            for name, t in times.items()}


def markdown(runs: list, command: str, load_before: list) -> str:
    """The page: one table per run (a tree, or this tree), medians of each."""
    from bench.common import page_footer

    lines = ["# Host time of a Graph-mode train step", "",
             "Written by `bench/host_step.py`: the time-to-accuracy page's `gemm` network (ResNet-10 width 8, GEMM "
             "convolutions, 16 px, batch 32), one fixed batch, four train cells in one process called in turn (the "
             "order reversed every round), medians over the rounds. *Main thread*: CPU time of the calling thread per "
             "call (Python, MindSpore's call path, the launch); *wall*: the call as a training loop sees it; *wall / "
             "MindSpore*: paired round by round with MindSpore's `TrainOneStepCell`.", ""]
    for run in runs:
        lines += [f"## {run['label']}", "", "| train cell | main thread (ms) | wall (ms) | wall / MindSpore |",
                  "|---|---|---|---|"]
        for name in CELLS:
            s = run["summary"][name]
            lines.append(f"| {name} | {s['main_ms']:.3f} | {s['wall_ms']:.2f} | {s['wall_vs_mindspore']:.3f}x |")
        lines.append("")
    return "\n".join(lines + page_footer(command, load_before))


def _child(tree: str, rounds: int) -> dict:
    """One measurement in a fresh process running ``tree``'s code."""
    env = dict(os.environ, PYTHONPATH=str(Path(tree).resolve()))
    script = Path(tree).resolve() / "bench" / "host_step.py"
    if not script.is_file():
        script = Path(__file__).resolve()  # a tree from before this script: measured by this one
    out = subprocess.run([sys.executable, str(script), "--child", str(Path(tree).resolve()), "--rounds", str(rounds)],
                         env=env,
                         capture_output=True, text=True, check=True, cwd=str(Path(tree).resolve()))
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--rounds", type=int, default=80, help="calls of each cell (after 12 warm-up calls)")
    parser.add_argument("--trees", nargs="+", default=None, help="code trees to compare, each in its own process")
    parser.add_argument("--repeats", type=int, default=2, help="with --trees: processes per tree, alternating")
    parser.add_argument("--name", default="host_step", help="results/<name>.{md,json}")
    parser.add_argument("--no_write", action="store_true", help="print the page instead of writing it")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)  # the tree a child process measures
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error(f"--rounds {args.rounds}: at least 2 rounds are needed (each order once).")
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: at least 1.")
    if args.child:
        print(json.dumps(summary(measure(args.rounds, Path(args.child)))))
        return
    from bench.common import load_average, write_results

    load_before = load_average()
    runs = []
    if args.trees:
        missing = [t for t in args.trees if not (Path(t) / "ms_boost").is_dir()]
        if missing:
            parser.error(f"--trees: {missing} hold no ms_boost package (a checkout of this project is needed).")
        for repeat in range(args.repeats):
            for tree in args.trees:
                runs.append({"label": f"{tree}, process {repeat + 1}", "tree": tree,
                             "summary": _child(tree, args.rounds)})
    else:
        runs.append({"label": "this tree", "tree": str(ROOT), "summary": summary(measure(args.rounds))})
    command = "python bench/host_step.py " + " ".join(argv if argv is not None else sys.argv[1:])
    page = markdown(runs, command.strip(), load_before)
    if args.no_write:
        print(page)
        return
    write_results(args.name, {"runs": runs, "rounds": args.rounds, "load_before": load_before,
                              "load_after": load_average()}, page)
    print(page)


if __name__ == "__main__":
    main()

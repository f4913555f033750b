"""One command for the whole benchmark report: ``python -m bench [NAME ...] [--quick] [--only NAME ...] [--list]``.

Runs every benchmark in :data:`REGISTRY` (each in its own process, one after the other: they share the
CPU with nothing of ours), redraws the figures (:mod:`bench.plots`) and writes the summary page
``bench/results/README.md``. ``--quick`` runs each benchmark's short configuration (a few minutes in
all on an idle 2-core machine); the full report takes hours on this CPU.

Adding a benchmark: append one :class:`Run` line to :data:`REGISTRY` -- a name, the script under
``bench/``, the arguments of the full run and of the quick run (``None``: not run with ``--quick``)
and the result pages it writes. The script must write its pages under ``bench/results/`` itself and
exit non-zero on failure.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


@dataclass(frozen=True)
class Run:
    """One benchmark invocation of the report."""

    name: str
    script: str
    full: Sequence[str] = ()
    quick: Optional[Sequence[str]] = ()
    pages: Sequence[str] = field(default_factory=tuple)
    what: str = ""


#: bench_o1_parts.py's contenders that compare gradient centralization's forms (O0 runs with any --only)
GC_PARTS = ("O1", "O1, gc as a 4-D mean (previous)", "O1, gc off", "LessBN: + gc",
            "LessBN: + gc as a 4-D mean (previous)", "LessBN: BatchNorm removal only")

#: The report, in running order. One line per benchmark run; other helpers add theirs here.
REGISTRY: List[Run] = [
    Run("overhead", "bench_overhead.py", (), ("--quick",), ("overhead.md",),
        "ms_boost.Model O0 vs mindspore.train.Model; ms_boost O1 vs upstream mindspore.boost O1 (both modes)"),
    Run("conv", "bench_conv.py", (), ("--quick",), ("conv.md",),
        "the zoo's CPU convolutions: ResNet-18 step and forward, nn.Conv2d vs GemmConv2d (both modes)"),
    Run("dim_reduce_steps", "bench_dim_reduce.py", ("--step_only",), ("--step_only", "--quick"), ("dim_reduce.md",),
        "DimReduce step vs SGD step, Graph mode, ResNet-18 widths 16 and 32"),
    Run("dim_reduce_steps_pynative", "bench_dim_reduce.py", ("--step_only", "--mode", "pynative", "--step_widths",
                                                              "16", "--step_repeats", "10"),
        ("--step_only", "--quick", "--mode", "pynative"), ("dim_reduce.md",),
        "DimReduce step vs SGD step, PyNative mode, width 16"),
    Run("dim_reduce_steps_trajectory", "bench_dim_reduce.py", ("--step_only", "--basis", "trajectory"),
        ("--step_only", "--quick", "--basis", "trajectory"), ("dim_reduce.md",),
        "DimReduce step vs SGD step with the PCA of a short stage 1 and real batches (what a user runs)"),
    Run("dim_reduce_e2e", "bench_dim_reduce.py", ("--carry_search",), ("--quick", "--carry_search"), ("dim_reduce.md",),
        "stage 1 + DimReduce (upstream line search and carry_search) vs SGD continuation, accuracy per epoch"),
    Run("pca", "bench_pca.py", (), ("--sizes", "300000", "1000000", "--num", "40"), ("dim_reduce.md",),
        "streaming PCA time and peak memory vs M"),
    Run("adasum", "bench_adasum.py", (), ("--workers", "2", "--rounds", "3", "--epochs", "3", "--train_per_class",
                                          "50"), ("adasum.md",),
        "AdaSum vs mean all-reduce under msrun: step time, convergence at a large global batch"),
    Run("thor_conv", "bench_thor_conv.py", (), ("--quick",), ("thor_conv.md",),
        "THOR step on CPU with Conv2dThor's GEMM convolution vs ops.Conv2D, and vs Momentum (both modes)"),
    Run("thor", "bench_thor.py", (), ("--epochs", "3", "--seeds", "0", "--frequency", "10", "--timed_steps", "20"),
        ("thor.md",), "THOR vs Momentum"),
    Run("o1_parts", "bench_o1_parts.py", ("--notes", "bench/results/o1_parts_notes.md"), None, ("o1_parts.md",),
        "where an O1 step's time goes against O0 (zoo GEMM ResNet, Graph mode), each O1 part switched off"),
    Run("o1_parts_gc", "bench_o1_parts.py", ("--repeats", "25", "--page", "o1_parts_gc", "--only", *GC_PARTS), None,
        ("o1_parts_gc.md",), "O1 and LessBN with gradient centralization's form against its previous form (Graph)"),
    Run("o1_parts_gc_pynative", "bench_o1_parts.py", ("--mode", "pynative", "--repeats", "15", "--page",
                                                       "o1_parts_gc_pynative", "--only", *GC_PARTS), None,
        ("o1_parts_gc_pynative.md",), "the same in PyNative mode"),
    Run("gc_forms", "bench_gc_forms.py", (), ("--rounds", "10"), ("gc_forms.md",),
        "gradient centralization written several ways (incl. one fused flat-buffer form): CPU time of the 12 "
        "ResNet-10 kernels"),
    Run("gc_forms_threads1", "bench_gc_forms.py", ("--threads", "1"), None, ("gc_forms_threads1.md",),
        "the same with one MindSpore kernel thread (no thread-pool cost: the operations' own work)"),
    Run("tta", "bench_tta.py", (), ("--quick",), ("tta.md",),
        "time to accuracy on real data (digits, MNIST-5k): boost and THOR against a tuned Momentum baseline"),
    Run("tta_autotune", "tta_autotune.py", ("--full",), (), ("tta_autotune.md",),
        "boost_level='auto' against the fixed plans on digits, MNIST and the generated set (time to target)"),
]


def _load() -> List[float]:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return []


def run_benchmarks(runs: Sequence[Run], quick: bool) -> List[dict]:
    """Run each benchmark script in a child process; returns one status dict per run."""
    status = []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    for run in runs:
        args = run.quick if quick else run.full
        if args is None:
            status.append({"name": run.name, "status": "skipped (no quick configuration; the page keeps its last "
                                                           "full run)"})
            print(f"[bench] {run.name}: skipped with --quick", flush=True)
            continue
        command = [sys.executable, str(ROOT / "bench" / run.script), *args]
        print(f"[bench] {run.name}: {' '.join(command[1:])}", flush=True)
        start, load = time.time(), _load()
        code = subprocess.call(command, cwd=ROOT, env=env)
        status.append({"name": run.name, "command": " ".join(["python", f"bench/{run.script}", *args]),
                       "seconds": round(time.time() - start, 1), "exit_code": code, "load_before": load,
                       "status": "ok" if code == 0 else f"failed (exit {code})"})
        print(f"[bench] {run.name}: {status[-1]['status']} in {status[-1]['seconds']:.0f} s", flush=True)
    return status


# ------------------------------------------------------------------------------------------------------
def _fmt(value: Optional[float], digits: int) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _headlines(folder: Path) -> List[str]:
    """Headline rows of the summary table, from the result JSON files present."""
    rows = []

    def load(name):
        path = folder / f"{name}.json"
        return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None

    over = load("overhead")
    if over:
        for mode, data in over.get("modes", {}).items():
            ratios = data.get("ratios", {})
            noise = ratios.get("mindspore O0 (twin) / mindspore O0")
            for key in ("ms_boost O0 / mindspore O0", "ms_boost O1 / upstream O1",
                        "ms_boost O1 (gc off) / upstream O1 (gc off)"):
                if key in ratios:
                    rows.append(f"| {key} | {mode} | {ratios[key]:.3f} | "
                                f"{_fmt(noise, 3)} | [overhead.md](overhead.md) |")
    dim = load("dim_reduce")
    if dim:
        for name in ("steps", "steps_pynative"):
            for r in dim.get(name, {}).get("data", {}).get("runs", []):
                noise = r.get("noise_ratio")
                carry = ", carry_search" if r.get("carry_search") else ""
                rows.append(f"| DimReduce step / SGD step, ResNet-18 width {r['width']} "
                            f"({r['weights']:,} weights{carry}) | "
                            f"{r['mode']} | {r['ratio_median']:.2f} | "
                            f"{_fmt(noise, 2)} | [dim_reduce.md](dim_reduce.md) |")
    conv = load("conv")
    if conv:
        for r in conv.get("runs", []):
            rows.append(f"| GemmConv2d / nn.Conv2d ResNet-18 width {r['width']} training step (speed-up, "
                        f"native / GEMM) | {r['mode']} | {r['step_speedup']['median']:.2f} | "
                        f"{_fmt(r['noise']['median'], 2)} | [conv.md](conv.md) |")
    ada = load("adasum")
    if ada and "steptime" in ada:
        for key, r in sorted(ada["steptime"].get("rows", {}).items()):
            workers, mode, net = key.split("/", 2)
            rows.append(f"| AdaSum step / mean all-reduce step, {net}, {workers} workers | {mode} | "
                        f"{r['ratio']:.3f} | n/a | [adasum.md](adasum.md) |")
    return rows


def write_summary(folder: Path, status: Sequence[dict], quick: bool, pngs: Sequence[Path], load_start,
                  ran: bool = True) -> Path:
    """``bench/results/README.md``: what ran, headline ratios with their noise floor, figures, machine."""
    sys.path.insert(0, str(ROOT))
    from bench.common import environment

    env = environment()
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    how = (f"Regenerated by `python -m bench{' --quick' if quick else ''}`" if ran else
           "Summary and figures redrawn by `python -m bench --summary_only` from the pages' JSON files (each page "
           "dates its own run)")
    lines = ["# Benchmark report", "",
             f"{how} on {when}. "
             "Every page below states its machine, versions, load and command; figures are redrawn from the JSON "
             "files by `python -m bench.plots`.", "",
             "## Headline ratios", "",
             "Ratios are medians over repeats of paired per-repeat ratios (contenders interleaved). *Noise floor*: "
             "the same measurement between two identical contenders -- a ratio within that distance of 1 is no "
             "difference.", "",
             "| ratio (lower is faster for the first) | mode | value | noise floor | page |", "|---|---|---|---|---|"]
    lines += _headlines(folder) or ["| (no results yet) | | | | |"]
    if status:
        lines += ["", "## This run", "", "| benchmark | status | seconds | load before |", "|---|---|---|---|"]
        for s in status:
            lines.append(f"| {s['name']} | {s['status']} | {s.get('seconds', '')} | "
                         f"{' / '.join(str(v) for v in s.get('load_before', []))} |")
    lines += ["", "## Figures", ""]
    for png in pngs:
        lines.append(f"![{png.stem}]({png.name})")
        lines.append("")
    lines += ["## Pages", ""]
    for run in REGISTRY:
        for page in run.pages:
            if (folder / page).exists():
                lines.append(f"- [{page}]({page}): {run.what} (`python bench/{run.script} {shlex.join(run.full)}`)")
    load_end = _load()
    lines += ["", "## Machine", "",
              f"- {env['cpu_count']} CPUs ({env['cpu_model']}), {env['memory_gib']} GiB, {env['os']}; MindSpore "
              f"{env['mindspore']}, numpy {env['numpy']}, Python {env['python']}.",
              f"- Load average (1/5/15 min) at the start: {' / '.join(str(v) for v in load_start)}; at the end: "
              f"{' / '.join(str(v) for v in load_end)}. The CPU is shared with other jobs: absolute times are "
              "indicative, paired ratios are what carries over.",
              f"- Reproduce: `pip install -e .[bench]`, then `python -m bench{' --quick' if quick else ''}`."]
    target = folder / "README.md"
    tmp = target.with_suffix(".md.tmp")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.replace(tmp, target)
    return target


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="each benchmark's short configuration")
    parser.add_argument("names", nargs="*", metavar="NAME", help="run only these registry entries (as --only)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these registry entries")
    parser.add_argument("--list", action="store_true", help="list the registry and exit")
    parser.add_argument("--summary_only", action="store_true", help="redraw figures and the summary, run nothing")
    args = parser.parse_args(argv)
    if args.list:
        for run in REGISTRY:
            print(f"{run.name:28s} bench/{run.script} full={' '.join(run.full) or '-'} "
                  f"quick={'-' if run.quick is None else ' '.join(run.quick) or '(no args)'}  {run.what}")
        return 0
    runs = REGISTRY
    args.only = [*(args.only or []), *args.names]
    if args.only:
        unknown = sorted(set(args.only) - {r.name for r in REGISTRY})
        if unknown:
            parser.error(f"--only {unknown}: not in the registry; allowed: {[r.name for r in REGISTRY]}")
        runs = [r for r in REGISTRY if r.name in args.only]
    load_start = _load()
    status = [] if args.summary_only else run_benchmarks(runs, args.quick)
    sys.path.insert(0, str(ROOT))
    try:
        from bench.plots import render_all

        pngs = render_all(RESULTS)
    except ImportError as exc:  # matplotlib missing: the pages still get written
        print(f"[bench] figures skipped: {exc} (pip install -e .[bench])", flush=True)
        pngs = sorted(RESULTS.glob("*.png"))
    summary = write_summary(RESULTS, status, args.quick, pngs, load_start, ran=not args.summary_only)
    print(f"[bench] summary: {summary}")
    return 0 if all(s.get("exit_code", 0) == 0 for s in status) else 1


if __name__ == "__main__":
    sys.exit(main())

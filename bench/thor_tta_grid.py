r"""THOR's refresh frequency x learning rate on the time-to-accuracy page's fast-step network.

The page (:mod:`bench.bench_tta`, quick form) tunes the Momentum baseline over an lr grid but runs THOR at one
point (lr 0.05, damping 0.03, frequency 10). This grid gives THOR the same chance on the page's ``gemm`` cells
(the zoo's ResNet-10 width 8 on GEMM convolutions, 16 px, batch 32, 4 epochs, cosine lr to 0, Graph mode, CPU):
every (frequency, lr, block size, statistics fraction) of THOR and the baseline at its picked lr, per seed, each run
in its own process through the page's own worker (:func:`bench.bench_tta.launch`: the same data, network, Model and
schedule).

Recorded per run: validation accuracy after every epoch, and each epoch's wall and process CPU seconds (all
threads; the machine may be shared, so CPU time is the figure to read). Reported per setting (median [min, max]
over the seeds): epochs to the target (the baseline's median final accuracy minus 1 point, as on the page),
final accuracy (both machine-independent), steady epoch CPU seconds (median of epochs 2..), steady CPU seconds to
the target (compile taken out) and its per-seed ratio to the baseline's.

Usage::

    python bench/thor_tta_grid.py [--datasets digits mnist5k] [--frequencies 10 25 50] [--lrs 0.05 0.1]
        [--block_sizes 64] [--stat_fractions 1 0.5] [--seeds 0 1 2] [--name thor_tta_grid] [--render]

A setting at block size 64 (the size the first pages ran at) keeps its old label ``THOR f<frequency> lr<lr>``;
another size is labelled ``... b<size>``; a statistics fraction below 1 (``thor(..., stat_fraction=)``: the factor
statistics on that fraction of each batch) ``... s<fraction>``.

Results: ``bench/results/<name>.json`` (rewritten after every run; a stopped sweep resumes from it) and ``.md``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_tta import (  # noqa: E402
    QUICK,
    RunSpec,
    epochs_to_target,
    launch,
    median_spread,
    paired_ratios,
    steady_and_compile,
    steady_time_to_target,
    target_accuracy,
)

RESULTS = ROOT / "bench" / "results"
BASELINE_LR = 0.1  # the baseline's pick on both pages (digits/gemm and mnist5k/gemm)
DAMPING = 0.03  # the page's THOR damping
PAGE_BLOCK_SIZE = 64  # the block size of the first pages' runs: their labels carry no size


def run_key(dataset: str, name: str, seed: int) -> str:
    """The key of one run in the results file."""
    return f"{dataset}|{name}|{seed}"


def thor_name(frequency: int, lr: float, block_size: int = PAGE_BLOCK_SIZE, stat_fraction: float = 1.0) -> str:
    """The label of one THOR setting (block size 64 and the whole batch's statistics unlabelled, as on the first
    pages)."""
    size = "" if block_size == PAGE_BLOCK_SIZE else f" b{block_size}"
    fraction = "" if stat_fraction == 1.0 else f" s{stat_fraction:g}"
    return f"THOR f{frequency} lr{lr}{size}{fraction}"


def _cpu(run: dict) -> List[float]:
    return run.get("epoch_cpu_seconds") or run["epoch_seconds"]


def summarize(runs: Dict[str, dict], dataset: str, names: List[str], seeds: List[int]) -> dict:
    """Per setting of one data set: epochs to target, final accuracy, steady CPU epoch and CPU time to target."""
    by = {n: {s: runs.get(run_key(dataset, n, s)) for s in seeds} for n in names}
    by = {n: {s: r for s, r in d.items() if r and not r.get("error") and r["accuracy"]} for n, d in by.items()}
    base = by.get("baseline") or {}
    if not base:
        return {}
    target = target_accuracy([r["accuracy"][-1] for r in base.values()])
    ttt = {n: {s: steady_time_to_target(r["accuracy"], _cpu(r), target) for s, r in d.items()} for n, d in by.items()}
    out = {"target": target, "rows": {}}
    for n, d in by.items():
        if not d:
            continue
        ratios = paired_ratios(ttt[n], ttt["baseline"])
        out["rows"][n] = {
            "runs": len(d), "reached": sum(v is not None for v in ttt[n].values()),
            "epochs_to_target": median_spread([epochs_to_target(r["accuracy"], target) for r in d.values()]),
            "final_accuracy": median_spread([r["accuracy"][-1] for r in d.values()]),
            "steady_cpu_s": median_spread([steady_and_compile(_cpu(r))[0] for r in d.values()]),
            "steady_wall_s": median_spread([steady_and_compile(r["epoch_seconds"])[0] for r in d.values()]),
            "compile_cpu_s": median_spread([steady_and_compile(_cpu(r))[1] for r in d.values()]),
            "cpu_to_target": median_spread(list(ttt[n].values())),
            "ratio": median_spread(ratios), "ratio_values": ratios}
    return out


def _fmt(stat: Optional[dict], digits: int = 2) -> str:
    if not stat:
        return "--"
    if stat["min"] == stat["max"]:
        return f"{stat['median']:.{digits}f}"
    return f"{stat['median']:.{digits}f} [{stat['min']:.{digits}f}, {stat['max']:.{digits}f}]"


def render(payload: dict) -> str:
    """The results page."""
    cfg = payload["config"]
    lines = ["# THOR's refresh frequency x lr on the time-to-accuracy page's `gemm` network", "",
             f"Written by `bench/thor_tta_grid.py`. {payload.get('seconds', 0) / 60:.1f} min of runs. The page's "
             "quick-form cell (`bench/bench_tta.py`): zoo ResNet-10 width 8 on GEMM convolutions, 16 px, batch 32, "
             f"{cfg['epochs']} epochs, cosine lr to 0, Graph mode, CPU, every run in its own process through the "
             f"page's worker. Baseline: Momentum 0.9 at lr {BASELINE_LR} (the page's pick). THOR: damping "
             f"{DAMPING}, block size {_sizes(cfg)}, statistics on {_fractions(cfg)} of each batch, the frequencies "
             f"and lrs below. Seeds {cfg['seeds']}.", "",
             "**Target** = the baseline's median final accuracy here minus 1 point (as on the page). Epochs to the "
             "target and final accuracy do not depend on the machine. **CPU to target**: steady process CPU seconds "
             "(all threads; the compile, epoch 1 minus the median later epoch, taken out) until the end of the "
             "first epoch at or above the target; **ratio**: per seed over the baseline's, median [min, max] over "
             "the seeds where both reached it.", "",
             f"Load average (1/5/15 min) before: {payload.get('load_before')}; after: {payload.get('load_after')} "
             "(a shared machine: read the CPU seconds and the ratios, not the wall times).", ""]
    for dataset, summ in payload.get("summary", {}).items():
        if not summ:
            continue
        lines += [f"## {dataset}/gemm", "", f"Target **{summ['target']:.4f}**.", "",
                  "| setting | reached | epochs to target | final accuracy | steady epoch CPU (s) | steady epoch wall "
                  "(s) | compile CPU (s) | CPU to target (s) | ratio to baseline |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for name, row in summ["rows"].items():
            lines.append(f"| {name} | {row['reached']}/{row['runs']} | {_fmt(row['epochs_to_target'], 0)} | "
                         f"{_fmt(row['final_accuracy'], 4)} | {_fmt(row['steady_cpu_s'])} | "
                         f"{_fmt(row['steady_wall_s'])} | {_fmt(row['compile_cpu_s'], 1)} | "
                         f"{_fmt(row['cpu_to_target'])} | {_fmt(row['ratio'])} |")
        lines.append("")
    notes = payload.get("notes")
    if notes:
        lines += ["## Reading", "", notes.strip(), ""]
    return "\n".join(lines) + "\n"


def _sizes(cfg: dict) -> str:
    sizes = cfg.get("block_sizes", [PAGE_BLOCK_SIZE])
    text = " and ".join(str(b) for b in sizes)
    return text + (" (a setting labelled b<size> ran at that size, an unlabelled one at 64)" if len(sizes) > 1 else "")


def _fractions(cfg: dict) -> str:
    fractions = cfg.get("stat_fractions", [1.0])
    text = " and ".join(f"{f:g}" for f in fractions)
    return text + (" (a setting labelled s<fraction> used that fraction, an unlabelled one the whole batch)"
                   if len(fractions) > 1 else "")


def _load() -> List[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def main(argv=None) -> int:
    """Run (or resume) the grid and write its page."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", nargs="+", default=["digits", "mnist5k"])
    parser.add_argument("--frequencies", nargs="+", type=int, default=[10, 25, 50])
    parser.add_argument("--lrs", nargs="+", type=float, default=[0.05, 0.1])
    parser.add_argument("--block_sizes", nargs="+", type=int, default=[PAGE_BLOCK_SIZE],
                        help="THOR's block_size values (the settings at 64 keep the first pages' labels)")
    parser.add_argument("--stat_fractions", nargs="+", type=float, default=[1.0],
                        help="THOR's stat_fraction values (factor statistics on that fraction of each batch; the "
                             "settings at 1 keep the first pages' labels)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--name", default="thor_tta_grid")
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--notes", default="", help="a markdown file appended as the page's reading")
    parser.add_argument("--render", action="store_true", help="only write the page again from the JSON")
    args = parser.parse_args(argv)
    bad = [b for b in args.block_sizes if b < 1]
    if bad:
        parser.error(f"--block_sizes={args.block_sizes}: {bad} not allowed (a block size is a positive integer)")
    bad_fractions = [f for f in args.stat_fractions if not 0.0 < f <= 1.0]
    if bad_fractions:
        parser.error(f"--stat_fractions={args.stat_fractions}: {bad_fractions} not allowed (a fraction in (0, 1])")
    from model_zoo.resnet.src.real_data import ensure_real

    path = RESULTS / f"{args.name}.json"
    payload = json.loads(path.read_text()) if path.exists() else {"runs": {}}
    payload["config"] = {"datasets": args.datasets, "frequencies": args.frequencies, "lrs": args.lrs,
                         "seeds": args.seeds, "epochs": QUICK.epochs["gemm"], "image_size": QUICK.image_size,
                         "width": QUICK.width["gemm"], "damping": DAMPING, "baseline_lr": BASELINE_LR,
                         "block_sizes": args.block_sizes, "stat_fractions": args.stat_fractions}
    settings = {thor_name(f, lr, b, s): (f, lr, b, s) for f in args.frequencies for lr in args.lrs
                for b in args.block_sizes for s in args.stat_fractions}
    names = ["baseline"] + list(settings)
    start = time.perf_counter()
    if not args.render:
        payload.setdefault("load_before", _load())
        for dataset in args.datasets:
            root = ensure_real(dataset, image_size=QUICK.image_size)
            for i, seed in enumerate(args.seeds):
                order = names if i % 2 == 0 else names[:1] + names[:0:-1]  # THOR settings reversed every other seed
                for name in order:
                    key = run_key(dataset, name, seed)
                    if key in payload["runs"] and not payload["runs"][key].get("error"):
                        continue
                    if name == "baseline":
                        spec = RunSpec(dataset, "gemm", "baseline", BASELINE_LR, seed, QUICK.epochs["gemm"],
                                       image_size=QUICK.image_size, width=QUICK.width["gemm"])
                    else:
                        freq, lr, size, fraction = settings[name]
                        extra = {"block_size": size, **({"stat_fraction": fraction} if fraction != 1.0 else {})}
                        spec = RunSpec(dataset, "gemm", "THOR", lr, seed, QUICK.epochs["gemm"],
                                       image_size=QUICK.image_size, width=QUICK.width["gemm"], damping=DAMPING,
                                       frequency=freq, extra=extra)
                    print(f"[grid] {key}", flush=True)
                    run = launch(spec, root, args.timeout)
                    run.update(spec=asdict(spec), load=_load())
                    payload["runs"][key] = run
                    print(f"[grid] {key}: acc {[round(a, 4) for a in run['accuracy']]} cpu "
                          f"{[round(c, 2) for c in run.get('epoch_cpu_seconds', [])]}", flush=True)
                    tmp = path.with_suffix(".tmp")
                    tmp.write_text(json.dumps(payload) + "\n")
                    tmp.replace(path)
        payload["load_after"] = _load()
        payload["seconds"] = payload.get("seconds", 0.0) + time.perf_counter() - start
    if not payload.get("load_after") and payload["runs"]:  # a stopped sweep: the load after its last run
        payload["load_after"] = list(payload["runs"].values())[-1].get("load")
    payload["summary"] = {d: summarize(payload["runs"], d, names, args.seeds) for d in args.datasets}
    if args.notes:
        payload["notes"] = Path(args.notes).read_text()
    path.write_text(json.dumps(payload) + "\n")
    (RESULTS / f"{args.name}.md").write_text(render(payload))
    print((RESULTS / f"{args.name}.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())

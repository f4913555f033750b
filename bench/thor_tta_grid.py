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

**Schedule lengths** (``--epochs`` for THOR, ``--baseline_epochs`` x ``--baseline_lrs`` for the baseline): a run
at ``e`` epochs has its cosine lr (and THOR's damping schedule) over ``e`` epochs, ending at 0 there: a second-order
method's shorter schedule, with the baseline given the same choice. The target stays the page's: the baseline at
the page's lr pick today (digits 0.1, MNIST-5k 0.2) and 4 epochs. Each setting is also reported against the
**best baseline setting** (the lowest median steady CPU to the target among those reaching it on the most seeds),
per seed, and by a **modelled ratio**: the pages' idle steady-epoch ratio THOR/baseline times the epochs-to-target
ratio to the baseline setting with the fewest epochs to it (the CPU ratio free of this machine's load).

Usage::

    python bench/thor_tta_grid.py [--datasets digits mnist5k] [--frequencies 10 25 50] [--lrs 0.05 0.1]
        [--block_sizes 64] [--stat_fractions 1 0.5] [--epochs 2 3] [--baseline_lrs 0.1 0.2]
        [--baseline_epochs 2 3 4] [--seeds 0 1 2] [--name thor_tta_grid] [--render]

A setting at block size 64 (the size the first pages ran at) keeps its old label ``THOR f<frequency> lr<lr>``;
another size is labelled ``... b<size>``; a statistics fraction below 1 (``thor(..., stat_fraction=)``: the factor
statistics on that fraction of each batch) ``... s<fraction>``; a schedule other than the page's 4 epochs
``... e<epochs>``. The baseline at lr 0.1 and 4 epochs keeps ``baseline``; another is ``baseline lr<lr> e<epochs>``.

Results: ``bench/results/<name>.json`` (rewritten after every run; a stopped sweep resumes from it) and ``.md``.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

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
BASELINE_LR = 0.1  # the baseline's pick on both pages when the first grids ran (digits/gemm and mnist5k/gemm)
#: the baseline's lr picked by the pages today (tta.json digits/gemm; tta_mnist5k.json mnist5k/gemm since its idle
#: rerun at block size 64): a schedule grid's target is the baseline at this lr and the page's epochs
PAGE_BASELINE_LR = {"digits": 0.1, "mnist5k": 0.2}
DAMPING = 0.03  # the page's THOR damping
PAGE_BLOCK_SIZE = 64  # the block size of the first pages' runs: their labels carry no size
PAGE_EPOCHS = QUICK.epochs["gemm"]  # the page's schedule length: the first pages' labels carry no epochs
#: THOR's steady epoch over the baseline's on the pages (bench/results/tta.md, tta_mnist5k.md: quick form, gemm),
#: measured idle; times the epochs-to-target ratio, the CPU-to-target ratio a loaded machine cannot measure
PAGE_STEADY_RATIO = {"digits": 1.53, "mnist5k": 2.16}


def run_key(dataset: str, name: str, seed: int) -> str:
    """The key of one run in the results file."""
    return f"{dataset}|{name}|{seed}"


def thor_name(frequency: int, lr: float, block_size: int = PAGE_BLOCK_SIZE, stat_fraction: float = 1.0,
              epochs: int = PAGE_EPOCHS) -> str:
    """The label of one THOR setting (block size 64, the whole batch's statistics and the page's epochs
    unlabelled, as on the first pages)."""
    size = "" if block_size == PAGE_BLOCK_SIZE else f" b{block_size}"
    fraction = "" if stat_fraction == 1.0 else f" s{stat_fraction:g}"
    length = "" if epochs == PAGE_EPOCHS else f" e{epochs}"
    return f"THOR f{frequency} lr{lr}{size}{fraction}{length}"


def baseline_name(lr: float, epochs: int = PAGE_EPOCHS) -> str:
    """The label of one baseline setting: ``baseline`` at the page's lr and epochs (the first pages' label; its
    runs define the target), ``baseline lr<lr> e<epochs>`` otherwise."""
    return "baseline" if (lr, epochs) == (BASELINE_LR, PAGE_EPOCHS) else f"baseline lr{lr} e{epochs}"


def shown_name(name: str) -> str:
    """``name`` as the page shows it: with its lr and epochs always written out (the unlabelled defaults)."""
    if name == "baseline":
        return f"baseline lr{BASELINE_LR} e{PAGE_EPOCHS}"
    if name.startswith("THOR") and not re.search(r" e\d+$", name):
        return f"{name} e{PAGE_EPOCHS}"
    return name


def schedule_epochs(name: str) -> int:
    """The schedule length (epochs) of a setting's label."""
    hit = re.search(r" e(\d+)$", name)
    return int(hit.group(1)) if hit else PAGE_EPOCHS


def _sibling_key(name: str) -> str:
    """A setting's label without its schedule length: the runs of one computation (same steady epoch)."""
    if name.startswith("baseline"):
        return "baseline"
    return re.sub(r" e\d+$", "", name)


def _cpu(run: dict) -> List[float]:
    return run.get("epoch_cpu_seconds") or run["epoch_seconds"]


def _steady(runs: Dict[str, dict], dataset: str, name: str, seed: int, run: dict) -> Optional[float]:
    """A run's steady epoch CPU seconds; a 1-epoch run has none of its own (its epoch holds the compile): the
    median steady epoch of the same seed's runs of the same computation at other schedule lengths (None if
    none)."""
    cpu = _cpu(run)
    if len(cpu) >= 2:
        return steady_and_compile(cpu)[0]
    sibling = _sibling_key(name)
    others = [steady_and_compile(_cpu(r))[0] for k, r in runs.items()
              if k.startswith(f"{dataset}|") and k.endswith(f"|{seed}") and not r.get("error")
              and len(_cpu(r)) >= 2 and _sibling_key(k.split("|")[1]) == sibling]
    return float(np.median(others)) if others else None


def _cpu_to_target(run: dict, steady: Optional[float], target: float) -> Optional[float]:
    """Steady CPU seconds to the target (compile out); a 1-epoch run: its epochs to target x ``steady``."""
    hit = epochs_to_target(run["accuracy"], target)
    if hit is None:
        return None
    if len(_cpu(run)) >= 2:
        return steady_time_to_target(run["accuracy"], _cpu(run), target)
    return None if steady is None else hit * steady


def best_baseline(cost: Dict[str, Dict[int, Optional[float]]], seeds: List[int]) -> Optional[str]:
    """The baseline setting with the lowest median cost to the target (steady CPU seconds, or epochs) over the
    seeds it reached it on, among those that reached it on the most seeds (every seed if any did; ties: the lower
    mean, then the first in ``cost``'s order); None when none reached it."""
    reached = {n: [d[s] for s in seeds if d.get(s) is not None] for n, d in cost.items() if n.startswith("baseline")}
    most = max((len(v) for v in reached.values()), default=0)
    if most == 0:
        return None
    return min((n for n, v in reached.items() if len(v) == most),
               key=lambda n: (float(np.median(reached[n])), float(np.mean(reached[n]))))


def epoch_ratios(contender: Dict[int, Optional[int]], reference: Dict[int, Optional[int]]) -> List[float]:
    """Per seed where both reached the target: the contender's epochs to it over the reference's."""
    return [contender[s] / reference[s] for s in sorted(contender)
            if contender[s] is not None and reference.get(s)]


def target_setting(dataset: str, schedules: bool) -> str:
    """The baseline setting whose runs define a data set's target: ``baseline`` (lr 0.1, 4 epochs) on the first
    pages; in a schedule grid the page's own pick today (:data:`PAGE_BASELINE_LR`) at the page's epochs."""
    return baseline_name(PAGE_BASELINE_LR.get(dataset, BASELINE_LR), PAGE_EPOCHS) if schedules else "baseline"


def summarize(runs: Dict[str, dict], dataset: str, names: List[str], seeds: List[int],
              target_name: str = "baseline") -> dict:
    """Per setting of one data set: epochs to target, final accuracy, steady CPU epoch and CPU time to target,
    and the CPU-to-target ratios to the page's baseline (``target_name``: its runs define the target) and to the
    best baseline setting (:func:`best_baseline`)."""
    by = {n: {s: runs.get(run_key(dataset, n, s)) for s in seeds} for n in names}
    by = {n: {s: r for s, r in d.items() if r and not r.get("error") and r["accuracy"]} for n, d in by.items()}
    base = by.get(target_name) or {}
    if not base:
        return {}
    target = target_accuracy([r["accuracy"][-1] for r in base.values()])
    steady = {n: {s: _steady(runs, dataset, n, s, r) for s, r in d.items()} for n, d in by.items()}
    ttt = {n: {s: _cpu_to_target(r, steady[n][s], target) for s, r in d.items()} for n, d in by.items()}
    ett = {n: {s: epochs_to_target(r["accuracy"], target) for s, r in d.items()} for n, d in by.items()}
    ran = [s for s in seeds if s in base]
    best = best_baseline({n: ttt[n] for n in names if by.get(n)}, ran)
    # the modelled ratio's reference: the fewest epochs to the target (every baseline setting has the same steady
    # epoch, so on an idle machine the fewest epochs is the least CPU; this pick does not depend on the load)
    best_epochs = best_baseline({n: ett[n] for n in names if by.get(n)}, ran)
    page_ratio = PAGE_STEADY_RATIO.get(dataset)
    out = {"target": target, "target_setting": target_name, "best_baseline": best,
           "best_baseline_by_epochs": best_epochs, "page_steady_ratio": page_ratio, "rows": {}}
    for n, d in by.items():
        if not d:
            continue
        ratios = paired_ratios(ttt[n], ttt[target_name])
        row = {
            "epochs": schedule_epochs(n),
            "runs": len(d), "reached": sum(v is not None for v in ett[n].values()),
            "epochs_to_target": median_spread(list(ett[n].values())),
            "final_accuracy": median_spread([r["accuracy"][-1] for r in d.values()]),
            "steady_cpu_s": median_spread(list(steady[n].values())),
            "steady_wall_s": median_spread([steady_and_compile(r["epoch_seconds"])[0] for r in d.values()
                                            if len(r["epoch_seconds"]) >= 2]),
            "compile_cpu_s": median_spread([steady_and_compile(_cpu(r))[1] for r in d.values()
                                            if len(_cpu(r)) >= 2]),
            "cpu_to_target": median_spread(list(ttt[n].values())),
            "ratio": median_spread(ratios), "ratio_values": ratios}
        if best is not None:
            best_ratios = paired_ratios(ttt[n], ttt[best])
            row.update(ratio_best=median_spread(best_ratios), ratio_best_values=best_ratios)
        if best_epochs is not None:
            e_ratios = epoch_ratios(ett[n], ett[best_epochs])
            factor = 1.0 if n.startswith("baseline") else page_ratio
            row.update(epochs_ratio_best=median_spread(e_ratios),
                       modelled_ratio_best=None if factor is None else median_spread([factor * r for r in e_ratios]))
        out["rows"][n] = row
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
    title = ("THOR's and the baseline's schedule length" if "thor_epochs" in cfg
             else "THOR's refresh frequency x lr")
    lines = [f"# {title} on the time-to-accuracy page's `gemm` network", "",
             f"Written by `bench/thor_tta_grid.py`. {payload.get('seconds', 0) / 60:.1f} min of runs. The page's "
             "quick-form cell (`bench/bench_tta.py`): zoo ResNet-10 width 8 on GEMM convolutions, 16 px, batch 32, "
             f"{cfg['epochs']} epochs, cosine lr to 0, Graph mode, CPU, every run in its own process through the "
             f"page's worker. Baseline: Momentum 0.9 at lr {_baseline_lrs(cfg)}. THOR: damping "
             f"{DAMPING}, block size {_sizes(cfg)}, statistics on {_fractions(cfg)} of each batch, the frequencies "
             f"and lrs below. Seeds {cfg['seeds']}.", "",
             "**Target** = the baseline's median final accuracy here minus 1 point (as on the page). Epochs to the "
             "target and final accuracy do not depend on the machine. **CPU to target**: steady process CPU seconds "
             "(all threads; the compile, epoch 1 minus the median later epoch, taken out) until the end of the "
             "first epoch at or above the target; **ratio**: per seed over the baseline's, median [min, max] over "
             "the seeds where both reached it.", ""]
    if "thor_epochs" in cfg:
        picks = ", ".join(f"{d} {lr}" for d, lr in PAGE_BASELINE_LR.items())
        lines += [f"**Schedule lengths**: THOR at {cfg['thor_epochs']} epochs, the baseline at lrs "
                  f"{cfg['baseline_lrs']} x {cfg['baseline_epochs']} epochs: each run's cosine lr (and THOR's "
                  "damping schedule) spans its own epochs and ends at 0 there. The target stays the page's: the "
                  f"baseline at the page's lr pick today ({picks}) and {PAGE_EPOCHS} epochs; **ratio to the page's "
                  "baseline** is to that setting. **Ratio to the best baseline**: per seed over the baseline "
                  "setting with the lowest median CPU to the target among those reaching it on the most seeds (named "
                  "under each table). **Modelled ratio**: the pages' idle steady-epoch ratio THOR/baseline "
                  f"({', '.join(f'{d} {r}x' for d, r in PAGE_STEADY_RATIO.items())}; 1 for a baseline setting) "
                  "times the per-seed epochs-to-target ratio to the baseline setting with the fewest epochs to "
                  "the target (median, then mean; every baseline setting runs the same steady epoch, so idle that "
                  "is the least CPU): the CPU ratio without this "
                  "machine's load. A 1-epoch run's steady epoch is the same seed's same setting at the other "
                  "lengths (its one epoch holds the compile).", ""]
    lines += [f"Load average (1/5/15 min) before: {payload.get('load_before')}; after: {payload.get('load_after')} "
              "(a shared machine: read the CPU seconds and the ratios, not the wall times).", ""]
    for dataset, summ in payload.get("summary", {}).items():
        if not summ:
            continue
        schedules = "thor_epochs" in cfg
        best = summ.get("best_baseline") if schedules else None
        by_epochs = summ.get("best_baseline_by_epochs") if schedules else None
        lines += [f"## {dataset}/gemm", "", f"Target **{summ['target']:.4f}**"
                  + (f" (from {shown_name(summ.get('target_setting', 'baseline'))})." if schedules else ".")
                  + (f" Best baseline setting (lowest median steady CPU to the target among those reaching it on "
                     f"the most seeds): **{shown_name(best)}** ({summ['rows'][best]['reached']} of "
                     f"{summ['rows'][best]['runs']} seeds)." if best else "")
                  + (f" Fewest epochs to the target (the modelled ratio's reference): **{shown_name(by_epochs)}**."
                     if by_epochs else ""), ""]
        head = ["setting", "reached", "epochs to target", "final accuracy", "steady epoch CPU (s)",
                "steady epoch wall (s)", "compile CPU (s)", "CPU to target (s)", "ratio to baseline"]
        if schedules:
            head[-1] = "ratio to the page's baseline"
            head += ["ratio to the best baseline", "epochs ratio to the fewest-epochs baseline",
                     "modelled ratio to it"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for name, row in summ["rows"].items():
            shown = shown_name(name) + (" (the target's)" if name == summ.get("target_setting") else "")
            cells = [shown if schedules else name, f"{row['reached']}/{row['runs']}",
                     _fmt(row["epochs_to_target"], 0), _fmt(row["final_accuracy"], 4), _fmt(row["steady_cpu_s"]),
                     _fmt(row["steady_wall_s"]), _fmt(row["compile_cpu_s"], 1), _fmt(row["cpu_to_target"]),
                     _fmt(row["ratio"])]
            if schedules:
                cells += [_fmt(row.get("ratio_best")), _fmt(row.get("epochs_ratio_best")),
                          _fmt(row.get("modelled_ratio_best"))]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    notes = payload.get("notes")
    if notes:
        lines += ["## Reading", "", notes.strip(), ""]
    return "\n".join(lines) + "\n"


def _baseline_lrs(cfg: dict) -> str:
    if "baseline_lrs" not in cfg:
        return f"{BASELINE_LR} (the page's pick)"
    return " / ".join(str(lr) for lr in cfg["baseline_lrs"]) + " (the schedule lengths below)"


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
    parser.add_argument("--epochs", nargs="+", type=int, default=[PAGE_EPOCHS],
                        help="THOR's schedule lengths: cosine lr to 0 (and the damping schedule) over that many "
                             f"epochs, the run ending there (the settings at the page's {PAGE_EPOCHS} keep the first "
                             "pages' labels, the others end in e<epochs>)")
    parser.add_argument("--baseline_lrs", nargs="+", type=float, default=[BASELINE_LR],
                        help=f"the baseline's lrs (its lr {BASELINE_LR} at the page's epochs, the target's run, "
                             "always runs)")
    parser.add_argument("--baseline_epochs", nargs="+", type=int, default=[PAGE_EPOCHS],
                        help="the baseline's schedule lengths (as --epochs)")
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
    for key in ("epochs", "baseline_epochs"):
        bad = [e for e in getattr(args, key) if e < 1]
        if bad:
            parser.error(f"--{key}={getattr(args, key)}: {bad} not allowed (a schedule length is a positive "
                         "number of epochs)")
    bad_lrs = [lr for lr in args.baseline_lrs if lr <= 0]
    if bad_lrs:
        parser.error(f"--baseline_lrs={args.baseline_lrs}: {bad_lrs} not allowed (an lr is positive)")
    from model_zoo.resnet.src.real_data import ensure_real

    path = RESULTS / f"{args.name}.json"
    payload = json.loads(path.read_text()) if path.exists() else {"runs": {}}
    payload["config"] = {"datasets": args.datasets, "frequencies": args.frequencies, "lrs": args.lrs,
                         "seeds": args.seeds, "epochs": QUICK.epochs["gemm"], "image_size": QUICK.image_size,
                         "width": QUICK.width["gemm"], "damping": DAMPING, "baseline_lr": BASELINE_LR,
                         "block_sizes": args.block_sizes, "stat_fractions": args.stat_fractions}
    if (args.epochs, args.baseline_lrs, args.baseline_epochs) != ([PAGE_EPOCHS], [BASELINE_LR], [PAGE_EPOCHS]):
        # a schedule grid: its page has the columns against the best baseline (a first page's stays as it was)
        payload["config"].update(thor_epochs=args.epochs, baseline_lrs=args.baseline_lrs,
                                 baseline_epochs=args.baseline_epochs)
    settings = {thor_name(f, lr, b, s, e): (f, lr, b, s, e) for f in args.frequencies for lr in args.lrs
                for b in args.block_sizes for s in args.stat_fractions for e in args.epochs}
    schedules = "thor_epochs" in payload["config"]
    targets = {d: target_setting(d, schedules) for d in args.datasets}
    baselines = {"baseline": (BASELINE_LR, PAGE_EPOCHS)}  # the first pages' target run, first
    baselines.update({targets[d]: (PAGE_BASELINE_LR.get(d, BASELINE_LR), PAGE_EPOCHS) for d in args.datasets})
    baselines.update({baseline_name(lr, e): (lr, e) for lr in args.baseline_lrs for e in args.baseline_epochs})
    names = list(baselines) + list(settings)
    start = time.perf_counter()
    if not args.render:
        payload.setdefault("load_before", _load())
        for dataset in args.datasets:
            root = ensure_real(dataset, image_size=QUICK.image_size)
            for i, seed in enumerate(args.seeds):
                # the page's baseline first; the other settings reversed every other seed
                order = names if i % 2 == 0 else names[:1] + names[:0:-1]
                for name in order:
                    key = run_key(dataset, name, seed)
                    if key in payload["runs"] and not payload["runs"][key].get("error"):
                        continue
                    if name in baselines:
                        lr, epochs = baselines[name]
                        spec = RunSpec(dataset, "gemm", "baseline", lr, seed, epochs,
                                       image_size=QUICK.image_size, width=QUICK.width["gemm"])
                    else:
                        freq, lr, size, fraction, epochs = settings[name]
                        extra = {"block_size": size, **({"stat_fraction": fraction} if fraction != 1.0 else {})}
                        spec = RunSpec(dataset, "gemm", "THOR", lr, seed, epochs,
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
    payload["summary"] = {d: summarize(payload["runs"], d, names, args.seeds, targets[d]) for d in args.datasets}
    if args.notes:
        payload["notes"] = Path(args.notes).read_text()
    path.write_text(json.dumps(payload) + "\n")
    (RESULTS / f"{args.name}.md").write_text(render(payload))
    print((RESULTS / f"{args.name}.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The autotune contender of the time-to-accuracy benchmark (bench/bench_tta.py) and its section of the page.

``ms_boost auto`` is ``ms_boost.Model(boost_level="auto")`` as a user writes it: before the run a trial picks
among the candidate plans (docs/autotune.md). Its **trial time is counted in its first epoch** (the trial runs
inside ``train`` before the first epoch starts; :func:`bench.bench_tta.run_one` adds it), so its time to target is
trial included. The section judges the issue's goals per (data set, network):

* the autotuned run reaches the target within 10% of the best fixed contender's time (medians over the seeds;
  fixed contenders: every one-process contender of the cell, the baseline included);
* it is never slower than ms_boost O0 by more than its trial cost (per seed: ``auto - O0 <= trial``).

``python bench/tta_autotune.py [--from tta]`` runs only this contender on every cell of an existing
``bench/results/<from>.json`` (same plan, data, epochs and seeds, the cell's picked baseline lr), and writes
``bench/results/tta_autotune.{json,md}``: the section against the fixed contenders of that payload, measured at
another time (the page says so). A full ``python -m bench tta`` run measures it beside the others.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

AUTO = "ms_boost auto"
AUTO_TEXT = ("ms_boost.Model(boost_level='auto'): a measured trial (default budget: 5% of the run's steps and of its "
             "estimated time; trial time counted in epoch 1) picks among O0, O0 + cpu_gemm_conv, O1, THOR at 3 "
             "settings, accumulation x2 (batch <= 32)")
#: the trial options the benchmark gives (the defaults: what a user gets without choosing)
AUTOTUNE_OPTIONS: Dict[str, object] = {}
WITHIN = 0.10  # the goal: time to target within 10% of the best fixed contender's


def _median(values) -> Optional[float]:
    kept = [v for v in values if v is not None]
    return float(np.median(kept)) if kept else None


def wall_to_target(cell: dict, contender: str) -> Dict[int, Optional[float]]:
    """Per seed: training seconds until the end of the first epoch at or above the cell's target, **compile (and
    for the auto contender its trial) included**: the sum of the raw epoch times, computed here from the curves
    for every contender alike (None: not reached or failed)."""
    out = {}
    for seed, run in (cell["curves"].get(contender) or {}).items():
        hit = None if run.get("error") else next(
            (i for i, acc in enumerate(run["accuracy"]) if acc >= cell["target"]), None)
        out[int(seed)] = None if hit is None else float(np.sum(run["epoch_seconds"][:hit + 1]))
    return out


def autotune_goals(cell: dict) -> List[str]:
    """The goal lines of one cell (pure: from its ``target`` and ``curves``), times with compile included."""
    if AUTO not in cell["curves"]:
        return []
    auto = wall_to_target(cell, AUTO)
    auto_t = _median(auto.values())
    fixed = {name: _median(wall_to_target(cell, name).values()) for name in cell["curves"]
             if name != AUTO and " x2" not in name}
    fixed = {name: t for name, t in fixed.items() if t is not None}
    lines = []
    if auto_t is None:
        lines.append("did not reach the target on any seed")
    elif fixed:
        best_name = min(fixed, key=fixed.get)
        ratio = auto_t / fixed[best_name]
        verdict = "**met**" if ratio <= 1 + WITHIN else "not met"
        lines.append(f"time to target (compile and trial included) {auto_t:.1f} s against the best fixed contender "
                     f"({best_name}) {fixed[best_name]:.1f} s: {ratio:.2f}x, within {WITHIN:.0%}: {verdict}")
    runs = cell["curves"][AUTO]
    trials = {int(s): r.get("trial_seconds") for s, r in runs.items() if not r.get("error")}
    o0 = wall_to_target(cell, "ms_boost O0")
    over = {s: auto[s] - o0[s] for s in auto
            if auto[s] is not None and o0.get(s) is not None and trials.get(s) is not None}
    if over:
        ok = all(over[s] <= trials[s] + 1e-9 for s in over)
        lines.append("slower than O0 by at most the trial's cost on every seed: "
                     f"{'**met**' if ok else 'not met'} (" + ", ".join(
                         f"seed {s}: {over[s]:+.1f} s vs trial {trials[s]:.1f} s" for s in sorted(over)) + ")")
    picks = {int(s): r.get("autotune_pick") for s, r in runs.items() if not r.get("error")}
    if picks:
        lines.append("picked: " + ", ".join(f"seed {s}: {picks[s]}" for s in sorted(picks))
                     + f"; trial {_median(trials.values()):.1f} s (median)")
    return lines


def autotune_section(payload: dict, note: str = "") -> List[str]:
    """The page's "Autotune" section (empty when no cell ran the contender)."""
    cells = {key: cell for key, cell in payload["cells"].items() if AUTO in cell["curves"]}
    if not cells:
        return []
    lines = ["## Autotune (`boost_level=\"auto\"`)", "",
             f"**{AUTO}**: {AUTO_TEXT}. Times here are training seconds to the target with compile included for "
             f"every contender (and the trial for this one), from the raw epoch times. Goals (issue "
             f"\"Autotune\"): within {WITHIN:.0%} of the best fixed contender's time to target, and never slower "
             "than ms_boost O0 by more than its trial cost (per seed)." + (f" {note}" if note else ""), ""]
    for key, cell in cells.items():
        lines += [f"- **{key}**: " + "; ".join(autotune_goals(cell)) + "."]
    return lines + [""]


def run_autotune_only(payload: dict, timeout: int, rerun: Sequence[str] = (),
                      cells: Optional[Sequence[str]] = None) -> dict:
    """Run the auto contender on every cell of ``payload`` (its plan, seeds and baseline lr), and again the
    contenders named in ``rerun`` (replacing their curves), seed by seed in turn so that each seed's runs share the
    machine's conditions; returns ``payload`` with the new curves. ``cells``: only these (default: all)."""
    from bench.bench_tta import RunSpec, launch
    from model_zoo.resnet.src.real_data import ensure_real

    plan = payload["plan"]
    for key, cell in payload["cells"].items():
        if cells and key not in cells:
            continue
        dataset, net = key.split("/")
        root = ensure_real(dataset, image_size=plan["image_size"])
        names = [*rerun, AUTO]
        runs: Dict[str, dict] = {name: {} for name in names}
        for seed in plan["seeds"]:
            for name in names:
                spec = RunSpec(dataset=dataset, net=net, contender=name, lr=cell["baseline_lr"], seed=seed,
                               epochs=plan["epochs"][net], image_size=plan["image_size"], mode=payload["mode"],
                               width=plan["width"][net])
                print(f"[tta autotune] {key} {name} seed {seed}", flush=True)
                runs[name][str(seed)] = launch(spec, root, timeout)
        for name in names:
            cell["curves"][name] = runs[name]
        cell["rerun"] = list(rerun)
    if cells:
        payload["cells"] = {k: v for k, v in payload["cells"].items() if k in cells}
    return payload


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="the autotune contender beside an existing tta payload")
    parser.add_argument("--from", dest="source", default="tta",
                        help="the payload to extend: a results stem (bench/results/<stem>.json) or a JSON path")
    parser.add_argument("--timeout", type=int, default=1800)
    parser.add_argument("--rerun", default="", help="contenders measured again beside it, comma-separated (their lr: "
                                                    "the cell's baseline lr)")
    parser.add_argument("--cells", default="", help="only these cells, comma-separated (e.g. digits/gemm)")
    parser.add_argument("--render_only", action="store_true", help="rewrite tta_autotune.md from its JSON")
    args = parser.parse_args(argv)
    from bench.common import RESULTS, load_average, page_footer, write_results

    if args.render_only:
        payload = json.loads((RESULTS / "tta_autotune.json").read_text(encoding="utf-8"))
    else:
        source = Path(args.source) if args.source.endswith(".json") else RESULTS / f"{args.source}.json"
        payload = json.loads(source.read_text(encoding="utf-8"))
        load_before, start = load_average(), time.time()
        payload = run_autotune_only(payload, args.timeout, [c for c in args.rerun.split(",") if c],
                                    [c for c in args.cells.split(",") if c] or None)
        payload.update({"autotune_load_before": load_before, "autotune_load_after": load_average(),
                        "autotune_seconds": time.time() - start, "autotune_source": source.stem})
    rerun = sorted({name for cell in payload["cells"].values() for name in cell.get("rerun", [])})
    source = payload.get("autotune_source", "tta")
    again = f" ({', '.join(rerun)} measured again beside it, seed by seed)" if rerun else ""
    note = (f"Measured by `python bench/tta_autotune.py --from {source}"
            f"{' --rerun ' + repr(','.join(rerun)) if rerun else ''}` after the other contenders{again} (the "
            f"others' figures: `bench/results/{source}.md`), same plan, data, epochs and seeds, lr = the cell's "
            f"picked baseline lr; load average before/after: {payload.get('autotune_load_before')} / "
            f"{payload.get('autotune_load_after')}.")
    lines = ["# Time to accuracy: the autotuned run", ""] + autotune_section(payload, note)
    lines += ["| cell | contender | reached | time to target, compile (and trial) included: median [min, max] s | "
              "final accuracy (median) |", "|---|---|---|---|---|"]
    for key, cell in payload["cells"].items():
        for name in cell["curves"]:
            if " x2" in name:
                continue
            times = [t for t in wall_to_target(cell, name).values() if t is not None]
            finals = [r["accuracy"][-1] for r in cell["curves"][name].values() if r.get("accuracy")]
            spread = f"{np.median(times):.1f} [{min(times):.1f}, {max(times):.1f}]" if times else "not reached"
            lines.append(f"| {key} | {name} | {len(times)}/{len(cell['curves'][name])} | {spread} | "
                         f"{np.median(finals):.4f} |" if finals else f"| {key} | {name} | 0 | failed | - |")
    page = "\n".join(lines + [""] + page_footer(f"python bench/tta_autotune.py --from "
                                                 f"{payload.get('autotune_source', 'tta')}",
                                                 payload.get("autotune_load_before", [])))
    write_results("tta_autotune", payload, page)
    print(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Why O1 makes more progress per epoch than O0 on the conv net: an ablation of O1's parts (``--help``).

O1 on CPU is the ``cpu_gemm_conv`` rewrite plus LessBN plus gradient freezing, and LessBN itself is three things:
the BatchNorm reduction (only where a residual addition ends a chain of BatchNorm layers), the FN head (``fn_flag``,
the last Dense replaced by a feature-normalised one) and gradient centralization (``gc_flag``). Each variant below is
the GEMM rewrite (O0's function, computed faster) plus some of them, trained as the time-to-accuracy benchmark trains
its contenders (:func:`bench.bench_tta.launch`: one process a run, Graph mode, CPU, batch 32, Momentum 0.9, cosine lr
from 0.1), seed by seed with the variants' order rotated each seed. Reported per cell: epoch-1 accuracy, epochs to the
target (the GEMM rewrite's median final accuracy minus 1 point, as the autotune page's target from O0) and the final
accuracy, per seed. It measures progress per epoch only: the times are not compared.

``python bench/autotune_o1_ablation.py [--cells mnist5k/conv,digits/conv] [--seeds 0 1 2]`` writes
``bench/results/autotune_o1_ablation.{json,md}``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GEMM = {"boost": {"mode": "manual", "cpu_gemm_conv": True}}
#: name -> (contender, boost_config_dict): the level O1 in manual mode keeps cpu_gemm_conv on (CPU) and switches parts
VARIANTS: Dict[str, tuple] = {
    "gemm (O0's function)": ("ms_boost O0", GEMM),
    "gemm + freezing": ("ms_boost O1", {"boost": {"mode": "manual", "less_bn": False}}),
    "gemm + LessBN": ("ms_boost O1", {"boost": {"mode": "manual", "grad_freeze": False}}),
    "gemm + LessBN's FN head only": ("ms_boost O1", {"boost": {"mode": "manual", "grad_freeze": False},
                                                     "less_bn": {"gc_flag": False}}),
    "gemm + LessBN's GC only": ("ms_boost O1", {"boost": {"mode": "manual", "grad_freeze": False},
                                                "less_bn": {"fn_flag": False}}),
    "O1 (gemm + LessBN + freezing)": ("ms_boost O1", {}),
}
#: cell -> (dataset, net, epochs, training images, width): the long page's mnist5k cells, the quick page's digits/conv
CELLS = {"mnist5k/conv": ("mnist5k", "conv", 10, 3000, 8), "digits/conv": ("digits", "conv", 3, None, 8),
         "mnist5k/gemm": ("mnist5k", "gemm", 10, 3000, 8)}


def epochs_to(accuracy: Sequence[float], target: float) -> Optional[int]:
    """The first epoch (1-based) at or above ``target`` (None: never)."""
    return next((i + 1 for i, acc in enumerate(accuracy) if acc >= target), None)


def run(cells: Sequence[str], seeds: Sequence[int], variants: Sequence[str], timeout: int) -> dict:
    """Train every variant of ``cells`` for each seed in turn (order rotated each seed); the per-run records."""
    from bench.bench_tta import RunSpec, launch, paired_order
    from bench.tta_autotune import data_root

    out: Dict[str, dict] = {}
    for key in cells:
        dataset, net, epochs, train, width = CELLS[key]
        root = data_root(dataset, train)
        runs: Dict[str, dict] = {name: {} for name in variants}
        for seed, order in paired_order(list(variants), seeds):
            for name in order:
                contender, config = VARIANTS[name]
                spec = RunSpec(dataset=dataset, net=net, contender=contender, lr=0.1, seed=seed, epochs=epochs,
                               image_size=16, mode="graph", width=width,
                               extra={"boost_config_dict": json.loads(json.dumps(config))} if config else {})
                print(f"[o1 ablation] {key} {name} seed {seed}", flush=True)
                record = launch(spec, root, timeout)
                runs[name][str(seed)] = {k: record.get(k) for k in ("accuracy", "epoch_seconds", "error")}
        finals = [r["accuracy"][-1] for r in runs.get(next(iter(variants)), {}).values() if r.get("accuracy")]
        out[key] = {"target": float(np.median(finals)) - 0.01 if finals else None, "epochs": epochs, "runs": runs}
    return out


def render(payload: dict) -> str:
    """The page: per cell, each variant's epoch-1 accuracy, epochs to the target and final accuracy per seed."""
    lines = ["# Why O1 progresses faster on the conv net: an ablation of O1's parts", "",
             f"Written by `python bench/autotune_o1_ablation.py` ({payload['minutes']:.1f} min; load average "
             f"before {payload['load_before']}, after {payload['load_after']}). Every variant is the GEMM rewrite "
             "(O0's function) plus the parts named; Graph mode, CPU, batch 32, Momentum 0.9, cosine lr from 0.1, "
             "16 px, one process a run, the variants' order rotated each seed. Target: the GEMM rewrite's median "
             "final accuracy minus 1 point. Per seed (seeds " + ", ".join(map(str, payload["seeds"])) + ").", ""]
    for key, cell in payload["cells"].items():
        target = cell["target"]
        note = ("The zoo's ResNet-10 on GEMM convolutions has no `nn.Conv2d`: the rewrite changes nothing, the first "
                "variant is O0; LessBN removes 4 of its 12 BatchNorm layers (the first of each basic block)."
                if key.endswith("/gemm") else
                "The conv net: LessBN removes none of its 3 BatchNorm layers (no residual addition); it replaces the "
                "Dense head by the FN head and adds gradient centralization.")
        lines += [f"## {key} ({cell['epochs']} epochs; target {target:.4f})", "", note, "",
                  "| variant | epoch-1 accuracy | epochs to target | final accuracy | median epochs to target |",
                  "|---|---|---|---|---|"]
        for name, runs in cell["runs"].items():
            seeds = sorted(runs, key=int)
            first, reach, final = [], [], []
            for s in seeds:
                acc = runs[s].get("accuracy") or []
                first.append(f"{acc[0]:.2f}" if acc else "err")
                hit = epochs_to(acc, target) if acc else None
                reach.append(str(hit) if hit is not None else "-")
                final.append(f"{acc[-1]:.3f}" if acc else "err")
            hits = [np.inf if r == "-" else int(r) for r in reach]
            mid = float(np.median(hits))
            lines.append(f"| {name} | {' / '.join(first)} | {' / '.join(reach)} | {' / '.join(final)} | "
                         f"{'not reached' if not np.isfinite(mid) else f'{mid:g}'} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", default="mnist5k/conv,digits/conv", help=f"comma-separated, of {list(CELLS)}")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--variants", default="", help="comma-separated names of VARIANTS (default: all)")
    parser.add_argument("--timeout", type=int, default=600)
    parser.add_argument("--out", default="autotune_o1_ablation")
    parser.add_argument("--render_only", action="store_true", help="rewrite <out>.md from its JSON")
    args = parser.parse_args(argv)
    cells = [c for c in args.cells.split(",") if c]
    bad = [c for c in cells if c not in CELLS]
    if bad:
        parser.error(f"--cells {bad}: allowed {list(CELLS)}")
    variants = [v for v in args.variants.split(",") if v] or list(VARIANTS)
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        parser.error(f"--variants {bad}: allowed {list(VARIANTS)}")
    folder = ROOT / "bench" / "results"
    if args.render_only:
        (folder / f"{args.out}.md").write_text(render(json.loads((folder / f"{args.out}.json").read_text())))
        return 0
    before, start = [round(v, 2) for v in os.getloadavg()], time.perf_counter()
    cell_runs = run(cells, args.seeds, variants, args.timeout)
    payload = {"cells": cell_runs, "seeds": args.seeds, "load_before": before,
               "load_after": [round(v, 2) for v in os.getloadavg()], "minutes": (time.perf_counter() - start) / 60}
    (folder / f"{args.out}.json").write_text(json.dumps(payload, indent=1))
    (folder / f"{args.out}.md").write_text(render(payload))
    print(render(payload))
    return 0


if __name__ == "__main__":
    sys.exit(main())

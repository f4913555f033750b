"""Plots of the benchmark results (matplotlib, the ``bench`` extra): PNGs beside the result pages.

Every function takes plain Python data (what the ``bench/results/*.json`` files hold) and writes one
PNG; :func:`render_all` reads the result files that exist and draws every figure it has data for.
Nothing here imports MindSpore, so the figures can be redrawn from committed JSON alone:
``python -m bench.plots [results folder]``.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

RESULTS = Path(__file__).resolve().parent / "results"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _save_epoch_figure(plt, fig, ax, ylabel: str, title: str, out: Path) -> Path:
    """Label a per-epoch figure (x: epoch), add grid and legend, write it to ``out`` and close it."""
    ax.set_xlabel("epoch")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def accuracy_curves(curves: Dict[str, Sequence[float]], out: Path, title: str,
                    first_epoch: int = 1, ylabel: str = "validation accuracy") -> Path:
    """Accuracy per epoch, one line per contender.

    Args:
        curves: label -> accuracy after each epoch (fractions in [0, 1]).
        out: PNG path.
        title: figure title.
        first_epoch: epoch number of the first value.
        ylabel: y axis label.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=100)
    for label, values in curves.items():
        epochs = list(range(first_epoch, first_epoch + len(values)))
        ax.plot(epochs, [100.0 * v for v in values], marker="o", markersize=3, label=label)
    return _save_epoch_figure(plt, fig, ax, f"{ylabel} (%)", title, out)


def step_ratios(rows: Sequence[Tuple[str, float, Optional[Tuple[float, float]]]], out: Path, title: str,
                noise: Optional[float] = None, target: Optional[float] = None) -> Path:
    """Horizontal bars of step-time ratios (contender / baseline), with the noise band around 1.

    Args:
        rows: ``(label, median ratio, (low, high) quartiles of the per-repeat ratios or None)``.
        out: PNG path.
        title: figure title.
        noise: half width of the noise band: identical contenders timed against each other differ by up
            to this (e.g. 0.05 draws the band 0.95 .. 1.05).
        target: a vertical line (e.g. the ratio a goal allows).
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 0.5 + 0.42 * max(1, len(rows))), dpi=100)
    labels = [r[0] for r in rows]
    values = [r[1] for r in rows]
    ys = list(range(len(rows)))[::-1]
    lows = [r[1] - r[2][0] if r[2] else 0.0 for r in rows]
    highs = [r[2][1] - r[1] if r[2] else 0.0 for r in rows]
    ax.barh(ys, values, xerr=[lows, highs], color="#4c72b0", alpha=0.85, capsize=3)
    if noise:
        ax.axvspan(1.0 - noise, 1.0 + noise, color="grey", alpha=0.25, label=f"noise band (1 +- {noise:.2f})")
    ax.axvline(1.0, color="black", linewidth=0.8)
    if target:
        ax.axvline(target, color="#c44e52", linestyle="--", linewidth=1, label=f"target {target:g}x")
    for y, v in zip(ys, values):
        ax.text(v, y, f" {v:.2f}x", va="center", fontsize=8)
    ax.set_yticks(ys)
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_xlabel("step time ratio (median of paired per-repeat ratios)")
    ax.set_xlim(0, max(values + [1.0 + (noise or 0), target or 0]) * 1.25)
    ax.set_title(title, fontsize=10)
    if noise or target:
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def pca_scaling(runs: Sequence[dict], out: Path, upstream: Sequence[dict] = ()) -> Path:
    """PCA time and peak memory against the number of weights (log-log), ours and upstream's.

    Args:
        runs: dicts with ``weights``, ``seconds``, ``peak_rss_mb`` (``bench_pca.py``'s rows).
        out: PNG path.
        upstream: the same for upstream ``mindspore.boost``'s PCA (may be empty).
    """
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3.4), dpi=100)
    for data, label, style in ((runs, "ms_boost streaming PCA", "o-"), (upstream, "upstream mindspore.boost", "s--")):
        data = sorted(data, key=lambda r: r["weights"])
        if not data:
            continue
        m = [r["weights"] for r in data]
        left.plot(m, [r["seconds"] for r in data], style, label=label)
        right.plot(m, [r["peak_rss_mb"] / 1024.0 for r in data], style, label=label)
    for ax, ylabel in ((left, "PCA time (s)"), (right, "peak RSS (GB)")):
        ax.set_xscale("log")
        ax.set_xlabel("weights M")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    left.set_yscale("log")
    fig.suptitle("DimReduce PCA (N = 60 checkpoints, k = 32)", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


# ------------------------------------------------------------------------------------------------------
def _load(folder: Path, name: str) -> Optional[dict]:
    path = folder / f"{name}.json"
    if not path.exists():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def ratio_rows(folder: Path) -> Tuple[List[tuple], Optional[float]]:
    """The step-time ratios of every result page (for the summary figure) and the largest noise floor."""
    rows, noise = [], []
    over = _load(folder, "overhead")
    if over:
        for mode, data in over.get("modes", {}).items():
            for key, value in data.get("ratios", {}).items():
                band = data.get("ratio_quartiles", {}).get(key)
                if "(twin)" in key:  # identical contenders: the noise floor
                    noise.append(abs(value - 1.0))
                    continue
                rows.append((f"{key} ({mode})", value, tuple(band) if band else None))
    dim = _load(folder, "dim_reduce")
    if dim and "steps" in dim:
        for r in dim["steps"]["data"]["runs"]:
            band = r.get("ratio_quartiles")
            carry = ", carry_search" if r.get("carry_search") else ""
            rows.append((f"DimReduce / SGD, width {r['width']}{carry} ({r['mode']})", r["ratio_median"],
                         tuple(band) if band else None))
            if "noise_ratio" in r:
                noise.append(abs(r["noise_ratio"] - 1.0))
    ada = _load(folder, "adasum")
    if ada and "steptime" in ada:
        for key, r in sorted(ada["steptime"].get("rows", {}).items()):  # "<workers>/<mode>/<net>"
            workers, mode, net = key.split("/", 2)
            rows.append((f"AdaSum / mean, {net.split()[0]}, {workers} workers ({mode})", r["ratio"], None))
    return rows, (max(noise) if noise else None)


def render_all(folder: Path = RESULTS) -> List[Path]:
    """Draw every figure the result files in ``folder`` have data for; returns the PNGs written."""
    written = []
    rows, noise = ratio_rows(folder)
    if rows:
        written.append(step_ratios(rows, folder / "step_ratios.png", "Step time ratios (2-core CPU, shared)",
                                   noise=noise))
    ada = _load(folder, "adasum")
    if ada and "convergence" in ada:
        table = ada["convergence"]["table"]
        names = {"mean": "mean all-reduce (lr 0.05)", "mean_lr_x4": "mean all-reduce (lr x4)", "adasum": "AdaSum"}
        curves = {names.get(k, k): v["acc"] for k, v in table.items() if "acc" in v}
        written.append(accuracy_curves(curves, folder / "adasum_accuracy.png",
                                       "AdaSum vs mean all-reduce, global batch 256 (4 workers)"))
    dim = _load(folder, "dim_reduce")
    if dim:
        if "pca" in dim:
            data = dim["pca"]["data"]
            written.append(pca_scaling(data["runs"], folder / "pca_scaling.png", data.get("upstream", ())))
        for name, section in sorted(dim.items()):
            runs = section.get("data", {}).get("runs", []) if isinstance(section, dict) else []
            for r in runs:
                if "curve_dim_reduce" in r:
                    written.append(_continuation_plot(r, folder / f"dim_reduce_{name}_seed{r['seed']}_accuracy.png"))
    return written


def _continuation_plot(run: dict, out: Path) -> Path:
    """Stage-1 accuracy per epoch, then the two continuations (plain SGD, DimReduce) from its last epoch.

    Args:
        run: a ``bench_dim_reduce.py`` run with ``curve_stage1``, ``curve_plain``, ``curve_dim_reduce``
            (validation accuracy after each epoch) and ``seed``.
        out: PNG path.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=100)
    stage1 = list(run.get("curve_stage1", []))
    start = len(stage1)
    if stage1:
        ax.plot(range(1, start + 1), [100 * v for v in stage1], marker="o", markersize=3, label="stage 1 (Momentum)")
    for label, key in (("Momentum SGD continued", "curve_plain"), ("DimReduce (stage 2)", "curve_dim_reduce"),
                       ("DimReduce, carry_search", "curve_dim_reduce_carry")):
        if key not in run:
            continue
        values = ([stage1[-1]] if stage1 else []) + list(run[key])
        first = start if stage1 else 1
        ax.plot(range(first, first + len(values)), [100 * v for v in values], marker="o", markersize=3, label=label)
    return _save_epoch_figure(plt, fig, ax, "validation accuracy (%)",
                              f"DimReduce vs SGD continuation (seed {run['seed']})", out)


if __name__ == "__main__":
    for png in render_all(Path(sys.argv[1]) if len(sys.argv) > 1 else RESULTS):
        print(png)

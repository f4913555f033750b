"""Plot the training curves of one or several run folders (overlaid) to a PNG.

    python -m model_zoo.resnet.plot_run output/run_a output/run_b -o curves.png

Reads ``<run>/metrics.jsonl`` (written by ``train.py``; a metrics file may be given instead of a folder)
and draws four panels against the global step: the training loss (per step, and the epoch mean),
top-1 accuracy when the run evaluated, the learning rate and the loss scale (when the run scaled the
loss). Needs matplotlib: ``pip install ms_boost[bench]``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from model_zoo.resnet.src.metrics import read_metrics  # noqa: E402

__all__ = ["plot_runs", "main"]


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ImportError("plot_run needs matplotlib, which is not installed; install it with "
                          "`pip install ms_boost[bench]` (or `pip install matplotlib`).") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _series(records: List[Dict], kind: str, key: str) -> tuple:
    points = [(r["step"], r[key]) for r in records
              if r.get("kind") == kind and r.get(key) is not None and r.get("step") is not None]
    return [p[0] for p in points], [p[1] for p in points]


def plot_runs(runs: Sequence[str], output: str, labels: Optional[Sequence[str]] = None, title: str = "") -> Path:
    """Draw the runs' curves overlaid into ``output`` (PNG).

    Args:
        runs: run folders (or metrics files).
        output: the PNG to write (its folder is created).
        labels: legend names (default: the folder names).
        title: figure title.

    Returns:
        the written file.

    Raises:
        ValueError: no runs, a run without metrics, or ``labels`` of another length.
        ImportError: matplotlib is missing (the message names ``pip install ms_boost[bench]``).
    """
    if not runs:
        raise ValueError("plot_run: give at least one run folder (or metrics file).")
    if labels is not None and len(labels) != len(runs):
        raise ValueError(f"--labels gives {len(labels)} name(s) {list(labels)} for {len(runs)} run(s) {list(runs)}; "
                         f"give one name per run, comma-separated.")
    data = [read_metrics(run) for run in runs]
    for run, records in zip(runs, data):
        if not any(r.get("kind") == "step" for r in records):
            raise ValueError(f"plot_run: {run!r} holds no step records (did training start?).")
    plt = _pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    (loss_ax, acc_ax), (lr_ax, scale_ax) = axes
    has_acc = has_scale = False
    for index, (run, records) in enumerate(zip(runs, data)):
        name = labels[index] if labels else (Path(run).name if Path(run).is_dir() else Path(run).parent.name)
        color = f"C{index % 10}"
        steps, loss = _series(records, "step", "loss")
        loss_ax.plot(steps, loss, color=color, alpha=0.35, linewidth=0.8)
        epochs, epoch_loss = _series(records, "epoch", "loss")
        loss_ax.plot(epochs, epoch_loss, color=color, marker="o", markersize=3, label=name)
        evals, top1 = _series(records, "eval", "top_1_accuracy")
        if evals:
            has_acc = True
            acc_ax.plot(evals, top1, color=color, marker="o", label=name)
        steps, lr = _series(records, "step", "lr")
        lr_ax.plot(steps, lr, color=color, label=name)
        steps, scale = _series(records, "step", "loss_scale")
        if steps:
            has_scale = True
            scale_ax.plot(steps, scale, color=color, label=name)
    loss_ax.set(title="training loss (line: step, dots: epoch mean)", xlabel="step", ylabel="loss")
    acc_ax.set(title="top-1 accuracy", xlabel="step", ylabel="top-1")
    lr_ax.set(title="learning rate", xlabel="step", ylabel="lr")
    scale_ax.set(title="loss scale", xlabel="step", ylabel="scale")
    if not has_acc:
        acc_ax.text(0.5, 0.5, "not evaluated", ha="center", va="center", transform=acc_ax.transAxes)
    if not has_scale:
        scale_ax.text(0.5, 0.5, "no loss scaling", ha="center", va="center", transform=scale_ax.transAxes)
    for ax in axes.flat:
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=100)
    plt.close(fig)
    return out


def main(argv=None) -> Path:
    """Command line: ``plot_run RUN [RUN ...] -o out.png [--labels a,b] [--title T]``."""
    parser = argparse.ArgumentParser(prog="python -m model_zoo.resnet.plot_run", description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="run folders (output_path of train.py) or metrics.jsonl files")
    parser.add_argument("-o", "--output", default="curves.png", help="PNG to write (default curves.png)")
    parser.add_argument("--labels", default="", help="comma-separated legend names, one per run")
    parser.add_argument("--title", default="", help="figure title")
    args = parser.parse_args(argv)
    labels = [s.strip() for s in args.labels.split(",")] if args.labels else None
    try:
        path = plot_runs(args.runs, args.output, labels, args.title)
    except (ValueError, ImportError) as err:
        parser.exit(1, f"plot_run: error: {err}\n")
    print(f"wrote {path}", flush=True)
    return path


if __name__ == "__main__":
    main()

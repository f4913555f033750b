"""THOR robustness sweep: THOR vs Momentum over learning rate x damping on a real and a generated image set.

The set-up of issue 13, as a tutorial reader runs it: ``thor(net, lr, damping, 0.9, weight_decay=0.0,
loss_scale=1.0, batch_size=32, frequency=10)`` and ``ConvertModelUtils().convert_to_thor_model(...)``,
Graph mode, batch 32, a small network of three convolutions and a dense layer (no BatchNorm), validation
accuracy after every epoch. Data sets:

* ``digits``: scikit-learn's bundled handwritten digits (real, offline), 32x32 RGB, 1,500 train / 297 val
  (:mod:`model_zoo.resnet.src.real_data`);
* ``generated``: the model zoo's built-in set, 10 classes, 32 px, 150 train / 30 val per class.

Every cell starts from the same initial weights and sees the same batches; one compiled Model per
optimizer and data set is reused across cells (its parameters, optimizer state, learning rate and
damping are reset), so the sweep compiles four graphs in all.

Usage::

    python bench/bench_thor_sweep.py [--epochs 3] [--lrs 0.005 0.01 0.03 0.1] [--dampings 0.01 0.03 0.1 0.3]
        [--kl_clip 0.001] [--datasets digits generated] [--name thor_sweep] [--render]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import Tensor, nn, ops

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import RESULTS, environment, write_results  # noqa: E402
from model_zoo.resnet.src.real_data import ensure_digits, read_folder  # noqa: E402
from model_zoo.resnet.src.synthetic_data import ensure_dataset  # noqa: E402
from ms_boost import Model  # noqa: E402
from ms_boost.thor import ConvertModelUtils, thor  # noqa: E402
from ms_boost.thor.assignment import DEFAULT_BLOCK_SIZE  # noqa: E402
from ms_boost.thor.optimizer import DEFAULT_KL_CLIP  # noqa: E402

TUTORIAL_DAMPING = 0.03


class SmallConvNet(nn.Cell):
    """Three 3x3 stride-2 convolutions (16, 32, 32 channels, ReLU) and a dense layer; no BatchNorm.

    Strided convolutions rather than max-pooling: MindSpore's CPU max-pool backward made a step 8x slower.
    """

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.SequentialCell([
            nn.Conv2d(3, 16, 3, stride=2, pad_mode="same", has_bias=True), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, pad_mode="same", has_bias=True), nn.ReLU(),
            nn.Conv2d(32, 32, 3, stride=2, pad_mode="same", has_bias=True), nn.ReLU()])
        self.flatten = nn.Flatten()
        self.head = nn.Dense(32 * 4 * 4, num_classes)

    def construct(self, x):
        return self.head(self.flatten(self.features(x)))


def load(name: str, cache: str):
    """``((x_train, y_train), (x_val, y_val))`` NCHW float32 normalised per channel with the train statistics."""
    if name == "digits":
        root = ensure_digits(cache or None, image_size=32, train_count=1500, seed=0)
    elif name == "generated":
        root = ensure_dataset(cache or None, num_classes=10, image_size=32, train_per_class=150, val_per_class=30,
                              seed=0)
    else:
        raise ValueError(f"--datasets: {name!r} is not one of 'digits', 'generated'.")
    (xt, yt), (xv, yv) = read_folder(root / "train"), read_folder(root / "val")
    xt, xv = xt.astype(np.float32) / 255.0, xv.astype(np.float32) / 255.0
    mean, std = xt.mean(axis=(0, 1, 2)), xt.std(axis=(0, 1, 2)) + 1e-6
    prep = [((x - mean) / std).transpose(0, 3, 1, 2).astype(np.float32) for x in (xt, xv)]
    return (prep[0], yt), (prep[1], yv)


def batches(x, y, batch: int, seed=None):
    """Batches of ``(x, y)``; shuffled with a fixed seed (same order for every cell) when ``seed`` is given."""
    if seed is not None:
        ds.config.set_seed(seed)
    data = ds.NumpySlicesDataset({"image": x, "label": y}, shuffle=seed is not None)
    return data.batch(batch, drop_remainder=seed is not None)


class Contender:
    """One compiled Model (Momentum or THOR) whose state is reset for every cell of the grid."""

    def __init__(self, kind: str, args, num_classes: int):
        ms.set_seed(args.seed)
        net = SmallConvNet(num_classes)
        loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        self.kind = kind
        if kind == "momentum":
            self.opt = nn.Momentum(net.trainable_params(), 0.01, 0.9)
            self.model = Model(net, loss_fn=loss, optimizer=self.opt, metrics={"acc"})
        else:
            self.opt = thor(net, 0.01, TUTORIAL_DAMPING, 0.9, weight_decay=0.0, loss_scale=1.0, batch_size=32,
                            frequency=args.frequency, kl_clip=args.kl_clip, pi_damping=args.pi_damping,
                            block_size=args.block_size)
            self.model = ConvertModelUtils().convert_to_thor_model(
                model=Model(net, loss_fn=loss, optimizer=self.opt, metrics={"acc"}), network=net, loss_fn=loss,
                optimizer=self.opt, metrics={"acc"}, amp_level="O0")
        cells = [self.model.train_network, net]
        params, seen = [], set()
        for cell in cells:
            for p in cell.get_parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    params.append(p)
        self.snapshot = [(p, p.asnumpy().copy()) for p in params]

    def reset(self, lr: float, damping: float) -> None:
        # written in place (ops.assign): set_data gives a Parameter new memory, and a graph compiled before keeps
        # reading the old one -- THOR's refresh graph then kept the first cell's damping for every later cell
        for p, value in self.snapshot:
            ops.assign(p, Tensor(value))
        ops.assign(self.opt.learning_rate, Tensor(np.float32(lr)))
        if self.kind == "thor":
            ops.assign(self.opt.damping.values, Tensor(np.array([damping], np.float32)))

    def run(self, lr: float, damping: float, data, args) -> dict:
        (xt, yt), (xv, yv) = data
        self.reset(lr, damping)
        accuracy, error, start = [], None, time.perf_counter()
        try:
            for epoch in range(args.epochs):
                self.model.train(1, batches(xt, yt, args.batch, seed=args.seed * 100 + epoch), dataset_sink_mode=False)
                accuracy.append(float(self.model.eval(batches(xv, yv, 100), dataset_sink_mode=False)["acc"]))
        except Exception as exc:  # noqa: BLE001 - a crash is a result of the sweep
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            traceback.print_exc()
        result = {"accuracy": accuracy, "error": error, "seconds": time.perf_counter() - start}
        if self.kind == "thor":
            health = self.opt.health()
            result["health"] = {k: v for k, v in health.items() if k != "rejected_refreshes"}
            result["health"]["rejected_refreshes"] = sum(health["rejected_refreshes"].values())
        return result


def sweep(args) -> dict:
    out = {}
    for name in args.datasets:
        data = load(name, args.cache_dir)
        classes = int(max(data[0][1].max(), data[1][1].max())) + 1
        print(f"== {name}: {len(data[0][1])} train / {len(data[1][1])} val, {classes} classes", flush=True)
        momentum = Contender("momentum", args, classes)
        res = {"momentum": {}, "thor": {}}
        for lr in args.lrs:
            r = momentum.run(lr, 0.0, data, args)
            res["momentum"][str(lr)] = r
            print(f"  momentum lr {lr}: {_fmt(r)}", flush=True)
        thor_c = Contender("thor", args, classes)
        for lr in args.lrs:
            for damping in args.dampings:
                r = thor_c.run(lr, damping, data, args)
                res["thor"][f"{lr}/{damping}"] = r
                print(f"  thor lr {lr} damping {damping}: {_fmt(r)}", flush=True)
                if r["error"]:
                    # a cell stopped by an error is not reset by writing the Parameters back (the cells after
                    # it then failed within a few steps); the next cell gets a newly built, recompiled Model
                    thor_c = Contender("thor", args, classes)
        out[name] = res
    return out


def _fmt(r: dict) -> str:
    text = " ".join(f"{a:.3f}" for a in r["accuracy"])
    extra = f" health {r['health']}" if "health" in r else ""
    return (f"{text}  ({r['seconds']:.1f} s)" + (f"  ERROR {r['error']}" if r["error"] else "")) + extra


def verdict(args, results: dict) -> dict:
    """Per data set: crashes, collapses (final < 0.9 x Momentum's best final), epoch-1 check at the tutorial damping."""
    out = {}
    for name, res in results.items():
        best = max((r["accuracy"][-1] for r in res["momentum"].values() if r["accuracy"]), default=0.0)
        crashes = [k for k, r in res["thor"].items() if r["error"] or len(r["accuracy"]) < args.epochs]
        collapses = [k for k, r in res["thor"].items()
                     if r["accuracy"] and r["accuracy"][-1] < 0.9 * best]
        epoch1 = {}
        if TUTORIAL_DAMPING in args.dampings:
            for lr in args.lrs:
                t = res["thor"][f"{lr}/{TUTORIAL_DAMPING}"]["accuracy"]
                m = res["momentum"][str(lr)]["accuracy"]
                if t and m:
                    epoch1[str(lr)] = {"thor": t[0], "momentum": m[0], "ok": t[0] >= m[0]}
        out[name] = {"momentum_best_final": best, "crashes": crashes, "collapses": collapses, "epoch1": epoch1}
    return out


def plots(args, results: dict, stem: str) -> list:
    """Heatmap of THOR's final accuracy (plus Momentum's row) and accuracy-per-epoch curves at the tutorial damping."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    names = list(results)
    fig, axes = plt.subplots(1, len(names), figsize=(5.2 * len(names), 4.2), squeeze=False)
    for ax, name in zip(axes[0], names):
        res = results[name]
        grid = np.array([[_final(res["thor"][f"{lr}/{d}"]) for d in args.dampings] for lr in args.lrs])
        mom = np.array([[_final(res["momentum"][str(lr)])] for lr in args.lrs])
        full = np.concatenate([grid, mom], axis=1)
        im = ax.imshow(full, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
        ax.set_xticks(range(full.shape[1]), [f"THOR\nd={d}" for d in args.dampings] + ["Momentum"])
        ax.set_yticks(range(len(args.lrs)), [f"lr {lr}" for lr in args.lrs])
        for i in range(full.shape[0]):
            for j in range(full.shape[1]):
                value = full[i, j]
                ax.text(j, i, "crash" if np.isnan(value) else f"{value:.3f}", ha="center", va="center",
                        color="white" if not np.isnan(value) and value < 0.6 else "black", fontsize=8)
        ax.set_title(f"{name}: final val accuracy ({args.epochs} epochs)")
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8)
    path = RESULTS / f"{stem}_heatmap.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    files.append(path.name)
    if TUTORIAL_DAMPING in args.dampings:
        fig, axes = plt.subplots(1, len(names), figsize=(5.2 * len(names), 3.8), squeeze=False)
        epochs = np.arange(1, args.epochs + 1)
        for ax, name in zip(axes[0], names):
            res = results[name]
            for k, lr in enumerate(args.lrs):
                colour = f"C{k}"
                t = res["thor"][f"{lr}/{TUTORIAL_DAMPING}"]["accuracy"]
                m = res["momentum"][str(lr)]["accuracy"]
                ax.plot(epochs[:len(t)], t, "-o", color=colour, label=f"THOR lr {lr}")
                ax.plot(epochs[:len(m)], m, "--x", color=colour, label=f"Momentum lr {lr}")
            ax.set_xlabel("epoch")
            ax.set_ylabel("val accuracy")
            ax.set_ylim(0, 1)
            ax.set_xticks(epochs)
            ax.set_title(f"{name}: THOR (damping {TUTORIAL_DAMPING}) vs Momentum")
            ax.legend(fontsize=7, ncol=2)
        path = RESULTS / f"{stem}_curves.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        files.append(path.name)
    return files


def _final(r: dict) -> float:
    return r["accuracy"][-1] if r["accuracy"] and not r["error"] else float("nan")


def markdown(args, results: dict, checks: dict, files: list, env: dict) -> str:
    kl = "off" if not args.kl_clip else args.kl_clip
    lines = ["# THOR robustness sweep", "",
             f"Written by `bench/bench_thor_sweep.py`. CPU (2 cores shared with other jobs), Graph mode. The "
             f"tutorial's call: `thor(net, lr, damping, 0.9, weight_decay=0.0, loss_scale=1.0, batch_size=32, "
             f"frequency={args.frequency})` + `ConvertModelUtils().convert_to_thor_model(...)`; trust region "
             f"`kl_clip={kl}`, pi-damping {'on' if args.pi_damping else 'off'}, block size "
             f"{getattr(args, 'block_size', 128)}. Network: three 3x3 convolutions "
             f"(stride 2, 16/32/32 channels, ReLU) and a dense layer, no BatchNorm; batch {args.batch}, "
             f"{args.epochs} epochs, constant learning rate, momentum 0.9, same initial weights and batches for "
             "every cell. Data: `digits` = scikit-learn's bundled handwritten digits (real, offline; 32x32 RGB, "
             "1,500 train / 297 val); `generated` = the model zoo's built-in set (10 classes, 32 px, 1,500 / 300).",
             ""]
    for f in files:
        lines += [f"![{f}]({f})", ""]
    for name, res in results.items():
        c = checks[name]
        lines += [f"## {name}", "",
                  f"Momentum's best final accuracy: {c['momentum_best_final']:.3f}; collapse threshold "
                  f"(0.9x): {0.9 * c['momentum_best_final']:.3f}. Crashed THOR cells: "
                  f"{len(c['crashes'])} {c['crashes'] or ''}; collapsed: {len(c['collapses'])} "
                  f"{c['collapses'] or ''}.", "",
                  "Final validation accuracy (per epoch in brackets):", "",
                  "| lr | " + " | ".join(f"THOR d={d}" for d in args.dampings) + " | Momentum |",
                  "|---" * (len(args.dampings) + 2) + "|"]
        for lr in args.lrs:
            row = [f"{lr}"]
            for d in args.dampings:
                row.append(_cell(res["thor"][f"{lr}/{d}"]))
            row.append(_cell(res["momentum"][str(lr)]))
            lines.append("| " + " | ".join(row) + " |")
        if c["epoch1"]:
            lines += ["", f"Epoch-1 accuracy at the tutorial's damping {TUTORIAL_DAMPING}:", "",
                      "| lr | THOR | Momentum | THOR >= Momentum |", "|---|---|---|---|"]
            for lr, e in c["epoch1"].items():
                lines.append(f"| {lr} | {e['thor']:.3f} | {e['momentum']:.3f} | {'yes' if e['ok'] else 'no'} |")
        health = [(k, r["health"]) for k, r in res["thor"].items() if "health" in r]
        fallback = sum(h["eigen_fallback_blocks"] for _, h in health)
        skipped = sum(h["skipped_steps"] for _, h in health)
        rejected = sum(h["rejected_refreshes"] for _, h in health)
        lines += ["", f"THOR health over the {len(health)} cells: {fallback} blocks inverted through the eigen "
                  f"fallback, {rejected} layer refreshes rejected (non-finite factors), {skipped} steps skipped "
                  "(non-finite update).", ""]
    lines += [f"Environment: `{env}`"]
    return "\n".join(lines)


def _cell(r: dict) -> str:
    if r["error"]:
        return f"crash: {r['error'][:80]}"
    accs = r["accuracy"]
    return f"**{accs[-1]:.3f}** ({' '.join(f'{a:.2f}' for a in accs)})"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", nargs="+", default=["digits", "generated"])
    parser.add_argument("--lrs", type=float, nargs="+", default=[0.005, 0.01, 0.03, 0.1])
    parser.add_argument("--dampings", type=float, nargs="+", default=[0.01, 0.03, 0.1, 0.3])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--frequency", type=int, default=10)
    parser.add_argument("--kl_clip", type=float, default=DEFAULT_KL_CLIP, help="0: trust region off")
    parser.add_argument("--pi_damping", action="store_true")
    parser.add_argument("--block_size", type=int, default=DEFAULT_BLOCK_SIZE,
                        help=f"THOR's block size (default {DEFAULT_BLOCK_SIZE}, thor()'s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache_dir", default="")
    parser.add_argument("--name", default="thor_sweep", help="results file stem")
    parser.add_argument("--no_write", action="store_true")
    parser.add_argument("--no_plots", action="store_true", help="json and page only (e.g. before --merge)")
    parser.add_argument("--render", action="store_true", help="rewrite the page and plots from the saved json")
    parser.add_argument("--merge", nargs="+", default=None,
                        help="result stems (one per data set, run in parallel) merged into --name")
    args = parser.parse_args(argv)
    if args.merge:
        parts = [json.loads((RESULTS / f"{stem}.json").read_text(encoding="utf-8")) for stem in args.merge]
        merged_args = argparse.Namespace(**{**parts[0]["args"], "datasets": [d for p in parts for d in p["results"]]})
        results = {k: v for p in parts for k, v in p["results"].items()}
        checks = {k: v for p in parts for k, v in p["checks"].items()}
        saved = {"args": vars(merged_args), "results": results, "checks": checks,
                 "environment": parts[0]["environment"], "merged_from": args.merge}
        files = plots(merged_args, results, args.name)
        write_results(args.name, saved, markdown(merged_args, results, checks, files, saved["environment"]))
        return
    if args.render:
        saved = json.loads((RESULTS / f"{args.name}.json").read_text(encoding="utf-8"))
        saved_args = argparse.Namespace(**saved["args"])
        files = plots(saved_args, saved["results"], args.name)
        write_results(args.name, saved, markdown(saved_args, saved["results"], saved["checks"], files,
                                                 saved["environment"]))
        return
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    results = sweep(args)
    checks = verdict(args, results)
    print(json.dumps(checks, indent=1))
    if args.no_write:
        return
    env = environment()
    files = [] if args.no_plots else plots(args, results, args.name)
    write_results(args.name, {"args": vars(args), "results": results, "checks": checks, "environment": env},
                  markdown(args, results, checks, files, env))


if __name__ == "__main__":
    main()

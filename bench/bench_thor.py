"""THOR vs Momentum on the built-in generated image set with a small ResNet (CPU, graph mode).

Two measurements, written to ``bench/results/thor.md`` and ``thor.json``:

* **Convergence**: both optimizers train the same network from the same initial weights on the same
  batches (model zoo ResNet with one basic block per stage, the model zoo's generated classes rendered
  in memory); validation accuracy after every epoch; epochs and training time until the target accuracy.
  Graph compilation is timed apart and not counted as training time.
* **Amortized step time**: the two compiled train steps alternate step by step on a fixed batch; THOR's
  refresh steps and other steps are timed apart, and the amortized step for frequency F is
  ``t_other + (t_refresh - t_other) / F``; ratio to the Momentum step.

Usage::

    python bench/bench_thor.py [--epochs 8] [--target 0.85] [--seeds 0 1] [--frequency 10 50 100]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import RESULTS, environment, write_results  # noqa: E402
from model_zoo.resnet.src.resnet import BasicBlock, ResNet  # noqa: E402
from model_zoo.resnet.src.synthetic_data import render_image  # noqa: E402
from ms_boost import Model  # noqa: E402
from ms_boost.thor import ConvertModelUtils, thor  # noqa: E402


def make_images(num_classes: int, per_class: int, size: int, split: int, seed: int):
    """Images of the model zoo's generated set, rendered in memory, normalised, NCHW float32."""
    x, y = [], []
    for c in range(num_classes):
        for j in range(per_class):
            rng = np.random.default_rng([seed, split, c, j])
            x.append(np.asarray(render_image(c, num_classes, size, rng), np.float32))
            y.append(c)
    x = (np.stack(x) / 255.0 - 0.45) / 0.25
    return x.transpose(0, 3, 1, 2).astype(np.float32), np.array(y, np.int32)


def loader(x, y, batch: int, shuffle_seed=None):
    data = ds.NumpySlicesDataset({"image": x, "label": y}, shuffle=shuffle_seed is not None)
    return data.batch(batch, drop_remainder=shuffle_seed is not None)


def build(kind: str, args, seed: int, steps_per_epoch: int):
    ms.set_seed(seed)
    net = ResNet(BasicBlock, (1, 1, 1, 1), class_num=args.classes, base_width=args.width)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    total = steps_per_epoch * args.epochs
    if kind == "momentum":
        lr = Tensor(cosine(args.momentum_lr, total))
        opt = nn.Momentum(net.trainable_params(), lr, 0.9, weight_decay=args.weight_decay)
        return net, opt, Model(net, loss, opt, metrics={"acc"})
    frequency = int(kind.split("_")[1])
    lr = Tensor(cosine(args.thor_lr, total))
    damping = Tensor(np.geomspace(args.damping, args.damping * 0.1, total).astype(np.float32))
    opt = thor(net, lr, damping, 0.9, args.weight_decay, frequency=frequency,
               decay_filter=lambda p: p.ndim > 1)
    model = ConvertModelUtils().convert_to_thor_model(Model(net, loss, opt, metrics={"acc"}), net, loss, opt,
                                                      metrics={"acc"})
    return net, opt, model


def cosine(peak: float, total: int) -> np.ndarray:
    steps = np.arange(total, dtype=np.float64)
    return (0.5 * peak * (1 + np.cos(np.pi * steps / total))).astype(np.float32)


def convergence(kind: str, args, seed: int, data) -> dict:
    (xt, yt), (xv, yv) = data
    steps = len(xt) // args.batch
    net, opt, model = build(kind, args, seed, steps)
    accuracy, epoch_times = [], []
    for epoch in range(args.epochs):
        start = time.perf_counter()
        model.train(1, loader(xt, yt, args.batch, shuffle_seed=seed * 1000 + epoch), dataset_sink_mode=False)
        epoch_times.append(time.perf_counter() - start)
        accuracy.append(float(model.eval(loader(xv, yv, 100), dataset_sink_mode=False)["acc"]))
        print(f"  {kind} seed {seed} epoch {epoch + 1}: val acc {accuracy[-1]:.3f} ({epoch_times[-1]:.1f} s)",
              flush=True)
    steady = statistics.median(epoch_times[1:]) if len(epoch_times) > 1 else epoch_times[0]
    train_times = [steady] + epoch_times[1:]  # epoch 1 without graph compilation
    reached = next((e for e, a in enumerate(accuracy) if a >= args.target), None)
    return {"accuracy": accuracy, "epoch_times": epoch_times, "compile_s": epoch_times[0] - steady,
            "epochs_to_target": None if reached is None else reached + 1,
            "time_to_target_s": None if reached is None else float(sum(train_times[:reached + 1])),
            "steps_per_epoch": steps}


def step_time(args, data) -> dict:
    """Per-step times of the compiled train steps on one fixed batch, Momentum and THOR alternating step by step.

    THOR's steps are split into refresh steps (every ``--time_frequency``-th) and the others; the amortized
    THOR step for a frequency F is ``t_other + (t_refresh - t_other) / F`` (medians), compared with the median
    Momentum step measured in the same alternation (so both see the same machine load).
    """
    (xt, yt), _ = data
    x, y = Tensor(xt[:args.batch]), Tensor(yt[:args.batch])
    cells = {}
    for kind in ("momentum", f"thor_{args.time_frequency}"):
        _, _, model = build(kind, args, 0, 1000)
        cell = model.train_network
        cell.set_train()
        start = time.perf_counter()
        _sync(cell(x, y))  # compile (and THOR's first refresh)
        print(f"  {kind}: compiled in {time.perf_counter() - start:.1f} s", flush=True)
        cells[kind] = cell
    momentum_cell, thor_cell = cells.values()
    momentum, refresh, other = [], [], []
    for step in range(1, args.timed_steps + 1):
        start = time.perf_counter()
        _sync(momentum_cell(x, y))
        momentum.append(time.perf_counter() - start)
        start = time.perf_counter()
        _sync(thor_cell(x, y))
        (refresh if step % args.time_frequency == 0 else other).append(time.perf_counter() - start)
    t_m, t_r, t_o = (statistics.median(v) for v in (momentum, refresh, other))
    f = args.time_frequency
    thor_all = [None] * len(momentum)
    r_iter, o_iter = iter(refresh), iter(other)
    for step in range(1, len(momentum) + 1):
        thor_all[step - 1] = next(r_iter) if step % f == 0 else next(o_iter)
    cycles = [sum(thor_all[k:k + f]) / sum(momentum[k:k + f]) for k in range(0, len(momentum) - f + 1, f)]
    amortized = {f: t_o + (t_r - t_o) / f for f in args.frequency}
    return {"momentum_s": t_m, "thor_refresh_s": t_r, "thor_other_s": t_o, "amortized_s": amortized,
            "paired_ratio": statistics.median(cycles) if cycles else float("nan"), "cycles": cycles,
            "ratio": {f: a / t_m for f, a in amortized.items()},
            "samples": {"momentum": momentum, "refresh": refresh, "other": other}}


def combine_runs(runs: list) -> dict:
    """One mode's repeated step-time measurements: the run with the median amortized ratio at the first
    reported frequency, its ratios replaced by the medians over the runs; every run kept under ``runs``."""
    if len(runs) == 1:
        return runs[0]
    first = next(iter(runs[0]["ratio"]))
    order = sorted(runs, key=lambda r: r["ratio"][first])
    out = dict(order[(len(order) - 1) // 2])
    out["ratio"] = {f: statistics.median(r["ratio"][f] for r in runs) for f in runs[0]["ratio"]}
    out["paired_ratio"] = statistics.median(r["paired_ratio"] for r in runs)
    out["runs"] = [{k: v for k, v in r.items() if k != "runs"} for r in runs]
    return out


def _sync(out) -> None:
    (out[0] if isinstance(out, tuple) else out).asnumpy()


def markdown(args, conv: dict, steps: dict, env: dict) -> str:
    lines = ["# THOR vs Momentum", "",
             f"Written by `bench/bench_thor.py`. CPU, 2 cores shared with other jobs, graph mode; times are "
             f"indicative, ratios carry over. Network: model zoo ResNet, one basic block per stage, base width "
             f"{args.width} (13 layers THOR preconditions); data: the model zoo's generated set, {args.classes} "
             f"classes, {args.size} px, {args.train_per_class} train / {args.val_per_class} val images per class, "
             f"batch {args.batch}. Both optimizers: momentum 0.9, weight decay {args.weight_decay}, cosine learning "
             f"rate (Momentum peak {args.momentum_lr}, THOR peak {args.thor_lr}); THOR damping {args.damping} "
             f"decaying 10x over the run, frequency {args.conv_frequency}.", "",
             f"## Convergence (target: {args.target:.0%} validation accuracy)", "",
             "Measured time: the epochs' wall time (epoch 1 counted at the median epoch time; the rest of it is "
             "the *compile* column); it swings with the other jobs on the machine. Modelled time: epochs x steps "
             "per epoch x the step time measured below with both optimizers alternating (load-independent "
             "ratio).", "",
             "| optimizer | seed | epochs to target | measured time to target | modelled time to target | compile "
             "| val acc per epoch |",
             "|---|---|---|---|---|---|---|"]
    for kind, runs in conv.items():
        step = _step_seconds(kind, steps)
        for seed, r in runs.items():
            reached = r["epochs_to_target"]
            epochs = reached if reached else f"> {args.epochs}"
            t = f"{r['time_to_target_s']:.1f} s" if r["time_to_target_s"] else "-"
            model = f"{reached * r['steps_per_epoch'] * step:.1f} s" if reached and step else "-"
            accs = " ".join(f"{a:.2f}" for a in r["accuracy"])
            lines.append(f"| {kind} | {seed} | {epochs} | {t} | {model} | {r['compile_s']:.1f} s | {accs} |")
    if not steps:
        return "\n".join(lines + ["", f"Environment: `{env}`"])
    if "momentum_s" in steps:  # a results file written before the per-mode timing
        steps = {"graph": steps}
    for mode, st in steps.items():
        runs = st.get("runs", [st])
        lines += ["", f"## Step time, {mode} mode (fixed batch, Momentum and THOR steps alternating, medians)", "",
                  f"Momentum step {st['momentum_s'] * 1e3:.1f} ms; THOR step without refresh "
                  f"{st['thor_other_s'] * 1e3:.1f} ms ({st['thor_other_s'] / st['momentum_s']:.2f}x), refresh "
                  f"step {st['thor_refresh_s'] * 1e3:.1f} ms ({st['thor_refresh_s'] / st['momentum_s']:.2f}x) "
                  f"({len(st['samples']['other'])} and {len(st['samples']['refresh'])} samples; paired median ratio "
                  f"per refresh cycle {st.get('paired_ratio', float('nan')):.2f}x at frequency {args.time_frequency})"
                  + (f"; medians over {len(runs)} repeats, each a fresh process-local build, modes interleaved"
                     if len(runs) > 1 else "") + ".",
                  "", "| THOR frequency | amortized THOR step | vs Momentum |"
                  + (" spread over repeats (min-max) |" if len(runs) > 1 else ""),
                  "|---|---|---|" + ("---|" if len(runs) > 1 else "")]
        for f, ratio in st["ratio"].items():
            row = f"| {f} | {st['amortized_s'][f] * 1e3:.1f} ms | {ratio:.2f}x |"
            if len(runs) > 1:
                values = [r["ratio"][f] for r in runs]
                row += f" {min(values):.2f}-{max(values):.2f}x |"
            lines.append(row)
    lines += ["", f"Environment: `{env}`"]
    return "\n".join(lines)


def _step_seconds(kind: str, steps) -> float:
    """Median step time of ``kind`` from the Graph-mode step-time measurement (amortized for THOR's frequency)."""
    if not steps:
        return 0.0
    steps = steps.get("graph", steps) if "momentum_s" not in steps else steps
    if "momentum_s" not in steps:
        return 0.0
    if kind == "momentum":
        return steps["momentum_s"]
    frequency = int(kind.split("_")[1])
    return steps["thor_other_s"] + (steps["thor_refresh_s"] - steps["thor_other_s"]) / frequency


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--target", type=float, default=0.85)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--classes", type=int, default=20)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--train_per_class", type=int, default=32)
    parser.add_argument("--val_per_class", type=int, default=10)
    parser.add_argument("--momentum_lr", type=float, default=0.1)
    parser.add_argument("--thor_lr", type=float, default=0.1)
    parser.add_argument("--damping", type=float, default=0.3)
    parser.add_argument("--weight_decay", type=float, default=1e-4)
    parser.add_argument("--conv_frequency", type=int, default=10, help="THOR frequency in the convergence runs")
    parser.add_argument("--frequency", type=int, nargs="+", default=[10, 50, 100],
                        help="frequencies whose amortized step time is reported")
    parser.add_argument("--time_frequency", type=int, default=10, help="THOR frequency while timing steps")
    parser.add_argument("--timed_steps", type=int, default=60)
    parser.add_argument("--modes", nargs="+", default=["graph", "pynative"], help="execution modes timed")
    parser.add_argument("--repeats", type=int, default=1,
                        help="step-time measurements per mode (modes interleaved); reported: medians and spread")
    parser.add_argument("--keep_convergence", action="store_true",
                        help="with --skip_convergence: keep the convergence section of the saved thor.json")
    parser.add_argument("--skip_convergence", action="store_true")
    parser.add_argument("--skip_step_time", action="store_true")
    parser.add_argument("--kinds", nargs="*", default=None, help="e.g. momentum thor_10 (default: both)")
    parser.add_argument("--no_write", action="store_true", help="print only (hyper-parameter exploration)")
    parser.add_argument("--render", action="store_true", help="rewrite thor.md from the saved thor.json")
    args = parser.parse_args(argv)
    if args.render:
        saved = json.loads((RESULTS / "thor.json").read_text(encoding="utf-8"))
        write_results("thor", saved, markdown(argparse.Namespace(**saved["args"]), saved["convergence"],
                                              saved["step_time"], saved["environment"]))
        return
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    data = (make_images(args.classes, args.train_per_class, args.size, 0, 0),
            make_images(args.classes, args.val_per_class, args.size, 1, 0))
    conv = {}
    if not args.skip_convergence:
        for kind in args.kinds or ("momentum", f"thor_{args.conv_frequency}"):
            conv[kind] = {seed: convergence(kind, args, seed, data) for seed in args.seeds}
    steps = None
    if not args.skip_step_time:
        runs = {mode: [] for mode in args.modes}
        for _ in range(args.repeats):
            for mode in args.modes:
                ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
                runs[mode].append(step_time(args, data))
                print(mode, {f"thor_{k}": f"{v:.2f}x" for k, v in runs[mode][-1]["ratio"].items()}, flush=True)
        ms.set_context(mode=ms.GRAPH_MODE)
        steps = {mode: combine_runs(r) for mode, r in runs.items()}
    if args.skip_convergence and args.keep_convergence:
        conv = json.loads((RESULTS / "thor.json").read_text(encoding="utf-8"))["convergence"]
    if args.no_write:
        return
    env = environment()
    write_results("thor", {"args": vars(args), "convergence": conv, "step_time": steps, "environment": env},
                  markdown(args, conv, steps, env))


if __name__ == "__main__":
    main()

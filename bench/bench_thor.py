"""THOR vs Momentum on the built-in generated image set with a small ResNet (CPU, graph mode).

Two measurements, written to ``bench/results/thor.md`` and ``thor.json``:

* **Convergence**: both optimizers train the same network from the same initial weights on the same
  batches (model zoo ResNet with one basic block per stage, the model zoo's generated classes rendered
  in memory); validation accuracy after every epoch; epochs and training time until the target accuracy.
  Graph compilation is timed apart and not counted as training time.
* **Amortized step time**: the compiled train steps alternate step by step on a fixed batch (Momentum, THOR
  with its step variants chosen on the host, and in Graph mode THOR with device-side switches, the previous
  step); THOR's refresh steps and other steps are timed apart, and the amortized step for frequency F is
  ``t_other + (t_refresh - t_other) / F``; ratio to the Momentum step. The step-time network is set apart
  (``--time_blocks``, ``--time_width``; default the zoo's ResNet-18 at width 16). Compile times: the first
  call (THOR's variants: the first two calls, which compile the refresh and the plain variant).
  ``--time_adaptive 0.1 0.3`` (default 0.3; ``--time_adaptive`` alone: none) and ``--time_block_sizes 64 32`` time
  more THOR configurations in the same alternation (the adaptive refresh with how many layer refreshes kept their
  inverses; other block sizes); ``--time_stat_fractions 0.5 0.25`` times THOR with its factor statistics on that
  fraction of each batch (``stat_fraction``), at the fixed frequency and with each ``--time_adaptive`` threshold;
  ``--time_batches 20`` cycles through the training set's batches instead of one fixed batch (every
  configuration gets the same batch at a step), which the adaptive refresh needs to see its factors change.

Usage::

    python bench/bench_thor.py [--epochs 8] [--target 0.85] [--seeds 0 1] [--frequency 10 50 100]
"""
from __future__ import annotations

import argparse
import functools
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
from ms_boost.thor.assignment import DEFAULT_BLOCK_SIZE  # noqa: E402


class PreconditionFloor(nn.Cell):
    """The preconditioning products of every THOR layer of ``opt`` and nothing else: the arithmetic a THOR step adds
    to a Momentum step between refreshes (its floor), compiled alone and fed fixed gradients."""

    def __init__(self, opt):
        super().__init__()
        self.opt = opt

    def construct(self, *gradients):
        return self.opt.directions(gradients)


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


def build(kind: str, args, seed: int, steps_per_epoch: int, blocks=(1, 1, 1, 1), width=None):
    ms.set_seed(seed)
    net = ResNet(BasicBlock, tuple(blocks), class_num=args.classes, base_width=width or args.width)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    total = steps_per_epoch * args.epochs
    if kind == "momentum":
        lr = Tensor(cosine(args.momentum_lr, total))
        opt = nn.Momentum(net.trainable_params(), lr, 0.9, weight_decay=args.weight_decay)
        return net, opt, Model(net, loss, opt, metrics={"acc"})
    parts = kind.split("_")
    frequency = int(parts[1])
    # thor_10_a0.1: adaptive refresh, threshold 0.1; thor_10_b64: block size 64; thor_10_s0.5: statistics on half
    # of each batch; thor_10_k0: trust region off (k: its kl_clip) (these combine: thor_10_a0.3_s0.5)
    options = {part[0]: float(part[1:]) for part in parts[2:]}
    threshold = options.get("a")
    block_size = int(options.get("b", args.block_size))
    fraction = {"stat_fraction": options["s"]} if "s" in options else {}
    if "k" in options:
        fraction["kl_clip"] = options["k"]
    lr = Tensor(cosine(args.thor_lr, total))
    damping = Tensor(np.geomspace(args.damping, args.damping * 0.1, total).astype(np.float32))
    opt = thor(net, lr, damping, 0.9, args.weight_decay, frequency=frequency,
               decay_filter=lambda p: p.ndim > 1, refresh_threshold=threshold, block_size=block_size, **fraction)
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


def adaptive_compare(args, data, seed: int) -> dict:
    """THOR with the fixed frequency and with the adaptive per-layer refresh, trained epoch by epoch alternately
    (same machine load) from the same weights on the same batches: epoch times, validation accuracy, and how many
    layer refreshes kept their inverses."""
    (xt, yt), (xv, yv) = data
    steps = len(xt) // args.batch
    kinds = [f"thor_{args.conv_frequency}"] + [f"thor_{args.conv_frequency}_a{t:g}" for t in args.adaptive]
    built = {kind: build(kind, args, seed, steps) for kind in kinds}
    out = {kind: {"accuracy": [], "epoch_times": []} for kind in kinds}
    for epoch in range(args.epochs):
        for kind in kinds:
            _, _, model = built[kind]
            start = time.perf_counter()
            model.train(1, loader(xt, yt, args.batch, shuffle_seed=seed * 1000 + epoch), dataset_sink_mode=False)
            out[kind]["epoch_times"].append(time.perf_counter() - start)
            out[kind]["accuracy"].append(float(model.eval(loader(xv, yv, 100), dataset_sink_mode=False)["acc"]))
            print(f"  {kind} seed {seed} epoch {epoch + 1}: val acc {out[kind]['accuracy'][-1]:.3f} "
                  f"({out[kind]['epoch_times'][-1]:.1f} s)", flush=True)
    for kind in kinds:
        opt = built[kind][1]
        refreshes = 1 + (args.epochs * steps - 1) // args.conv_frequency
        stable = sum(opt.health().get("stable_refreshes", {}).values())
        times = out[kind]["epoch_times"]
        out[kind].update({"steady_epoch_s": statistics.median(times[1:]) if len(times) > 1 else times[0],
                          "layer_refreshes": refreshes * opt.n_layers, "stable_refreshes": stable,
                          "epochs_to_target": next((e + 1 for e, a in enumerate(out[kind]["accuracy"])
                                                    if a >= args.target), None)})
    return out


def step_time(args, data) -> dict:
    """Per-step times of the compiled train steps on one fixed batch, Momentum and THOR alternating step by step.

    THOR's steps are split into refresh steps (every ``--time_frequency``-th) and the others; the amortized
    THOR step for a frequency F is ``t_other + (t_refresh - t_other) / F`` (medians), compared with the median
    Momentum step measured in the same alternation (so both see the same machine load). In Graph mode THOR runs
    twice, from the same weights: with its step variants chosen on the host (the train cell called directly, as
    ``Model.train`` calls it) and with the device-side switches (``nn.Cell.__call__`` of it: the previous step;
    ``--skip_switch`` leaves it out). *floor*: THOR's preconditioning products alone (:class:`PreconditionFloor`,
    the arithmetic a THOR step adds between refreshes), timed in the same alternation.
    """
    (xt, yt), _ = data
    n_batches = max(1, min(getattr(args, "time_batches", 1), len(xt) // args.batch))
    batches = [(Tensor(xt[k * args.batch:(k + 1) * args.batch]), Tensor(yt[k * args.batch:(k + 1) * args.batch]))
               for k in range(n_batches)]
    x, y = batches[0]
    graph = ms.get_context("mode") == ms.GRAPH_MODE
    # more THOR configurations timed alongside: the adaptive refresh (thor_a<threshold>), other block sizes
    thresholds, fractions = getattr(args, "time_adaptive", []), getattr(args, "time_stat_fractions", [])
    adaptive = ([f"thor_a{t:g}" for t in thresholds]
                + [f"thor_b{b}" for b in getattr(args, "time_block_sizes", [])]
                + [f"thor_s{s:g}" for s in fractions] + [f"thor_a{t:g}_s{s:g}" for s in fractions for t in thresholds])
    kinds = (["momentum", "thor"] + adaptive
             + (["thor_switch"] if graph and not getattr(args, "skip_switch", False) else []))
    calls, compile_s, compile_cpu, opts = {}, {}, {}, {}
    for kind in kinds:
        built = "momentum" if kind == "momentum" else f"thor_{args.time_frequency}"
        if kind in adaptive:
            built += kind[len("thor"):]  # thor_10_a0.1
        _, opt, model = build(built, args, 0, 1000, args.time_blocks, args.time_width)
        opts[kind] = opt
        cell = model.train_network
        cell.set_train()
        # ms_boost's train cell chooses THOR's step variant itself (its stage hook); "thor_switch" calls it without
        # that choice (nn.Cell's own call): the default graph with the device-side switches
        call = functools.partial(nn.Cell.__call__, cell) if kind == "thor_switch" else cell
        start, cpu = time.perf_counter(), time.process_time()
        _sync(call(x, y))  # compile (and THOR's first refresh)
        first, first_cpu = time.perf_counter() - start, time.process_time() - cpu
        start, cpu = time.perf_counter(), time.process_time()
        _sync(call(x, y))  # THOR's variants: compiles the plain one
        second, second_cpu = time.perf_counter() - start, time.process_time() - cpu
        compile_s[kind] = (first, second)
        compile_cpu[kind] = (first_cpu, second_cpu)
        print(f"  {kind}: first call {first:.1f} s, second {second:.1f} s", flush=True)
        calls[kind] = call
        if kind == "thor":  # the floor: the same layers' preconditioning products on fixed gradients
            rng = np.random.default_rng(0)
            grads = tuple(Tensor(rng.standard_normal(p.shape).astype(np.float32)) for p in opt._parameters)
            floor = PreconditionFloor(opt)
            calls["floor"] = lambda _x, _y, floor=floor, grads=grads: floor(*grads)
            _sync(calls["floor"](x, y))
    timed = kinds + ["floor"]
    times = {kind: ([], []) for kind in timed}  # (refresh steps, other steps); Momentum, floor: all in "other"
    # also the process's CPU time (all its threads): on a machine shared with other jobs the wall time of a step
    # mostly measures the waits for a core; the CPU time it used is far steadier
    cpu_times = {kind: ([], []) for kind in timed}
    kept_before = {kind: _kept_refreshes(opts[kind]) for kind in adaptive}
    f = args.time_frequency
    for step in range(2, args.timed_steps + 2):
        x, y = batches[step % n_batches]  # every kind gets the same batch at a step
        for kind in timed:
            start, cpu = time.perf_counter(), time.process_time()
            _sync(calls[kind](x, y))
            refresh = kind not in ("momentum", "floor") and step % f == 0
            times[kind][0 if refresh else 1].append(time.perf_counter() - start)
            cpu_times[kind][0 if refresh else 1].append(time.process_time() - cpu)
    momentum = times["momentum"][1]
    t_m = statistics.median(momentum)
    out = {"momentum_s": t_m, "compile_s": {}, "samples": {"momentum": momentum},
           "floor_s": statistics.median(times["floor"][1])}
    for kind in kinds[1:]:
        if kind in adaptive:
            continue
        refresh, other = times[kind]
        t_r, t_o = statistics.median(refresh), statistics.median(other)
        ordered, r_iter, o_iter = [], iter(refresh), iter(other)
        for step in range(2, args.timed_steps + 2):
            ordered.append(next(r_iter) if step % f == 0 else next(o_iter))
        cycles = [sum(ordered[k:k + f]) / sum(momentum[k:k + f]) for k in range(0, len(momentum) - f + 1, f)]
        amortized = {fr: t_o + (t_r - t_o) / fr for fr in args.frequency}
        prefix = "thor" if kind == "thor" else "switch"
        out.update({f"{prefix}_refresh_s": t_r, f"{prefix}_other_s": t_o})
        if kind == "thor":
            out.update({"amortized_s": amortized, "ratio": {fr: a / t_m for fr, a in amortized.items()},
                        "paired_ratio": statistics.median(cycles) if cycles else float("nan"), "cycles": cycles})
            out["samples"].update({"refresh": refresh, "other": other})
        else:
            out.update({"switch_amortized_s": amortized, "switch_ratio": {fr: a / t_m for fr, a in amortized.items()},
                        "switch_paired_ratio": statistics.median(cycles) if cycles else float("nan")})
    # compile: Momentum's and the switch step's first call minus a step; the variants' first two calls minus two
    out["compile_s"]["momentum"] = compile_s["momentum"][0] - t_m
    out["compile_s"]["thor"] = sum(compile_s["thor"]) - out["thor_refresh_s"] - out["thor_other_s"]
    out["compile_s"]["thor_refresh_variant"] = compile_s["thor"][0] - out["thor_refresh_s"]
    out["compile_s"]["thor_plain_variant"] = compile_s["thor"][1] - out["thor_other_s"]
    if "thor_switch" in kinds:
        out["compile_s"]["thor_switch"] = compile_s["thor_switch"][0] - out["switch_refresh_s"]
    med = {kind: _medians(cpu_times[kind]) for kind in timed}
    c_m, (c_r, c_o) = med["momentum"][1], med["thor"]
    out["cpu"] = {"momentum_s": c_m, "floor_s": med["floor"][1], "thor_refresh_s": c_r, "thor_other_s": c_o,
                  "ratio": {fr: (c_o + (c_r - c_o) / fr) / c_m for fr in args.frequency},
                  "compile_s": {"momentum": compile_cpu["momentum"][0] - c_m,
                                "thor_refresh_variant": compile_cpu["thor"][0] - c_r,
                                "thor_plain_variant": compile_cpu["thor"][1] - c_o}}
    if "thor_switch" in kinds:
        out["cpu"].update({"switch_other_s": med["thor_switch"][1], "switch_refresh_s": med["thor_switch"][0]})
    out["batches"] = n_batches
    if adaptive:  # per threshold: refresh steps with the trace rule, and how many layer refreshes kept their inverses
        out["adaptive"] = {}
        refreshes = sum(1 for step in range(2, args.timed_steps + 2) if step % f == 0)
        for kind in adaptive:
            (t_r, t_o), (a_r, a_o) = med[kind], _medians(times[kind])
            out["adaptive"][kind] = {
                "refresh_s": a_r, "other_s": a_o, "cpu_refresh_s": t_r, "cpu_other_s": t_o,
                "cpu_ratio": {fr: (t_o + (t_r - t_o) / fr) / c_m for fr in args.frequency},
                "cpu_ratio_vs_fixed": {fr: (t_o + (t_r - t_o) / fr) / (c_o + (c_r - c_o) / fr)
                                       for fr in args.frequency},
                "kept": _kept_refreshes(opts[kind]) - kept_before[kind],
                "layer_refreshes": refreshes * opts[kind].n_layers,
                "compile_cpu_s": [compile_cpu[kind][0] - t_r, compile_cpu[kind][1] - t_o]}
    return out


def _medians(pair) -> tuple:
    return tuple(statistics.median(s) if s else float("nan") for s in pair)


def _kept_refreshes(opt) -> int:
    """Layer refreshes at which THOR's trace rule kept a layer's inverses, so far."""
    return sum(opt.health().get("stable_refreshes", {}).values())


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


def _cpu_line(cpu: dict, with_ms: bool) -> str:
    """One sentence of per-step CPU times (Momentum, THOR between refreshes and on a refresh, the
    preconditioning products alone), the amortized ratios and the compile CPU-seconds."""
    base = cpu["momentum_s"]

    def part(key: str) -> str:
        ratio = f"{cpu[key] / base:.2f}x"
        return f"{cpu[key] * 1e3:.1f} ms ({ratio})" if with_ms else ratio

    return (f"Momentum {base * 1e3:.1f} ms, THOR between refreshes {cpu['thor_other_s'] * 1e3:.1f} ms "
            f"({cpu['thor_other_s'] / base:.2f}x), refresh step {part('thor_refresh_s')}, preconditioning products "
            f"alone {part('floor_s')}; amortized " + ", ".join(f"{r:.2f}x ({fr})" for fr, r in cpu["ratio"].items())
            + "; compile " + ", ".join(f"{k} {v:.1f} CPU-s" for k, v in cpu["compile_s"].items()) + ".")


def markdown(args, conv: dict, steps: dict, env: dict, adaptive: dict = None) -> str:
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
    lines += _adaptive_lines(args, adaptive)
    if not steps:
        return "\n".join(lines + ["", f"Environment: `{env}`"])
    if "momentum_s" in steps:  # a results file written before the per-mode timing
        steps = {"graph": steps}
    for mode, st in steps.items():
        runs = st.get("runs", [st])
        network = ""
        if "time_blocks" in vars(args):
            network = (f"Network: zoo ResNet with {' '.join(map(str, args.time_blocks))} basic blocks per stage, "
                       f"base width {args.time_width}, batch {args.batch}, {args.size} px. ")
        switch = ""
        if "switch_other_s" in st:
            switch = (f" Before (the same THOR with device-side switches, alternating in the same loop): step "
                      f"without refresh {st['switch_other_s'] * 1e3:.1f} ms "
                      f"({st['switch_other_s'] / st['momentum_s']:.2f}x), refresh step "
                      f"{st['switch_refresh_s'] * 1e3:.1f} ms ({st['switch_refresh_s'] / st['momentum_s']:.2f}x), "
                      f"amortized: see the last column.")
        if "floor_s" in st:
            switch += (f" THOR's preconditioning products alone (the arithmetic it adds between refreshes, compiled "
                       f"apart, same alternation): {st['floor_s'] * 1e3:.1f} ms "
                       f"({st['floor_s'] / st['momentum_s']:.2f}x Momentum), so the floor of the step between "
                       f"refreshes is about {1 + st['floor_s'] / st['momentum_s']:.2f}x Momentum.")
        cpu = st.get("cpu")
        if cpu:
            switch += (" CPU time of the process (all threads; steadier than wall time on a shared machine): "
                       + _cpu_line(cpu, with_ms=True))
        if "compile_s" in st:
            switch += " Compile (first calls less their steps): " + ", ".join(
                f"{k} {v:.1f} s" for k, v in st["compile_s"].items()) + "."
        prev = st.get("previous_code")
        if prev:  # the code before the change, timed by this script in its own process at the same time
            switch += (f" Previous code ({prev['label']}, run concurrently in its own process): Momentum "
                       f"{prev['momentum_s'] * 1e3:.1f} ms, THOR step without refresh "
                       f"{prev['thor_other_s'] * 1e3:.1f} ms ({prev['thor_other_s'] / prev['momentum_s']:.2f}x), "
                       f"refresh step {prev['thor_refresh_s'] * 1e3:.1f} ms "
                       f"({prev['thor_refresh_s'] / prev['momentum_s']:.2f}x), amortized "
                       + ", ".join(f"{r:.2f}x ({f})" for f, r in prev["ratio"].items())
                       + f"; compile: Momentum {prev['compile_s']['momentum']:.1f} s, THOR "
                       f"{prev['compile_s']['thor']:.1f} s.")
            pcpu = prev.get("cpu")
            if pcpu:
                switch += " Its CPU time: " + _cpu_line(pcpu, with_ms=False)
        batch = "fixed batch" if st.get("batches", 1) == 1 else f"{st['batches']} batches in turn"
        lines += ["", f"## Step time, {mode} mode ({batch}, Momentum and THOR steps alternating, medians)", "",
                  network + f"Momentum step {st['momentum_s'] * 1e3:.1f} ms; THOR step without refresh "
                  f"{st['thor_other_s'] * 1e3:.1f} ms ({st['thor_other_s'] / st['momentum_s']:.2f}x), refresh "
                  f"step {st['thor_refresh_s'] * 1e3:.1f} ms ({st['thor_refresh_s'] / st['momentum_s']:.2f}x) "
                  f"({len(st['samples']['other'])} and {len(st['samples']['refresh'])} samples; paired median ratio "
                  f"per refresh cycle {st.get('paired_ratio', float('nan')):.2f}x at frequency {args.time_frequency})"
                  + (f"; medians over {len(runs)} repeats, each a fresh process-local build, modes interleaved"
                     if len(runs) > 1 else "") + "." + switch,
                  "", "| THOR frequency | amortized THOR step | vs Momentum |"
                  + (" spread over repeats (min-max) |" if len(runs) > 1 else "")
                  + (" before: device-side switches, vs Momentum |" if "switch_ratio" in st else ""),
                  "|---|---|---|" + ("---|" if len(runs) > 1 else "") + ("---|" if "switch_ratio" in st else "")]
        for f, ratio in st["ratio"].items():
            row = f"| {f} | {st['amortized_s'][f] * 1e3:.1f} ms | {ratio:.2f}x |"
            if len(runs) > 1:
                values = [r["ratio"][f] for r in runs]
                row += f" {min(values):.2f}-{max(values):.2f}x |"
            if "switch_ratio" in st:
                row += f" {st['switch_ratio'][f]:.2f}x |"
            lines.append(row)
        lines += _adaptive_step_lines(st, args)
    lines += ["", f"Environment: `{env}`"]
    return "\n".join(lines)


def _adaptive_step_lines(st: dict, args) -> list:
    """The step-time table of THOR with the adaptive refresh (CPU time), when it was timed."""
    adaptive = st.get("adaptive")
    if not adaptive:
        return []
    fr = next(iter(st["cpu"]["ratio"]))  # the first reported frequency (a str key once read back from thor.json)
    batches = st.get("batches", 1)
    data = "one fixed batch" if batches == 1 else f"{batches} batches of the training set in turn (all kinds alike)"
    lines = ["", f"Other THOR configurations in the same alternation ({data}, frequency {args.time_frequency}; CPU "
             f"time per step, medians; block size {getattr(args, 'block_size', 128)} unless named; *kept*: layer "
             "refreshes at which the adaptive refresh's trace rule kept the inverses, of all layer refreshes of the "
             "timed steps):", "",
             f"| THOR | kept | between refreshes | refresh step | amortized ({fr}) vs Momentum | vs fixed frequency |",
             "|---|---|---|---|---|---|",
             f"| fixed frequency, all layers | - | {st['cpu']['thor_other_s'] / st['cpu']['momentum_s']:.2f}x | "
             f"{st['cpu']['thor_refresh_s'] / st['cpu']['momentum_s']:.2f}x | {st['cpu']['ratio'][fr]:.2f}x | 1.00x |"]
    base = st["cpu"]["momentum_s"]
    for kind, a in adaptive.items():
        name = ", ".join({"a": f"adaptive refresh, threshold {part[1:]}", "b": f"block size {part[1:]}",
                          "s": f"statistics on {part[1:]} of each batch"}[part[0]] for part in kind.split("_")[1:])
        kept = f"{a['kept']} / {a['layer_refreshes']}" if kind.startswith("thor_a") else "-"
        lines.append(f"| {name} | {kept} | "
                     f"{a['cpu_other_s'] / base:.2f}x | {a['cpu_refresh_s'] / base:.2f}x | "
                     f"{a['cpu_ratio'][fr]:.2f}x | {a['cpu_ratio_vs_fixed'][fr]:.2f}x |")
    return lines


def _adaptive_lines(args, adaptive) -> list:
    if not adaptive:
        return []
    lines = ["", "## Adaptive per-layer refresh vs fixed frequency (convergence network, epochs alternating)", "",
             "Same weights, batches and schedules; the runs alternate epoch by epoch (same machine load). *Kept*: "
             "layer refreshes at which the trace rule kept a layer's inverses, of all layer refreshes. Steady epoch: "
             "median epoch time after the first (which compiles).", "",
             "| THOR | seed | kept inverses | steady epoch | vs fixed | epochs to target | val acc per epoch |",
             "|---|---|---|---|---|---|---|"]
    for seed, runs in adaptive.items():
        base = next(iter(runs.values()))["steady_epoch_s"]
        for kind, r in runs.items():
            accs = " ".join(f"{a:.2f}" for a in r["accuracy"])
            lines.append(f"| {kind} | {seed} | {r['stable_refreshes']} / {r['layer_refreshes']} | "
                         f"{r['steady_epoch_s']:.2f} s | {r['steady_epoch_s'] / base:.2f}x | "
                         f"{r['epochs_to_target'] or '-'} | {accs} |")
    return lines


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
    parser.add_argument("--time_blocks", type=int, nargs=4, default=[2, 2, 2, 2],
                        help="basic blocks per stage of the step-time network (2 2 2 2: ResNet-18)")
    parser.add_argument("--time_width", type=int, default=16, help="base width of the step-time network")
    parser.add_argument("--timed_steps", type=int, default=60)
    parser.add_argument("--time_batches", type=int, default=1,
                        help="batches of the training set the step-time loop cycles through (1: a fixed batch)")
    parser.add_argument("--time_adaptive", type=float, nargs="*", default=[0.3],
                        help="adaptive-refresh thresholds timed in the step-time alternation too (default 0.3, the "
                             "issue's adaptive target; none: --time_adaptive with no value)")
    parser.add_argument("--time_block_sizes", type=int, nargs="*", default=[],
                        help="other THOR block sizes timed in the step-time alternation too")
    parser.add_argument("--time_stat_fractions", type=float, nargs="*", default=[],
                        help="THOR's stat_fraction values (factor statistics on that fraction of each batch) timed in "
                             "the step-time alternation too, alone and with each --time_adaptive threshold")
    parser.add_argument("--block_size", type=int, default=DEFAULT_BLOCK_SIZE,
                        help="THOR block size (convergence and timing; default thor()'s)")
    parser.add_argument("--skip_switch", action="store_true",
                        help="time THOR with its host-chosen step variants only (not the device-switch graph too)")
    parser.add_argument("--modes", nargs="+", default=["graph", "pynative"], help="execution modes timed")
    parser.add_argument("--repeats", type=int, default=1,
                        help="step-time measurements per mode (modes interleaved); reported: medians and spread")
    parser.add_argument("--adaptive", type=float, nargs="*", default=[],
                        help="adaptive-refresh thresholds compared with the fixed frequency (epoch by epoch)")
    parser.add_argument("--keep_step_time", action="store_true",
                        help="with --skip_step_time: keep the step-time section of the saved thor.json")
    parser.add_argument("--keep_convergence", action="store_true",
                        help="with --skip_convergence: keep the convergence section of the saved thor.json")
    parser.add_argument("--skip_convergence", action="store_true")
    parser.add_argument("--skip_step_time", action="store_true")
    parser.add_argument("--kinds", nargs="*", default=None, help="e.g. momentum thor_10 (default: both)")
    parser.add_argument("--no_write", action="store_true", help="print only (hyper-parameter exploration)")
    parser.add_argument("--render", action="store_true", help="rewrite thor.md from the saved thor.json")
    parser.add_argument("--device", choices=("CPU", "GPU"), default="CPU",
                        help="device the steps run on (GPU: MindSpore's CUDA plugin, see scripts/gpu_check.sh)")
    args = parser.parse_args(argv)
    bad = [f for f in args.time_stat_fractions if not 0.0 < f <= 1.0]
    if bad:
        parser.error(f"--time_stat_fractions={args.time_stat_fractions}: {bad} not allowed (a fraction in (0, 1])")
    if args.render:
        saved = json.loads((RESULTS / "thor.json").read_text(encoding="utf-8"))
        text = markdown(argparse.Namespace(**saved["args"]), saved["convergence"], saved["step_time"],
                        saved["environment"], saved.get("adaptive"))
        if saved.get("note"):  # conditions recorded with the run (e.g. the machine's load)
            text = text.replace("\n\n", f"\n\n*{saved['note']}*\n\n", 1)
        write_results("thor", saved, text)
        return
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device(args.device)
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
    adaptive = {seed: adaptive_compare(args, data, seed) for seed in args.seeds} if args.adaptive else None
    saved = json.loads((RESULTS / "thor.json").read_text(encoding="utf-8")) if (RESULTS / "thor.json").exists() else {}
    if args.skip_convergence and args.keep_convergence:
        conv = saved["convergence"]
    if args.skip_step_time and args.keep_step_time:
        steps = saved.get("step_time")
    if adaptive is None:
        adaptive = saved.get("adaptive")
    env = environment()
    if args.no_write:  # the page's text on stdout, nothing written
        print(markdown(args, conv, steps, env, adaptive), flush=True)
        return
    write_results("thor", {"args": vars(args), "convergence": conv, "step_time": steps, "adaptive": adaptive,
                           "environment": env}, markdown(args, conv, steps, env, adaptive))


if __name__ == "__main__":
    main()

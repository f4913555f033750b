"""Step-time overhead of ms_boost.Model against mindspore.train.Model and upstream mindspore.boost.

Ratios are measured side by side in one run, interleaving the contenders each repeat, and reported as
medians over repeats:

* ms_boost O0 / mindspore.train.Model O0   (target: <= 1.02)
* ms_boost O1 / upstream mindspore.boost O1, with and without gradient centralization (``gc_flag``);
  a contender that fails to build or train is reported in the table with its error instead of a time
  (on CPU upstream O1 with ``gc_flag`` on fails: its ``Centralization`` operator is Ascend-only, so the
  gc-off pair is the comparison there)

Upstream's ``AutoBoost`` is a process-wide singleton fixed by the first model built; :func:`build` resets
it before every upstream contender (and checks the level), else every "upstream O1" would train at O0.

The noise floor is the ratio of two identical contenders (``mindspore O0 (twin)`` / ``mindspore O0``)
timed the same way.

Usage: python bench/bench_overhead.py [--repeats 9] [--steps 10] [--batch 8] [--quick]
Writes bench/results/overhead.{md,json}.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mindspore as ms  # noqa: E402
import mindspore.dataset as ds  # noqa: E402
from mindspore import nn  # noqa: E402
from mindspore.train import Model as MsModel  # noqa: E402

from bench.common import (  # noqa: E402
    BenchConvNet,
    environment,
    load_average,
    page_footer,
    quartiles_of,
    random_batches,
    write_results,
)
from ms_boost import Model as BoostModel  # noqa: E402

CONTENDERS = {
    "mindspore O0": (MsModel, "O0", None),
    "mindspore O0 (twin)": (MsModel, "O0", None),  # identical contender: the noise floor
    "ms_boost O0": (BoostModel, "O0", None),
    "upstream O1": (MsModel, "O1", None),
    "upstream O1 (gc off)": (MsModel, "O1", {"less_bn": {"gc_flag": False}}),
    "ms_boost O1": (BoostModel, "O1", None),
    "ms_boost O1 (gc off)": (BoostModel, "O1", {"less_bn": {"gc_flag": False}}),
}
NOISE = ("mindspore O0 (twin)", "mindspore O0")
RATIOS = [NOISE, ("ms_boost O0", "mindspore O0"), ("ms_boost O1", "upstream O1"),
          ("ms_boost O1 (gc off)", "upstream O1 (gc off)")]


def fresh_upstream_boost() -> None:
    """Forget upstream's process-wide ``mindspore.boost.AutoBoost`` singleton.

    Upstream's AutoBoost keeps the level and config of the FIRST instance created in the process:
    without this, the first contender (``mindspore O0``) fixes the singleton at O0 and every later
    "upstream O1" model silently trains with no boost algorithm at all (no LessBN, no freezing).
    """
    from mindspore.boost import AutoBoost

    AutoBoost._instance = None  # noqa: SLF001 - the only way to build a second, different upstream config


def build(model_cls, level, cfg, x, y, batch):
    ms.set_seed(0)
    if model_cls is MsModel:
        fresh_upstream_boost()
    net = BenchConvNet()
    opt = nn.Momentum(net.trainable_params(), 0.01, 0.9)
    kwargs = {"boost_level": level, "metrics": {"acc"}}
    if cfg:
        kwargs["boost_config_dict"] = cfg
    model = model_cls(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), opt, **kwargs)
    if model_cls is MsModel and level != "O0":
        from mindspore.boost import AutoBoost

        built_level = AutoBoost._instance.level  # noqa: SLF001
        if built_level != level:
            raise RuntimeError(f"upstream AutoBoost singleton is at {built_level}, not {level}: the contender would "
                               f"not run the algorithms it is named after")
    data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(batch, drop_remainder=True)
    return model, data


def time_epoch(model, data, steps):
    import time

    start = time.perf_counter()
    model.train(1, data, dataset_sink_mode=False)
    return (time.perf_counter() - start) / steps


def run_mode(mode_name, repeats, steps, batch):
    ms.set_context(mode=ms.GRAPH_MODE if mode_name == "graph" else ms.PYNATIVE_MODE)
    x, y = random_batches(steps, batch)
    built, errors = {}, {}
    for name, (cls, level, cfg) in CONTENDERS.items():
        try:
            model, data = build(cls, level, cfg, x, y, batch)
            warm = time_epoch(model, data, steps)  # warm-up: compilation, first-step allocation
            built[name] = (model, data)
            print(f"[bench] {mode_name} {name}: warm-up epoch {warm * steps:.1f} s", flush=True)
        except Exception as exc:  # noqa: BLE001 - a contender that fails is reported, not hidden
            lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip() and not ln.strip().startswith("-")]
            errors[name] = f"{type(exc).__name__}: {(lines or [''])[0][:200]}"  # MindSpore's first line is blank
            traceback.print_exc(limit=1)
    times = {name: [] for name in built}
    for r in range(repeats):
        for name, (model, data) in built.items():  # interleaved: drift hits every contender alike
            times[name].append(time_epoch(model, data, steps))
        print(f"[bench] {mode_name} repeat {r + 1}/{repeats}: "
              + ", ".join(f"{n} {t[-1] * 1e3:.1f} ms" for n, t in times.items()), flush=True)
    medians = {name: statistics.median(t) for name, t in times.items()}
    return medians, times, errors


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="3 repeats of 5 steps (a few minutes)")
    parser.add_argument("--modes", default="pynative,graph")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.steps = 3, 5
    ms.set_device("CPU")
    payload = {"env": environment(), "args": vars(args), "modes": {}}
    lines = ["# Overhead: ms_boost.Model vs mindspore.train.Model and upstream mindspore.boost", "",
             f"Small ResNet-like conv net (BatchNorm), batch {args.batch}, 3x32x32, CPU, {args.steps} steps per "
             f"epoch, median of {args.repeats} interleaved repeats after one warm-up epoch. "
             f"MindSpore {ms.__version__}. Command: `python bench/bench_overhead.py`.", ""]
    for mode_name in args.modes.split(","):
        medians, times, errors = run_mode(mode_name, args.repeats, args.steps, args.batch)
        # paired: each repeat's ratio (the two ran back to back, under the same load), median over repeats
        ratios = {f"{a} / {b}": statistics.median(x / y for x, y in zip(times[a], times[b]))
                  for a, b in RATIOS if a in medians and b in medians}
        quartiles = {f"{a} / {b}": quartiles_of([x / y for x, y in zip(times[a], times[b])])
                     for a, b in RATIOS if a in medians and b in medians}
        payload["modes"][mode_name] = {"median_step_s": medians, "times": times, "errors": errors, "ratios": ratios,
                                       "ratio_quartiles": quartiles}
        lines += [f"## {mode_name}", "", "| contender | median step (ms) |", "|---|---|"]
        for name in CONTENDERS:
            cell = f"{medians[name] * 1e3:.2f}" if name in medians else f"fails: `{errors.get(name, '?')}`"
            lines.append(f"| {name} | {cell} |")
        lines += ["", "| ratio (median over repeats of the paired per-repeat ratio) | value | quartiles |",
                  "|---|---|---|"]
        for a, b in RATIOS:
            key = f"{a} / {b}"
            label = f"{key} (noise floor: identical contenders)" if (a, b) == NOISE else key
            lines.append(f"| {label} | {ratios[key]:.3f} | {quartiles[key][0]:.3f} .. {quartiles[key][1]:.3f} |"
                         if key in ratios else f"| {label} | n/a ({b} fails) | |")
        lines.append("")
    lines += page_footer("python bench/bench_overhead.py" + (" --quick" if args.quick else ""))
    payload["load"] = load_average()
    write_results("overhead", payload, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()

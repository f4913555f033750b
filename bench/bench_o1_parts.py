"""Where an O1 step's time goes against O0: the zoo's GEMM ResNet in Graph mode, each O1 part switched off.

Contenders (``ms_boost.Model``, same weights and batches, built in one process and timed interleaved so that
the shared CPU's drift hits each alike): O0, an identical O0 twin (the noise floor), O1, O1 with gradient
centralization off, with the FN head off too (these with freezing's graph per train set, ``grad_freeze.graph_variants``
on, as the default chooses for long runs), O1 and gradient freezing alone with freezing's one masked graph
(``graph_variants`` off, what the default runs on short runs), LessBN alone, gradient freezing alone, and
cpu_gemm_conv alone (a no-op on this network: its convolutions are the zoo's ``GemmConv2d`` already), and LessBN's
three parts apart
(BatchNorm removal, FN head, gradient centralization), and O1 and LessBN's BatchNorm removal + gradient
centralization with gradient centralization's previous form (a mean over axes 1..3 of the 4-D gradient; ms_boost's
takes it over the gradient seen as a ``(C_out, n)`` matrix), paired with the same contenders in ms_boost's form.
Reported per contender: the warm-up (compiles included)
in wall and in process CPU seconds, the median step over the timed epochs, and the median of the paired per-repeat
ratios to O0, in wall time and in process CPU time. Each repeat starts at the next contender (the order rotates), so
that no contender always runs first. On the shared 2-core machine the CPU time of the process is the steadier
measure: other jobs stretch the wall time of a compile or a step, not the work it does.

Usage::

    python bench/bench_o1_parts.py [--repeats 13] [--steps 10] [--warmup_steps 100] [--width 8] [--image_size 16]
                                   [--mode graph|pynative] [--only NAME ...] [--page NAME] [--notes FILE]
"""
from __future__ import annotations

import argparse
import contextlib
import shlex
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mindspore as ms  # noqa: E402
import mindspore.dataset as ds  # noqa: E402
from mindspore import nn  # noqa: E402
from mindspore.ops import composite as C  # noqa: E402

import ms_boost.grad_process as grad_process  # noqa: E402
from bench.common import load_average, page_footer, paired_ratio, random_batches, write_results  # noqa: E402
from ms_boost import Model  # noqa: E402

MANUAL = {"mode": "manual", "less_bn": False, "grad_freeze": False, "cpu_gemm_conv": False}
# freezing's graph per train set, as the default (auto) chooses for runs of 20,000 steps and more; this run is short
PER_SET = {"graph_variants": True}
CONTENDERS = {
    "O0": ("O0", None),
    "O0 (twin)": ("O0", None),
    "O1": ("O1", {"grad_freeze": PER_SET}),
    "O1, gc off": ("O1", {"grad_freeze": PER_SET, "less_bn": {"gc_flag": False}}),
    "O1, gc and FN head off": ("O1", {"grad_freeze": PER_SET, "less_bn": {"gc_flag": False, "fn_flag": False}}),
    "LessBN alone (gc, FN head)": ("O1", {"boost": {**MANUAL, "less_bn": True}}),
    "LessBN: BatchNorm removal only": ("O1", {"boost": {**MANUAL, "less_bn": True},
                                              "less_bn": {"gc_flag": False, "fn_flag": False}}),
    "LessBN: + FN head": ("O1", {"boost": {**MANUAL, "less_bn": True}, "less_bn": {"gc_flag": False}}),
    "LessBN: + gc": ("O1", {"boost": {**MANUAL, "less_bn": True}, "less_bn": {"fn_flag": False}}),
    "gradient freezing alone": ("O1", {"boost": {**MANUAL, "grad_freeze": True}, "grad_freeze": PER_SET}),
    "gradient freezing alone, one masked graph": ("O1", {"boost": {**MANUAL, "grad_freeze": True},
                                                         "grad_freeze": {"graph_variants": False}}),
    "O1, one masked freezing graph": ("O1", {"grad_freeze": {"graph_variants": False}}),
    "cpu_gemm_conv alone": ("O1", {"boost": {**MANUAL, "cpu_gemm_conv": True}}),
    # gradient centralization's previous form (kept here for the comparison; ms_boost's is the 2-D one)
    "O1, gc as a 4-D mean (previous)": ("O1", {"grad_freeze": PER_SET}, "4-D mean"),
    "LessBN: + gc as a 4-D mean (previous)": ("O1", {"boost": {**MANUAL, "less_bn": True},
                                                     "less_bn": {"fn_flag": False}}, "4-D mean"),
}

_gc_4d_mean = C.MultitypeFuncGraph("bench_gc_4d_mean")


@_gc_4d_mean.register("Bool", "Tensor")
def _gc_4d_mean_one(flag, grad):
    """The previous form: one ReduceMean over axes 1..r-1 of the gradient as it is, then a broadcast Sub."""
    if flag and len(grad.shape) >= 2:
        return grad - grad.mean(axis=tuple(range(1, len(grad.shape))), keep_dims=True)
    return grad


GC_FORMS = {"4-D mean": _gc_4d_mean}
#: (contender with ms_boost's gradient centralization, the same with the previous form)
GC_FORM_PAIRS = [("O1", "O1, gc as a 4-D mean (previous)"), ("LessBN: + gc", "LessBN: + gc as a 4-D mean (previous)")]


@contextlib.contextmanager
def gc_form(form):
    """Gradient centralization computed by ``GC_FORMS[form]`` (None: ms_boost's) for the graphs compiled inside."""
    if form is None:
        yield
        return
    saved = grad_process._centralize_where_flagged
    grad_process._centralize_where_flagged = GC_FORMS[form]
    try:
        yield
    finally:
        grad_process._centralize_where_flagged = saved


def build(level, cfg, x, y, args):
    from model_zoo.resnet.src.resnet import create_model

    ms.set_seed(0)
    net = create_model("resnet10", class_num=10, base_width=args.width, conv_impl="gemm")
    opt = nn.Momentum(net.trainable_params(), 0.05, 0.9)
    kwargs = {"boost_level": level}
    if cfg:
        kwargs["boost_config_dict"] = cfg
    model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), opt, **kwargs)
    data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(args.batch, drop_remainder=True)
    return model, data


def epoch_seconds(model, data, epochs: int = 1, form=None) -> tuple:
    """Wall and process CPU seconds of ``epochs`` epochs (gradient centralization in ``form``, see :func:`gc_form`)."""
    with gc_form(form):
        start, cpu = time.perf_counter(), time.process_time()
        model.train(epochs, data, dataset_sink_mode=False)
        return time.perf_counter() - start, time.process_time() - cpu


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=13)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup_steps", type=int, default=100,
                        help="steps before the timed repeats (whole epochs): every graph a contender compiles (the "
                             "default freezing schedule reaches its 10 train sets by step 87) is compiled in them")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--image_size", type=int, default=16)
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    parser.add_argument("--only", nargs="+", default=None, metavar="NAME",
                        help="run only these contenders (O0 always runs: the ratios pair with it)")
    parser.add_argument("--page", default=None,
                        help="the result page's name (default o1_parts, or o1_parts_pynative in PyNative mode)")
    parser.add_argument("--notes", default="", help="a markdown file of notes on the run, put before the footer")
    args = parser.parse_args(argv)
    ms.set_context(mode=ms.GRAPH_MODE if args.mode == "graph" else ms.PYNATIVE_MODE)
    chosen = {name: spec for name, spec in CONTENDERS.items() if args.only is None or name in args.only or
              name == "O0"}
    unknown = sorted(set(args.only or ()) - set(CONTENDERS))
    if unknown:
        parser.error(f"--only: unknown contenders {unknown}; known: {list(CONTENDERS)}")
    load_before = load_average()
    x, y = random_batches(args.steps, args.batch, size=args.image_size)
    built, warm = {}, {}
    warm_epochs = max(1, -(-args.warmup_steps // args.steps))
    for name, (level, cfg, *form) in chosen.items():
        model, data = build(level, cfg, x, y, args)
        form = form[0] if form else None
        warm[name] = epoch_seconds(model, data, warm_epochs, form)
        built[name] = (model, data, form)
        print(f"[o1_parts] {name}: warm-up {warm[name][0]:.1f} s (CPU {warm[name][1]:.1f} s)", flush=True)
    times = {name: [] for name in built}
    cpu = {name: [] for name in built}
    names = list(built)
    for r in range(args.repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            model, data, form = built[name]
            wall, used = epoch_seconds(model, data, 1, form)
            times[name].append(wall / args.steps)
            cpu[name].append(used / args.steps)
        print(f"[o1_parts] repeat {r + 1}/{args.repeats}", flush=True)
    warm_steps = warm_epochs * args.steps
    rows = {name: {"warmup_s": warm[name][0], "warmup_cpu_s": warm[name][1],
                   "step_ms": 1e3 * float(np.median(t)), "step_cpu_ms": 1e3 * float(np.median(cpu[name])),
                   # the warm-up's CPU time beyond its steps at the steady step's CPU time: compiles, first runs
                   "compile_cpu_s": warm[name][1] - warm_steps * float(np.median(cpu[name])),
                   "ratio_to_o0": paired_ratio(times, name, "O0"), "cpu_ratio_to_o0": paired_ratio(cpu, name, "O0")}
            for name, t in times.items()}
    mode_name = "Graph" if args.mode == "graph" else "PyNative"
    page = args.page or ("o1_parts" + ("" if args.mode == "graph" else "_pynative"))
    lines = [f"# Where an O1 step's time goes (zoo GEMM ResNet-10, {mode_name} mode, CPU)", "",
             f"Written by `bench/bench_o1_parts.py`: ResNet-10 width {args.width} on the GEMM convolutions, "
             f"{args.image_size} px, batch {args.batch}, Momentum; {args.steps} steps an epoch, {args.repeats} "
             f"repeats after a warm-up of {warm_steps} steps (every compile included) per contender, the order "
             "rotating each repeat; all in one process. Ratios pair each repeat's epoch with O0's. *Compile, CPU* is "
             "the warm-up's CPU time minus its steps at the contender's median step CPU time.", "",
             "| contender | warm-up, wall (s) | warm-up, CPU (s) | compile, CPU (s) | median step, wall (ms) | "
             "step / O0 step, wall (median [IQR]) | step / O0 step, CPU (median [IQR]) |",
             "|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        q, c = r["ratio_to_o0"], r["cpu_ratio_to_o0"]
        lines.append(f"| {name} | {r['warmup_s']:.1f} | {r['warmup_cpu_s']:.1f} | {r['compile_cpu_s']:.1f} | "
                     f"{r['step_ms']:.1f} | "
                     f"{q['median']:.2f} [{q['quartiles'][0]:.2f}, {q['quartiles'][1]:.2f}] | "
                     f"{c['median']:.2f} [{c['quartiles'][0]:.2f}, {c['quartiles'][1]:.2f}] |")
    form_pairs = [(new, old) for new, old in GC_FORM_PAIRS if new in rows and old in rows]
    if form_pairs:
        lines += ["", "Gradient centralization's forms side by side (paired per repeat, in this run):", "",
                  "| contender | step / same contender with gc as a 4-D mean, CPU (median [IQR]) | wall |",
                  "|---|---|---|"]
        for new, old in form_pairs:
            c, q = paired_ratio(cpu, new, old), paired_ratio(times, new, old)
            rows[new]["cpu_ratio_to_previous_gc"] = c
            lines.append(f"| {new} | {c['median']:.2f} [{c['quartiles'][0]:.2f}, {c['quartiles'][1]:.2f}] | "
                         f"{q['median']:.2f} [{q['quartiles'][0]:.2f}, {q['quartiles'][1]:.2f}] |")
    if args.notes:
        lines += ["", Path(args.notes).read_text().strip()]
    command = shlex.join(["python", "bench/bench_o1_parts.py"] + list(argv if argv is not None else sys.argv[1:]))
    lines += page_footer(command, load_before)
    write_results(page, {"args": vars(args), "rows": rows, "times": times, "cpu_times": cpu},
                  "\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

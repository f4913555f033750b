"""Fault sweep (not a benchmark): does every gradient-freezing variant of an O1 run compile and train?

Issue 30 reported once, in Graph mode, ``TypeError: The parameters number of the function is 0, but the number of
provided arguments is 1.`` from an O1 run of a small BatchNorm conv net (four conv-BN-ReLU blocks, global average
pool, dense head) on the real digits, trained first with ``mindspore.train.Model`` and then with
``ms_boost.Model(..., boost_level="O1", boost_config_dict={"grad_freeze": {"total_steps": <steps>}})``, Momentum
with a cosine learning-rate list and weight decay 1e-4, six epochs, seeds 0 then 1 in one process, evaluating after
every epoch.

This script replays that run over a grid (modes x seeds x epochs x param_groups x freeze_type, and how each
epoch is evaluated), every ``Model`` of a mode built in ONE process (as the report: plain and O1 models, several
seeds, one after another), and records for each O1 run which frozen groups the schedule reached and whether it
trained. Exit status 1 when a run failed; the first line of each failure is printed.

Swept (2026-11-26, MindSpore 2.10, 2 shared cores at load 15-20), 34 runs, none failed: Graph and PyNative,
seeds 0 then 1, 6 epochs of 1280 images, plain + O1, evaluation between epochs (8 runs); Graph, 256 images,
6 and 3 epochs, evaluation from a callback inside ``train`` (8); Graph, a fresh evaluation ``ms_boost.Model``
each epoch (4); Graph O1 only, ``param_groups`` 2 and 5 x ``freeze_type`` 0 and 1 x seeds (7); Graph with
MindSpore's compile cache on, three processes in different orders (7). The 120-step schedules reached all
10 groups, the 24-step ones groups 0-2, 4, 6 and 7.

The cause was found apart from the sweep: MindSpore compiles a graph from the source file as it is when the
graph is compiled, at the line numbers of the code loaded at import; a file edited during the long run (a merge
into the checkout) made a later compile parse other lines. Four lines inserted above a network class reproduce
the exact error; ``ms_boost.source_pin`` keeps the loaded text (tests/test_source_pin.py).

    python bench/sweep_freeze_variants.py                       # the default grid (~15 min on 2 busy cores)
    python bench/sweep_freeze_variants.py --modes graph --seeds 0 1 --epochs 6 --param_groups 10
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mindspore as ms  # noqa: E402
from mindspore import nn  # noqa: E402

BATCH = 64


def digits(train_count: int = 1280, seed: int = 0):
    """Real digits (scikit-learn's bundled copy): ``(x_train, y_train, x_val, y_val)``, images 1x8x8 in [0, 1]."""
    from model_zoo.resnet.src.real_data import load_digits_arrays

    images, labels = load_digits_arrays()
    x = (images.astype(np.float32) / 16.0)[:, None]
    y = labels.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(y))
    x, y = x[order], y[order]
    return x[:train_count], y[:train_count], x[1280:], y[1280:]


class Block(nn.Cell):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, pad_mode="same", has_bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()

    def construct(self, x):
        return self.relu(self.bn(self.conv(x)))


class SmallBNNet(nn.Cell):
    """Four conv-BN-ReLU blocks, global average pool, dense head (the report's network)."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.SequentialCell([Block(1, 8), Block(8, 16), Block(16, 16), Block(16, 32)])
        self.mean = ms.ops.ReduceMean(keep_dims=False)
        self.head = nn.Dense(32, 10)

    def construct(self, x):
        return self.head(self.mean(self.blocks(x), (2, 3)))


def cosine_lr(base: float, total: int) -> list:
    return [float(base * 0.5 * (1 + np.cos(np.pi * t / total))) for t in range(total)]


class _EvalEachEpoch(ms.train.Callback):
    """Evaluate inside ``Model.train`` at the end of every epoch (as a user's evaluation callback)."""

    def __init__(self, model, data, accs: list):
        super().__init__()
        self.model, self.data, self.accs = model, data, accs

    def on_train_epoch_end(self, run_context):
        self.accs.append(float(self.model.eval(self.data, dataset_sink_mode=False)["acc"]))


EVALS = ("model", "callback", "fresh_ms", "fresh_boost", "direct")


def direct_accuracy(net: nn.Cell, xv: np.ndarray, yv: np.ndarray) -> float:
    """Accuracy of ``net`` called directly (a compiled ``construct`` in Graph mode), batch by batch."""
    net.set_train(False)
    hits = sum(int((net(ms.Tensor(xv[i:i + BATCH])).asnumpy().argmax(1) == yv[i:i + BATCH]).sum())
               for i in range(0, len(yv), BATCH))
    net.set_train(True)
    return hits / len(yv)


def one_run(kind: str, seed: int, epochs: int, param_groups: int, freeze_type: int, data,
            evaluate: str = "model", net: nn.Cell = None) -> dict:
    """Train one model (``kind`` "plain" or "o1") for ``epochs`` epochs, evaluating after each: ``evaluate``
    "model" (the training Model's ``eval`` between ``train`` calls of one epoch), "callback" (the same from a
    callback inside one ``train``), "fresh_ms" / "fresh_boost" (a new evaluation-only ``mindspore.train.Model`` /
    ``ms_boost.Model(..., boost_level=<the run's>)`` on the trained network each epoch), "direct" (the network
    called on the evaluation images). ``net``: train this network (e.g. the previous run's) instead of a new one;
    the network trained is returned under "net"."""
    import ms_boost

    ms.set_seed(seed)
    np.random.seed(seed)
    x, y, xv, yv = data
    train = ms.dataset.NumpySlicesDataset({"x": x, "y": y}, shuffle=True).batch(BATCH, drop_remainder=True)
    val = ms.dataset.NumpySlicesDataset({"x": xv, "y": yv}, shuffle=False).batch(BATCH)
    steps = train.get_dataset_size() * epochs
    net = SmallBNNet() if net is None else net
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = nn.Momentum(net.trainable_params(), cosine_lr(0.1, steps), 0.9, weight_decay=1e-4)
    out = {"kind": kind, "seed": seed, "epochs": epochs, "param_groups": param_groups, "freeze_type": freeze_type,
           "eval": evaluate}
    if kind == "plain":
        model = ms.train.Model(net, loss, opt, metrics={"acc"})
    else:
        cfg = {"grad_freeze": {"total_steps": steps, "param_groups": param_groups, "freeze_type": freeze_type}}
        model = ms_boost.Model(net, loss, opt, metrics={"acc"}, boost_level="O1", boost_config_dict=cfg)
        fopt = model._optimizer
        sched = fopt.schedule.values(0, steps) if hasattr(fopt, "schedule") else np.zeros(steps, np.int32)
        out["groups_reached"] = sorted({int(v) for v in sched})
    accs = []
    if evaluate == "callback":
        model.train(epochs, train, callbacks=[_EvalEachEpoch(model, val, accs)], dataset_sink_mode=False)
    for _ in range(0 if evaluate == "callback" else epochs):
        model.train(1, train, dataset_sink_mode=False)
        evaluator = model
        if evaluate == "fresh_ms":
            evaluator = ms.train.Model(net, loss, metrics={"acc"})
        elif evaluate == "fresh_boost":
            evaluator = ms_boost.Model(net, loss, metrics={"acc"}, boost_level="O1" if kind == "o1" else "O0")
        if evaluate == "direct":
            accs.append(direct_accuracy(net, xv, yv))
        else:
            accs.append(float(evaluator.eval(val, dataset_sink_mode=False)["acc"]))
    out["acc"], out["net"] = accs, net
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", nargs="+", default=["graph", "pynative"], choices=["graph", "pynative"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--epochs", nargs="+", type=int, default=[6])
    parser.add_argument("--param_groups", nargs="+", type=int, default=[10])
    parser.add_argument("--freeze_types", nargs="+", type=int, default=[1])
    parser.add_argument("--no_plain", action="store_true", help="skip the plain mindspore Model before each O1 run")
    parser.add_argument("--eval", default="model", choices=EVALS, help="how each epoch is evaluated (one_run)")
    parser.add_argument("--train_count", type=int, default=1280, help="training images (batch 64)")
    parser.add_argument("--repeat", type=int, default=1, help="the whole grid this many times in one process")
    parser.add_argument("--same_net", action="store_true",
                        help="the O1 run goes on training the plain run's network (else a new one)")
    parser.add_argument("--json", default=None, help="write every run's record here")
    args = parser.parse_args(argv)
    # one process per mode: set_context(mode) once, as a user script does
    if len(args.modes) > 1:
        import subprocess

        rc = 0
        for mode in args.modes:
            cmd = [sys.executable, __file__, "--modes", mode, "--seeds", *map(str, args.seeds), "--epochs",
                   *map(str, args.epochs), "--param_groups", *map(str, args.param_groups), "--freeze_types",
                   *map(str, args.freeze_types), "--train_count", str(args.train_count), "--repeat",
                   str(args.repeat)] + (["--no_plain"] if args.no_plain else []) + \
                (["--same_net"] if args.same_net else []) + \
                ["--eval", args.eval]
            if args.json:
                cmd += ["--json", f"{args.json}.{mode}"]
            rc |= subprocess.call(cmd)
        return rc
    mode = args.modes[0]
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    data = digits(args.train_count)
    records, failures = [], 0
    grid = [epochs for _ in range(args.repeat) for epochs in args.epochs]
    for epochs in grid:
        for groups in args.param_groups:
            for freeze_type in args.freeze_types:
                for seed in args.seeds:
                    trained = None
                    for kind in ([] if args.no_plain else ["plain"]) + ["o1"]:
                        start = time.perf_counter()
                        try:
                            rec = one_run(kind, seed, epochs, groups, freeze_type, data, args.eval,
                                          trained if args.same_net else None)
                            trained = rec.pop("net")
                            rec["ok"] = True
                        except Exception as exc:  # noqa: BLE001 - a sweep records every failure
                            failures += 1
                            rec = {"kind": kind, "seed": seed, "epochs": epochs, "param_groups": groups,
                                   "freeze_type": freeze_type, "eval": args.eval, "ok": False,
                                   "error": f"{type(exc).__name__}: {exc}".splitlines()[0],
                                   "traceback": traceback.format_exc()}
                        rec["mode"], rec["seconds"] = mode, round(time.perf_counter() - start, 1)
                        records.append(rec)
                        print(json.dumps({k: v for k, v in rec.items() if k != "traceback"}), flush=True)
                        if not rec["ok"]:
                            print(rec["traceback"], file=sys.stderr, flush=True)
    print(f"{mode}: {len(records)} runs, {failures} failed", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""AdaSum vs mean all-reduce: step time at 2 and 4 CPU workers, convergence at a large global batch.

Every measurement is a real ``msrun`` job (one process per rank, MCCL on CPU, one kernel thread per
rank):

* **step time** -- two small conv nets: ``BenchConvNet`` of ``bench/common.py`` (residual block,
  BatchNorm, 3x32x32) and :class:`TinyConvNet` (two strided conv-BN-ReLU, 3x16x16, where the step is
  so cheap that the combine stage weighs most). Each is built with ``ms_boost.build_train_network``
  as ``boost_level="O0"`` (data-parallel mean all-reduce) and with the AdaSum-only boost
  (``{"boost": {"mode": "manual", "adasum": True, ...}, "common": {"device_number": 1}}``); a step is
  forward, backward, combine, Momentum. The contenders alternate in short rounds in the same job
  (``--steps`` steps each, ten times more for TinyConvNet; the order flips every round), so that the
  load of a shared machine hits both alike; the ratio reported is the median over ``--rounds`` rounds
  of the per-round ratio AdaSum / mean. Graph and PyNative mode. The combine stage alone (fused mean
  all-reduce vs AdaSum of the same tensors) is timed the same way.
* **convergence** -- :class:`TinyConvNet` on the built-in generated data set
  (``model_zoo.resnet.src.synthetic_data``, 16x16), the same global batch and learning rate for both
  (plus mean all-reduce with the learning rate scaled linearly by the number of workers, the usual
  large-batch recipe, for reference); training loss (mean over ranks and steps) and validation
  accuracy (rank 0's network) per epoch.

Usage: python bench/bench_adasum.py [--workers 2,4] [--modes graph,pynative] [--rounds 15] [--steps 1]
           [--batch 8] [--conv_workers 4] [--global_batch 256] [--epochs 12] [--lr 0.05]
           [--train_per_class 200] [--skip_convergence]
``--workers ''`` skips the step-time jobs; a skipped section keeps its previous numbers.
Writes bench/results/adasum.{md,json}.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402
from mindspore import Tensor, nn  # noqa: E402

from bench.common import RESULTS, BenchConvNet, environment, random_batches, write_results  # noqa: E402
from ms_boost import build_train_network, comm  # noqa: E402
from ms_boost.adasum import AdaSumReduce  # noqa: E402
from tests.helpers.msrun import run_msrun, save_result  # noqa: E402

ADASUM_BOOST = {"boost": {"mode": "manual", "less_bn": False, "grad_freeze": False, "adasum": True,
                          "grad_accumulation": False, "dim_reduce": False}, "common": {"device_number": 1}}
MODES = {"graph": ms.GRAPH_MODE, "pynative": ms.PYNATIVE_MODE}


class TinyConvNet(nn.Cell):
    """Two strided conv-BN-ReLU blocks and a dense head for 3x16x16 inputs (about 10k weights)."""

    def __init__(self, num_classes: int = 10, width: int = 16):
        super().__init__()
        self.features = nn.SequentialCell([
            nn.Conv2d(3, width, 3, stride=2, pad_mode="same", has_bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, stride=2, pad_mode="same", has_bias=False), nn.BatchNorm2d(2 * width),
            nn.ReLU()])
        self.flatten = nn.Flatten()
        self.head = nn.Dense(2 * width * 4 * 4, num_classes)

    def construct(self, x):
        return self.head(self.flatten(self.features(x)))


#: name -> (net class, image side, steps per timed round as a multiple of --steps: a cheap net runs more)
NETS = {"BenchConvNet 32x32": (BenchConvNet, 32, 1), "TinyConvNet 16x16": (TinyConvNet, 16, 10)}


def train_cell(kind: str, lr: float, net_name: str):
    """``(net, train cell)``: ``kind`` is ``"mean"`` (boost O0) or ``"adasum"``; same initial weights."""
    ms.set_seed(0)
    net = NETS[net_name][0]()
    opt = nn.Momentum(net.trainable_params(), lr, 0.9)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    if kind == "adasum":
        cell = build_train_network(net, opt, loss, level="O0", boost_level="O0", boost_config_dict=ADASUM_BOOST)
    else:
        cell = build_train_network(net, opt, loss, level="O0", boost_level="O0")
    return net, cell.set_train()


def timed(fn, steps: int) -> tuple:
    """``(wall, cpu)`` seconds per call of ``fn`` (returns a Tensor; synchronised through ``asnumpy``).

    ``cpu`` is this process's CPU time (all its threads): the work a step costs, whatever else the
    shared machine runs, but blind to time spent waiting for other ranks.
    """
    wall, cpu = time.perf_counter(), time.process_time()
    out = None
    for _ in range(steps):
        out = fn()
    out.asnumpy()
    return (time.perf_counter() - wall) / steps, (time.process_time() - cpu) / steps


def worker_steptime(args) -> None:
    """One rank of the step-time job: per net and mode, both train cells and both combine stages."""
    results = {}
    for mode_name in args.modes.split(","):
        ms.set_context(mode=MODES[mode_name])
        for net_name, (net_cls, size, multiple) in NETS.items():
            x, y = random_batches(1, args.batch, size=size, seed=comm.get_rank())
            x, y = Tensor(x), Tensor(y)
            cells = {kind: train_cell(kind, 0.01, net_name)[1] for kind in ("mean", "adasum")}
            params = net_cls().trainable_params()
            rng = np.random.default_rng(comm.get_rank())
            grads = tuple(Tensor(rng.normal(size=p.shape).astype(np.float32)) for p in params)
            combiners = {"mean": comm.GradReducer(params, True),
                         "adasum": AdaSumReduce([p.shape for p in params], 1)}
            work = {f"step/{k}": (lambda c=c, a=x, b=y: c(a, b)) for k, c in cells.items()}
            work.update({f"combine/{k}": (lambda c=c, g=grads: c(g)[0]) for k, c in combiners.items()})
            for fn in work.values():  # warm-up: compilation and first allocations
                timed(fn, 2)
            times = {name: [] for name in work}
            for r in range(args.rounds):
                names = list(work) if r % 2 == 0 else list(reversed(work))  # interleaved, alternating order
                for name in names:
                    comm.barrier()  # every rank starts the item together: no rank's lag is billed to the next
                    times[name].append(timed(work[name], args.steps * multiple))
            key = f"{mode_name}/{net_name}"
            results.update({f"{key}/{name}": np.array([t[0] for t in ts]) for name, ts in times.items()})
            results.update({f"{key}/cpu/{name}": np.array([t[1] for t in ts]) for name, ts in times.items()})
            results[f"{key}/num_params"] = np.array(sum(int(np.prod(p.shape)) for p in params))
    save_result(**results)


def accuracy(net, val) -> float:
    net.set_train(False)
    correct = total = 0
    for x, y in val.create_tuple_iterator(num_epochs=1):
        pred = net(x).asnumpy().argmax(1)
        correct += int((pred == y.asnumpy()).sum())
        total += int(y.shape[0])
    net.set_train(True)
    return correct / max(total, 1)


def worker_convergence(args) -> None:
    """One rank of the convergence job: each contender from the same weights and data order."""
    from model_zoo.resnet.src.dataset import create_dataset

    ms.set_context(mode=ms.GRAPH_MODE)
    world, rank = comm.get_size(), comm.get_rank()
    per_rank = args.global_batch // world
    root = Path(args.data)
    val = create_dataset(root / "val", do_train=False, batch_size=50, image_size=16)
    results = {}
    contenders = {"mean": ("mean", args.lr), "adasum": ("adasum", args.lr),
                  f"mean_lr_x{world}": ("mean", args.lr * world)}
    for name, (kind, lr) in contenders.items():
        data = create_dataset(root / "train", do_train=True, batch_size=per_rank, image_size=16, rank_size=world,
                              rank_id=rank, crop_scale=(0.5, 1.0), seed=1234)
        steps = data.get_dataset_size()
        it = data.create_tuple_iterator(num_epochs=args.epochs)
        net, cell = train_cell(kind, lr, "TinyConvNet 16x16")
        losses, accs, seconds = [], [], []
        for _ in range(args.epochs):
            start = time.perf_counter()
            epoch_loss = [float(cell(x, y).asnumpy()) for x, y in it]  # one epoch of the iterator
            seconds.append(time.perf_counter() - start)
            losses.append(float(np.mean(epoch_loss)))
            accs.append(accuracy(net, val))
        results.update({f"{name}/loss": np.array(losses), f"{name}/acc": np.array(accs),
                        f"{name}/epoch_s": np.array(seconds), f"{name}/steps_per_epoch": np.array(steps)})
    save_result(**results)


def worker(args) -> None:
    from mindspore.communication import init

    ms.set_device("CPU")
    ms.device_context.cpu.op_tuning.threads_num(args.threads)
    init()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    {"steptime": worker_steptime, "convergence": worker_convergence}[args.role](args)


def forward(args, names) -> list:
    """Command-line flags of ``args`` named in ``names`` (handed to the msrun workers)."""
    return [f"--{n}={getattr(args, n)}" for n in names]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="2,4", help="worker counts of the step-time jobs")
    parser.add_argument("--modes", default="graph,pynative")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--batch", type=int, default=8, help="per-rank batch of the step-time jobs")
    parser.add_argument("--conv_workers", type=int, default=4)
    parser.add_argument("--global_batch", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--train_per_class", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1, help="CPU kernel threads per rank")
    parser.add_argument("--skip_convergence", action="store_true")
    parser.add_argument("--role", default="", help=argparse.SUPPRESS)
    parser.add_argument("--data", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role:
        worker(args)
        return

    previous = RESULTS / "adasum.json"
    payload = json.loads(previous.read_text()) if previous.exists() else {}
    payload["env"] = environment()
    if args.workers:
        payload["steptime"] = run_steptime(args)
    if not args.skip_convergence:
        payload["convergence"] = run_convergence(args)
    markdown = render(payload)
    write_results("adasum", payload, markdown)
    print(markdown)


def run_steptime(args) -> dict:
    """Step-time jobs, one per worker count; per (workers, mode, net) the medians and the paired ratios."""
    flags = ["modes", "rounds", "steps", "batch", "threads"]
    kinds = ("step/mean", "step/adasum", "combine/mean", "combine/adasum")
    rows = {}
    for workers in [int(w) for w in args.workers.split(",") if w]:
        res = run_msrun(Path(__file__), workers=workers, args=["--role=steptime", *forward(args, flags)],
                        timeout=3600)[0]
        for net_name in NETS:
            for mode_name in args.modes.split(","):
                key = f"{mode_name}/{net_name}"
                rows[f"{workers}/{key}"] = {
                    "workers": workers, "mode": mode_name, "net": net_name,
                    "num_params": int(res[f"{key}/num_params"]),
                    "median_ms": {k: 1e3 * statistics.median(res[f"{key}/{k}"].tolist()) for k in kinds},
                    "ratio": statistics.median((res[f"{key}/step/adasum"] / res[f"{key}/step/mean"]).tolist()),
                    "cpu_ratio": statistics.median(
                        (res[f"{key}/cpu/step/adasum"] / res[f"{key}/cpu/step/mean"]).tolist()),
                    "times_s": {k: res[f"{key}/{k}"].tolist() for k in kinds},
                    "cpu_times_s": {k: res[f"{key}/cpu/{k}"].tolist() for k in kinds}}
                print(rows[f"{workers}/{key}"]["median_ms"], rows[f"{workers}/{key}"]["ratio"], flush=True)
    return {"args": {k: getattr(args, k) for k in ["workers", *flags]}, "rows": rows}


def run_convergence(args) -> dict:
    """The convergence job; per contender the loss (mean over ranks) and rank 0's accuracy per epoch."""
    from model_zoo.resnet.src.synthetic_data import ensure_dataset

    data = ensure_dataset(num_classes=10, image_size=16, train_per_class=args.train_per_class,
                          val_per_class=20, seed=0)
    flags = ["global_batch", "epochs", "lr", "threads"]
    ranks = run_msrun(Path(__file__), workers=args.conv_workers,
                      args=["--role=convergence", f"--data={data}", *forward(args, flags)], timeout=3600)
    names = sorted({k.split("/")[0] for k in ranks[0]}, key=lambda n: ("adasum" in n, n))
    table = {}
    for name in names:
        table[name] = {"loss": np.mean([r[f"{name}/loss"] for r in ranks], axis=0).tolist(),
                       "acc": ranks[0][f"{name}/acc"].tolist(),
                       "epoch_s": np.median([r[f"{name}/epoch_s"] for r in ranks], axis=0).tolist(),
                       "steps_per_epoch": int(ranks[0][f"{name}/steps_per_epoch"])}
    return {"args": {k: getattr(args, k) for k in ["conv_workers", "train_per_class", *flags]}, "table": table}


def render(payload: dict) -> str:
    """The markdown report of ``payload`` (whatever sections it holds)."""
    lines = ["# AdaSum vs mean all-reduce", "",
             "Written by `bench/bench_adasum.py` (`python bench/bench_adasum.py`; `--workers ''` or "
             "`--skip_convergence` rerun one section and keep the other). CPU only: 2 cores shared with other "
             "jobs, so absolute times are indicative and wall times are noisy; the contenders run side by side "
             f"in the same `msrun` job. MindSpore {ms.__version__}, one kernel thread per rank.", ""]
    step = payload.get("steptime")
    if step:
        a = step["args"]
        lines += ["## Step time", "",
                  f"Per-rank batch {a['batch']}, Momentum; *mean* = `boost_level=\"O0\"` under DATA_PARALLEL "
                  "(fused mean all-reduce), *AdaSum* = the AdaSum-only boost with `common.device_number: 1` "
                  f"(AdaSum across every rank). {a['rounds']} rounds; in each, every contender runs {a['steps']} "
                  f"step(s) ({10 * a['steps']} for TinyConvNet) after a barrier, the order flipping every round. "
                  "Step times: "
                  "medians over rounds (ms). **Wall ratio**: median over rounds of the round's AdaSum / mean wall "
                  "time (pairing cancels most of the load drift). **CPU ratio**: the same with the process's CPU "
                  "time (the work a step costs, independent of the other jobs on the machine, blind to waiting for "
                  "other ranks). *combine*: the combine stage alone on the net's gradient tuple (fused mean "
                  "all-reduce vs fused AllGather + AdaSum tree), ms.", "",
                  "| net (weights) | workers | mode | mean step | AdaSum step | **wall ratio** | **CPU ratio** | "
                  "combine: mean | combine: AdaSum |", "|---|---|---|---|---|---|---|---|---|"]
        for row in step["rows"].values():
            m = row["median_ms"]
            lines.append(f"| {row['net']} ({row['num_params']:,}) | {row['workers']} | {row['mode']} | "
                         f"{m['step/mean']:.1f} | {m['step/adasum']:.1f} | **{row['ratio']:.3f}** | "
                         f"**{row['cpu_ratio']:.3f}** | {m['combine/mean']:.2f} | {m['combine/adasum']:.2f} |")
        lines.append("")
    conv = payload.get("convergence")
    if conv:
        a, table = conv["args"], conv["table"]
        names = list(table)
        steps = table[names[0]]["steps_per_epoch"]
        lines += ["## Convergence at a large global batch", "",
                  f"TinyConvNet on the built-in generated data set (10 classes, 16x16, {10 * a['train_per_class']} "
                  f"train / 200 val images), {a['conv_workers']} workers x {a['global_batch'] // a['conv_workers']} "
                  f"= global batch {a['global_batch']} ({steps} steps per epoch), Momentum 0.9, learning rate "
                  f"{a['lr']} (and {a['lr'] * a['conv_workers']} for the linearly scaled mean), Graph mode, same "
                  "initial weights and data order. Loss: training loss averaged over ranks and the epoch's steps; "
                  "acc: validation accuracy of rank 0's network after the epoch.", "",
                  "| epoch | " + " | ".join(f"{n} loss | {n} acc" for n in names) + " |",
                  "|---|" + "---|---|" * len(names)]
        for e in range(a["epochs"]):
            lines.append(f"| {e + 1} | " + " | ".join(f"{table[n]['loss'][e]:.4f} | {table[n]['acc'][e]:.3f}"
                                                     for n in names) + " |")
        lines.append("")
    lines += [f"Environment: `{payload.get('env')}`", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()

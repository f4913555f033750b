"""Dimension-reduce training end to end on the built-in data set, and the DimReduce step time vs plain SGD.

The tutorial's two stages, scaled down to a CPU (ResNet-18 of base width 16 on the model zoo's generated
10-class 32 px images):

1. stage 1: Momentum SGD with the zoo's linear schedule planned for ``E1 + E2`` epochs; trained ``E1``
   epochs, saving the network's weights ``saves_per_epoch`` times an epoch from epoch ``save_from`` on
   (>= k + 1 files, like the tutorial's ``checkpoint_pca`` callback);
2. a) stage 2 as the tutorial writes it: a fresh ``ms_boost.Model(net, ..., SGD(lr=1), boost_level="O1",
      boost_config_dict={... "dim_reduce": {... "n_component": 32, "weight_load_dir": ...}})`` from the
      stage-1 weights, ``E2`` epochs (the PCA is computed from the checkpoints on the way);
   b) plain: the stage-1 run simply continued for ``E2`` epochs (same schedule, same momentum state).

Validation accuracy of the stage-1 end, (a) and (b), the PCA time, and the median step time of (a) and (b)
(measured by a callback, first step of each run excluded) go to section ``--section`` (default "e2e") of
bench/results/dim_reduce.{json,md}.

Usage: python bench/bench_dim_reduce.py [--mode graph] [--epochs1 24] [--epochs2 2] [--save_from 7] [--seeds 0]
       python bench/bench_dim_reduce.py --step_only [--step_widths 16 32] [--step_repeats 30]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "bench" / "results"


def update_section(name: str, payload: dict, markdown: str) -> None:
    """Replace one section of bench/results/dim_reduce.{json,md}, keeping the other script's section."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    json_path = RESULTS / "dim_reduce.json"
    data = json.loads(json_path.read_text(encoding="utf-8")) if json_path.exists() else {}
    data[name] = {"data": payload, "markdown": markdown}
    try:
        from bench.common import environment

        data["environment"] = environment()
    except ImportError:
        pass
    parts = ["# DimReduce benchmarks", "",
             "Written by `bench/bench_pca.py` (section *Streaming PCA*) and `bench/bench_dim_reduce.py` "
             "(sections *End to end* and *Step time*). CPU only, 2 cores shared with other jobs: times are "
             "indicative.", ""]
    sections = sorted(k for k in data if k != "environment")
    sections = [k for k in sections if k == "pca"] + [k for k in sections if k != "pca"]
    parts += [data[s]["markdown"] + "\n" for s in sections]
    try:
        from bench.common import page_footer

        parts += page_footer("python bench/bench_pca.py; python bench/bench_dim_reduce.py [--quick]; "
                             "python bench/bench_dim_reduce.py --step_only [--mode pynative]")
    except ImportError:
        pass
    for png in sorted(RESULTS.glob("dim_reduce_*_accuracy.png")):  # written by bench/plots.py
        parts.append(f"![DimReduce vs SGD continuation ({png.stem})]({png.name})")
    parts.append("![PCA time and memory](pca_scaling.png)" if (RESULTS / "pca_scaling.png").exists() else "")
    for path, text in ((json_path, json.dumps(data, indent=2, sort_keys=True)),
                       (RESULTS / "dim_reduce.md", "\n".join(parts))):
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text + "\n", encoding="utf-8")
        os.replace(tmp, path)


def tutorial_boost_dict(n_component: int, pca_mat_path: str, weight_load_dir: str, carry_search: bool = False) -> dict:
    """Stage 2's ``boost_config_dict`` as the dimension-reduce tutorial writes it (rho 0.55, gamma 0.9, alpha 0.001,
    sigma 0.4), with ``dim_reduce.carry_search`` added when asked."""
    boost_dict = {"boost": {"mode": "manual", "dim_reduce": True}, "common": {"device_num": 8},
                  "dim_reduce": {"rho": 0.55, "gamma": 0.9, "alpha": 0.001, "sigma": 0.4, "n_component": n_component,
                                 "pca_mat_path": pca_mat_path, "weight_load_dir": weight_load_dir, "timeout": 1200}}
    if carry_search:
        boost_dict["dim_reduce"]["carry_search"] = True
    return boost_dict


def _section_runs(name: str) -> list:
    """The runs already in a section of the result file (kept when only some widths are re-measured)."""
    path = RESULTS / "dim_reduce.json"
    if not path.exists():
        return []
    return json.loads(path.read_text(encoding="utf-8")).get(name, {}).get("data", {}).get("runs", [])


def _build(args, seed):
    import mindspore as ms

    from model_zoo.resnet.src.resnet import init_weight, resnet18

    ms.set_seed(seed)
    net = resnet18(class_num=args.classes, base_width=args.width)
    return init_weight(net, seed=seed + 1)


def _step_timer():
    from mindspore.train import Callback

    class StepTimer(Callback):
        """Wall time of every step (the first one, which compiles, is kept apart)."""

        def __init__(self):
            super().__init__()
            self.times = []
            self.losses = []
            self._start = 0.0

        def on_train_step_begin(self, run_context):
            self._start = time.perf_counter()

        def on_train_step_end(self, run_context):
            self.times.append(time.perf_counter() - self._start)
            out = run_context.original_args().net_outputs
            out = out[0] if isinstance(out, (tuple, list)) else out
            self.losses.append(float(out.asnumpy()))

        def median(self):
            return statistics.median(self.times[1:]) if len(self.times) > 1 else float("nan")

    return StepTimer()


def _saver(folder: Path, net, steps_per_epoch: int, save_from: int, saves_per_epoch: int):
    import mindspore as ms
    from mindspore.train import Callback

    class HalfEpochSaver(Callback):
        """The tutorial's weight callback: the network's parameters ``saves_per_epoch`` times an epoch from
        epoch ``save_from`` on (the tutorial: twice an epoch)."""

        step = 0

        def on_train_step_end(self, run_context):
            self.step += 1
            step = self.step
            epoch = (step - 1) // steps_per_epoch + 1
            if epoch >= save_from and step % max(1, steps_per_epoch // saves_per_epoch) == 0:
                ms.save_checkpoint(net, str(folder / f"resnet-{epoch}_{step}.ckpt"))

    return HalfEpochSaver()


def _datasets(args, seed: int):
    """Factories of the built-in data set's training (shuffled with ``seed``) and validation pipelines."""
    from model_zoo.resnet.src.dataset import create_dataset
    from model_zoo.resnet.src.synthetic_data import ensure_dataset

    data = ensure_dataset(num_classes=args.classes, image_size=32, train_per_class=args.train_per_class,
                          val_per_class=args.val_per_class, seed=0)

    def train_set():
        return create_dataset(data / "train", do_train=True, batch_size=args.batch, image_size=32, seed=seed,
                              num_parallel_workers=2)

    def val_set():
        return create_dataset(data / "val", do_train=False, batch_size=args.batch, image_size=32,
                              num_parallel_workers=2, drop_remainder=False)

    return train_set, val_set


def _loss(args):
    """The zoo's training loss (label smoothing 0.1)."""
    from model_zoo.resnet.src.loss import CrossEntropySmooth

    return CrossEntropySmooth(sparse=True, reduction="mean", smooth_factor=0.1, num_classes=args.classes)


def _stage1_model(args, net, steps: int):
    """Stage 1's ``ms_boost.Model``: Momentum 0.9 with the zoo's linear schedule (peak ``lr_max``) planned for
    ``epochs1 + epochs2`` epochs of ``steps`` steps."""
    import mindspore as ms
    from mindspore import nn

    from model_zoo.resnet.src.lr_generator import get_lr
    from ms_boost import Model

    lr = get_lr(lr_init=0.0, lr_end=0.0, lr_max=args.lr_max, warmup_epochs=1, total_epochs=args.epochs1 + args.epochs2,
                steps_per_epoch=steps, lr_decay_mode="linear")
    opt = nn.Momentum(net.trainable_params(), ms.Tensor(lr), 0.9, weight_decay=1e-4)
    return Model(net, loss_fn=_loss(args), optimizer=opt, metrics={"acc"}, boost_level="O0")


def run_seed(args, seed: int, work: Path) -> dict:
    import mindspore as ms
    from mindspore import nn

    from ms_boost import Model

    train_set, val_set = _datasets(args, seed)
    steps = train_set().get_dataset_size()

    # ---- stage 1 (and its plain continuation) -------------------------------------------------------------
    net = _build(args, seed)
    model = _stage1_model(args, net, steps)
    ckpt_dir = work / f"seed{seed}" / "checkpoint_pca"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    saver = _saver(ckpt_dir, net, steps, args.save_from, args.saves_per_epoch)
    curve_stage1, eval_seconds = [], 0.0
    data1 = train_set()
    for _ in range(args.epochs1):  # one epoch at a time, validation accuracy after each (the curves)
        model.train(1, data1, callbacks=[saver], dataset_sink_mode=False)
        tick = time.perf_counter()
        curve_stage1.append(model.eval(val_set(), dataset_sink_mode=False)["acc"])
        eval_seconds += time.perf_counter() - tick
    stage1_seconds = time.perf_counter() - start - eval_seconds
    stage1_weights = work / f"seed{seed}" / "stage1_end.ckpt"
    ms.save_checkpoint(net, str(stage1_weights))
    acc_stage1 = curve_stage1[-1]
    num_ckpts = len(list(ckpt_dir.glob("*.ckpt")))
    print(f"seed {seed}: stage 1 {args.epochs1} epochs in {stage1_seconds:.0f} s, val acc {acc_stage1:.4f}, "
          f"{num_ckpts} weight checkpoints", flush=True)

    plain_timer = _step_timer()
    curve_plain = []
    for _ in range(args.epochs2):
        model.train(1, data1, callbacks=[plain_timer], dataset_sink_mode=False)
        curve_plain.append(model.eval(val_set(), dataset_sink_mode=False)["acc"])
    acc_plain = curve_plain[-1]
    print(f"seed {seed}: plain continued {args.epochs2} epochs, val acc {acc_plain:.4f}", flush=True)

    # ---- stage 2: the tutorial's call (and, with --carry_search, the same with dim_reduce.carry_search) ----------
    pca_mat_path = str(work / f"seed{seed}" / "pca_mat.npy")

    def stage2(carry: bool):
        net2 = _build(args, seed)
        ms.load_param_into_net(net2, ms.load_checkpoint(str(stage1_weights)))
        boost_dict = tutorial_boost_dict(args.k, pca_mat_path, str(ckpt_dir), carry)
        start = time.perf_counter()
        model2 = Model(net2, loss_fn=_loss(args), optimizer=nn.SGD(net2.trainable_params(), learning_rate=1),
                       metrics={"acc"}, boost_level="O1", boost_config_dict=boost_dict)
        timer = _step_timer()
        curve, eval_seconds = [], 0.0
        data2 = train_set()
        for _ in range(args.epochs2):
            model2.train(1, data2, callbacks=[timer], dataset_sink_mode=False)
            tick = time.perf_counter()
            curve.append(model2.eval(val_set(), dataset_sink_mode=False)["acc"])
            eval_seconds += time.perf_counter() - tick
        print(f"seed {seed}: DimReduce{' (carry_search)' if carry else ''} {args.epochs2} epochs, "
              f"val acc {curve[-1]:.4f}", flush=True)
        return net2, timer, curve, time.perf_counter() - start - eval_seconds

    net2, dim_timer, curve_dim, stage2_seconds = stage2(False)
    weights = sum(int(p.size) for p in net2.trainable_params())
    out = {"seed": seed, "weights": weights, "steps_per_epoch": steps, "checkpoints": num_ckpts,
           "acc_stage1": acc_stage1, "acc_plain": acc_plain, "acc_dim_reduce": curve_dim[-1],
           "stage1_seconds": stage1_seconds, "stage2_dim_reduce_seconds_incl_pca_and_compile": stage2_seconds,
           "step_seconds_plain": plain_timer.median(), "step_seconds_dim_reduce": dim_timer.median(),
           "loss_plain_last_epoch": statistics.mean(plain_timer.losses[-steps:]),
           "loss_dim_reduce_last_epoch": statistics.mean(dim_timer.losses[-steps:]),
           "curve_stage1": curve_stage1, "curve_plain": curve_plain, "curve_dim_reduce": curve_dim}
    if args.carry_search:
        _, carry_timer, curve_carry, _ = stage2(True)
        out.update({"acc_dim_reduce_carry": curve_carry[-1], "curve_dim_reduce_carry": curve_carry,
                    "step_seconds_dim_reduce_carry": carry_timer.median(),
                    "loss_dim_reduce_carry_last_epoch": statistics.mean(carry_timer.losses[-steps:])})
    return out


def render(section: dict) -> str:
    cfg = section["config"]
    lines = [f"## End to end ({section['config']['section']}): stage 1, then {cfg['epochs2']} epochs of DimReduce "
             f"vs {cfg['epochs2']} epochs of plain SGD", "",
             f"ResNet-18 (base width {cfg['width']}, {section['runs'][0]['weights']:,} weights), built-in data set "
             f"({cfg['classes']} classes, 32 px, {cfg['train_per_class']} train / {cfg['val_per_class']} val "
             f"images per class), batch {cfg['batch']}, {cfg['mode']} mode. Stage 1: Momentum 0.9, linear "
             f"schedule (peak {cfg['lr_max']}) planned for {cfg['epochs1'] + cfg['epochs2']} epochs, "
             f"{cfg['epochs1']} trained, weights saved {cfg['saves_per_epoch']} times an epoch from epoch "
             f"{cfg['save_from']}. Stage 2: "
             f"the tutorial's `boost_config_dict` (rho 0.55, gamma 0.9, alpha 0.001, sigma 0.4, "
             f"n_component {cfg['k']}) for {cfg['epochs2']} epochs, vs the stage-1 run continued "
             f"{cfg['epochs2']} epochs.", "",
             "| seed | ckpts | val acc stage 1 | + plain | + DimReduce | diff (points) | train loss plain "
             "| train loss DimReduce | step plain | step DimReduce |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in section["runs"]:
        # one row per stage-2 variant: the upstream line search, then carry_search when it was run
        for suffix, label in (("", ""), ("_carry", " (carry_search)")):
            if f"acc_dim_reduce{suffix}" not in r:
                continue
            acc, loss = r[f"acc_dim_reduce{suffix}"], r[f"loss_dim_reduce{suffix}_last_epoch"]
            lines.append(f"| {r['seed']}{label} | {r['checkpoints']} | {100 * r['acc_stage1']:.2f}% "
                         f"| {100 * r['acc_plain']:.2f}% | {100 * acc:.2f}% | {100 * (acc - r['acc_plain']):+.2f} "
                         f"| {r['loss_plain_last_epoch']:.4f} | {loss:.4f} | {1e3 * r['step_seconds_plain']:.0f} ms "
                         f"| {1e3 * r[f'step_seconds_dim_reduce{suffix}']:.0f} ms |")
    ratio = statistics.median(r["step_seconds_dim_reduce"] / r["step_seconds_plain"] for r in section["runs"])
    lines += ["", f"DimReduce step / plain step (median of the two runs' medians, not interleaved, so noisy under "
              f"load; see the step-time section for an interleaved measurement): {ratio:.2f}x. "
              "Tutorial headline for comparison (ImageNet, 8 Ascend): 74.31% after 70 + 2 epochs with "
              "DimReduce vs 70.18% after 80 plain epochs."]
    return "\n".join(lines)


def _trajectory(args, width: int, work: Path):
    """A short stage 1 for the step benchmark's ``--basis trajectory``: Momentum training of the width-``width``
    ResNet-18 on the built-in data set, saving the weights ``saves_per_epoch`` times an epoch from epoch
    ``save_from`` (the tutorial's stage 1, scaled down). Returns the stage-1 end checkpoint, the folder of
    trajectory checkpoints and a factory of the training data set."""
    import mindspore as ms

    train_set, _ = _datasets(args, 0)
    ckpt_dir = work / f"trajectory_w{width}"
    end = work / f"stage1_end_w{width}.ckpt"
    if end.exists():  # --workdir given and stage 1 already run there with these settings
        print(f"width {width}: stage 1 reused from {work}", flush=True)
        return end, ckpt_dir, train_set
    steps = train_set().get_dataset_size()
    net = _build(argparse.Namespace(**{**vars(args), "width": width}), 0)
    model = _stage1_model(args, net, steps)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    model.train(args.epochs1, train_set(), dataset_sink_mode=False,
                callbacks=[_saver(ckpt_dir, net, steps, args.save_from, args.saves_per_epoch)])
    ms.save_checkpoint(net, str(end))
    print(f"width {width}: stage 1 {args.epochs1} epochs ({steps} steps each) in {time.perf_counter() - start:.0f} s, "
          f"{len(list(ckpt_dir.glob('*.ckpt')))} trajectory checkpoints", flush=True)
    return end, ckpt_dir, train_set


def step_benchmark(args) -> dict:
    """Interleaved step times: plain SGD train step vs DimReduce train step.

    ``--basis random`` (default): a random orthonormal P of k rows, an untrained network and one random batch
    repeated. ``--basis trajectory``: what a user runs -- a short stage 1 (:func:`_trajectory`), P the PCA of
    its checkpoints (computed by the DimReduce cell from ``weight_load_dir``, as the tutorial does), every
    contender starting from the stage-1 weights, and each repeat a new batch of the training set (the same
    batch for every contender of that repeat).

    The train cells come from ``ms_boost.build_train_network`` on copies of the same network; each repeat
    times one plain step, one DimReduce step and one step of a second, identical plain cell (its ratio to
    the first is the noise floor), back to back, so machine load affects them alike. The line search's
    outcome of every DimReduce step is read from ``dim_reduce.step_size``: accepted at the first trial
    (one extra forward pass), at the second (two), or not at all (two).
    """
    import mindspore as ms
    import numpy as np
    from mindspore import Tensor, nn

    from bench.common import quartiles_of
    from ms_boost import build_train_network
    from ms_boost.dim_reduce import DimReduceUpdate
    from ms_boost.dim_reduce.pca import write_npy_atomic

    results = []
    trajectory = args.basis == "trajectory"
    for width in args.step_widths:
        nets = [_build(argparse.Namespace(**{**vars(args), "width": width}), 0) for _ in range(5)]
        size = sum(int(p.size) for p in nets[0].trainable_params())
        rng = np.random.default_rng(0)
        tmp = Path(tempfile.mkdtemp(prefix="bench_step_"))
        try:
            pca_path = str(tmp / "p.npy")
            boost_extra = {}
            if trajectory:
                end, ckpt_dir, train_set = _trajectory(args, width, Path(args.workdir) if args.workdir else tmp)
                for net in nets:
                    ms.load_param_into_net(net, ms.load_checkpoint(str(end)))
                boost_extra = {"weight_load_dir": str(ckpt_dir)}  # the first DimReduce cell computes P into pca_path
                loss = _loss(args)
            else:
                pca = np.linalg.qr(rng.standard_normal((size, args.k)).astype(np.float32))[0].T
                write_npy_atomic(pca_path, pca)
                del pca
                loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
            plain = build_train_network(nets[0], nn.SGD(nets[0].trainable_params(), 0.01), loss, level="O0")
            twin = build_train_network(nets[2], nn.SGD(nets[2].trainable_params(), 0.01), loss, level="O0")
            dims = {}
            for carry, net in ((False, nets[1]), (True, nets[3])):
                boost = {"boost": {"mode": "manual", "dim_reduce": True},
                         "dim_reduce": {"n_component": args.k, "pca_mat_path": pca_path, "carry_search": carry,
                                        **boost_extra}}
                dims[carry] = build_train_network(net, nn.SGD(net.trainable_params(), 1.0), loss, level="O0",
                                                  boost_level="O1", boost_config_dict=boost)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        forward = nn.WithLossCell(nets[4], loss)  # one forward pass in train mode: the price of a line-search trial
        cells = {"plain": plain, "dim": dims[False], "dim_carry": dims[True], "twin": twin, "forward": forward}
        for cell in cells.values():
            cell.set_train(True)
        stages = {name: [c for _, c in cells[name].cells_and_names() if isinstance(c, DimReduceUpdate)][0]
                  for name in ("dim", "dim_carry")}
        # the two k x M products of a step alone (P grad, then P^T [d; g]): memory-bound reads of P
        cells["products"] = _products_cell(stages["dim"].pca_rows, size, rng)
        # the same two products by numpy (OpenBLAS): the best this CPU's memory bandwidth allows
        cells["numpy_products"] = _numpy_products(stages["dim"].pca_rows.asnumpy(), size, rng)
        if trajectory:  # real batches, a new one every repeat (cycling through the epoch)
            batches = [(Tensor(b["image"]), Tensor(b["label"]))
                       for b in train_set().create_dict_iterator(num_epochs=1, output_numpy=True)]
        else:
            batches = [(Tensor(rng.standard_normal((args.batch, 3, 32, 32)).astype(np.float32)),
                        Tensor(rng.integers(0, args.classes, args.batch).astype(np.int32)))]
        x, y = batches[0]
        for cell in cells.values():
            _sync(cell(x, y))  # compile
        times = {name: [] for name in cells}
        outcomes = {name: [] for name in stages}
        first_trials = {name: [] for name in stages}  # the first trial's step: rho^0 times the carried scale
        for repeat in range(args.step_repeats):
            x, y = batches[(repeat + 1) % len(batches)]
            for name, stage in stages.items():
                first_trials[name].append(float(stage.search_scale.asnumpy()) if stage.carry_search else 1.0)
            for name, cell in cells.items():  # interleaved: load drift hits every contender alike
                start = time.perf_counter()
                _sync(cell(x, y))
                times[name].append(time.perf_counter() - start)
            for name, stage in stages.items():
                outcomes[name].append(float(stage.step_size.asnumpy()))
        noise = [t / p for t, p in zip(times["twin"], times["plain"])]
        forward_ratio = statistics.median(f / p for f, p in zip(times["forward"], times["plain"]))
        products_ratio = statistics.median(f / p for f, p in zip(times["products"], times["plain"]))
        numpy_products_ratio = statistics.median(f / p for f, p in zip(times["numpy_products"], times["plain"]))
        for name, carry in (("dim", False), ("dim_carry", True)):
            ratios = [d / p for d, p in zip(times[name], times["plain"])]
            steps = outcomes[name]  # the accepted step (0: none); accepted at the first trial: equal to its step
            first = sum(abs(o - f) <= 1e-6 * f for o, f in zip(steps, first_trials[name]))
            none = sum(o == 0.0 for o in steps)
            # mean line-search trials per step: 1 when the first trial is accepted, else all max_search_time = 2
            trials = (first + 2 * (len(steps) - first)) / len(steps)
            results.append({"width": width, "weights": size, "k": args.k, "batch": args.batch,
                            "carry_search": carry,
                            "plain_ms": 1e3 * statistics.median(times["plain"]),
                            "dim_reduce_ms": 1e3 * statistics.median(times[name]),
                            "ratio_median": statistics.median(ratios), "ratio_quartiles": quartiles_of(ratios),
                            "noise_ratio": statistics.median(noise), "noise_quartiles": quartiles_of(noise),
                            "accepted_fraction": (len(steps) - none) / len(steps),
                            "first_trial_fraction": first / len(steps),
                            "none_fraction": none / len(steps),
                            "forward_ratio": forward_ratio, "mean_trials": trials,
                            "products_ratio": products_ratio,
                            "floor": 1.0 + trials * forward_ratio + products_ratio,
                            "numpy_products_ratio": numpy_products_ratio,
                            # one trial per step, the products by the faster of MindSpore and numpy
                            "bandwidth_floor": 1.0 + forward_ratio + min(products_ratio, numpy_products_ratio),
                            "repeats": args.step_repeats, "mode": args.mode, "basis": args.basis})
            print(json.dumps(results[-1]), flush=True)
    return {"runs": results}


def _products_cell(pca_rows, size, rng):
    """A compiled cell doing a DimReduce step's two k x M products on a random gradient (inputs ignored)."""
    import mindspore as ms
    import numpy as np
    from mindspore import Tensor, nn, ops

    from ms_boost.dim_reduce.math import back_project, project

    class Products(nn.Cell):
        def __init__(self):
            super().__init__()
            self.rows = pca_rows
            self.grad = Tensor(rng.standard_normal(size).astype(np.float32))

        @ms.jit
        def construct(self, *inputs):
            g = project(self.rows, self.grad)
            return back_project(self.rows, ops.stack((g, -g))).sum()

    return Products()


def _sync(value):
    """Wait for a contender's result (a Tensor is copied to the host; numpy's is already there)."""
    return value.asnumpy() if hasattr(value, "asnumpy") else value


def _numpy_products(pca_rows, size, rng):
    """The two k x M products of a step in numpy (OpenBLAS, all cores) on a random gradient (inputs ignored):
    how fast this machine reads P, i.e. the products' share of the bandwidth floor."""
    import numpy as np

    grad = rng.standard_normal(size).astype(np.float32)

    def products(*inputs):
        g = pca_rows @ grad
        return (np.stack((g, -g)) @ pca_rows).sum()

    return products


def render_steps(section: dict) -> str:
    modes = sorted({r["mode"] for r in section["runs"]})
    trajectory = any(r.get("basis") == "trajectory" for r in section["runs"])
    basis = ("P the PCA (k = 32) of a short stage 1 on the built-in data set (ResNet-18 trained 10 epochs with "
             "Momentum, weights saved 5 times an epoch from epoch 3, as `--quick` end to end), every contender "
             "starting from the stage-1 weights, a new training batch every repeat (the same for every contender)"
             if trajectory else "random orthonormal P, untrained weights, the same random batch every step")
    title = "trajectory PCA basis" if trajectory else "random basis"
    lines = [f"## Step time: DimReduce vs plain SGD ({', '.join(modes)} mode, {title})", "",
             f"ResNet-18 at 32 px, one process, {basis}. Every repeat times, "
             "back to back: a plain SGD step, a DimReduce step (line search as upstream), a DimReduce step with "
             "`dim_reduce.carry_search`, a second identical plain step and one forward pass (train mode) alone. "
             "Medians over the repeats; ratio = median of the per-repeat ratios to the plain step (quartiles in "
             "brackets). *Noise floor*: the twin plain step / the plain step. *Floor*: 1 + (mean line-search "
             "trials) x (forward / plain step) + (the two k x M products alone / plain step), what the step "
             "would cost with no bookkeeping at all (rows written before the products column existed: without "
             "that term). *Bandwidth floor*: 1 + (forward / plain step) + (the two products by the faster of "
             "MindSpore and numpy's OpenBLAS / plain step), what the step would cost if every line search accepted "
             "its first trial and nothing but the forward pass and the two reads of P were added (rows written "
             "before that column existed: -). The "
             "machine "
             "is shared with other jobs (2 cores): absolute times drift, only the paired ratios are compared.", "",
             "| base width | weights | mode | carry_search | plain step | DimReduce step | ratio | floor "
             "| bandwidth floor | noise floor | forward / plain | products / plain | products in numpy / plain "
             "| accepted at trial 1 / trial 2 / none |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in section["runs"]:
        q = r.get("ratio_quartiles") or [float("nan")] * 2
        first = r.get("first_trial_fraction")
        first = float("nan") if first is None else first
        second = r["accepted_fraction"] - first
        lines.append(f"| {r['width']} | {r['weights']:,} | {r['mode']} | {'on' if r.get('carry_search') else 'off'} | "
                     f"{r['plain_ms']:.0f} ms | {r['dim_reduce_ms']:.0f} ms | **{r['ratio_median']:.2f}x** "
                     f"[{q[0]:.2f}, {q[1]:.2f}] | {r.get('floor', float('nan')):.2f} | {_opt(r, 'bandwidth_floor')} | "
                     f"{r.get('noise_ratio', float('nan')):.2f} | {r.get('forward_ratio', float('nan')):.2f} | "
                     f"{r.get('products_ratio', float('nan')):.2f} | {_opt(r, 'numpy_products_ratio')} | "
                     f"{100 * first:.0f}% / {100 * second:.0f}% / {100 * r.get('none_fraction', float('nan')):.0f}% |")
    lines += ["", "k = 32, batch 32. A DimReduce step is one forward + backward, the projection `P grad` (k x M), the "
              "back-projection (2 x M), the k x k BFGS algebra, flat copies of the weights and BatchNorm statistics, "
              "and 1 (accepted at once) or 2 extra forward passes of the line search (`max_search_time` = 2)."]
    return "\n".join(lines)


def _opt(row: dict, key: str) -> str:
    """A ratio of a row, or '-' for rows written before the column existed."""
    return f"{row[key]:.2f}" if key in row else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=["graph", "pynative"], default="graph")
    parser.add_argument("--epochs1", type=int, default=24)
    parser.add_argument("--epochs2", type=int, default=2)
    parser.add_argument("--save_from", type=int, default=7)
    parser.add_argument("--saves_per_epoch", type=int, default=2)
    parser.add_argument("--section", default="e2e", help="result section name (several configurations side by side)")
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--train_per_class", type=int, default=100)
    parser.add_argument("--val_per_class", type=int, default=30)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr_max", type=float, default=0.1)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--step_only", action="store_true", help="only the interleaved step-time benchmark")
    parser.add_argument("--step_widths", type=int, nargs="+", default=[16, 32])
    parser.add_argument("--step_repeats", type=int, default=30)
    parser.add_argument("--carry_search", action="store_true",
                        help="end to end: also run stage 2 with dim_reduce.carry_search (a third contender)")
    parser.add_argument("--basis", choices=["random", "trajectory"], default="random",
                        help="step-time only: a random orthonormal P on untrained weights and one batch, or the PCA "
                             "of a short stage 1 with real batches (what a user runs)")
    parser.add_argument("--quick", action="store_true",
                        help="step-time only: width 16, 5 repeats; end to end: the short configuration")
    args = parser.parse_args()
    if args.step_only and args.basis == "trajectory":  # stage 1 of the short end-to-end configuration
        args.classes, args.train_per_class, args.epochs1, args.epochs2 = 12, 40, 10, 2
        args.save_from, args.saves_per_epoch, args.lr_max = 3, 5, 0.05
    if args.quick and args.step_only:
        args.step_widths, args.step_repeats = [16], 5
    elif args.quick:  # the short end-to-end configuration (section e2e_short)
        args.classes, args.train_per_class, args.epochs1, args.epochs2 = 12, 40, 10, 2
        args.save_from, args.saves_per_epoch, args.lr_max, args.section = 3, 5, 0.05, "e2e_short"

    import mindspore as ms

    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE if args.mode == "graph" else ms.PYNATIVE_MODE)
    if args.step_only:
        steps = step_benchmark(args)
        section = "steps" + ("_trajectory" if args.basis == "trajectory" else "")
        section += "" if args.mode == "graph" else f"_{args.mode}"
        old = _section_runs(section)
        keys = {(r["width"], bool(r.get("carry_search"))) for r in steps["runs"]}
        steps["runs"] = sorted([r for r in old if (r["width"], bool(r.get("carry_search"))) not in keys]
                               + steps["runs"], key=lambda r: (r["width"], bool(r.get("carry_search"))))
        update_section(section, steps, render_steps(steps))
        print(render_steps(steps))
        return
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_dim_reduce_"))
    try:
        runs = [run_seed(args, seed, work) for seed in args.seeds]
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    section = {"config": vars(args), "runs": runs}
    update_section(args.section, section, render(section))
    print(render(section))


if __name__ == "__main__":
    main()

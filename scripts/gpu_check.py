"""A few training steps of O0, O1, THOR and DimReduce through ``ms_boost.Model`` on one device, compared with the
same steps on CPU (same seed, same data, same initial weights).

    python scripts/gpu_check.py --device GPU              # GPU against CPU (scripts/gpu_check.sh sets the libraries)
    python scripts/gpu_check.py --device CPU              # self-check: CPU against CPU, two separate processes

Each device runs in a process of its own (MindSpore binds a process to one device): ``--worker DEVICE --out FILE``
writes that device's losses as JSON; without ``--worker`` the script starts one worker for ``--device`` and one
for CPU at once, compares their losses and ends with one summary line. Tolerance: the first step's loss (the same
weights on the same batch: only the kernels differ, TF32 included) within ``--rtol_first`` (default 1e-3)
relative; the later steps, after updates that carry those differences along (THOR inverts curvature matrices),
within ``--rtol`` (default 1e-2). Exit status 0 when every algorithm agrees, 1 when one does not, 2 when a worker
fails (its output is printed).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Sequence

ROOT = Path(__file__).resolve().parents[1]
ALGORITHMS = ("O0", "O1", "THOR", "DimReduce")
DEVICES = ("GPU", "CPU")
RTOL_FIRST = 1e-3
RTOL = 1e-2
SEED = 7
BATCH = 16
CLASSES = 4
PCA_COMPONENTS = 3


# ---------------------------------------------------------------------------------------------------------------
# comparison (no MindSpore)
# ---------------------------------------------------------------------------------------------------------------
def relative_difference(value: float, reference: float) -> float:
    """``|value - reference| / max(|reference|, 1e-12)``; ``inf`` when either is not finite."""
    if not (math.isfinite(value) and math.isfinite(reference)):
        return math.inf
    return abs(value - reference) / max(abs(reference), 1e-12)


def compare(losses: Dict[str, Sequence[float]], reference: Dict[str, Sequence[float]], rtol_first: float = RTOL_FIRST,
            rtol: float = RTOL) -> List[dict]:
    """One row per algorithm of ``reference``: ``{"algorithm", "ok", "max_rel", "reason"}``.

    An algorithm agrees when both runs give the same number of steps (at least one), every loss is finite, the first
    step's loss is within ``rtol_first`` and every later one within ``rtol`` (relative to the reference). ``reason``
    says why not ("" when it agrees).
    """
    rows = []
    for name, ref in reference.items():
        got = losses.get(name)
        if got is None:
            rows.append({"algorithm": name, "ok": False, "max_rel": math.inf,
                         "reason": "no losses from the device run"})
            continue
        if len(got) != len(ref) or not ref:
            rows.append({"algorithm": name, "ok": False, "max_rel": math.inf,
                         "reason": f"{len(got)} step(s) against {len(ref)} on the reference"})
            continue
        diffs = [relative_difference(float(g), float(r)) for g, r in zip(got, ref)]
        bad = [i for i, d in enumerate(diffs) if d > (rtol_first if i == 0 else rtol)]
        reason = ""
        if bad:
            i = bad[0]
            reason = (f"step {i + 1}: loss {float(got[i]):.6g} against {float(ref[i]):.6g} (relative difference "
                      f"{diffs[i]:.2e} > {rtol_first if i == 0 else rtol:g})")
        rows.append({"algorithm": name, "ok": not bad, "max_rel": max(diffs), "reason": reason})
    return rows


def summary(rows: List[dict], device: str, reference: str) -> str:
    """The one summary line."""
    passed = [r["algorithm"] for r in rows if r["ok"]]
    failed = [r["algorithm"] for r in rows if not r["ok"]]
    worst = max((r["max_rel"] for r in rows), default=0.0)
    verdict = "PASS" if rows and not failed else "FAIL"
    return (f"gpu_check: {verdict}: {device} vs {reference}: {len(passed)}/{len(rows)} algorithms agree "
            f"({', '.join(passed) or 'none'}{'; differ: ' + ', '.join(failed) if failed else ''}); largest relative "
            f"loss difference {worst:.2e}")


# ---------------------------------------------------------------------------------------------------------------
# one device (a worker process)
# ---------------------------------------------------------------------------------------------------------------
def _net():
    """The tests' conv-BN-ReLU x2 + dense net (tests/helpers/nets.py) on 3x8x8 inputs."""
    from tests.helpers.nets import SmallConvNet

    return SmallConvNet(num_classes=CLASSES, width=8)


def initial_weights() -> dict:
    """The net's initial weights, drawn with numpy (the same on every device whatever its random generator)."""
    import numpy as np

    rng = np.random.default_rng(SEED)
    net = _net()
    values = {}
    for p in net.get_parameters():
        if "moving_variance" in p.name or "gamma" in p.name:
            values[p.name] = np.ones(p.shape, np.float32)
        elif "moving_mean" in p.name or "beta" in p.name or "bias" in p.name:
            values[p.name] = np.zeros(p.shape, np.float32)
        else:
            fan_in = int(np.prod(p.shape[1:]))
            values[p.name] = (rng.standard_normal(p.shape) / np.sqrt(fan_in)).astype(np.float32)
    return values


def _fresh_net():
    import mindspore as ms

    net = _net()
    ms.load_param_into_net(net, {k: ms.Parameter(ms.Tensor(v), name=k) for k, v in initial_weights().items()})
    return net


def arrays(steps: int):
    """``steps`` batches of learnable 3x8x8 images (a bright quadrant per class) and their labels, as numpy."""
    import numpy as np

    xs, ys = [], []
    for batch in range(steps):  # batch b is the same whatever ``steps``
        rng = np.random.default_rng([SEED, batch])
        y = rng.integers(0, CLASSES, BATCH).astype(np.int32)
        x = rng.normal(0.0, 0.5, size=(BATCH, 3, 8, 8)).astype(np.float32)
        for i, c in enumerate(y):
            r, q = divmod(int(c), 2)
            x[i, int(c) % 3, r * 4:(r + 1) * 4, q * 4:(q + 1) * 4] += 2.0
        xs.append(x)
        ys.append(y)
    return np.concatenate(xs), np.concatenate(ys)


def _data(steps: int):
    import mindspore.dataset as ds

    x, y = arrays(steps)
    return ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(BATCH, drop_remainder=True)


def _weight_trajectory(folder: str, count: int) -> str:
    """Stage-1 stand-in for DimReduce: ``count`` weight-only checkpoints on a seeded random walk."""
    import mindspore as ms
    import numpy as np

    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(SEED + 1)
    net = _fresh_net()
    walk = [np.zeros(p.shape, np.float32) for p in net.trainable_params()]
    for i in range(count):
        walk = [v + 0.02 * rng.standard_normal(v.shape).astype(np.float32) for v in walk]
        items = [{"name": p.name, "data": ms.Tensor(p.asnumpy() + v)} for p, v in zip(net.trainable_params(), walk)]
        ms.save_checkpoint(items, os.path.join(folder, f"stage1-{i + 1}_1.ckpt"))
    return folder


def _model(algorithm: str, work: str):
    from mindspore import nn

    from ms_boost import Model

    net = _fresh_net()
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    if algorithm == "THOR":
        from ms_boost.thor import ConvertModelUtils, thor

        opt = thor(net, 0.05, 0.05, 0.9, weight_decay=1e-4, batch_size=BATCH, frequency=2, block_size=16)
        return ConvertModelUtils().convert_to_thor_model(Model(net, loss, opt), net, loss, opt)
    if algorithm == "DimReduce":
        folder = _weight_trajectory(os.path.join(work, "stage1"), PCA_COMPONENTS + 2)
        config = {"boost": {"mode": "manual", "dim_reduce": True}, "common": {"device_number": 1},
                  "dim_reduce": {"n_component": PCA_COMPONENTS, "weight_load_dir": folder, "pca_mat_path": None}}
        opt = nn.SGD(net.trainable_params(), learning_rate=1.0)
        return Model(net, loss, opt, boost_level="O1", boost_config_dict=config)
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.05, momentum=0.9)
    return Model(net, loss, opt, boost_level=algorithm)


def run_device(device: str, steps: int, mode: str) -> Dict[str, List[float]]:
    """``steps`` steps of every algorithm on ``device``: their losses."""
    import mindspore as ms
    from mindspore.train import Callback

    ms.set_device(device)
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)

    class Losses(Callback):
        def __init__(self):
            super().__init__()
            self.values: List[float] = []

        def on_train_step_end(self, run_context):
            out = run_context.original_args().net_outputs
            out = out[0] if isinstance(out, (tuple, list)) else out
            self.values.append(float(out.asnumpy().reshape(-1)[0]))

    results = {}
    with tempfile.TemporaryDirectory() as work:
        for algorithm in ALGORITHMS:
            ms.set_seed(SEED)
            record = Losses()
            _model(algorithm, work).train(1, _data(steps), callbacks=[record], dataset_sink_mode=False)
            results[algorithm] = record.values
    return results


# ---------------------------------------------------------------------------------------------------------------
# both devices
# ---------------------------------------------------------------------------------------------------------------
def _start_worker(device: str, out: Path, args) -> subprocess.Popen:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", device, "--out", str(out), "--steps",
           str(args.steps), "--mode", args.mode]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=DEVICES, default="GPU",
                        help="device to check against CPU (CPU: self-check)")
    parser.add_argument("--steps", type=int, default=3, help="training steps per algorithm (default 3)")
    parser.add_argument("--mode", choices=("pynative", "graph"), default="pynative")
    parser.add_argument("--rtol_first", type=float, default=RTOL_FIRST, help="relative tolerance of step 1's loss")
    parser.add_argument("--rtol", type=float, default=RTOL, help="relative tolerance of the later steps' losses")
    parser.add_argument("--worker", choices=DEVICES, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    if args.worker:
        Path(args.out).write_text(json.dumps(run_device(args.worker, args.steps, args.mode)))
        return 0
    with tempfile.TemporaryDirectory() as work:
        outs = {name: Path(work) / f"{name}.json" for name in ("device", "reference")}
        procs = {"device": _start_worker(args.device, outs["device"], args),
                 "reference": _start_worker("CPU", outs["reference"], args)}
        logs = {name: proc.communicate()[0] for name, proc in procs.items()}
        failed = [name for name, proc in procs.items() if proc.returncode != 0 or not outs[name].is_file()]
        runs = {"device": f"{args.device} run", "reference": "CPU reference run"}
        for name in failed:
            print(f"--- the {runs[name]} failed (exit {procs[name].returncode}):\n{logs[name][-6000:]}")
        if failed:
            print(f"gpu_check: FAIL: the {' and the '.join(runs[n] for n in failed)} did not complete (output above)")
            return 2
        losses = {name: json.loads(path.read_text()) for name, path in outs.items()}
    rows = compare(losses["device"], losses["reference"], args.rtol_first, args.rtol)
    print(f"{args.steps} step(s) each, {args.mode} mode, tolerance: step 1 {args.rtol_first:g}, later steps "
          f"{args.rtol:g} (relative)")
    for row in rows:
        name = row["algorithm"]
        print(f"  {name:<9} {args.device}: {', '.join(f'{v:.6f}' for v in losses['device'].get(name, []))}  "
              f"CPU: {', '.join(f'{v:.6f}' for v in losses['reference'][name])}  max rel {row['max_rel']:.2e}"
              f"{'  ' + row['reason'] if row['reason'] else ''}")
    print(summary(rows, args.device, "CPU"))
    return 0 if all(row["ok"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

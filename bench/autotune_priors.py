"""Measure the figures the autotune priors stand for: each plan's compile and steady step time against O0's.

For each network of the time-to-accuracy page (``conv``: three ``nn.Conv2d`` stages; ``gemm``: the zoo's ResNet-10 on
GEMM convolutions) on digits at 16 px, batch 32, one process per network, this runs
:func:`ms_boost.autotune_plan` with every candidate named, the time budget off and a step budget that probes them all
(``probe_steps`` timed steps each, no progress window), and prints each candidate's compile ``k`` and steady step
``t`` with the ratios to O0's (``k / k_O0``, ``t / t_O0``) and O0's compile in O0 steps (``k_O0 / t_O0``): the
quantities of the priors in ``ms_boost/autotune/candidates.py`` (docs/autotune.md, "Candidates").

``python bench/autotune_priors.py [--nets conv,gemm] [--probe_steps 6]``; the lines are printed, nothing is written.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CANDIDATES = {"conv": ["O0", "O0_cpu_gemm_conv", "O1", "grad_accumulation_2", "thor_d0.03_f20"],
              "gemm": ["O0", "O1", "grad_accumulation_2", "thor_d0.03_f20"]}
TAG = "PRIORS "


def measure(net_name: str, probe_steps: int) -> dict:
    """The figures of every candidate of ``net_name`` (run in this process)."""
    import mindspore as ms
    import numpy as np
    from mindspore import Tensor, nn

    from bench.bench_tta import RunSpec, build_network
    from bench.tta_autotune import data_root
    from model_zoo.resnet.src.dataset import class_folders, create_dataset
    from model_zoo.resnet.src.lr_generator import get_lr
    from ms_boost import autotune_plan

    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    root = data_root("digits")
    train = create_dataset(root / "train", do_train=True, batch_size=32, image_size=16, num_parallel_workers=2,
                           crop_scale=(0.6, 1.0), seed=0, hflip=False)
    spec = RunSpec(dataset="digits", net=net_name, contender="probe", lr=0.1, seed=0, epochs=3, image_size=16,
                   width=8)
    net = build_network(spec, len(class_folders(root / "train")))
    steps = train.get_dataset_size()
    lr = Tensor(get_lr(0.0, 0.0, 0.1, 0, 3, steps, "cosine").astype(np.float32))
    opt = nn.Momentum(net.trainable_params(), lr, 0.9)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    names = CANDIDATES[net_name]
    options = {"autotune": {"candidates": names, "budget": 0.9, "time_budget": False, "measure_progress": False,
                            "probe_steps": probe_steps, "holdout_batches": 1}}
    report = autotune_plan(net, loss, opt, train, 3, options)
    print(report.table(), flush=True)
    out = {}
    for c in report.candidates:
        f = c.figures
        out[c.name] = {"ok": f.ok, "compile_s": f.compile_s, "step_s": f.step_s, "reason": c.reason}
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", default="conv,gemm")
    parser.add_argument("--probe_steps", type=int, default=6)
    parser.add_argument("--worker", default="")
    args = parser.parse_args(argv)
    if args.worker:
        print(TAG + json.dumps(measure(args.worker, args.probe_steps)), flush=True)
        return 0
    from bench.common import load_average

    print(f"load average before: {load_average()}", flush=True)
    for net in [n for n in args.nets.split(",") if n]:
        done = subprocess.run([sys.executable, __file__, "--worker", net, "--probe_steps", str(args.probe_steps)],
                              capture_output=True, text=True, cwd=ROOT, check=False)
        line = next((ln for ln in done.stdout.splitlines() if ln.startswith(TAG)), None)
        if line is None:
            print(f"{net}: failed\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}", flush=True)
            continue
        print("\n".join(ln for ln in done.stdout.splitlines() if not ln.startswith(TAG)))
        figures = json.loads(line[len(TAG):])
        base = figures.get("O0", {})
        k0, t0 = base.get("compile_s") or float("nan"), base.get("step_s") or float("nan")
        print(f"{net}: O0 compile {k0:.2f} s, step {t0 * 1e3:.1f} ms, compile / step {k0 / t0:.0f}")
        for name, f in figures.items():
            if f["ok"]:
                print(f"  {name:22s} compile {f['compile_s']:6.2f} s ({f['compile_s'] / k0:5.2f}x)  step "
                      f"{f['step_s'] * 1e3:7.1f} ms ({f['step_s'] / t0:5.2f}x)")
            else:
                print(f"  {name:22s} {f['reason']}")
    print(f"load average after: {load_average()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

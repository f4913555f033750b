"""The parts of THOR's refresh step, in Graph mode and on the host (issue 27: where the refresh's cost sits).

On ``bench/bench_thor.py``'s step-time network and settings (zoo ResNet-18, base width 16, batch 32, 32 px, 20 classes,
block size 64, the training set's batches in turn, one process, CPU), every *round* times each of these once, in
turn (so all see the same machine load), wall and CPU time of the process (all threads):

* ``momentum``: the Momentum train step (the reference);
* ``plain``: THOR's plain step variant (no capture, no refresh), ``refresh``: its capture-and-refresh variant with the
  refresh taken, ``capture``: the capture variant without refresh (the step a refresh step becomes when the graph
  only captures and something else inverts), ``adaptive``: the refresh variant of THOR with the adaptive per-layer
  refresh (threshold 0.3). The variant is forced by the host (the optimizer's ``next_step_variant`` answered here;
  ``refresh_next`` set before a refresh step so the device condition takes the refresh);
* ``refresh_alone``: the optimizer's whole refresh (``THOR._refresh``: the folds, the batched blocks and their
  safety test, the inversion, keep-or-replace, the 42 assignments, the written-out copies, the health counters)
  compiled alone on the stored factors; ``invert_graph``: the refresh's inversion path alone (the same kernels from
  ``ms_boost/thor/kernels.py`` from the stored factors to the assigned inverses and written-out copies, no fold, no
  health); ``invert_core``: only the batched Cholesky inversions (``math.cholesky_block_inverse``) of the same block
  stacks, given as inputs;
* ``host_*``: the same inversion on the host with numpy/scipy (one OpenBLAS thread unless ``OPENBLAS_NUM_THREADS``
  is set): the stored factors copied out (``asnumpy``), the blocks stacked by size, symmetrised, the Cholesky-safety
  test, then ``np.linalg.cholesky`` and a ``scipy.linalg.solve_triangular`` per block (``chol``) or
  ``np.linalg.inv`` of the batch (``inv``), in float32 or float64, the inverses written back into the inverse
  Parameters and their written-out copies with ``ops.assign``. For all layers and for a third / two thirds of them
  (every third layer / the others; the adaptive rule at threshold 0.3 kept the inverses of 28 of 84 layer refreshes
  in ``bench_thor.py``, i.e. inverted two thirds); ``host_all_copy_out``: only the copies out and the stacking,
  ``host_all_compute_chol_32``: only the arithmetic (float32 Cholesky), ``host_all_write_back``: only the
  ``ops.assign`` calls (42 inverses and their written-out copies);
* ``handoff``: a graph that takes every gradient as an input and returns it (the cost of splitting a step into two
  calls with the gradients handed through the host).

Compile times (first calls) of the variants and of the inversion graphs are recorded. The page
(``bench/results/thor_refresh_parts.md``) gives medians per part against Momentum's and the predicted amortized step
at frequency 10 of a design where the refresh variant only captures and the host inverts.

Usage::

    python bench/thor_refresh_parts.py [--rounds 20] [--no_write]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

# numpy's OpenBLAS threads fight MindSpore's own thread pool in one process (np.linalg.inv of the stacks took 0.6 s
# instead of 15 ms with two BLAS threads); one BLAS thread unless the caller sets it (before numpy is imported)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import mindspore as ms
import numpy as np
import scipy.linalg
from mindspore import Tensor, nn, ops

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_thor import build, make_images  # noqa: E402
from bench.common import environment, load_average, page_footer, write_results  # noqa: E402
from ms_boost.thor import kernels  # noqa: E402
from ms_boost.thor import math as thor_math  # noqa: E402
from ms_boost.thor.assignment import DEFAULT_BLOCK_SIZE  # noqa: E402
from ms_boost.thor.optimizer import written_out_inverse  # noqa: E402

_pair = ops.MultitypeFuncGraph("refresh_parts_pair")


@_pair.register("Tensor", "Tensor")
def _pair_tensor(a, g):
    return a, g


class RefreshAlone(nn.Cell):
    """The optimizer's whole refresh (``THOR._refresh``) on the statistics the last capture stored."""

    def __init__(self, opt):
        super().__init__()
        self.opt = opt

    def construct(self, token):
        return self.opt._refresh(self.opt.damping(self.opt.global_step), token)


class InvertGraph(nn.Cell):
    """The refresh's inversion path alone: the stored factors' blocks batched by size and checked for Cholesky
    safety, inverted (Cholesky, or the eigen fallback when a block is unsafe), kept or replaced, assigned, and the
    written-out copies rebuilt; the library's own kernels, as ``THOR._refresh`` maps them (no fold, no health)."""

    def __init__(self, opt):
        super().__init__()
        self.opt = opt
        self.ok = Tensor(np.ones(opt.n_layers, np.bool_))

    def construct(self, root):
        opt = self.opt
        folds = kernels.MAP(_pair, opt.a_batches, opt.g_batches)
        prepared = kernels.MAP(ops.partial(kernels.prepare_batch, folds, (), self.ok, root, False),
                               opt.inverse_batches, opt.batch_job_layers, opt.batch_job_slots, opt.batch_job_groups,
                               opt.batch_job_blocks, opt.batch_block_layer)
        blocks = kernels.MAP(kernels.field_0, prepared)
        shifts = kernels.MAP(kernels.field_1, prepared)
        block_ok = kernels.MAP(kernels.field_2, prepared)
        unsafe = ops.addn(kernels.MAP(kernels.field_3, prepared))
        if unsafe > 0.5:
            raw = kernels.MAP(kernels.eigen_inverse, blocks, shifts)
        else:
            raw = kernels.MAP(kernels.cholesky_inverse, blocks, shifts)
        bad = kernels.MAP(kernels.blocks_bad, block_ok, raw)
        kept = kernels.MAP(ops.partial(kernels.keep_or_replace, opt.a_inverses, opt.g_inverses), raw, bad, block_ok,
                           opt.batch_job_layers, opt.batch_job_slots, opt.batch_job_matrix, opt.batch_block_matrix)
        raw = kernels.MAP(kernels.field_0, kept)
        jobs = kernels.MAP(ops.partial(kernels.job_inverse, (), raw, opt.a_inverses, opt.g_inverses, True),
                           opt.job_specs, opt.job_diagonal)
        token = ops.depend(ops.zeros((), ms.float32), jobs)
        dense = kernels.MAP(ops.partial(kernels.dense_inverse, opt.a_inverses, opt.g_inverses, token),
                            opt.dense_inverses, opt.dense_layer, opt.dense_slot, opt.dense_dims)
        return ops.depend(token, dense)


class InvertCore(nn.Cell):
    """Only the batched Cholesky inversions of given block stacks (``math.cholesky_block_inverse``)."""

    def construct(self, *stacks):
        out = ()
        for k in range(len(stacks) // 2):
            out += (thor_math.cholesky_block_inverse(stacks[2 * k], stacks[2 * k + 1]),)
        return out


class Handoff(nn.Cell):
    """Every gradient in, every gradient out: the price of a second graph call fed from the first one's outputs."""

    def construct(self, *gradients):
        out = ()
        for g in gradients:
            out += (g * 1.0,)
        return out


def _sync(out) -> None:
    while isinstance(out, (tuple, list)):
        out = out[0]
    out.asnumpy()


def host_jobs(opt, layers):
    """The inversion jobs of ``layers``: (source Parameter, inverse Parameter, written-out copy and its dim or None)."""
    dense = {(layer, slot): (opt.dense_inverses[k], dim)
             for k, (layer, slot, dim) in enumerate(zip(opt.dense_layer, opt.dense_slot, opt.dense_dims))}
    jobs = []
    for layer in layers:
        for slot in (0, 1):
            source = (opt.a_batches if slot == 0 else opt.g_batches)[layer]
            jobs.append((source, opt._inverse_param(2 * layer + slot), dense.get((layer, slot))))
    return jobs


def host_stacks(jobs, dtype=np.float32):
    """Copy the jobs' factors out and stack their symmetrised blocks by size -> {b: (stack, [(job, count)])}."""
    stacks = {}
    for k, (source, _, _) in enumerate(jobs):
        f = source.asnumpy()
        b = f.shape[-1]
        blocks = f.reshape(-1, b, b).astype(dtype)
        stacks.setdefault(b, []).append((k, blocks))
    out = {}
    for b, parts in stacks.items():
        stack = np.concatenate([p for _, p in parts])
        out[b] = ((stack + np.swapaxes(stack, -1, -2)) * 0.5, [(k, len(p)) for k, p in parts])
    return out


def host_invert(stack, shift: float, method: str):
    scale = np.abs(stack).max(axis=(-2, -1))
    safe = np.isfinite(stack).all(axis=(-2, -1)) & (shift >= np.maximum(scale, 1e-30) * thor_math.CHOLESKY_SAFE_RATIO)
    eye = np.eye(stack.shape[-1], dtype=stack.dtype)
    damped = stack + shift * eye
    if not safe.all():  # the clamped eigen-inverse, as the library's fallback
        mu, v = np.linalg.eigh(stack)
        return (v / (np.maximum(mu, 0.0) + shift)[:, None, :]) @ np.swapaxes(v, -1, -2)
    if method == "inv":
        return np.linalg.inv(damped)
    lower = np.linalg.cholesky(damped)
    lower_inv = np.stack([scipy.linalg.solve_triangular(m, eye, lower=True, check_finite=False) for m in lower])
    return np.swapaxes(lower_inv, -1, -2) @ lower_inv


def host_refresh(jobs, shift: float, dtype, method: str) -> None:
    """The host's refresh of ``jobs``: copy out, invert, write the inverses and their written-out copies back."""
    last = None
    for stack, owners in host_stacks(jobs, dtype).values():
        inverse = host_invert(stack, shift, method).astype(np.float32)
        if not np.isfinite(inverse).all():
            raise FloatingPointError("host inversion produced inf/NaN")
        start = 0
        for k, count in owners:
            _, target, dense = jobs[k]
            blocks = inverse[start:start + count].reshape(target.shape)
            start += count
            last = ops.assign(target, Tensor(blocks))
            if dense is not None:
                last = ops.assign(dense[0], Tensor(written_out_inverse(blocks, dense[1])))
    last.asnumpy()  # the writes done (an eager op may return before its kernel ran)


def run(args) -> dict:
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    xt, yt = make_images(args.classes, args.train_per_class, args.size, 0, 0)
    batches = [(Tensor(xt[k * args.batch:(k + 1) * args.batch]), Tensor(yt[k * args.batch:(k + 1) * args.batch]))
               for k in range(args.batches)]
    x, y = batches[0]
    blocks = (2, 2, 2, 2)
    _, _, momentum = build("momentum", args, 0, 1000, blocks, args.time_width)
    _, opt, model = build(f"thor_{args.frequency}", args, 0, 1000, blocks, args.time_width)
    _, aopt, amodel = build(f"thor_{args.frequency}_a{args.threshold:g}", args, 0, 1000, blocks, args.time_width)
    cells = {"momentum": momentum.train_network, "thor": model.train_network, "adaptive": amodel.train_network}
    for cell in cells.values():
        cell.set_train()
    variant = {"thor": (True, True), "adaptive": (True, True)}
    for name, o in (("thor", opt), ("adaptive", aopt)):  # the host's choice of variant, forced per call
        object.__setattr__(o, "next_step_variant", lambda name=name: variant[name])
    refresh_flag = Tensor(True, ms.bool_)

    def thor_step(name, o, mode):
        def call(x, y):
            variant[name] = mode
            if mode[1]:
                ops.assign(o.refresh_next, refresh_flag)
            return cells[name](x, y)
        return call

    root = float(np.sqrt(args.damping))
    refresh_alone, invert_graph, core, handoff = RefreshAlone(opt), InvertGraph(opt), InvertCore(), Handoff()
    token, root_t = Tensor(np.zeros((), np.float32)), Tensor(np.float32(root))
    all_layers = list(range(opt.n_layers))
    subsets = {"all": all_layers, "third": all_layers[::3], "two_thirds": [i for i in all_layers if i % 3]}
    host_sets = {name: host_jobs(opt, layers) for name, layers in subsets.items()}
    rng = np.random.default_rng(0)
    gradients = tuple(Tensor(rng.standard_normal(p.shape).astype(np.float32)) for p in opt._parameters)

    core_cache = []

    def core_inputs():  # the stacks as they stand after the first refresh, built once (not timed after)
        if not core_cache:
            for stack, _ in host_stacks(host_sets["all"]).values():
                core_cache.extend([Tensor(stack), Tensor(np.full((stack.shape[0],), root, np.float32))])
        return core_cache

    parts = {
        "momentum": lambda x, y: cells["momentum"](x, y),
        "refresh": thor_step("thor", opt, (True, True)),
        "plain": thor_step("thor", opt, (False, False)),
        "capture": thor_step("thor", opt, (True, False)),
        "adaptive": thor_step("adaptive", aopt, (True, True)),
        "adaptive_plain": thor_step("adaptive", aopt, (False, False)),
        "refresh_alone": lambda x, y: refresh_alone(token),
        "invert_graph": lambda x, y: invert_graph(root_t),
        "invert_core": lambda x, y: core(*core_inputs()),
        "handoff": lambda x, y: handoff(*gradients),
    }
    host = {f"host_{subset}_{method}_{bits}": (subset, method, dtype)
            for subset in subsets for method, bits, dtype in
            (("chol", 32, np.float32), ("chol", 64, np.float64), ("inv", 32, np.float32), ("inv", 64, np.float64))
            if subset == "all" or bits == 32}
    for name, (subset, method, dtype) in host.items():
        parts[name] = (lambda x, y, s=subset, m=method, d=dtype: host_refresh(host_sets[s], root, d, m))
    # the host refresh in three pieces: the copies out (asnumpy of every stored factor and the stacking), the
    # arithmetic alone on stacks copied once, the write-back alone (ops.assign of Tensors made once)
    parts["host_all_copy_out"] = lambda x, y: host_stacks(host_sets["all"])
    cached = {}

    def compute_only(x, y):
        if "stacks" not in cached:
            cached["stacks"] = [stack for stack, _ in host_stacks(host_sets["all"]).values()]
        return {"inverses": [host_invert(stack, root, "chol") for stack in cached["stacks"]]}

    def write_back_only(x, y):
        if "values" not in cached:
            cached["values"] = [(target, Tensor(target.asnumpy()), None if dense is None else
                                 (dense[0], Tensor(dense[0].asnumpy()))) for _, target, dense in host_sets["all"]]
        for target, value, dense in cached["values"]:
            last = ops.assign(target, value)
            if dense is not None:
                last = ops.assign(*dense)
        return last

    parts["host_all_compute_chol_32"] = compute_only
    parts["host_all_write_back"] = write_back_only
    compile_s = {}
    for name, call in parts.items():  # first calls: compile (the THOR variants: the refresh variant first)
        start, cpu = time.perf_counter(), time.process_time()
        out = call(x, y)
        if out is not None and not isinstance(out, dict):
            _sync(out)
        compile_s[name] = (time.perf_counter() - start, time.process_time() - cpu)
        print(f"  first call {name}: {compile_s[name][0]:.1f} s wall, {compile_s[name][1]:.1f} s CPU", flush=True)
    kept_before = sum(aopt.health().get("stable_refreshes", {}).values())
    wall = {name: [] for name in parts}
    cpu = {name: [] for name in parts}
    load = [load_average()]
    for r in range(args.rounds):
        x, y = batches[r % len(batches)]
        for name, call in parts.items():
            start, c0 = time.perf_counter(), time.process_time()
            out = call(x, y)
            if out is not None and not isinstance(out, dict):
                _sync(out)
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - c0)
        if r % 5 == 4:
            print(f"  round {r + 1}: momentum {statistics.median(cpu['momentum']) * 1e3:.1f} ms CPU", flush=True)
    load.append(load_average())
    kept = sum(aopt.health().get("stable_refreshes", {}).values()) - kept_before
    return {"wall": wall, "cpu": cpu, "compile_s": compile_s, "load": load, "n_layers": opt.n_layers,
            "adaptive_kept": kept, "eigen_fallback_blocks": opt.health()["eigen_fallback_blocks"],
            "adaptive_layer_refreshes": (args.rounds + 1) * aopt.n_layers,
            "subsets": subsets, "batches_by_size": {int(b): int(s.shape[0]) for b, (s, _) in
                                                    host_stacks(host_sets["all"]).items()}}


def predictions(med: dict, frequency: int) -> dict:
    """Predicted refresh steps and amortized steps (x Momentum) of the designs, from medians ``med`` (seconds)."""
    m, plain = med["momentum"], med["plain"]
    designs = {"today, fixed frequency (measured)": med["refresh"], "today, adaptive (measured)": med["adaptive"]}
    for subset, label in (("all", "all layers"), ("two_thirds", "two thirds of the layers (adaptive, 56 of 84)"),
                          ("third", "a third of the layers")):
        host = min(med[f"host_{subset}_chol_32"], med[f"host_{subset}_inv_32"])
        designs[f"capture variant + host inversion, {label}, one-step delay"] = med["capture"] + host
        designs[f"capture variant + host inversion, {label}, exact (+ handoff)"] = (med["capture"] + host
                                                                                    + med["handoff"])
    designs["capture variant alone (no inversion at all: the bound)"] = med["capture"]
    return {name: {"refresh_x": t / m, "amortized_x": (plain + (t - plain) / frequency) / m}
            for name, t in designs.items()}


def markdown(args, res: dict, command: str) -> str:
    lines = ["# THOR's refresh step in parts (issue 27)", "",
             f"Zoo ResNet-18 width {args.time_width}, batch {args.batch}, {args.size} px, block size "
             f"{args.block_size}, {args.batches} batches in turn, {args.rounds} rounds; every part timed once per "
             "round in turn in one process (same load); medians. Load average (1/5/15 min) at the start / end: "
             + " / ".join(" ".join(str(v) for v in ld) for ld in res["load"]) + ". "
             f"{res['n_layers']} THOR layers; block stacks by size (blocks): "
             + ", ".join(f"{b}: {n}" for b, n in sorted(res["batches_by_size"].items())) + ".", ""]
    for clock in ("cpu", "wall"):
        med = {k: statistics.median(v) for k, v in res[clock].items()}
        m = med["momentum"]
        lines += [f"## {'CPU time of the process' if clock == 'cpu' else 'Wall time'}", "",
                  "| part | median | x Momentum | paired per round (median) |", "|---|---|---|---|"]
        for name, t in med.items():
            paired = statistics.median(a / b for a, b in zip(res[clock][name], res[clock]["momentum"]))
            lines.append(f"| {name} | {t * 1e3:.1f} ms | {t / m:.3f}x | {paired:.3f}x |")
        lines += ["", f"Predicted (frequency {args.frequency}; plain step as measured; host: the faster float32 "
                  "method of each layer set):", "",
                  "| design | refresh step | amortized |", "|---|---|---|"]
        for name, p in predictions(med, args.frequency).items():
            lines.append(f"| {name} | {p['refresh_x']:.2f}x | {p['amortized_x']:.3f}x |")
        lines.append("")
    lines += ["## First calls (compile)", "", "| part | wall | CPU |", "|---|---|---|"]
    lines += [f"| {k} | {w:.1f} s | {c:.1f} s |" for k, (w, c) in res["compile_s"].items()]
    lines += ["", "The THOR variants compile in the order refresh, plain, capture (the capture variant's first call "
              "is its compile; the refresh variant's first call also runs the first refresh). The adaptive cell's "
              f"trace rule kept the inverses at {res['adaptive_kept']} of about {res['adaptive_layer_refreshes']} "
              "layer refreshes here (a refresh every round). Blocks the fixed-frequency cell's refreshes (and "
              f"`refresh_alone`) sent to the eigen fallback: {res['eigen_fallback_blocks']} (0: Cholesky throughout)."]
    lines += page_footer(command, res["load"][0])
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--frequency", type=int, default=10)
    parser.add_argument("--threshold", type=float, default=0.3)
    parser.add_argument("--no_write", action="store_true")
    args = parser.parse_args(argv)
    # bench_thor.py's defaults for the step-time network
    for key, value in {"classes": 20, "size": 32, "width": 8, "time_width": 16, "batch": 32, "train_per_class": 32,
                       "epochs": 8, "momentum_lr": 0.1, "thor_lr": 0.1, "damping": 0.3, "weight_decay": 1e-4,
                       "block_size": DEFAULT_BLOCK_SIZE}.items():
        setattr(args, key, value)
    res = run(args)
    command = "python bench/thor_refresh_parts.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = markdown(args, res, command.strip())
    print(text, flush=True)
    if not args.no_write:
        write_results("thor_refresh_parts", {"args": vars(args), "result": res, "environment": environment()}, text)


if __name__ == "__main__":
    main()

"""Time and peak memory of the streaming PCA (ms_boost.dim_reduce.pca) on synthetic stage-1 checkpoints.

For each size M (default 1 M, 5 M and 25.557 M = ResNet-50's trainable weights, with ResNet-50's real
parameter names and shapes at that size) the script writes N = 60 checkpoints of a drifting low-rank
trajectory with noise, then runs ``compute_pca_matrix(..., output=...)`` for k = 32 in a fresh child
process and records wall time and the child's peak resident memory (``VmHWM``; MindSpore's import
included, reported separately). The result is checked: orthonormal rows, and for M = 1 M equality with
``numpy.linalg.svd`` up to sign. For comparison, upstream ``mindspore.boost``'s PCA (all checkpoints in
memory + randomized SVD) is run on the 1 M set.

Usage: python bench/bench_pca.py [--sizes 1000000 5000000 25557032] [--num 60] [--k 32] [--workdir DIR]
Writes the "pca" section of bench/results/dim_reduce.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESNET50_WEIGHTS = 25557032


def _rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def _peak_mb() -> float:
    """Peak resident memory of this process image (``VmHWM``; unlike ``ru_maxrss`` it does not inherit the
    parent's peak through ``vfork``/``exec``)."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def make_specs(size: int) -> list:
    """ResNet-50's (name, shape) list at its own size; 160 flat tensors otherwise."""
    if size == RESNET50_WEIGHTS:
        from model_zoo.resnet.src.resnet import resnet50

        net = resnet50(class_num=1000)
        return [(p.name, tuple(int(d) for d in p.shape)) for p in net.trainable_params()]
    bounds = np.linspace(0, size, 161).astype(np.int64)
    return [(f"layer{i}.weight", (int(b - a),)) for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]


def write_checkpoints(folder: Path, specs: list, num: int, seed: int = 0) -> float:
    """``num`` checkpoints x_i = base + c_i D + noise (5 drift directions), one tensor list per file."""
    import mindspore as ms
    from mindspore import Tensor

    size = sum(int(np.prod(s)) for _, s in specs)
    rng = np.random.default_rng(seed)
    base = rng.standard_normal(size, dtype=np.float32) * 0.05
    drift = rng.standard_normal((5, size), dtype=np.float32) * np.array([[3], [2], [1.5], [1], [0.7]], np.float32)
    coef = (np.cumsum(rng.standard_normal((num, 5)), axis=0) * 1e-3).astype(np.float32)
    marker = folder / "COMPLETE"
    if marker.exists():  # same seed, same sizes: the files of an earlier run are reused
        return 0.0
    folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    for i in range(num):
        row = base + coef[i] @ drift + rng.standard_normal(size, dtype=np.float32) * 1e-4
        items, off = [], 0
        for name, shape in specs:
            n = int(np.prod(shape))
            items.append({"name": name, "data": Tensor(row[off:off + n].reshape(shape))})
            off += n
        ms.save_checkpoint(items, str(folder / f"resnet-{i + 1}_625.ckpt"))
    marker.write_text("done\n")
    return time.perf_counter() - start


def child_ms_boost(args) -> None:
    """Child process: streaming PCA; prints one JSON line."""
    baseline = _rss_mb()
    import mindspore  # noqa: F401  (imported first so its footprint is measured apart)

    from ms_boost.dim_reduce.pca import compute_pca_matrix

    after_import = _rss_mb()
    specs = [(n, tuple(s)) for n, s in json.loads(Path(args.specs).read_text())]
    start = time.perf_counter()
    compute_pca_matrix(args.dir, args.k, specs, output=args.output,
                       progress=lambda m: print(f"[pca] {m}", file=sys.stderr, flush=True))
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "peak_rss_mb": _peak_mb(), "rss_after_import_mb": after_import,
                      "rss_start_mb": baseline}))


def child_upstream(args) -> None:
    """Child process: upstream mindspore.boost's PCA (all checkpoints in memory, randomized SVD)."""
    import mindspore  # noqa: F401
    from mindspore.boost import base as upstream

    after_import = _rss_mb()
    names = [n for n, _ in json.loads(Path(args.specs).read_text())]

    class _Net:  # upstream only asks the network for its trainable parameter names
        @staticmethod
        def trainable_params():
            return [type("P", (), {"name": n})() for n in names]

    np.random.seed(0)
    start = time.perf_counter()
    data = upstream._load_weights(args.dir, _Net())  # pylint: disable=protected-access
    mat = upstream._compute_pca_mat(data, args.k)  # pylint: disable=protected-access
    seconds = time.perf_counter() - start
    np.save(args.output, np.asarray(mat, dtype=np.float32))
    print(json.dumps({"seconds": seconds, "peak_rss_mb": _peak_mb(), "rss_after_import_mb": after_import}))


def run_child(kind: str, folder: Path, specs_file: Path, k: int, output: Path) -> dict:
    cmd = [sys.executable, __file__, f"--child={kind}", "--dir", str(folder), "--specs", str(specs_file),
           "--k", str(k), "--output", str(output)]
    env = dict(os.environ, PYTHONPATH=str(ROOT), GLOG_v="3")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} PCA failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check_result(path: Path, folder: Path, specs: list, check_svd: bool) -> dict:
    mat = np.load(path, mmap_mode="r", allow_pickle=False)
    k, width = mat.shape
    gram = np.zeros((k, k))
    for a in range(0, width, 1 << 20):
        block = np.asarray(mat[:, a:a + (1 << 20)], dtype=np.float64)
        gram += block @ block.T
    out = {"orthonormality_error": float(np.abs(gram - np.eye(k)).max())}
    if check_svd:
        from ms_boost.dim_reduce.pca import list_checkpoints, read_flat_weights

        x = np.stack([read_flat_weights(f, specs) for f in list_checkpoints(str(folder))]).astype(np.float64)
        x -= x.mean(axis=0)
        ref = np.linalg.svd(x, full_matrices=False)[2][:k]
        signs = np.sign(np.sum(np.asarray(mat, np.float64) * ref, axis=1))
        out["max_abs_diff_vs_numpy_svd"] = float(np.abs(np.asarray(mat) - signs[:, None] * ref).max())
    return out


def render(section: dict) -> str:
    lines = ["## Streaming PCA (`ms_boost.dim_reduce.pca`)", "",
             f"N = {section['num']} checkpoints, k = {section['k']}; child process per run; peak = `VmHWM` "
             "of the whole process (MindSpore import included; its share is the 'after import' column).", "",
             "| M (weights) | checkpoints on disk | PCA time | peak RSS | RSS after import | orthonormality err "
             "| vs numpy SVD |", "|---|---|---|---|---|---|---|"]
    for row in section["runs"]:
        svd = row.get("max_abs_diff_vs_numpy_svd")
        svd_text = f"{svd:.1e}" if svd is not None else "-"
        lines.append(f"| {row['weights']:,} | {row['checkpoint_gb']:.2f} GB | {row['seconds']:.1f} s "
                     f"| {row['peak_rss_mb'] / 1024:.2f} GB | {row['rss_after_import_mb'] / 1024:.2f} GB "
                     f"| {row['orthonormality_error']:.1e} | {svd_text} |")
    for row in section.get("upstream", []):
        lines.append(f"\nUpstream `mindspore.boost` PCA at M = {row['weights']:,}: {row['seconds']:.1f} s, peak RSS "
                     f"{row['peak_rss_mb'] / 1024:.2f} GB (holds all N x M weights, then a randomized SVD; it would "
                     f"need > {row['weights'] * section['num'] * 8 / 2**30 * (RESNET50_WEIGHTS / row['weights']):.0f} "
                     "GB at ResNet-50 size).")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 5_000_000, RESNET50_WEIGHTS])
    parser.add_argument("--num", type=int, default=60)
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--workdir", default=None, help="scratch folder (default: a temporary folder)")
    parser.add_argument("--no_upstream", action="store_true")
    parser.add_argument("--child", default=None, choices=["ms_boost", "upstream"], help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    parser.add_argument("--specs", help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "ms_boost":
        child_ms_boost(args)
        return
    if args.child == "upstream":
        child_upstream(args)
        return

    from bench.bench_dim_reduce import update_section

    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_pca_"))
    section = {"num": args.num, "k": args.k, "runs": [], "upstream": []}
    try:
        for size in args.sizes:
            specs = make_specs(size)
            folder = work / f"m{size}"
            gen = write_checkpoints(folder, specs, args.num)
            specs_file = work / f"specs{size}.json"
            specs_file.write_text(json.dumps(specs))
            disk = sum(f.stat().st_size for f in folder.glob("*.ckpt")) / 2**30
            print(f"M={size:,}: wrote {args.num} checkpoints ({disk:.2f} GB) in {gen:.0f} s", flush=True)
            output = work / f"pca{size}.npy"
            row = {"weights": size, "checkpoint_gb": disk, **run_child("ms_boost", folder, specs_file, args.k, output)}
            row.update(check_result(output, folder, specs, check_svd=size <= 1_000_000))
            print(json.dumps(row), flush=True)
            section["runs"].append(row)
            if size <= 1_000_000 and not args.no_upstream:
                up = run_child("upstream", folder, specs_file, args.k, work / f"up{size}.npy")
                up["weights"] = size
                print("upstream", json.dumps(up), flush=True)
                section["upstream"].append(up)
            output.unlink()
            if not args.workdir:
                shutil.rmtree(folder)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    update_section("pca", section, render(section))


if __name__ == "__main__":
    main()

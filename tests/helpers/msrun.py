"""Run a Python script under MindSpore's ``msrun`` with N CPU workers and collect each rank's result.

A worker script reports by calling :func:`save_result` (importable in the worker as
``from tests.helpers.msrun import save_result``), which writes ``rank_<r>.npz`` into the folder named
by the ``MS_BOOST_RESULT_DIR`` environment variable. :func:`run_msrun` returns those arrays, one
dict per rank, and raises with every worker's log when the job fails.
"""
from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    rng = random.SystemRandom()  # not the seeded global generator: concurrent jobs must not pick the same port
    for _ in range(50):
        port = rng.randint(20000, 40000)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port found for msrun")


def msrun_binary() -> str:
    """Path of ``msrun`` next to the running interpreter (a venv) or on PATH."""
    local = Path(sys.executable).with_name("msrun")
    return str(local) if local.exists() else "msrun"


def run_msrun(script, workers: int = 2, args=(), env=None, timeout: int = 600, cwd=None) -> list:
    """Run ``script`` with ``workers`` CPU ranks and return each rank's saved arrays.

    Args:
        script: path of the worker script.
        workers: number of processes (all local).
        args: extra command-line arguments for the script.
        env: extra environment variables.
        timeout: seconds before the job is killed and the test fails.
        cwd: working directory (a temporary folder by default).

    Returns:
        list of ``{name: np.ndarray}``, index = rank.
    """
    with tempfile.TemporaryDirectory(prefix="msrun_") as tmp:
        result_dir = Path(tmp) / "results"
        log_dir = Path(tmp) / "logs"
        result_dir.mkdir()
        full_env = dict(os.environ)
        full_env.update({"MS_BOOST_RESULT_DIR": str(result_dir),
                         "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), full_env.get("PYTHONPATH", "")]),
                         # msrun starts workers with the `python` found on PATH: make it this interpreter
                         "PATH": os.pathsep.join([str(Path(sys.executable).parent), full_env.get("PATH", "")]),
                         "GLOG_v": "3"})
        full_env.update(env or {})
        cmd = [msrun_binary(), f"--worker_num={workers}", f"--local_worker_num={workers}",
               f"--master_port={_free_port()}", f"--log_dir={log_dir}", "--join=True",
               str(script), *map(str, args)]
        try:
            proc = subprocess.run(cmd, cwd=cwd or tmp, env=full_env, capture_output=True, text=True,
                                  timeout=timeout)
            failed = proc.returncode != 0
            out = proc.stdout[-3000:] + proc.stderr[-3000:]
        except subprocess.TimeoutExpired as exc:
            failed, out = True, f"timeout after {timeout}s: {exc}"
        results = []
        for r in range(workers):
            path = result_dir / f"rank_{r}.npz"
            if not path.exists():
                failed = True
                break
            with np.load(path, allow_pickle=False) as data:
                results.append({k: data[k] for k in data.files})
        if failed:
            logs = ""
            for log in sorted(log_dir.glob("*.log")) if log_dir.exists() else []:
                logs += f"\n===== {log.name} =====\n" + log.read_text(errors="replace")[-4000:]
            raise AssertionError(f"msrun job failed: {' '.join(cmd)}\n{out}\n{logs}")
        return results


def save_result(**arrays) -> None:
    """Called inside a worker: save named arrays for this rank (atomically)."""
    from ms_boost import comm

    out_dir = Path(os.environ["MS_BOOST_RESULT_DIR"])
    rank = comm.get_rank()
    tmp = out_dir / f".rank_{rank}.tmp.npz"
    np.savez(tmp, **{k: np.asarray(v) for k, v in arrays.items()})
    os.replace(tmp, out_dir / f"rank_{rank}.npz")


def run_once(tmp_path_factory, name: str, job) -> tuple:
    """``job(folder)`` -> list of per-rank dicts, run once per test session however many test files (and, under
    pytest-xdist, worker processes) ask for it: the first caller runs it in ``<shared temp>/<name>`` while holding
    a lock, the others wait for the lock and read what it saved. Returns ``(folder, ranks)``.

    The shared temp folder is the one above each xdist worker's own (every worker of a run has the same), or the
    session's own without xdist. A job that failed saved nothing: the next caller runs it again (and fails again,
    with the job's logs).
    """
    import fcntl

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    folder = root / name
    with open(root / f"{name}.lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = folder / "ranks.done"
        if not done.exists():
            folder.mkdir(exist_ok=True)
            ranks = job(folder)
            for rank, arrays in enumerate(ranks):
                np.savez(folder / f"rank_{rank}.npz", **arrays)
            done.write_text(str(len(ranks)), encoding="utf-8")
        ranks = []
        for rank in range(int(done.read_text(encoding="utf-8"))):
            with np.load(folder / f"rank_{rank}.npz", allow_pickle=False) as data:
                ranks.append({k: data[k] for k in data.files})
    return folder, ranks

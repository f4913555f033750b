"""Summarise the per-test CPU lines written with ``MS_BOOST_CPU_REPORT=<file>`` (see tests/conftest.py).

Usage: ``python -m tests.helpers.cpu_report <file> [N]`` prints the CPU-seconds per xdist worker and per test
file, the N (default 25) tests that used the most CPU (own process + child processes), and each worker's
timeline: the files it ran in order, with the second (from the first test's start) at which each one ended; then
the schedule replayed (:func:`replay`): when the run would end in the order of ``tests/conftest.py`` ``HEAVY_FIRST``
and in other orders, against the bound no order can beat (CPU-seconds / cores).
"""
from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path
from typing import Dict, List


def _read(base: Path) -> list:
    """Rows ``(worker, own, kids, wall, end, nodeid)``; ``end`` is None in files written before it was logged."""
    rows = []
    for path in sorted(base.parent.glob(base.name + ".*")):
        worker = path.name[len(base.name) + 1:]
        if worker != "main" and not worker.startswith("gw"):  # not a worker's file (a log beside them)
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            fields = line.split("\t")
            own, kids, wall = (float(v) for v in fields[:3])
            end = float(fields[3]) if len(fields) > 4 else None
            rows.append((worker, own, kids, wall, end, fields[-1]))
    return rows


def _timeline(rows: list) -> None:
    """Per worker, the files in the order run and when each ended (seconds after the earliest test began)."""
    timed = [r for r in rows if r[4] is not None]
    if not timed:
        return
    origin = min(end - wall for _w, _o, _k, wall, end, _n in timed)
    print("timeline per worker (file: CPU-s, ended at s):")
    for worker in sorted({r[0] for r in timed}):
        files: dict = {}
        for _w, own, kids, _wall, end, nodeid in (r for r in timed if r[0] == worker):
            name = nodeid.split("::")[0].rsplit("/", 1)[-1]
            cpu, _last = files.get(name, (0.0, 0.0))
            files[name] = (cpu + own + kids, end - origin)
        ended = max(last for _cpu, last in files.values())
        print(f"  worker {worker}, done at {ended:.0f} s: " +
              ", ".join(f"{name[5:-3]} {cpu:.0f}@{last:.0f}" for name, (cpu, last) in files.items()))


def replay(cpu: Dict[str, float], order: List[str], workers: int = 3, cores: float = 2.0) -> float:
    """Seconds until the last file ends when ``workers`` workers take whole files in ``order`` (each the next one
    when it runs dry, as ``--dist loadfile`` does) and share ``cores`` cores equally, a worker using at most one.

    A model of a CPU-bound run: each file costs its CPU-seconds ``cpu[name]``; waits inside a file (msrun ranks,
    timeouts) are not modelled, so a real run ends somewhat later. No order ends before ``sum(cpu) / cores``.
    """
    queue, running, now = list(order), {}, 0.0
    while queue or running:
        while queue and len(running) < workers:
            name = queue.pop(0)
            running[name] = cpu[name]
        rate = min(1.0, cores / len(running))
        step = min(running.values()) / rate
        now += step
        running = {name: left - step * rate for name, left in running.items() if left - step * rate > 1e-9}
    return now


def _replays(per_file: dict) -> None:
    """The schedule replayed (:func:`replay`) in the order of ``HEAVY_FIRST`` and in two others."""
    from tests.conftest import HEAVY_FIRST

    cpu = {path.rsplit("/", 1)[-1]: value[0] for path, value in per_file.items()}
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    orders = {"HEAVY_FIRST": sorted(cpu, key=lambda n: (rank.get(n, len(rank)), n)),
              "heaviest first": sorted(cpu, key=lambda n: -cpu[n]), "alphabetical": sorted(cpu)}
    print(f"schedule replayed (3 workers, 2 cores; no order ends before {sum(cpu.values()) / 2:.0f} s): " +
          ", ".join(f"{label} {replay(cpu, order):.0f} s" for label, order in orders.items()))


def main(argv: list) -> None:
    base, top = Path(argv[0]), int(argv[1]) if len(argv) > 1 else 25
    rows = _read(base)
    per_worker, per_file = defaultdict(float), defaultdict(lambda: [0.0, 0.0])
    for worker, own, kids, wall, _end, nodeid in rows:
        per_worker[worker] += own + kids
        per_file[nodeid.split("::")[0]][0] += own + kids
        per_file[nodeid.split("::")[0]][1] += wall
    print(f"{len(rows)} tests, {sum(per_worker.values()):.0f} CPU-s in all (tests only, not collection)")
    for worker, cpu in sorted(per_worker.items()):
        print(f"  worker {worker}: {cpu:.0f} CPU-s")
    print("per file (CPU-s, wall-s):")
    for name, (cpu, wall) in sorted(per_file.items(), key=lambda kv: -kv[1][0]):
        print(f"  {cpu:7.1f} {wall:7.1f}  {name}")
    print(f"{top} tests with the most CPU (own + children, wall):")
    for _worker, own, kids, wall, _end, nodeid in sorted(rows, key=lambda r: -(r[1] + r[2]))[:top]:
        print(f"  {own + kids:7.1f} ({own:.1f} + {kids:.1f}) {wall:7.1f}  {nodeid}")
    _timeline(rows)
    _replays(per_file)


if __name__ == "__main__":
    main(sys.argv[1:])

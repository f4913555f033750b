"""Summarise the per-test CPU lines written with ``MS_BOOST_CPU_REPORT=<file>`` (see tests/conftest.py).

Usage: ``python -m tests.helpers.cpu_report <file> [N]`` prints the CPU-seconds per xdist worker and per test
file, and the N (default 25) tests that used the most CPU (own process + child processes).
"""
from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path


def main(argv: list) -> None:
    base, top = Path(argv[0]), int(argv[1]) if len(argv) > 1 else 25
    rows = []
    for path in sorted(base.parent.glob(base.name + ".*")):
        worker = path.name[len(base.name) + 1:]
        for line in path.read_text(encoding="utf-8").splitlines():
            own, kids, wall, nodeid = line.split("\t", 3)
            rows.append((worker, float(own), float(kids), float(wall), nodeid))
    per_worker, per_file = defaultdict(float), defaultdict(lambda: [0.0, 0.0])
    for worker, own, kids, wall, nodeid in rows:
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
    for _worker, own, kids, wall, nodeid in sorted(rows, key=lambda r: -(r[1] + r[2]))[:top]:
        print(f"  {own + kids:7.1f} ({own:.1f} + {kids:.1f}) {wall:7.1f}  {nodeid}")


if __name__ == "__main__":
    main(sys.argv[1:])

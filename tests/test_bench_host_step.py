"""bench/host_step.py: bad arguments are refused by name, and the page renders every cell of every run (from made-up
medians: the measurement itself compiles four train cells and belongs to the benchmark, not the suite)."""
from __future__ import annotations

import pytest

from bench import host_step


@pytest.mark.parametrize("argv, names", [(["--rounds", "1"], "--rounds 1"), (["--repeats", "0"], "--repeats 0"),
                                         (["--trees", "/nonexistent-tree"], "/nonexistent-tree")])
def test_bad_arguments_are_refused_by_name(argv, names, capsys):
    with pytest.raises(SystemExit) as stopped:
        host_step.main(argv)
    assert stopped.value.code == 2
    assert names in capsys.readouterr().err


def test_summary_pairs_each_cell_with_mindspores_round_by_round():
    times = {name: {"main_ms": [1.0, 2.0, 3.0], "wall_ms": [10.0, 20.0, 30.0]} for name in host_step.CELLS}
    times["THOR"]["wall_ms"] = [15.0, 20.0, 60.0]  # ratios 1.5, 1.0, 2.0: median 1.5 (the medians' ratio is 1.33)
    got = host_step.summary(times)
    assert got["mindspore"] == {"main_ms": 2.0, "wall_ms": 20.0, "wall_vs_mindspore": 1.0}
    assert got["THOR"]["wall_vs_mindspore"] == pytest.approx(1.5)
    page = host_step.markdown([{"label": "tree A, process 1", "summary": got}], "python bench/host_step.py", [1, 2, 3])
    assert "## tree A, process 1" in page and "| THOR | 2.000 | 20.00 | 1.500x |" in page
    assert all(f"| {name} |" in page for name in host_step.CELLS)

"""tests/helpers/cpu_report.py's schedule replay, against schedules worked out by hand."""
from __future__ import annotations

import pytest

from tests.helpers.cpu_report import replay


def test_replay_shares_the_cores_between_the_running_workers():
    # three files of 10 CPU-s on three workers and two cores: each runs at 2/3 of a core, all end at 15 s
    assert replay({"a": 10.0, "b": 10.0, "c": 10.0}, ["a", "b", "c"]) == pytest.approx(15.0)
    # one worker: the files one after the other at a whole core; four workers on two cores: the bound
    assert replay({"a": 4.0, "b": 6.0}, ["a", "b"], workers=1) == pytest.approx(10.0)
    assert replay({n: 3.0 for n in "abcd"}, list("abcd"), workers=4) == pytest.approx(6.0)


def test_replay_long_file_last_makes_a_tail_and_first_does_not():
    cpu = {"long": 10.0, "s1": 1.0, "s2": 1.0, "s3": 1.0, "s4": 1.0}
    # long first: the four short files run beside it on the two other workers (1.5 s each pair at 2/3 of a core,
    # the long one gets 2 CPU-s by 3 s), then it runs alone at a whole core: 3 + 8 = 11 s
    assert replay(cpu, ["long", "s1", "s2", "s3", "s4"]) == pytest.approx(11.0)
    # long last: s1-s3 share two cores (1.5 s), then s4 and long (s4 done 1 s later), then long alone: 2.5 + 9
    assert replay(cpu, ["s1", "s2", "s3", "s4", "long"]) == pytest.approx(11.5)
    assert replay(cpu, list(cpu)) >= sum(cpu.values()) / 2

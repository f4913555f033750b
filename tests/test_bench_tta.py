"""The pure parts of the time-to-accuracy benchmark (bench/bench_tta.py): target rule, time to target, medians,
paired ratios, the lr pick and the worker's result parsing. Nothing here is timed."""
from __future__ import annotations

import json

import numpy as np
import pytest

from bench.bench_tta import (
    RESULT_TAG,
    _summary,
    epochs_to_target,
    median_spread,
    paired_ratios,
    parse_result,
    pick_lr,
    steady_and_compile,
    target_accuracy,
    time_to_target,
)


def test_target_is_the_baseline_median_final_accuracy_minus_one_point():
    assert target_accuracy([0.95, 0.97, 0.96]) == pytest.approx(0.95)
    assert target_accuracy([0.90, 0.94]) == pytest.approx(0.91)  # even count: mean of the middle two
    assert target_accuracy([0.9], margin=0.05) == pytest.approx(0.85)
    with pytest.raises(ValueError, match="baseline_finals is empty"):
        target_accuracy([])


def test_epochs_and_time_to_target_count_up_to_the_first_epoch_at_or_above_it():
    acc = [0.5, 0.8, 0.95, 0.93, 0.97]
    secs = [10.0, 1.0, 1.5, 1.0, 2.0]
    assert epochs_to_target(acc, 0.95) == 3  # reached exactly at epoch 3, a later dip does not matter
    assert time_to_target(acc, secs, 0.95) == pytest.approx(12.5)
    assert epochs_to_target(acc, 0.5) == 1 and time_to_target(acc, secs, 0.5) == pytest.approx(10.0)
    assert epochs_to_target(acc, 0.98) is None and time_to_target(acc, secs, 0.98) is None
    with pytest.raises(ValueError, match="accuracy has 5 epochs but epoch_seconds 4"):
        time_to_target(acc, secs[:4], 0.9)


def test_steady_epoch_is_the_median_after_the_first_and_compile_the_excess():
    steady, compile_s = steady_and_compile([12.0, 1.0, 3.0, 2.0])
    assert steady == pytest.approx(2.0) and compile_s == pytest.approx(10.0)
    assert steady_and_compile([1.0, 2.0, 2.0]) == (2.0, 0.0)  # a first epoch faster than steady: no compile
    assert steady_and_compile([5.0]) == (5.0, 0.0)
    with pytest.raises(ValueError, match="epoch_seconds is empty"):
        steady_and_compile([])


def test_median_spread_and_paired_ratios_skip_runs_that_did_not_reach():
    assert median_spread([None, None]) is None
    assert median_spread([3.0, None, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    contender = {0: 5.0, 1: None, 2: 9.0, 3: 4.0}
    baseline = {0: 10.0, 1: 8.0, 2: 6.0, 3: None}
    assert paired_ratios(contender, baseline) == pytest.approx([0.5, 1.5])  # seeds 0 and 2 only


def test_summary_of_a_contender_against_the_target_and_the_baseline():
    runs = {0: {"accuracy": [0.6, 0.92, 0.95], "epoch_seconds": [11.0, 1.0, 1.0], "error": None},
            1: {"accuracy": [0.5, 0.7, 0.85], "epoch_seconds": [12.0, 2.0, 2.0], "error": None},
            2: {"accuracy": [], "epoch_seconds": [], "error": "crashed"}}
    s = _summary(runs, 0.91, {0: 24.0, 1: 20.0, 2: 30.0})
    assert s["failed"] == [2] and s["runs_ok"] == 2 and s["reached"] == 1
    assert s["time_to_target"] == {"median": 12.0, "min": 12.0, "max": 12.0, "n": 1}
    assert s["epochs_to_target"]["median"] == 2
    assert s["ratio_values"] == pytest.approx([0.5])
    assert s["final_accuracy"]["median"] == pytest.approx(0.9)
    assert s["compile_s"]["median"] == pytest.approx(np.median([10.0, 10.0]))


def test_pick_lr_takes_the_best_median_final_accuracy_ties_to_the_smaller():
    assert pick_lr({0.1: [0.9, 0.95, 0.2], 0.05: [0.91, 0.92, 0.93]}) == 0.05  # median 0.90 against 0.92
    assert pick_lr({0.2: [0.9], 0.1: [0.9]}) == 0.1
    with pytest.raises(ValueError, match="final_by_lr is empty"):
        pick_lr({})


def test_parse_result_reads_the_last_tagged_line():
    first = {"accuracy": [0.1], "epoch_seconds": [1.0]}
    last = {"accuracy": [0.5, 0.6], "epoch_seconds": [3.0, 1.0], "rank": 0}
    out = "\n".join(["[WARNING] noise", RESULT_TAG + json.dumps(first), "more", RESULT_TAG + json.dumps(last), ""])
    assert parse_result(out) == last
    with pytest.raises(ValueError, match="no line starting with 'TTA_RESULT' in the worker's output \\(2 lines\\)"):
        parse_result("a\nb")
    with pytest.raises(ValueError, match="lacks 'epoch_seconds'"):
        parse_result(RESULT_TAG + json.dumps({"accuracy": []}))


def _stats(ttt, epochs, compile_s, steady, final):
    return {"time_to_target_by_seed": {str(i): v for i, v in enumerate(ttt)},
            "reached": sum(v is not None for v in ttt),
            "epochs_to_target": median_spread(epochs), "compile_s": median_spread([compile_s]),
            "steady_epoch_s": median_spread([steady]), "final_accuracy": median_spread([final]),
            "ratio": None, "seeds": list(range(len(ttt))), "failed": []}


def test_goal_lines_judge_o1_against_o0_and_thor_against_the_baseline():
    from bench.bench_tta import goal_lines

    o0 = _stats([10.0, 12.0, 11.0], [2, 2, 2], 8.0, 1.0, 0.970)
    o1_fast = _stats([9.0, 12.0, 10.0], [2, 2, 2], 7.0, 1.0, 0.968)  # ratios 0.9, 1.0, 0.91; -0.2 points
    o1_worse = _stats([9.0, 12.0, 10.0], [2, 2, 2], 7.0, 1.0, 0.960)  # as fast, but -1.0 point
    thor = dict(_stats([5.0, 6.0, 7.0], [1, 1, 1], 20.0, 3.0, 0.98), ratio=median_spread([0.5, 0.6, 0.9]))
    payload = {"plan": {"distributed_batch": 256},
               "cells": {"digits/gemm": {"summary": {"baseline": o0, "ms_boost O0": o0, "ms_boost O1": o1_fast,
                                                     "THOR": thor}},
                         "digits/conv": {"summary": {"baseline": o0, "ms_boost O0": o0, "ms_boost O1": o1_worse}}}}
    lines = goal_lines(payload)
    assert len(lines) == 3
    assert lines[0].startswith("- digits/gemm: THOR time to target <= 0.8x the baseline's: **met** (0.60 [0.50, 0.90]x")
    assert "compile 20.0 s vs 8.0 s; steady epoch 3.00x baseline's; epochs to target 1 vs 2" in lines[0]
    assert "O1 time to target <= 1.0x O0's with final accuracy within 0.5 points: **met** (0.91 [0.90, 1.00]x" \
        in lines[1] and "-0.2 points" in lines[1]
    assert "digits/conv: O1" in lines[2] and ": not met (" in lines[2] and "-1.0 points" in lines[2]

"""bench/autotune_process_gap.py: its statistics, sign test and page (fake runs; nothing is timed here)."""
from __future__ import annotations

import math

import pytest

from bench.autotune_process_gap import ARMS, after_trial, epoch_row, pair_ratios, render, sign_test, steady


def test_an_epochs_row_leaves_its_first_step_out():
    row = epoch_row([2.0, 0.010, 0.030, 0.020], [3.0, 0.02, 0.01, 0.04])
    assert row == pytest.approx({"wall": 0.020, "cpu": 0.02, "mean": 0.020})
    assert epoch_row([1.0], [1.0]) is None


def test_the_steady_step_is_the_median_over_epochs_after_the_first():
    run = {"epochs": [{"wall": 9.0}, {"wall": 0.006}, {"wall": 0.005}, {"wall": 0.007}]}
    assert steady(run) == pytest.approx(0.006)  # epoch 1 (the compile's epoch) left out
    assert steady({"epochs": [{"wall": 1.0}]}) is None


def test_the_sign_test_against_an_exact_binomial():
    assert sign_test(5, 10) == 1.0
    assert sign_test(10, 10) == pytest.approx(2 / 1024)
    assert sign_test(0, 10) == pytest.approx(2 / 1024)
    # 8 of 10: P(X >= 8) = (45 + 10 + 1) / 1024, two-sided twice that
    assert sign_test(8, 10) == pytest.approx(2 * 56 / 1024)
    assert sign_test(2, 10) == sign_test(8, 10)
    assert sign_test(0, 0) == 1.0
    assert math.isclose(sign_test(9, 10), 2 * 11 / 1024)


def _run(ms, arm="fixed"):
    rows = [{"wall": 1.0, "cpu": 1.0, "gc_seconds": [0.0, 0.0, 0.0], "gc_count": [0, 0, 0], "rss_mib": 500.0,
             "threads": 9.0}] + [{"wall": ms / 1e3, "cpu": 2 * ms / 1e3, "gc_seconds": [0.001, 0.0, 0.002],
                                  "gc_count": [5, 1, 1], "rss_mib": 510.0, "threads": 9.0}] * 3
    return {"arm": arm, "epochs": rows, "after_trial": {"objects": 1000.0}}


def test_pairs_are_compared_with_the_fixed_run_of_the_same_pair_and_the_page_counts_them():
    pairs = [{"seed": i, "order": ["fixed", "auto"], "fixed": _run(5.0), "auto": _run(a, "auto")}
             for i, a in enumerate([6.0, 7.0, 4.0])]
    pairs.append({"seed": 3, "order": ["auto", "fixed"], "fixed": _run(5.0), "auto": {"error": "exit 1"}})
    payload = {"arms": ["fixed", "auto"], "epochs": 4, "pairs": pairs, "command": "python bench/x.py",
               "load_before": [1, 1, 1], "load_after": [1, 1, 1]}
    assert pair_ratios(payload, "auto") == pytest.approx([1.2, 1.4, 0.8])  # the failed pair is left out
    page = render(payload)
    assert "| auto | 3 | 1.200x [0.800, 1.400] | 2 of 3 | 1.000 |" in page
    assert "| fixed | 4 | (the reference) |" in page and "| 5.00 [5.00, 5.00] |" in page
    # 3 later epochs x 7 runs (4 fixed, 3 auto: the failed one has none) of [5, 1, 1] collections
    assert "generation 0: 105, 1: 21, 2: 21." in page
    assert "3.0 ms, 1 gen2" in page  # the collector's 3 ms an epoch inside the steps, one gen-2 collection
    assert "failed" in page


def test_every_arm_is_known_and_bad_actions_are_named():
    assert {"fixed", "auto"} <= set(ARMS)
    assert all(contender in ("ms_boost O0", "ms_boost auto") for contender, _ in ARMS.values())
    assert set(after_trial(("collect",))) == {"collect"}
    with pytest.raises(ValueError, match="action='sweep'"):
        after_trial(("sweep",))

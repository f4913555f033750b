"""bench/autotune_step_gap.py: its per-epoch statistics and its page (fake runs; nothing is timed here)."""
from __future__ import annotations

import numpy as np
import pytest

from bench.autotune_step_gap import AUTO, epoch_ratios, epoch_stats, render


def test_an_epochs_statistic_leaves_its_first_step_out_and_takes_medians():
    walls = [3.0, 0.010, 0.030, 0.020, 0.012]  # the first: a new iterator's first batch (or the compile)
    cpus = [5.0, 0.02, 0.01, 0.04, 0.03]
    assert epoch_stats(walls, cpus) == pytest.approx([np.median(walls[1:]), np.median(cpus[1:])])
    assert epoch_stats(walls, cpus)[0] == pytest.approx(0.016)  # (0.012 + 0.020) / 2, not pulled up by 3.0
    assert epoch_stats([1.0], [1.0]) is None  # one step: nothing steady to measure


def test_the_ratios_pair_epochs_both_measured_auto_over_fixed():
    fixed = [[0.010, 0.020], None, [0.020, 0.040], [0.010, 0.0]]
    auto = [[0.011, 0.018], [0.5, 0.5], None, [0.012, 0.010]]
    assert epoch_ratios(fixed, auto, 0) == pytest.approx([1.1, 1.2])  # epochs 0 and 3 (1 and 2 lack one side)
    assert epoch_ratios(fixed, auto, 1) == pytest.approx([0.9])  # epoch 3's fixed CPU 0 is not divided by


def test_the_page_gives_per_seed_and_pooled_ratios():
    fixed_name = "ms_boost O0"
    state = {"cells": 100.0, "threads": 9.0, "rss_mib": 500.0}

    def run(ratio):
        fixed = [[0.010, 0.020]] * 4
        return {"pick": "O0", "probed": ["O0"], "trial_seconds": 3.0, "state_before": state,
                "state_after_trial": state, "state_end": state,
                "epochs": {fixed_name: fixed, AUTO: [[f[0] * ratio, f[1] * ratio] for f in fixed]}}

    payload = {"cell": "mnist5k/gemm", "train": 3000, "epochs": 4, "seeds": [0, 1], "fixed": fixed_name,
               "options": {}, "command": "python bench/autotune_step_gap.py",
               "load_before": [1, 1, 1], "load_after": [1, 1, 1], "runs": {"0": run(1.1), "1": run(0.9)}}
    page = render(payload)
    assert "| 0 | O0 (O0) | 3.0 | 1.100x [1.100, 1.100] | 1.100x [1.100, 1.100] |" in page
    assert "| 1 | O0 (O0) | 3.0 | 0.900x [0.900, 0.900] |" in page
    # pooled over the 8 epoch pairs: median of four 1.1 and four 0.9 is 1.0; auto slower in 4 of 8
    assert "(8 pairs): wall 1.000x [0.900, 1.100]" in page and "slower in 4 of 8 pairs" in page


def test_the_cells_alone_train_the_same_batches_alternating_and_the_page_pools_their_rounds():
    from bench.autotune_step_gap import time_cells

    class Rows:  # a data set of 12 batches, of which 10 are read once
        def create_tuple_iterator(self, num_epochs, output_numpy):
            assert (num_epochs, output_numpy) == (1, True)
            return iter([(np.full((2, 3), i, np.float32), np.array([i, i], np.int32)) for i in range(12)])

    calls = []

    class Loss:
        def asnumpy(self):
            return np.float32(0.0)

    def cell(name):
        def step(x, y):
            calls.append((name, float(x.asnumpy()[0, 0]), int(y.asnumpy()[0])))
            return Loss()
        return step

    got = time_cells({"fixed": cell("fixed"), AUTO: cell(AUTO)}, Rows(), rounds=3)
    assert {k: len(v) for k, v in got.items()} == {"fixed": 3, AUTO: 3}  # one [wall, cpu] a round and cell
    assert all(len(pair) == 2 and pair[0] >= 0 for v in got.values() for pair in v)
    batches = [(float(i), i) for i in range(10)]
    assert calls == ([("fixed", *b) for b in batches] + [(AUTO, *b) for b in batches]  # round 0: fixed first
                     + [(AUTO, *b) for b in batches] + [("fixed", *b) for b in batches]  # round 1: swapped
                     + [("fixed", *b) for b in batches] + [(AUTO, *b) for b in batches])
    state = {"cells": 1.0, "threads": 1.0, "rss_mib": 1.0}
    run = {"pick": "O0", "probed": ["O0"], "trial_seconds": 1.0, "state_before": state, "state_after_trial": state,
           "state_end": state, "epochs": {"fixed": [[0.01, 0.01]], AUTO: [[0.01, 0.01]]},
           "cells": {"fixed": [[0.010, 0.02]] * 3, AUTO: [[0.009, 0.02], [0.011, 0.02], [0.012, 0.03]]}}
    payload = {"cell": "c/n", "train": 1, "epochs": 1, "seeds": [0], "fixed": "fixed", "options": {},
               "command": "x", "load_before": [0, 0, 0], "load_after": [0, 0, 0], "runs": {"0": run}}
    page = render(payload)
    assert "3 rounds): auto's cell over the fixed Model's, median step wall 1.100x [0.900, 1.200], CPU 1.000x " \
           "[1.000, 1.500]; auto's slower in 2 (wall), 1 (CPU) of 3 rounds." in page

"""The pure parts of the time-to-accuracy benchmark (bench/bench_tta.py): target rule, time to target, medians,
paired ratios, the lr pick and the worker's result parsing. Nothing here is timed."""
from __future__ import annotations

import json
from pathlib import Path

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
    steady_time_to_target,
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
    base = {0: {"accuracy": [0.5, 0.8, 0.93], "epoch_seconds": [6.0, 2.0, 2.0], "error": None},  # 3 epochs
            1: {"accuracy": [0.5, 0.95, 0.96], "epoch_seconds": [5.0, 3.0, 3.0], "error": None},
            2: {"accuracy": [0.5, 0.95, 0.96], "epoch_seconds": [5.0, 3.0, 3.0], "error": None}}
    assert steady_time_to_target(runs[0]["accuracy"], runs[0]["epoch_seconds"], 0.91) == pytest.approx(2.0)
    s = _summary(runs, 0.91, base)
    assert s["failed"] == [2] and s["runs_ok"] == 2 and s["reached"] == 1
    # seed 0: steady 2 s (12 s with its 10 s compile) against the baseline's 6 s (10 s with its 4 s compile)
    assert s["time_to_target"] == {"median": 2.0, "min": 2.0, "max": 2.0, "n": 1}
    assert s["time_to_target_with_compile"]["median"] == pytest.approx(12.0)
    assert s["ratio_values"] == pytest.approx([2.0 / 6.0])
    assert s["ratio_with_compile"]["median"] == pytest.approx(12.0 / 10.0)
    assert s["epochs_to_target"]["median"] == 2
    assert s["final_accuracy"]["median"] == pytest.approx(0.9)
    assert s["compile_s"]["median"] == pytest.approx(10.0)


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
    payload = {"plan": {"distributed_batch": 256, "datasets": ["digits"]},
               "cells": {"digits/gemm": {"summary": {"baseline": o0, "ms_boost O0": o0, "ms_boost O1": o1_fast,
                                                     "THOR": thor}},
                         "digits/conv": {"summary": {"baseline": o0, "ms_boost O0": o0, "ms_boost O1": o1_worse}}}}
    lines = goal_lines(payload)
    assert len(lines) == 6
    assert lines[3].startswith("- MNIST-5k: **not measured**") and "O2 (AdaSum)" in lines[4]
    assert "DimReduce stage 2" in lines[5] and "**not measured**" in lines[5]
    assert lines[0].startswith("- digits/gemm: THOR time to target <= 0.8x the baseline's: **met** (0.60 [0.50, 0.90]x")
    assert "compile 20.0 s vs 8.0 s; steady epoch 3.00x baseline's; epochs to target 1 vs 2" in lines[0]
    assert "O1 time to target <= 1.0x O0's with final accuracy within 0.5 points: **met** (0.91 [0.90, 1.00]x" \
        in lines[1] and "-0.2 points" in lines[1]
    assert "digits/conv: O1" in lines[2] and ": not met (" in lines[2] and "-1.0 points" in lines[2]


def test_page_and_readme_rows_from_runs_state_not_reached():
    from bench.bench_tta import readme_table, render_page, summarize_cell

    def run(acc, secs):
        return {"accuracy": acc, "epoch_seconds": secs, "error": None}

    cell = {"target": 0.9, "baseline_lr": 0.05, "grids": {"baseline": {"finals": {"0.05": [0.91]}, "picked": 0.05}},
            "curves": {"baseline": {"0": run([0.5, 0.92], [5.0, 2.0])},
                       "ms_boost O1": {"0": run([0.5, 0.95], [9.0, 1.0])},
                       "THOR": {"0": run([0.6, 0.85], [20.0, 4.0])}}}
    summarize_cell(cell)
    payload = {"plan": {"datasets": ["digits"], "image_size": 16, "width": {"gemm": 8}, "epochs": {"gemm": 2},
                        "seeds": [0], "grid_seeds": [0], "baseline_lrs": [0.05], "distributed_batch": 256},
               "cells": {"digits/gemm": cell}, "mode": "graph", "quick": True, "load_before": [1.0],
               "load_after": [2.0]}
    rows = readme_table(payload)
    assert rows[2] == "| ms_boost O1 | 0.50x |"  # steady: 1 s against the baseline's 2 s
    assert rows[3] == "| THOR | not reached (final 0.850) |"
    page = render_page(payload, "python bench/bench_tta.py --quick", [1.0], 60.0)
    assert "**Not reached** on every seed: THOR (0/1 seeds)" in page
    # no O0 run: the baseline (the same computation) stands in for it, and the line says so
    assert "O1 time to target <= 1.0x O0's with final accuracy within 0.5 points: **met** (0.50x O0's time; final " \
           "accuracy +3.0 points against O0" in page and "the baseline (plain Model, the same computation) stands in" \
           in page
    assert "THOR time to target <= 0.8x the baseline's: not reached" in page


def test_trajectory_steps_spread_over_the_second_half_of_stage_1():
    from bench.bench_tta import trajectory_steps

    steps = trajectory_steps(3, 46, 32)  # second half: epochs 2-3 = steps 47..138, 92 steps, every 92 // 36 = 2
    assert steps[0] == 48 and steps[-1] == 138 and all(b - a == 2 for a, b in zip(steps, steps[1:]))
    assert len(steps) == 46 >= 33
    assert trajectory_steps(1, 10, 8) == list(range(1, 11))  # one epoch: all of it, every step
    with pytest.raises(ValueError, match="n_component=32 needs at least 33 saved weights, but the second half of "
                                         "stage 1 has 20 steps"):
        trajectory_steps(2, 20, 32)


def test_dim_reduce_summary_pairs_the_baseline_tail_with_stage_2_of_each_seed():
    from bench.bench_tta import dim_reduce_goal, dim_reduce_summary

    def run(acc, secs, build=0.0, error=None):
        return {"accuracy": acc, "epoch_seconds": secs, "build_seconds": build, "error": error}

    # the baseline: stage 1 = epochs 1-2, the annealed continuation = epoch 3
    runs = {"0": {"baseline": run([0.8, 0.9, 0.95], [5.0, 1.0, 2.0]), "dim_reduce": run([0.96], [9.0], 1.0)},
            "1": {"baseline": run([0.8, 0.85, 0.94], [5.0, 1.0, 4.0]), "dim_reduce": run([0.93], [8.0])},
            "2": {"baseline": run([], [], error="crashed")}}
    s = dim_reduce_summary(runs, 1)
    assert s["ok"] == ["0", "1"] and s["seeds"] == ["0", "1", "2"]
    row = s["by_seed"]["0"]
    assert row["stage1"] == 0.9 and row["annealed"] == 0.95 and row["dim_reduce"] == 0.96
    assert row["diff_points"] == pytest.approx(1.0) and row["annealed_s"] == 2.0 and row["dim_reduce_s"] == 10.0
    assert s["by_seed"]["1"]["diff_points"] == pytest.approx(-1.0) and s["by_seed"]["1"]["time_ratio"] == 2.0
    assert s["diff_points"]["median"] == pytest.approx(0.0) and s["time_ratio"]["median"] == pytest.approx(3.5)
    assert dim_reduce_goal(s).endswith("not met: 0.00 [-1.00, 1.00] points at equal steps (median [min, max] over 2 "
                                       "seeds), in 3.50 [2.00, 5.00]x the continuation's wall time (PCA and compile "
                                       "included); at equal wall time the continuation would have had that much "
                                       "more time.")
    above = dim_reduce_summary({"0": runs["0"]}, 1)
    assert "not met at equal wall time (above at equal steps, but slower): 1.00 points" in dim_reduce_goal(above)
    assert "**not measured**" in dim_reduce_goal(dim_reduce_summary({"2": runs["2"]}, 1))
    with pytest.raises(ValueError, match="seed 0: the baseline ran 3 epochs, not more than epochs2=3"):
        dim_reduce_summary({"0": runs["0"]}, 3)


def test_select_restricts_the_plan_and_refuses_unknown_names():
    from bench.bench_tta import FULL, select

    plan = select(FULL, datasets=["mnist5k"], nets=["gemm"], contenders=["THOR", "DimReduce"], seeds=[1, 2])
    assert plan.datasets == ("mnist5k",) and plan.nets == ("gemm",) and plan.contenders == ("THOR",)
    assert plan.dim_reduce_nets == FULL.dim_reduce_nets and plan.seeds == (1, 2) and plan.grid_seeds == (1,)
    assert select(FULL, contenders=["ms_boost O1"]).dim_reduce_nets == ()
    from bench.bench_tta import QUICK

    assert "ms_boost O2 x2" not in QUICK.contenders  # msrun jobs: in the quick form only when asked
    assert select(QUICK, contenders=["ms_boost O2 x2", "data parallel x2"]).contenders == (
        "data parallel x2", "ms_boost O2 x2")
    with pytest.raises(ValueError, match=r"--contenders \['O1'\] not allowed; allowed: \["):
        select(FULL, contenders=["O1"])
    with pytest.raises(ValueError, match=r"--datasets \['mnist'\] not allowed"):
        select(FULL, datasets=["mnist"])


def test_thor_goal_says_when_only_the_steady_time_meets_it():
    from bench.bench_tta import goal_lines

    base = _stats([10.0, 12.0, 11.0], [3, 3, 3], 1.0, 3.0, 0.95)
    thor = dict(_stats([5.0, 6.0, 7.0], [2, 2, 2], 30.0, 3.0, 0.99), ratio=median_spread([0.5, 0.6, 0.7]),
                ratio_with_compile=median_spread([1.0, 1.1, 1.2]))
    payload = {"plan": {"datasets": ["digits"]}, "cells": {"digits/conv": {"summary": {"baseline": base,
                                                                                       "THOR": thor}}}}
    line = goal_lines(payload)[0]
    assert line.startswith("- digits/conv: THOR time to target <= 0.8x the baseline's: **met** in steady time, not "
                           "with the compile (0.60 [0.50, 0.70]x; with compile 1.10 [1.00, 1.20]x; compile 30.0 s")


def test_payload_from_partial_keeps_finished_cells_and_the_seeds_a_stopped_contender_ran(tmp_path):
    from bench.bench_tta import payload_from_partial

    def run(seed, lr, contender):
        return {"accuracy": [0.9], "epoch_seconds": [2.0], "error": None, "wall_seconds": 10.0,
                "spec": {"seed": seed, "lr": lr, "contender": contender}}

    base = {str(s): run(s, 0.1, "baseline") for s in (0, 1, 2)}
    partial = {"plan": {"contenders": ["ms_boost O1", "THOR"], "datasets": ["mnist5k"]}, "mode": "graph",
               "cells": {"mnist5k/gemm": {"target": 0.9, "curves": {"baseline": base},
                                          "runs": {"baseline": list(base.values()),
                                                   "ms_boost O1": [run(0, 0.1, "ms_boost O1")]}},
                         "mnist5k/conv": {"runs": {"baseline": [run(0, 0.02, "baseline")]}}}}
    path = tmp_path / "x.partial.json"
    path.write_text("{}")
    payload = payload_from_partial(partial, "python bench/bench_tta.py --quick", path)
    assert list(payload["cells"]) == ["mnist5k/gemm"]  # the conv cell's baseline grid never finished
    assert list(payload["cells"]["mnist5k/gemm"]["curves"]["ms_boost O1"]) == ["0"]
    assert payload["plan"]["contenders"] == ["ms_boost O1"] and payload["quick"] is True
    assert payload["seconds"] == 50.0


def test_paired_order_runs_every_name_once_per_seed_rotated_by_one_each_seed():
    from bench.bench_tta import paired_order

    rounds = paired_order(["baseline", "a", "b"], [0, 1, 2, 3])
    assert rounds == [(0, ["baseline", "a", "b"]), (1, ["a", "b", "baseline"]), (2, ["b", "baseline", "a"]),
                      (3, ["baseline", "a", "b"])]
    # over len(names) seeds every name runs once at every position
    positions = {name: sorted(order.index(name) for _, order in rounds[:3]) for name in ("baseline", "a", "b")}
    assert positions == {"baseline": [0, 1, 2], "a": [0, 1, 2], "b": [0, 1, 2]}
    assert paired_order(["x"], [5, 7]) == [(5, ["x"]), (7, ["x"])]
    with pytest.raises(ValueError, match="names is empty"):
        paired_order([], [0])


def _fake_runs(monkeypatch, finals_by_lr):
    """run_plan without processes or data: every launch is recorded as (contender, lr, seed) and returns a
    two-epoch curve whose final accuracy depends on its lr only."""
    import bench.bench_tta as tta
    from model_zoo.resnet.src import real_data

    calls = []

    def launch(spec, root, timeout):
        calls.append((spec.contender, spec.lr, spec.seed))
        return {"accuracy": [0.5, finals_by_lr.get(spec.lr, 0.8)], "epoch_seconds": [3.0, 1.0], "error": None,
                "wall_seconds": 1.0}

    monkeypatch.setattr(tta, "launch", launch)
    monkeypatch.setattr(real_data, "ensure_real", lambda name, image_size=32: Path("unused"))
    return calls


def _small_plan(**kw):
    from bench.bench_tta import Plan

    return Plan(**{**dict(datasets=("digits",), nets=("gemm",), seeds=(0, 1, 2), epochs={"gemm": 2, "conv": 2},
                          image_size=16, baseline_lrs=(0.05, 0.1), contenders=("ms_boost O0", "THOR"),
                          contender_lr_factors=(1.0, 2.0), thor_lrs=(0.05,), thor_dampings=(0.03,),
                          width={"gemm": 8, "conv": 8}, grid_seeds=(0,), dim_reduce_nets=("gemm",),
                          dim_reduce_epochs=1, n_component=2), **kw})


def test_run_plan_runs_the_grids_then_each_seed_paired_with_the_order_rotated(monkeypatch):
    from bench.bench_tta import run_plan

    calls = _fake_runs(monkeypatch, {0.05: 0.9, 0.1: 0.95})
    payload = run_plan(_small_plan(), timeout=10)
    assert calls == [
        # the grids on seed 0: the baseline's picks 0.1; O0's (0.1, 0.2) picks 0.1; THOR's one point runs nothing
        ("baseline", 0.05, 0), ("baseline", 0.1, 0), ("ms_boost O0", 0.1, 0), ("ms_boost O0", 0.2, 0),
        # the paired rounds at the picks (seed 0 run again), each seed's DimReduce stage 2 after its round
        ("baseline", 0.1, 0), ("ms_boost O0", 0.1, 0), ("THOR", 0.05, 0), ("DimReduce stage 2", 1.0, 0),
        ("ms_boost O0", 0.1, 1), ("THOR", 0.05, 1), ("baseline", 0.1, 1), ("DimReduce stage 2", 1.0, 1),
        ("THOR", 0.05, 2), ("baseline", 0.1, 2), ("ms_boost O0", 0.1, 2), ("DimReduce stage 2", 1.0, 2)]
    cell = payload["cells"]["digits/gemm"]
    assert payload["order"] == "paired" and cell["order"]["1"] == ["ms_boost O0", "THOR", "baseline"]
    assert list(cell["curves"]) == ["baseline", "ms_boost O0", "THOR"]
    assert all(sorted(runs) == [0, 1, 2] and all(r["phase"] == "paired" for r in runs.values())
               for runs in cell["curves"].values())
    assert cell["baseline_lr"] == 0.1 and cell["target"] == pytest.approx(0.94)
    assert cell["grids"]["baseline"]["finals"] == {"0.05": [0.9], "0.1": [0.95]}
    # THOR's one-point grid shows the paired runs' finals, on every seed
    assert cell["grids"]["THOR {'damping': 0.03}"] == {"finals": {"0.05": [0.9, 0.9, 0.9]}, "picked": 0.05}
    assert sorted(cell["dim_reduce"]["runs"]) == ["0", "1", "2"]
    assert cell["dim_reduce"]["runs"]["1"]["baseline"] is cell["curves"]["baseline"][1]
    assert "DimReduce stage 2" not in cell["curves"]
    assert cell["summary"]["ms_boost O0"]["ratio_values"] == [1.0, 1.0, 1.0]


def test_run_plan_reuse_grid_runs_takes_the_grid_run_at_the_pick_for_seed_0(monkeypatch):
    from bench.bench_tta import run_plan

    calls = _fake_runs(monkeypatch, {0.05: 0.9, 0.1: 0.95})
    payload = run_plan(_small_plan(dim_reduce_nets=()), timeout=10, reuse_grid_runs=True)
    assert calls[4:] == [("THOR", 0.05, 0), ("ms_boost O0", 0.1, 1), ("THOR", 0.05, 1), ("baseline", 0.1, 1),
                         ("THOR", 0.05, 2), ("baseline", 0.1, 2), ("ms_boost O0", 0.1, 2)]
    cell = payload["cells"]["digits/gemm"]
    assert cell["curves"]["baseline"][0]["phase"] == "grid" and cell["curves"]["baseline"][0]["spec"]["lr"] == 0.1
    assert payload["reuse_grid_runs"] is True


def test_drift_check_is_o0_steady_epoch_over_the_baseline_per_seed_and_the_page_states_the_order():
    from bench.bench_tta import drift_lines, render_page, steady_ratio_by_seed, summarize_cell

    def run(secs, error=None):
        return {"accuracy": [0.5, 0.95, 0.96][:len(secs)], "epoch_seconds": secs, "error": error}

    cell = {"target": 0.9, "baseline_lr": 0.1, "grids": {"baseline": {"finals": {"0.1": [0.96]}, "picked": 0.1}},
            "curves": {"baseline": {"0": run([5.0, 1.0, 1.2]), "1": run([5.0, 2.0, 2.0]), "2": run([5.0, 1.0])},
                       "ms_boost O0": {"0": run([4.0, 1.1, 1.1]), "1": run([6.0, 1.0, 3.0]),
                                       "2": run([], error="crashed")}}}
    # steady epoch = the median of epochs 2..: seed 0 1.1 / 1.1, seed 1 2.0 / 2.0; seed 2 failed
    assert steady_ratio_by_seed(cell, "ms_boost O0", "baseline") == {0: pytest.approx(1.0), 1: pytest.approx(1.0)}
    cell["curves"]["ms_boost O0"]["0"] = run([4.0, 1.32, 1.32])
    assert steady_ratio_by_seed(cell, "ms_boost O0", "baseline")[0] == pytest.approx(1.2)
    assert steady_ratio_by_seed(cell, "THOR", "baseline") == {}
    summarize_cell(cell)
    conv = {"target": 0.9, "curves": {"baseline": {"0": run([5.0, 1.0])}}}
    payload = {"plan": {"datasets": ["digits"], "image_size": 16, "width": {"gemm": 8}, "epochs": {"gemm": 3},
                        "seeds": [0, 1, 2], "grid_seeds": [0], "baseline_lrs": [0.1], "distributed_batch": 256},
               "cells": {"digits/gemm": cell, "digits/conv": conv}, "mode": "graph", "quick": True,
               "load_before": [1.0], "load_after": [2.0], "order": "paired", "reuse_grid_runs": False}
    assert drift_lines(payload)[0].endswith("much): digits/gemm: seed 0 1.20x, seed 1 1.00x; digits/conv: O0 not "
                                            "run.")
    del payload["cells"]["digits/conv"]
    page = render_page(payload, "python bench/bench_tta.py --quick", [1.0], 60.0)
    assert "then the **paired rounds**: seed by seed" in page and "the rounds run seed(s) [0] again" in page
    assert "**Drift check**" in page
    del payload["order"]
    assert "**Run order** (an older run): the baseline's lr grid and its picked lr on every seed first" in \
        render_page(payload, "python bench/bench_tta.py --quick", [1.0], 60.0)


def test_a_driver_stopped_in_the_paired_rounds_renders_the_seeds_each_contender_ran(monkeypatch, tmp_path):
    import bench.bench_tta as tta
    from bench.bench_tta import payload_from_partial, render_page, run_plan

    calls = _fake_runs(monkeypatch, {0.05: 0.9, 0.1: 0.95})
    recorded = tta.launch

    def stop_after_eight(spec, root, timeout):  # the 4 grid runs, seed 0's round, then seed 1's first run
        if len(calls) == 8:
            raise RuntimeError("stopped")
        return recorded(spec, root, timeout)

    monkeypatch.setattr(tta, "launch", stop_after_eight)
    partial = tmp_path / "t.partial.json"
    with pytest.raises(RuntimeError, match="stopped"):
        run_plan(_small_plan(dim_reduce_nets=()), timeout=10, partial=partial)
    payload = payload_from_partial(json.loads(partial.read_text()), "python bench/bench_tta.py --quick", partial)
    cell = payload["cells"]["digits/gemm"]
    assert {name: sorted(runs) for name, runs in cell["curves"].items()} == {
        "baseline": ["0"], "ms_boost O0": ["0", "1"], "THOR": ["0"]}  # O0's grid runs are not taken as curves
    tta.summarize_cell(cell)
    assert cell["summary"]["ms_boost O0"]["seeds"] == ["0", "1"] and cell["target"] == pytest.approx(0.94)
    assert "| ms_boost O0 | 2/2 |" in render_page(payload, payload["command"], [], payload["seconds"])


def test_thor_tta_grid_labels_keep_the_first_pages_names_at_block_64():
    from bench.thor_tta_grid import thor_name

    assert thor_name(10, 0.05) == "THOR f10 lr0.05" == thor_name(10, 0.05, 64)  # the first pages' keys
    assert thor_name(25, 0.1, 32) == "THOR f25 lr0.1 b32"
    assert thor_name(10, 0.05, 64, 1.0) == "THOR f10 lr0.05" and thor_name(10, 0.05, 64, 0.5) == "THOR f10 lr0.05 s0.5"


def test_thor_tta_grid_labels_say_the_schedule_length_except_the_first_pages_own():
    from bench.thor_tta_grid import baseline_name, schedule_epochs, shown_name, thor_name

    assert thor_name(10, 0.05, 64, 1.0, 4) == "THOR f10 lr0.05"  # the page's 4 epochs: the old key (resume)
    assert thor_name(10, 0.05, 64, 1.0, 2) == "THOR f10 lr0.05 e2"
    assert thor_name(10, 0.1, 32, 0.5, 3) == "THOR f10 lr0.1 b32 s0.5 e3"
    assert baseline_name(0.1, 4) == "baseline" and baseline_name(0.2, 3) == "baseline lr0.2 e3"
    assert baseline_name(0.1, 2) == "baseline lr0.1 e2" and baseline_name(0.2, 4) == "baseline lr0.2 e4"
    assert [schedule_epochs(n) for n in ("baseline", "THOR f10 lr0.05", "THOR f10 lr0.05 e2", "baseline lr0.2 e3")] \
        == [4, 4, 2, 3]
    assert shown_name("baseline") == "baseline lr0.1 e4"
    assert shown_name("THOR f10 lr0.05") == "THOR f10 lr0.05 e4" and shown_name("THOR f10 lr0.05 e2") == \
        "THOR f10 lr0.05 e2"


def _grid_run(acc, cpu):
    return {"accuracy": acc, "epoch_seconds": cpu, "epoch_cpu_seconds": cpu, "error": ""}


def test_thor_tta_grid_schedule_ratios_to_the_page_and_the_best_baseline_by_hand():
    from bench.thor_tta_grid import best_baseline, epoch_ratios, run_key, summarize, target_setting

    runs = {  # target: median(0.96, 0.98) - 0.01 = 0.96
        ("baseline", 0): _grid_run([0.5, 0.8, 0.9, 0.96], [5, 1, 1, 1]),  # 4 epochs: 8 - compile 4 = 4 s
        ("baseline", 1): _grid_run([0.5, 0.8, 0.965, 0.98], [5, 1, 1, 1]),  # 3 epochs: 3 s
        ("baseline lr0.2 e3", 0): _grid_run([0.6, 0.9, 0.965], [4, 1, 1]),  # 3 epochs: 3 s
        ("baseline lr0.2 e3", 1): _grid_run([0.6, 0.96, 0.97], [4, 1, 1]),  # 2 epochs: 2 s -> median 2.5: best
        ("baseline lr0.1 e2", 0): _grid_run([0.7, 0.95], [4, 1]),  # never: not a candidate for the best
        ("baseline lr0.1 e2", 1): _grid_run([0.7, 0.97], [4, 1]),  # 2 epochs: 2 s
        ("THOR f10 lr0.1 e2", 0): _grid_run([0.8, 0.97], [20, 2]),  # steady 2, compile 18: 2 epochs, 4 s
        ("THOR f10 lr0.1 e2", 1): _grid_run([0.965, 0.98], [20, 2]),  # 1 epoch: 2 s
        ("THOR f10 lr0.1 e1", 0): _grid_run([0.96], [21]),  # steady from the e2 run of seed 0: 1 x 2 s
        ("THOR f10 lr0.1 e1", 1): _grid_run([0.9], [21]),  # never
    }
    runs = {run_key("digits", n, s): r for (n, s), r in runs.items()}
    names = ["baseline", "baseline lr0.2 e3", "baseline lr0.1 e2", "THOR f10 lr0.1 e2", "THOR f10 lr0.1 e1"]
    out = summarize(runs, "digits", names, [0, 1])
    assert out["target"] == pytest.approx(0.96) and out["best_baseline"] == "baseline lr0.2 e3"
    rows = out["rows"]
    assert rows["baseline"]["cpu_to_target"]["median"] == pytest.approx(3.5)
    assert rows["baseline lr0.1 e2"]["reached"] == 1 and rows["baseline lr0.1 e2"]["epochs"] == 2
    thor2 = rows["THOR f10 lr0.1 e2"]
    assert thor2["ratio_values"] == pytest.approx([1.0, 2 / 3])  # to the page's baseline: 4/4, 2/3
    assert thor2["ratio_best_values"] == pytest.approx([4 / 3, 1.0])  # to the best: 4/3, 2/2
    assert thor2["epochs_ratio_best"]["median"] == pytest.approx((2 / 3 + 1 / 2) / 2)
    assert thor2["modelled_ratio_best"]["median"] == pytest.approx(1.53 * (2 / 3 + 1 / 2) / 2)  # digits' 1.53x
    thor1 = rows["THOR f10 lr0.1 e1"]
    assert thor1["reached"] == 1 and thor1["steady_cpu_s"]["median"] == pytest.approx(2.0)
    assert thor1["cpu_to_target"]["median"] == pytest.approx(2.0) and thor1["ratio_best_values"] == \
        pytest.approx([2 / 3])
    assert rows["baseline lr0.2 e3"]["modelled_ratio_best"]["median"] == pytest.approx(1.0)  # no THOR factor
    assert out["best_baseline_by_epochs"] == "baseline lr0.2 e3"  # epochs 3, 2 against the page's 4, 3
    # the most seeds first (a THOR setting is never a candidate); none reached: None
    assert best_baseline({"baseline": {0: 3.0, 1: None}, "baseline lr0.2 e3": {0: 2.0, 1: None},
                          "baseline lr0.1 e2": {0: None, 1: None}, "THOR f10 lr0.1": {0: 1.0, 1: 1.0}}, [0, 1]) \
        == "baseline lr0.2 e3"
    assert best_baseline({"baseline": {0: 1.0, 1: None}, "baseline lr0.2 e3": {0: 3.0, 1: 3.0}}, [0, 1]) == \
        "baseline lr0.2 e3"
    assert best_baseline({"baseline": {0: None}, "THOR f10 lr0.1": {0: 1.0}}, [0]) is None
    # the same median: the lower mean wins; then the first
    assert best_baseline({"baseline": {0: 3, 1: 3, 2: 4}, "baseline lr0.1 e3": {0: 3, 1: 3, 2: 2}}, [0, 1, 2]) == \
        "baseline lr0.1 e3"
    assert best_baseline({"baseline": {0: 3, 1: 3}, "baseline lr0.1 e3": {0: 3, 1: 3}}, [0, 1]) == "baseline"
    assert epoch_ratios({0: 2, 1: None, 2: 1}, {0: 3, 1: 3, 2: None}) == pytest.approx([2 / 3])
    # the target from another baseline setting (the page's pick on MNIST-5k: lr 0.2): median(0.965, 0.97) - 0.01
    other = summarize(runs, "digits", names, [0, 1], target_name="baseline lr0.2 e3")
    assert other["target"] == pytest.approx(0.9575) and other["target_setting"] == "baseline lr0.2 e3"
    assert other["rows"]["baseline lr0.2 e3"]["ratio_values"] == pytest.approx([1.0, 1.0])
    assert target_setting("mnist5k", True) == "baseline lr0.2 e4" and target_setting("digits", True) == "baseline"
    assert target_setting("mnist5k", False) == "baseline"  # a first page's target: as it was


def test_worker_gives_thor_the_block_size_of_extra_and_refuses_other_keys():
    from mindspore import nn

    from bench.bench_tta import RunSpec, _model
    from ms_boost.thor.assignment import DEFAULT_BLOCK_SIZE

    net = nn.SequentialCell([nn.Flatten(), nn.Dense(12, 3)])
    spec = RunSpec("digits", "gemm", "THOR", 0.05, 0, 1, extra={"block_size": 4})
    assert _model(spec, net, 2)._optimizer.block_size == 4  # pylint: disable=protected-access
    spec = RunSpec("digits", "gemm", "THOR", 0.05, 0, 1)
    other = nn.SequentialCell([nn.Flatten(), nn.Dense(12, 3)])
    assert _model(spec, other, 2)._optimizer.block_size == DEFAULT_BLOCK_SIZE  # pylint: disable=protected-access
    spec = RunSpec("digits", "gemm", "THOR", 0.05, 0, 1, extra={"block_size": 4, "stat_fraction": 0.25})
    third = nn.SequentialCell([nn.Flatten(), nn.Dense(12, 3)])
    assert _model(spec, third, 2)._optimizer.stat_fraction == 0.25  # pylint: disable=protected-access
    with pytest.raises(ValueError, match=r"extra=\{'blocks': 4\} for contender='THOR'.*\['blocks'\]"):
        _model(RunSpec("digits", "gemm", "THOR", 0.05, 0, 1, extra={"blocks": 4}), net, 2)


def test_run_plan_gives_thor_the_plans_frequency_of_the_network(monkeypatch):
    from bench.bench_tta import QUICK, run_plan

    _fake_runs(monkeypatch, {0.05: 0.9, 0.1: 0.95})
    payload = run_plan(_small_plan(dim_reduce_nets=(), thor_frequency={"gemm": 25}), timeout=10)
    cell = payload["cells"]["digits/gemm"]
    assert [r["spec"]["frequency"] for r in cell["curves"]["THOR"].values()] == [25, 25, 25]
    assert cell["grids"]["THOR picked"] == {"lr": 0.05, "damping": 0.03, "frequency": 25}
    payload = run_plan(_small_plan(dim_reduce_nets=()), timeout=10)  # no entry: the run's default, 10
    assert [r["spec"]["frequency"] for r in payload["cells"]["digits/gemm"]["curves"]["THOR"].values()] == [10] * 3
    assert QUICK.thor_frequency == {}  # the page's THOR runs at its default frequency

"""The autotune section of the time-to-accuracy page (bench/tta_autotune.py): goal verdicts from given curves,
checked against the rules computed by hand here. Nothing is timed."""
from __future__ import annotations

import json

import pytest

from bench.tta_autotune import AUTO, autotune_goals, autotune_section, wall_to_target


def _run(accuracy, epoch_seconds, **extra):
    return {"accuracy": accuracy, "epoch_seconds": epoch_seconds, "error": None, **extra}


def _cell(auto_runs, o0_runs, thor_runs, target=0.9):
    base = {"0": _run([0.5, 0.91], [10.0, 10.0]), "1": _run([0.5, 0.92], [10.0, 10.0])}
    return {"target": target, "summary": {},
            "curves": {"baseline": base, "ms_boost O0": o0_runs, "THOR": thor_runs, AUTO: auto_runs}}


def test_time_to_target_sums_the_raw_epochs_up_to_the_first_at_the_target():
    cell = _cell({}, {"0": _run([0.5, 0.95, 0.97], [7.0, 2.0, 2.0]), "1": _run([0.5, 0.8], [7.0, 2.0]),
                      "2": dict(_run([], []), error="crashed")}, {})
    assert wall_to_target(cell, "ms_boost O0") == {0: 9.0, 1: None, 2: None}


def test_auto_within_ten_percent_of_the_best_and_at_most_its_trial_slower_than_o0():
    o0 = {"0": _run([0.95], [12.0]), "1": _run([0.95], [12.0])}
    thor = {"0": _run([0.95], [11.0]), "1": _run([0.95], [11.0])}          # best fixed: 11 s
    auto = {"0": _run([0.95], [12.0], trial_seconds=1.5, autotune_pick="O0"),   # +0 s against O0
            "1": _run([0.95], [12.1], trial_seconds=1.0, autotune_pick="THOR")}
    lines = autotune_goals(_cell(auto, o0, thor))
    assert lines[0] == ("time to target (compile and trial included) 12.1 s against the best fixed contender "
                        "(THOR) 11.0 s: 1.10x, within 10%: **met**")  # median 12.05 / 11 = 1.095
    assert lines[1].startswith("slower than O0 by at most the trial's cost on every seed: **met**")
    # the issue's "median over 3 seeds" reading: median auto 12.05 s <= median O0 12 s + median trial 1.25 s
    assert lines[2] == ("slower than O0 by at most the trial's cost, medians over the seeds: **met** (auto 12.1 s "
                        "against O0 12.0 s + trial 1.2 s: +0.1 s)")
    assert lines[3] == ("slower than O0 by at most the trial's wall time on every seed: **met** (seed 0: +0.0 s vs "
                        "trial 1.5 s, seed 1: +0.1 s vs trial 1.0 s)")
    assert lines[4] == "picked: seed 0: O0, seed 1: THOR; trial 1.2 s (median)"


def test_auto_slower_than_o0_by_more_than_its_trial_is_not_met():
    o0 = {"0": _run([0.95], [10.0])}
    thor = {"0": _run([0.95], [30.0])}
    auto = {"0": _run([0.95], [14.0], trial_seconds=3.0, autotune_pick="O1")}   # 4 s over O0, trial 3 s
    lines = autotune_goals(_cell(auto, o0, thor))
    assert lines[0].endswith("1.40x, within 10%: not met")
    assert lines[1] == ("slower than O0 by at most the trial's cost on every seed: not met (seed 0: +4.0 s vs trial "
                        "3.0 s)")
    assert lines[2] == ("slower than O0 by at most the trial's cost, medians over the seeds: not met (auto 14.0 s "
                        "against O0 10.0 s + trial 3.0 s: +4.0 s)")


def test_section_names_the_contender_only_when_it_ran():
    o0 = {"0": _run([0.95], [10.0])}
    cell = _cell({"0": _run([0.5], [9.0], trial_seconds=1.0, autotune_pick="O0")}, o0, o0)
    assert autotune_goals(cell)[0] == "did not reach the target on the median seed"
    payload = {"cells": {"digits/gemm": cell}}
    section = autotune_section(payload)
    assert section[0] == '## Autotune (`boost_level="auto"`)' and "digits/gemm" in section[-2]
    del cell["curves"][AUTO]
    assert autotune_section(payload) == []


def test_the_trial_cost_is_its_overhead_when_recorded_and_the_summary_row_states_both_goals():
    from bench.tta_autotune import pick_lines, summary_table

    o0 = {"0": _run([0.95], [20.0])}
    o1 = {"0": _run([0.95], [10.0])}
    # 12 s to target: 2 s over O1's; its trial took 9 s of which 1.5 s were not the pick's (reused) compile
    auto = {"0": _run([0.95], [12.0], trial_seconds=9.0, trial_overhead=1.5, autotune_pick="O1")}
    cell = {"target": 0.9, "curves": {"ms_boost O0": o0, "ms_boost O1": o1, AUTO: auto}}
    lines = autotune_goals(cell)
    assert lines[0].endswith("1.20x, within 10%: not met")
    assert lines[1] == ("slower than O0 by at most the trial's cost on every seed: **met** (seed 0: -8.0 s vs trial "
                        "1.5 s)")
    row = summary_table({"cells": {"digits/conv": cell}})[2]
    assert row == "| digits/conv | 1 | 12.0 | 20.0 | 10.0 (ms_boost O1) | 1.20x | not met | met | O1 |"
    assert pick_lines(cell) == ["seed 0: picked O1, against ms_boost O1 +2.0 s over the whole run (to target 12.0 vs "
                                "10.0 s); trial 9.0 s of which 1.5 s not reused"]


def test_the_median_counts_a_seed_that_never_reached_the_target_as_infinitely_slow():
    from bench.tta_autotune import median_time

    assert median_time({0: 5.0, 1: None, 2: 9.0}) == 9.0
    assert median_time({0: None, 1: 4.0, 2: None}) is None  # 1 of 3 seeds is not a median
    assert median_time({0: 3.0, 1: 4.0}) == 3.5
    assert median_time({}) is None
    # a contender that reached the target on one seed only is not the best fixed one by that seed's time
    lucky = {"0": _run([0.5, 0.8], [5.0, 5.0]), "1": _run([0.95], [4.0]), "2": _run([0.5, 0.8], [5.0, 5.0])}
    steady = {s: _run([0.95], [8.0]) for s in ("0", "1", "2")}
    auto = {s: _run([0.95], [8.5], trial_seconds=0.5, autotune_pick="O1") for s in ("0", "1", "2")}
    cell = {"target": 0.9, "curves": {"ms_boost O0 + cpu_gemm_conv": lucky, "ms_boost O0": steady, AUTO: auto}}
    assert autotune_goals(cell)[0] == ("time to target (compile and trial included) 8.5 s against the best fixed "
                                       "contender (ms_boost O0) 8.0 s: 1.06x, within 10%: **met**")


def test_the_pick_line_states_both_runs_median_step_the_loads_mark():
    from bench.tta_autotune import median_step, pick_lines

    # per epoch: [median step, three slowest]; the run's pace is the median of the epochs' medians
    slow = [[0.052, 0.07, 0.17, 0.29], [0.043, 0.06, 0.08, 0.13], [0.052, 0.38, 1.66, 1.84]]
    fast = [[0.016, 0.03, 0.04, 13.4], [0.018, 0.02, 0.02, 0.03], [0.023, 0.05, 0.06, 0.06]]
    assert median_step({"slowest_steps": slow}) == 0.052 and median_step({"slowest_steps": fast}) == 0.018
    assert median_step({}) is None
    o0 = {"2": _run([0.5, 0.9, 0.95], [14.3, 0.8, 1.4], slowest_steps=fast)}
    auto = {"2": _run([0.5, 0.9, 0.95], [14.8, 2.0, 6.2], slowest_steps=slow, trial_seconds=12.0,
                      trial_overhead=0.9, autotune_pick="O0")}
    cell = {"target": 0.94, "curves": {"ms_boost O0": o0, AUTO: auto}}
    assert pick_lines(cell) == ["seed 2: picked O0, against ms_boost O0 +6.5 s over the whole run (to target 23.0 vs "
                                "16.5 s; median step 52 vs 18 ms); trial 12.0 s of which 0.9 s not reused; the gap: "
                                "the compile (trial 12.0 s vs its first step 13.4 s) -1.4 s, the rest of epoch 1 "
                                "+1.9 s, later epochs +6.0 s"]


def test_the_gap_splits_into_compile_rest_of_epoch_one_and_later_epochs_which_add_up():
    from bench.tta_autotune import gap_parts, gap_summary

    # the fixed run: epoch 1 of 3.0 s whose slowest step (its compile) took 2.5 s, then 0.6 + 0.5 s
    fixed = _run([0.5, 0.9, 0.95], [3.0, 0.6, 0.5], slowest_steps=[[0.012, 0.02, 0.03, 2.5], [0.012] * 4,
                                                                   [0.012] * 4])
    # auto: its epoch 1 holds the 3.3 s trial and 0.6 s of steps, then 0.7 + 0.4 s
    auto = _run([0.5, 0.9, 0.95], [3.9, 0.7, 0.4], trial_seconds=3.3, trial_overhead=0.1, autotune_pick="O0")
    compile_, rest, later, first = gap_parts(auto, fixed)
    assert (first, compile_, rest, later) == pytest.approx((2.5, 0.8, 0.1, 0.0))
    assert compile_ + rest + later == pytest.approx(sum(auto["epoch_seconds"]) - sum(fixed["epoch_seconds"]))
    assert gap_parts(auto, _run([0.95], [3.0])) is None  # no step times recorded
    assert gap_parts(_run([0.95], [3.0]), fixed) is None  # not an autotuned run
    # over two cells: medians and ranges of each part
    other = _run([0.95], [2.0, 1.0], trial_seconds=1.0, autotune_pick="O0")
    other_fixed = _run([0.95], [2.4, 1.2], slowest_steps=[[0.01, 1.5]])  # compile -0.5, rest +0.1, later -0.2
    payload = {"cells": {"a/gemm": {"curves": {"ms_boost O0": {"0": fixed}, AUTO: {"0": auto}}},
                         "b/gemm": {"curves": {"ms_boost O0": {"0": other_fixed}, AUTO: {"0": other}}}}}
    line = gap_summary(payload)[0]
    assert "(paired, 2 seeds; median [min, max])" in line
    assert ("the compile (trial minus the fixed run's first step) +0.15 s [-0.50, +0.80], the rest of epoch 1 "
            "+0.10 s [+0.10, +0.10], later epochs -0.10 s [-0.20, +0.00]") in line
    assert gap_summary({"cells": {}}) == []


def test_the_phases_page_gives_each_phase_median_and_range_over_the_seeds_per_contender():
    from bench.autotune_phases import render

    fixed = {"0": {"model": [0.2, 0.1], "epoch 1: step 1": [3.0, 2.5], "epoch 1, thread python": [0.0, 2.7]},
             "1": {"model": [0.4, 0.3], "epoch 1: step 1": [5.0, 2.9], "epoch 1, thread python": [0.0, 3.1]}}
    auto = {"0": {"model": [0.1, 0.1], "trial: probe step 1 (compile)": [2.8, 2.4], "pick: O0": [0.0, 0.0]},
            "1": {"model": [0.1, 0.1], "trial: probe step 1 (compile)": [3.2, 2.6], "pick: O0": [0.0, 0.0]}}
    page = render({"cell": "generated/gemm", "epochs": 3, "seeds": [0, 1], "load_before": [1.0, 1.0, 1.0],
                   "load_after": [1.0, 1.0, 1.0], "fixed": "ms_boost O0", "runs": {"ms_boost O0": fixed,
                                                                                  AUTO: auto}})
    rows = {line.split(" | ")[0][2:]: line for line in page.splitlines() if line.startswith("| ")}
    assert rows["model"] == "| model | 0.300 [0.200, 0.400] | 0.200 [0.100, 0.300] | 0.100 [0.100, 0.100] | " \
                            "0.100 [0.100, 0.100] |"
    assert rows["trial: probe step 1 (compile)"].endswith("| - | - | 3.000 [2.800, 3.200] | 2.500 [2.400, 2.600] |")
    assert rows["epoch 1, thread python"] == "| epoch 1, thread python | - | 2.900 [2.700, 3.100] | - | - |"
    assert "auto picked O0" in page and "pick: O0" not in rows
    # the model row first, then the trial's, then epoch 1's
    names = [n for n in rows if n not in ("phase", "---")]
    assert names.index("model") < names.index("trial: probe step 1 (compile)") < names.index("epoch 1: step 1")


def test_standalone_runs_each_seed_paired_with_the_order_rotated_and_any_number_of_seeds(monkeypatch):
    import bench.bench_tta as tta
    import bench.tta_autotune as auto_mod
    from bench.tta_autotune import Cell, parse_seeds, render_standalone, run_standalone

    calls = []

    def launch(spec, root, timeout):
        calls.append((spec.contender, spec.seed))
        extra = {"trial_seconds": 0.5, "autotune_pick": "O0"} if spec.contender == AUTO else {}
        return _run([0.5, 0.95], [3.0, 1.0], wall_seconds=1.0, **extra)

    monkeypatch.setattr(tta, "launch", launch)
    monkeypatch.setattr(auto_mod, "data_root", lambda dataset, train=None, classes=10: "unused")
    saved = []
    payload = run_standalone([Cell("digits", "gemm", 2)], parse_seeds(["0,1", "2", "3", "4"]), False, 10,
                             {"cells": {}}, lambda p: saved.append(len(calls)))
    names = ["ms_boost O0", "ms_boost O1", AUTO]
    rounds = [calls[i:i + 3] for i in range(0, 15, 3)]
    assert len(calls) == 15 and saved == [3, 6, 9, 12, 15]  # saved after every seed's round
    assert [{s for _, s in r} for r in rounds] == [{0}, {1}, {2}, {3}, {4}]  # a seed's runs one after the other
    assert [[n for n, _ in r] for r in rounds] == [names, names[1:] + names[:1], names[2:] + names[:2], names,
                                                   names[1:] + names[:1]]
    cell = payload["cells"]["digits/gemm"]
    assert cell["order"]["1"] == names[1:] + names[:1] and list(cell["curves"]) == names
    assert sorted(cell["curves"][AUTO]) == ["0", "1", "2", "3", "4"] and payload["seeds"] == [0, 1, 2, 3, 4]
    payload["command"] = "python bench/tta_autotune.py --seeds 0 1 2 3 4"
    page = render_standalone(payload)
    assert "Written by `python bench/tta_autotune.py --seeds 0 1 2 3 4`" in page
    assert "their order rotated by one place each seed" in page and "seeds 0, 1, 2, 3, 4." in page
    del payload["order"]
    assert "always in the order listed below (an older run: O0 first, auto last)" in render_standalone(payload)


def test_seeds_are_integers_each_once_space_or_comma_separated():
    from bench.tta_autotune import parse_seeds

    assert parse_seeds(["0", "1", "2", "3", "4"]) == parse_seeds(["0,1,2,3,4"]) == [0, 1, 2, 3, 4]
    assert parse_seeds([]) == [] and parse_seeds(["3,", "1"]) == [3, 1]
    with pytest.raises(ValueError, match="--seeds 'x' is not an integer"):
        parse_seeds(["0,x"])
    with pytest.raises(ValueError, match="--seeds 1 is given twice"):
        parse_seeds(["1", "0,1"])


def test_the_phases_driver_rotates_fixed_and_auto_each_seed(monkeypatch):
    import types

    import bench.autotune_phases as phases
    import bench.common

    calls = []

    def run(cmd, **kw):
        contender, seed, variant = json.loads(next(a for a in cmd if a.startswith("--worker="))[len("--worker="):])
        assert variant == ""
        calls.append((contender, seed))
        return types.SimpleNamespace(stdout=phases.TAG + json.dumps({"model": [0.1, 0.1], "pick: O0": [0.0, 0.0]}))

    monkeypatch.setattr(phases.subprocess, "run", run)
    pages = []
    monkeypatch.setattr(bench.common, "write_results", lambda name, payload, page: pages.append(page))
    assert phases.main(["--seeds", "0,1,2"]) == 0
    assert calls == [("ms_boost O0", 0), (AUTO, 0), (AUTO, 1), ("ms_boost O0", 1), ("ms_boost O0", 2), (AUTO, 2)]
    assert "the order rotated each seed" in pages[0]
    # the seeds as the autotune page takes them: space-separated too, each once
    calls.clear()
    assert phases.main(["--seeds", "3", "4"]) == 0
    assert calls == [("ms_boost O0", 3), (AUTO, 3), (AUTO, 4), ("ms_boost O0", 4)]
    with pytest.raises(ValueError, match="--seeds 1 is given twice"):
        phases.main(["--seeds", "1,1"])


def test_the_phases_variants_run_beside_the_fixed_run_rotated_and_the_page_pairs_each_with_it(monkeypatch):
    """``--variants eager``: per seed the fixed run, auto and auto [eager], rotated; the page's gaps are each auto
    run's compile minus the fixed run's first step, per seed (numbers made up, exact)."""
    import types

    import bench.autotune_phases as phases
    import bench.common

    calls = []
    eager = f"{AUTO} [eager]"
    compiles = {("ms_boost O0", 0): [3.0, 3.25, 3.0], (AUTO, 0): [3.5, 3.75, 3.25], (eager, 0): [4.0, 4.5, 3.25],
                ("ms_boost O0", 1): [2.0, 2.25, 2.0], (AUTO, 1): [2.125, 2.375, 2.125], (eager, 1): [3.0, 3.5, 2.25]}

    real_run = phases.subprocess.run

    def run(cmd, **kw):
        worker = [a for a in cmd if a.startswith("--worker=")]
        if not worker:  # the page's footer asking the platform (uname)
            return real_run(cmd, **kw)
        contender, seed, variant = json.loads(worker[0][len("--worker="):])
        name = phases.label(contender, variant)
        calls.append((name, seed))
        wall = compiles[(name, seed)]
        out = {phases.STARTUP: [w + 0.5 for w in wall]}
        if contender == AUTO:
            out.update({"trial: probe step 1 (compile)": wall, "trial (all)": [wall[0] + 0.2, 0.0, 0.0],
                        "trial: probe step 1 (compile), thread python": [0.0, 0.1, 0.0], "pick: O0": [0.0, 0.0, 0.0]})
        else:
            out["epoch 1: step 1"] = wall
        return types.SimpleNamespace(stdout=phases.TAG + json.dumps(out))

    monkeypatch.setattr(phases.subprocess, "run", run)
    pages = []
    monkeypatch.setattr(bench.common, "write_results", lambda name, payload, page: pages.append(page))
    assert phases.main(["--seeds", "0,1", "--variants", "eager"]) == 0
    assert calls == [("ms_boost O0", 0), (AUTO, 0), (eager, 0), (AUTO, 1), (eager, 1), ("ms_boost O0", 1)]
    page = pages[0]
    # compile wall: auto 0.5 and 0.125 over the fixed run (median 0.3125), eager 1.0 and 1.0 (binary fractions: exact)
    assert "| the compile, wall s | 0.31 [0.12, 0.50] | 1.00 [1.00, 1.00] |" in page
    # other threads (CPU - main): fixed 0.25 both seeds; auto 0.5 and 0.25 (+0.25, +0); eager 1.25 both (+1.0)
    assert "| the compile, other threads' CPU s | 0.12 [0.00, 0.25] | 1.00 [1.00, 1.00] |" in page
    # main thread waiting (wall - main): fixed 0 both; auto +0.25 and 0; eager +0.75 both
    assert "| the compile, main thread waiting s | 0.12 [0.00, 0.25] | 0.75 [0.75, 0.75] |" in page
    assert "| ms_boost auto [eager] | 0 |" in page and "python 0.10" in page
    with pytest.raises(SystemExit):
        phases.main(["--seeds", "0", "--variants", "sideways"])
    with pytest.raises(ValueError, match="variant='sideways' is not one of"):
        phases.apply_variant("sideways", types.SimpleNamespace())


def test_the_phases_bench_measures_a_cell_as_its_form_sizes_it(monkeypatch):
    """``--form long`` gives the workers the long page's cell (its epochs by default) and the page says so."""
    import types

    import bench.autotune_phases as phases
    import bench.common

    quick, long = phases.cell_of("generated/gemm"), phases.cell_of("generated/gemm", "long")
    assert (quick.train, quick.classes, quick.epochs) == (None, 10, 3)
    assert (long.train, long.classes, long.epochs, long.width) == (3000, 20, 10, 8)
    assert phases.cell_of("digits/gemm", "long").width == 4
    assert phases.cell_of("digits/conv", "long").key == "digits/conv"  # not in the form: the quick defaults
    with pytest.raises(ValueError, match="--form 'huge' is not one of"):
        phases.cell_of("generated/gemm", "huge")
    commands = []

    def run(cmd, **kw):
        commands.append(cmd)
        return types.SimpleNamespace(stdout=phases.TAG + json.dumps({"model": [0.1, 0.1], "pick: O0": [0.0, 0.0]}))

    monkeypatch.setattr(phases.subprocess, "run", run)
    pages = []
    monkeypatch.setattr(bench.common, "write_results", lambda name, payload, page: pages.append(page))
    assert phases.main(["--form", "long", "--seeds", "0"]) == 0
    assert all("--form=long" in c and "--epochs=10" in c for c in commands) and len(commands) == 2
    assert "--cell generated/gemm --form long --epochs 10" in pages[0]
    commands.clear()
    assert phases.main(["--seeds", "0", "--epochs", "2"]) == 0
    assert all("--form=quick" in c and "--epochs=2" in c for c in commands)
    assert "--form" not in pages[1]


def test_thread_cpu_deltas_sum_each_thread_name_over_the_threads_alive_at_the_end():
    from bench.autotune_phases import thread_cpu, thread_delta

    before = {"main:1": 1.0, "python:2": 0.5, "python:3": 0.25, "gone:4": 9.0}
    after = {"main:1": 3.5, "python:2": 0.75, "python:3": 0.5, "python:5": 0.125, "ActorThread_0:6": 0.0}
    assert thread_delta(before, after) == {"main": 2.5, "python": 0.625}  # 0.25 + 0.25 + a new thread's 0.125
    now = thread_cpu()
    if now:  # Linux: the main thread is named main, every figure a non-negative number of seconds
        assert sum(1 for k in now if k.startswith("main:")) == 1 and min(now.values()) >= 0.0


def _timed(accuracy, epoch_seconds, first, median, **extra):
    """A run whose epoch 1 recorded its median step and, as its slowest, its first (the compile)."""
    return _run(accuracy, epoch_seconds, slowest_steps=[[median, median, median, first]] +
                [[median] * 4] * (len(epoch_seconds) - 1), **extra)


def test_the_paired_ratio_is_per_seed_against_the_issues_best_fixed_contender_with_and_without_compile():
    from bench.tta_autotune import best_fixed, compile_seconds, paired_goal, paired_ratios, paired_table

    # O0 + cpu_gemm_conv is the best fixed by its median (10, 12, 11 -> 11); O0 is slower (20 each)
    cgc = {"0": _timed([0.5, 0.95], [6.0, 4.0], 3.0, 0.01), "1": _timed([0.5, 0.95], [7.0, 5.0], 4.0, 0.01),
           "2": _timed([0.5, 0.95], [6.5, 4.5], 2.0, 0.01)}
    o0 = {s: _timed([0.5, 0.95], [12.0, 8.0], 2.0, 0.05) for s in ("0", "1", "2")}
    # auto: seed 0 11 s (trial 3.5 s of which 0.3 s its own), seed 1 never reaches, seed 2 12.1 s
    auto = {"0": _timed([0.5, 0.95], [7.0, 4.0], 0.06, 0.01, trial_seconds=3.5, trial_overhead=0.3,
                        autotune_pick="O0_cpu_gemm_conv"),
            "1": _timed([0.5, 0.8], [7.0, 4.0], 0.06, 0.01, trial_seconds=3.5, trial_overhead=0.3,
                        autotune_pick="O0_cpu_gemm_conv"),
            "2": _timed([0.5, 0.95], [8.1, 4.0], 0.06, 0.01, trial_seconds=3.0, trial_overhead=0.2,
                        autotune_pick="O0_cpu_gemm_conv")}
    cell = {"target": 0.9, "curves": {"ms_boost O0": o0, "ms_boost O0 + cpu_gemm_conv": cgc, AUTO: auto}}
    assert best_fixed(cell) == "ms_boost O0 + cpu_gemm_conv"
    # taken out: each run's slowest step of epoch 1 beyond its median (a fixed run's compile) and auto's pick's
    # compile inside its trial (its wall time less its own cost)
    assert compile_seconds(cgc["1"]) == pytest.approx(3.99) and compile_seconds(auto["2"]) == pytest.approx(2.85)
    assert compile_seconds(_run([0.9], [1.0])) is None and compile_seconds(dict(auto["0"], error="x")) is None
    assert compile_seconds(_run([0.9], [1.0], trial_seconds=3.0, trial_overhead=0.2)) is None  # no step times
    best, ratios = paired_ratios(cell)
    assert best == "ms_boost O0 + cpu_gemm_conv" and ratios == pytest.approx({0: 11 / 10, 2: 12.1 / 11})  # not seed 1
    # compile excluded: auto 11 - 3.25 against 10 - 2.99; 12.1 - 2.85 against 11 - 1.99
    assert paired_ratios(cell, True)[1] == pytest.approx({0: 7.75 / 7.01, 2: 9.25 / 9.01})
    # bench_tta renders its payload before any JSON round trip: seeds are ints there
    as_ints = dict(cell, curves={name: {int(k): v for k, v in runs.items()} for name, runs in cell["curves"].items()})
    assert paired_ratios(as_ints, True)[1] == pytest.approx({0: 7.75 / 7.01, 2: 9.25 / 9.01})
    text, met = paired_goal(cell)
    assert met and text == ("paired (per seed, auto over the best fixed contender, both reached): median 1.10x "
                            "[1.10, 1.10] over 2 seed(s) against ms_boost O0 + cpu_gemm_conv, within 10%: **met**")
    text, met = paired_goal(cell, True)
    assert met and "median 1.07x [1.03, 1.11] over 2 seed(s)" in text
    # the issue's statistic and verdict stay as they were; the paired lines come after
    lines = autotune_goals(cell)
    assert lines[0].startswith("time to target (compile and trial included) 12.1 s against the best fixed "
                               "contender (ms_boost O0 + cpu_gemm_conv) 11.0 s: 1.10x")
    assert lines[-2].startswith("paired (per seed") and lines[-1].startswith("paired, compile excluded")
    row = paired_table({"cells": {"mnist5k/conv": cell}})[2]
    assert row == ("| mnist5k/conv | ms_boost O0 + cpu_gemm_conv | 2/3 | 1.10x [1.10, 1.10] | met | "
                   "1.07x [1.03, 1.11] | met |")
    # no seed where both reached: no paired verdict (not a failure, not a success)
    never = dict(cell, curves=dict(cell["curves"], **{AUTO: {"1": auto["1"]}}))
    assert paired_goal(never) is None and paired_ratios(never)[1] == {}


def test_the_long_form_runs_its_cells_and_writes_its_own_page(monkeypatch):
    import bench.bench_tta as tta
    import bench.common
    import bench.tta_autotune as auto_mod

    specs, roots = [], []

    def launch(spec, root, timeout):
        specs.append(spec)
        extra = {"trial_seconds": 0.5, "trial_overhead": 0.1, "autotune_pick": "O0"} if spec.contender == AUTO else {}
        return _timed([0.5, 0.95], [3.0, 1.0], 2.0, 0.01, **extra)

    monkeypatch.setattr(tta, "launch", launch)
    monkeypatch.setattr(auto_mod, "data_root",
                        lambda dataset, train=None, classes=10: roots.append((dataset, train, classes)) or "unused")
    monkeypatch.setattr(auto_mod, "image_count", lambda folder: 1500)
    pages = []
    monkeypatch.setattr(bench.common, "write_results", lambda name, payload, page: pages.append((name, page)))
    assert auto_mod.main(["--long", "--seeds", "0"]) == 0
    assert roots == [(c.dataset, c.train, c.classes) for c in auto_mod.LONG_CELLS]
    assert {(s.dataset, s.net, s.epochs, s.width) for s in specs} == {
        (c.dataset, c.net, c.epochs, c.width) for c in auto_mod.LONG_CELLS}
    # the three bundled workloads, each with the issue's contenders (O0, O1, auto; the GEMM rewrite on conv nets)
    assert {c.dataset for c in auto_mod.LONG_CELLS} == {"digits", "mnist5k", "generated"}
    for cell in auto_mod.LONG_CELLS:
        assert {s.contender for s in specs if (s.dataset, s.net) == (cell.dataset, cell.net)} == set(
            auto_mod.contenders_of(cell, False))
    assert all(s.epochs >= 10 for s in specs)  # long runs: far more steps than the quick form's 2-4 epochs
    name, page = pages[-1]
    assert name == "tta_autotune_long" and "(long form," in page and "--long --seeds 0" in page
    assert "Partial run" not in page and "**Paired**" in page
    # the data sentence names what differs from the quick form: the generated set's classes, digits' width
    assert "generated/gemm: the zoo's generated set (20 classes), 1,500 train" in page
    assert ("digits/gemm: scikit-learn's digits, 1,500 train / 1,500 val images, 20 epochs (47 steps an epoch), "
            "width 4;") in page
    with pytest.raises(ValueError, match="not in the long form"):
        auto_mod.main(["--long", "--cells", "digits/conv"])
    # one cell, longer: --epochs overrides the form's epochs and is part of the command on the page
    specs.clear()
    assert auto_mod.main(["--long", "--cells", "mnist5k/gemm", "--epochs", "20", "--seeds", "0"]) == 0
    assert {(s.dataset, s.net, s.epochs) for s in specs} == {("mnist5k", "gemm", 20)}
    assert "`python bench/tta_autotune.py --long --cells mnist5k/gemm --epochs 20 --seeds 0`" in pages[-1][1]
    with pytest.raises(ValueError, match="--epochs 1 must be >= 2"):
        auto_mod.main(["--long", "--epochs", "1"])


def test_the_generated_sets_classes_split_its_training_images_and_only_it_has_a_class_count(monkeypatch):
    import bench.tta_autotune as auto_mod
    import model_zoo.resnet.src.synthetic_data as synthetic

    calls = []
    monkeypatch.setattr(synthetic, "ensure_dataset", lambda **kw: calls.append(kw) or "folder")
    assert auto_mod.data_root("generated", 3000, 20) == "folder"
    assert calls[-1] == {"num_classes": 20, "image_size": auto_mod.IMAGE_SIZE, "train_per_class": 150,
                         "val_per_class": 40}
    auto_mod.data_root("generated")  # the quick form's: 10 classes of 150
    assert (calls[-1]["num_classes"], calls[-1]["train_per_class"]) == (10, 150)
    with pytest.raises(ValueError, match="classes=20 is only for the generated set; 'digits' has 10"):
        auto_mod.data_root("digits", None, 20)


def test_contenders_restricts_the_runs_to_the_named_ones_beside_o0(monkeypatch):
    import bench.bench_tta as tta
    import bench.tta_autotune as auto_mod
    from bench.tta_autotune import Cell, run_standalone

    calls = []

    def launch(spec, root, timeout):
        calls.append((spec.contender, spec.seed))
        return _run([0.5, 0.95], [3.0, 1.0], trial_seconds=0.5, autotune_pick="O0")

    monkeypatch.setattr(tta, "launch", launch)
    monkeypatch.setattr(auto_mod, "data_root", lambda dataset, train=None, classes=10: "unused")
    payload = run_standalone([Cell("generated", "gemm", 2)], [0, 1], False, 10, {"cells": {}}, contenders=[AUTO])
    assert calls == [("ms_boost O0", 0), (AUTO, 0), (AUTO, 1), ("ms_boost O0", 1)]  # O1 not run; order rotated
    assert list(payload["cells"]["generated/gemm"]["curves"]) == ["ms_boost O0", AUTO]
    with pytest.raises(ValueError, match=r"--contenders \['O9'\] not in these cells"):
        auto_mod.main(["--cells", "generated/gemm", "--contenders", "O9"])


def test_the_phases_page_pairs_the_start_up_per_seed_against_the_trials_own_steps():
    from bench.autotune_phases import STARTUP, render

    fixed = {"0": {STARTUP: [3.0, 2.9, 2.7], "epoch 1: step 1": [2.9, 2.8, 2.6]},
             "1": {STARTUP: [4.0, 3.0, 2.8], "epoch 1: step 1": [3.9, 2.9, 2.7]}}
    own = {"trial: probe steps 2+": [0.05, 0.05, 0.01], "trial: restore": [0.05, 0.05, 0.05], "pick: O0": [0.0] * 3}
    auto = {"0": {STARTUP: [3.5, 3.0, 2.8], "trial: probe step 1 (compile)": [3.2, 2.8, 2.6], **own},
            "1": {STARTUP: [3.8, 3.1, 2.7], "trial: probe step 1 (compile)": [3.5, 2.9, 2.6], **own}}
    page = render({"cell": "generated/gemm", "epochs": 10, "seeds": [0, 1], "load_before": [1.0] * 3,
                   "load_after": [1.0] * 3, "fixed": "ms_boost O0", "runs": {"ms_boost O0": fixed, AUTO: auto}})
    rows = [line for line in page.splitlines() if line.startswith(("| 0 |", "| 1 |"))]
    # seed 0: +0.5 wall, +0.1 CPU, +0.1 main, waiting +0.4, compile +0.3, own steps 0.1, beyond them +0.4
    assert rows == ["| 0 | 3.00 | 3.50 | +0.50 | +0.10 | +0.10 | +0.40 | +0.30 | 0.10 | +0.40 |",
                    "| 1 | 4.00 | 3.80 | -0.20 | +0.10 | -0.10 | -0.10 | -0.40 | 0.10 | -0.30 |"]
    assert "auto - fixed 0.15 [-0.20, 0.50] s wall; beyond the trial's own steps 0.05 [-0.30, 0.40] s." in page
    assert ("| phase | ms_boost O0 wall s | ms_boost O0 CPU s | ms_boost O0 main-thread CPU s | auto wall s | "
            "auto CPU s | auto main-thread CPU s |") in page


@pytest.mark.parametrize("name, switches, fn_gc", [
    ("gemm (O0's function)", {"cpu_gemm_conv"}, None),
    ("gemm + freezing", {"cpu_gemm_conv", "grad_freeze"}, None),
    ("gemm + LessBN", {"cpu_gemm_conv", "less_bn"}, (True, True)),
    ("gemm + LessBN's FN head only", {"cpu_gemm_conv", "less_bn"}, (True, False)),
    ("gemm + LessBN's GC only", {"cpu_gemm_conv", "less_bn"}, (False, True)),
    ("O1 (gemm + LessBN + freezing)", {"cpu_gemm_conv", "less_bn", "grad_freeze"}, (True, True)),
])
def test_the_o1_ablation_variants_are_the_plans_their_names_say(name, switches, fn_gc):
    from bench.autotune_o1_ablation import VARIANTS, epochs_to
    from ms_boost import AutoBoost

    contender, config = VARIANTS[name]
    boost = AutoBoost({"ms_boost O0": "O0", "ms_boost O1": "O1"}[contender], config or None)
    assert {n for n, on in boost.boost_config.items() if on} == switches
    if fn_gc is not None:
        assert (boost.less_bn.fn_flag, boost.less_bn.gc_flag) == fn_gc
    assert (epochs_to([0.2, 0.5, 0.9], 0.5), epochs_to([0.2], 0.5)) == (2, None)


def test_repeats_run_each_seeds_round_again_rotated_and_take_each_seeds_median_run(monkeypatch):
    import bench.bench_tta as tta
    import bench.tta_autotune as auto_mod
    from bench.tta_autotune import Cell, median_repeat, render_standalone, run_standalone

    # per (contender, seed): the times of the repeats' first epoch in launch order (second epoch 1 s, target at it)
    first_epochs = {("ms_boost O0", 0): [5.0, 2.0, 3.0], ("ms_boost O1", 0): [4.0, 4.0, 9.0],
                    (AUTO, 0): [6.0, 1.0, 2.0]}
    calls = []

    def launch(spec, root, timeout):
        calls.append((spec.contender, spec.seed))
        key = (spec.contender, spec.seed)
        first = first_epochs[key][sum(1 for c in calls if c == key) - 1]
        extra = {"trial_seconds": 0.5, "autotune_pick": "O0"} if spec.contender == AUTO else {}
        accuracy = [0.5, 0.8] if (spec.contender, first) == ("ms_boost O1", 9.0) else [0.5, 0.95]
        return _run(accuracy, [first, 1.0], **extra)

    monkeypatch.setattr(tta, "launch", launch)
    monkeypatch.setattr(auto_mod, "data_root", lambda dataset, train=None, classes=10: "unused")
    payload = run_standalone([Cell("digits", "gemm", 2)], [0], False, 10, {"cells": {}}, repeats=3)
    names = ["ms_boost O0", "ms_boost O1", AUTO]
    # three rounds of seed 0, each rotated by one more place
    assert [c for c, _ in calls] == names + names[1:] + names[:1] + names[2:] + names[:2]
    cell = payload["cells"]["digits/gemm"]
    assert cell["target"] == 0.94 and payload["repeats"] == 3
    assert [len(cell["repeats"][n]["0"]) for n in names] == [3, 3, 3]
    # the median run by time to target: O0 6, 3, 4 s -> 4 s; O1 5, 5, never -> 5 s (ties ranked in launch order);
    # auto 7, 2, 3 -> 3 s
    assert auto_mod.wall_to_target(cell, "ms_boost O0") == {0: 4.0}
    assert auto_mod.wall_to_target(cell, "ms_boost O1") == {0: 5.0}
    assert cell["curves"]["ms_boost O1"]["0"] is cell["repeats"]["ms_boost O1"]["0"][1]
    assert auto_mod.wall_to_target(cell, AUTO) == {0: 3.0}
    page = render_standalone(payload)
    assert "every seed's paired round ran 3 times" in page
    assert "| digits/gemm | ms_boost O0 | 6.0, 3.0, **4.0** |" in page
    assert "| digits/gemm | ms_boost O1 | 5.0, **5.0**, - |" in page
    assert render_standalone(json.loads(json.dumps(payload))) == page  # --render_only from the JSON: the same page
    # an even count takes the faster middle run; a failed run counts as never reaching the target
    runs = [_run([0.95], [t]) for t in (4.0, 2.0)] + [dict(_run([], []), error="crashed")]
    assert median_repeat(runs[:2], 0.9)["epoch_seconds"] == [2.0]
    assert median_repeat(runs, 0.9)["epoch_seconds"] == [4.0]
    with pytest.raises(ValueError, match="repeats=0 must be >= 1"):
        run_standalone([Cell("digits", "gemm", 2)], [0], False, 10, {"cells": {}}, repeats=0)
    with pytest.raises(ValueError, match="--repeats 0 must be >= 1"):
        auto_mod.main(["--cells", "digits/gemm", "--repeats", "0"])


def test_the_trial_cost_goal_read_per_seed_and_by_the_medians_over_the_seeds_can_differ():
    from bench.tta_autotune import render_standalone, summary_table

    o0 = {str(s): _run([0.95], [10.0]) for s in range(3)}
    # one seed's process 2 s slower: not within its 0.5 s trial on that seed, but the medians are 10.1 against 10.5
    auto = {str(s): _run([0.95], [t], trial_seconds=2.0, trial_overhead=0.5, autotune_pick="O0")
            for s, t in enumerate((10.1, 12.0, 9.9))}
    cell = {"target": 0.9, "curves": {"ms_boost O0": o0, AUTO: auto}}
    lines = autotune_goals(cell)
    assert lines[1].startswith("slower than O0 by at most the trial's cost on every seed: not met (seed 0: +0.1 s")
    assert lines[2] == ("slower than O0 by at most the trial's cost, medians over the seeds: **met** (auto 10.1 s "
                        "against O0 10.0 s + trial 0.5 s: +0.1 s)")
    # with the trial's whole wall time (2 s, its compile included) as the cost, every seed is within it
    assert lines[3] == ("slower than O0 by at most the trial's wall time on every seed: **met** (seed 0: +0.1 s vs "
                        "trial 2.0 s, seed 1: +2.0 s vs trial 2.0 s, seed 2: -0.1 s vs trial 2.0 s)")
    assert summary_table({"cells": {"digits/gemm": cell}})[2].endswith("| not met | O0 |")  # the per-seed column
    page = render_standalone({"cells": {"digits/gemm": cell}, "seeds": [0, 1, 2]})
    assert "which the run reuses): **0 of 1 cells**; by the medians over the seeds" in page
    assert "plus the median trial cost): **1 of 1 cells**; with the trial's whole wall time" in page
    assert "the pick's compile included): **1 of 1 cells**." in page

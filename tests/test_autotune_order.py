"""The autotune probe order and the probes' budget, on constructed trials with a scripted clock.

The prior order is checked against a numpy re-statement of the rule (``kappa K + N tau T / q``, O0's compile
``K`` a context-given number of O0 steps ``T``). The engine's probe loop runs on fake train steps that advance a fake
``perf_counter`` by a scripted compile and step time, so what is probed, in which order, why the rest is not, and what
is picked are exact, whatever the machine's load (no MindSpore graph is built).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Dict, List, Tuple

import numpy as np
import pytest

from ms_boost.autotune import engine, register_candidate, unregister_candidate
from ms_boost.autotune.candidates import (
    TrialContext,
    default_candidates,
    get_candidate,
    prior_run,
    probe_order,
    progress_of,
)
from ms_boost.autotune.decide import NO_ESTIMATE, Figures, best_left, o0_scale, predicted_run, prior_figures
from ms_boost.autotune.engine import batches_needed
from ms_boost.autotune.options import AutotuneOptions


def _conv(steps: int) -> TrialContext:
    """A network with nn.Conv2d layers on CPU, batch 32 (the time-to-accuracy page's conv cells)."""
    return TrialContext(ranks=1, batch_size=32, planned_steps=steps, device="CPU", conv2d_layers=3)


def _gemm(steps: int) -> TrialContext:
    return TrialContext(ranks=1, batch_size=32, planned_steps=steps, device="CPU", conv2d_layers=0)


def _numpy_prior_runs(ctx: TrialContext) -> Dict[str, float]:
    """kappa K + N tau T / q with T = 1 and K = ctx.compile_steps, for the default candidates (numpy)."""
    cands = default_candidates(ctx)
    kappa = np.array([c.compile_prior(ctx) for c in cands], np.float64)
    tau = np.array([c.step_prior(ctx) for c in cands], np.float64)
    q = np.array([c.progress_prior(ctx) if callable(c.progress_prior) else c.progress_prior for c in cands],
                 np.float64)
    runs = kappa * ctx.compile_steps + ctx.planned_steps * tau / q
    return {c.name: float(r) for c, r in zip(cands, runs)}


# ------------------------------------------------------------------------------------- the prior order, pure
@pytest.mark.parametrize("ctx", [_conv(4), _conv(94), _conv(138), _conv(5000), _gemm(138), _gemm(100000)])
def test_probe_order_is_the_increasing_prior_run(ctx):
    cands = default_candidates(ctx)
    want = _numpy_prior_runs(ctx)
    assert {c.name: prior_run(c, ctx) for c in cands} == pytest.approx(want, rel=1e-12)
    order = [cands[i].name for i in probe_order(cands, ctx)]
    assert [want[n] for n in order] == sorted(want.values())


def test_a_cheap_large_win_is_probed_first_in_a_short_conv_run_and_o0_in_a_tiny_one():
    # the time-to-accuracy page's conv cells: 94 and 138 planned steps; the GEMM rewrite compiles a little more
    # than O0 and steps several times faster; O1 compiles far more for about the same step
    for steps in (94, 138):
        ctx = _conv(steps)
        cands = default_candidates(ctx)
        assert cands[probe_order(cands, ctx)[0]].name == "O0_cpu_gemm_conv"
    tiny = _conv(4)  # a run of 4 steps cannot pay back a larger compile
    cands = default_candidates(tiny)
    assert cands[probe_order(cands, tiny)[0]].name == "O0"
    gemm = _gemm(138)  # no nn.Conv2d: O0 compiles least and no plan steps faster
    cands = default_candidates(gemm)
    assert cands[probe_order(cands, gemm)[0]].name == "O0"
    assert "O0_cpu_gemm_conv" not in [c.name for c in cands]


def test_o0_scale_prior_figures_and_what_the_best_still_needs():
    figs = [Figures(True, step_s=0.03, compile_s=4.0), Figures(False, reason="x"), Figures(True, step_s=0.6)]
    # each kept probe says K = k / kappa and T = t / tau; the estimate is their mean
    assert o0_scale(figs, [2.0, 1.0, 1.0], [0.1, 1.0, 1.0]) == pytest.approx((np.mean([2.0, 0.0]),
                                                                               np.mean([0.3, 0.6])))
    assert o0_scale([Figures(False, reason="x")], [1.0], [1.0]) is None
    guess = prior_figures(3.0, 0.2, 0.9, (2.0, 0.5))
    assert (guess.compile_s, guess.step_s, guess.gain, guess.ok) == (6.0, 0.1, 0.9, True)
    assert predicted_run(guess, 90) == pytest.approx(6.0 + 90 * 0.1 / 0.9)
    best = [Figures(True, step_s=0.03, compile_s=4.0, gain=1.0), Figures(True, step_s=0.5, compile_s=1.0, gain=1.0)]
    assert best_left(best, 100) == pytest.approx(100 * 0.03)  # the first: 7 s against 51 s, minus its 4 s compile
    assert best_left([Figures(False, reason="x")], 100) == NO_ESTIMATE


# ------------------------------------------------------------------------------------- the probe loop, scripted
class _Clock:
    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class _FakeRun:
    """A train step whose first call takes ``compile_s + step_s`` seconds of the fake clock, the others ``step_s``."""

    def __init__(self, clock: _Clock, compile_s: float, step_s: float, log: List[str], name: str):
        self.clock, self.compile_s, self.step_s, self.calls = clock, compile_s, step_s, 0
        self.log, self.name = log, name
        self.train_cell = object()
        self.on_originals = False

    def step(self, *batch):
        self.clock.now += self.step_s + (self.compile_s if self.calls == 0 else 0.0)
        self.calls += 1
        return 1.0

    def holdout_loss(self, batches) -> float:
        return 2.0 - 0.01 * self.calls

    def restore(self) -> None:
        self.clock.now += 0.01  # writing the Parameters back


def _plan_name(boost) -> str:
    if boost.enabled("less_bn"):
        return "O1"
    if boost.enabled("cpu_gemm_conv"):
        return "O0_cpu_gemm_conv"
    if boost.enabled("thor"):
        return "thor"
    if boost.enabled("grad_accumulation"):
        return "grad_accumulation_2"
    return "O0"


def _scripted_trial(monkeypatch, ctx: TrialContext, times: Dict[str, Tuple[float, float]], **options):
    """Run the engine on fake steps: ``times[name] = (compile_s, step_s)``; returns (report, names in probe order)."""
    clock, log = _Clock(), []
    monkeypatch.setattr(engine, "time", clock)

    def build(boost, on_originals):
        name = _plan_name(boost)
        log.append(name)
        compile_s, step_s = times[name]
        return _FakeRun(clock, compile_s, step_s, log, name)

    batches = [(np.zeros(1),)] * 60
    report = engine.run_trials(build, ctx, AutotuneOptions(**options), batches, batches[:2])
    return report, log


def test_a_short_conv_run_probes_the_gemm_rewrite_first_and_picks_it(monkeypatch):
    # mnist5k/conv's shape: 94 steps, O0 (nn.Conv2d) slow, the GEMM rewrite cheap and fast, O1 a dearer compile
    times = {"O0": (3.0, 0.4), "O0_cpu_gemm_conv": (4.0, 0.03), "O1": (9.0, 0.03), "thor": (30.0, 0.4),
             "grad_accumulation_2": (4.0, 0.4)}
    report, probed = _scripted_trial(monkeypatch, _conv(94), times)
    assert probed == ["O0_cpu_gemm_conv"] and report.pick == "O0_cpu_gemm_conv"
    assert report.candidate("O1").reason.startswith("dropped: not probed: the step budget (4 steps)")
    # a larger budget pays the steps: the time budget decides, and no plan left is predicted to save time
    report, probed = _scripted_trial(monkeypatch, _conv(94), times, budget=0.5)
    assert probed == ["O0_cpu_gemm_conv"] and report.pick == "O0_cpu_gemm_conv"
    assert "no candidate left is predicted to save time" in report.candidate("O1").reason
    assert report.candidate("O0_cpu_gemm_conv").figures.compile_s == pytest.approx(4.0)


@pytest.fixture()
def o1_fast():
    """O1's plan with priors of a plan that steps twice as fast as O0 after a compile 5x O0's (test only)."""
    cand = replace(get_candidate("O1"), name="O1_fast", compile_prior=lambda ctx: 5.0, step_prior=lambda ctx: 0.5)
    register_candidate(cand)
    yield cand
    unregister_candidate(cand.name)


@pytest.mark.parametrize("o0_times, budget, probed_second, why", [
    ((1.0, 0.1), 0.1, True, ""),                # O0 compiles in 10 of its steps: O1_fast's 5x is cheap
    ((20.0, 0.1), 0.1, False, "no candidate left is predicted to save time"),  # in 200: its 5x is dear
    ((1.0, 0.1), 0.05, False, "the time budget (0.05 x the predicted 101.0 s run"),  # saves, but over 5%
])
def test_after_a_probe_the_next_is_the_shortest_run_predicted_on_the_measured_scale_if_it_saves_and_pays(
        monkeypatch, o1_fast, o0_times, budget, probed_second, why):
    ctx = _gemm(1000)
    o0 = get_candidate("O0")
    assert probe_order([o0, o1_fast], ctx) == [0, 1]  # on the guessed scale (200 steps of compile) O0 comes first
    scale = (o0_times[0] / o0.compile_prior(ctx), o0_times[1] / o0.step_prior(ctx))
    guess = prior_figures(5.0, 0.5, progress_of(o1_fast, ctx), scale)
    saves = predicted_run(guess, 1000) < 1000 * o0_times[1]  # below what O0 still needs once compiled
    # its probe: compile, 3 steps and the restore; the waste so far: O0's 3 steps and restore
    pays = 3 * o0_times[1] + 0.01 + guess.compile_s + 3 * guess.step_s + 0.01 <= budget * (o0_times[0] + 100.0)
    assert (saves and pays) is probed_second
    times = {"O0": o0_times, "O1": (4.0, 0.04)}
    report, probed = _scripted_trial(monkeypatch, ctx, times, budget=budget, measure_progress=False,
                                     candidates=("O0", "O1_fast"))
    assert probed == (["O0", "O1"] if probed_second else ["O0"])
    if probed_second:  # measured: 4 + 1000 x 0.04 / 0.9 s against O0's 1 + 100 s
        assert report.pick == "O1_fast" and report.candidate("O1_fast").run_seconds(1000) == \
            pytest.approx(4.0 + 1000 * 0.04 / progress_of(o1_fast, ctx), rel=1e-9)
    else:
        assert report.pick == "O0" and report.candidate("O1_fast").reason.startswith(f"dropped: not probed: {why}")
    # time_budget off: whatever the scale, every candidate the step budget pays for is probed
    _, probed = _scripted_trial(monkeypatch, ctx, times, budget=budget, measure_progress=False, time_budget=False,
                                candidates=("O0", "O1_fast"))
    assert probed == ["O0", "O1"]


def test_with_the_time_budget_off_every_default_candidate_is_probed_in_the_prior_order(monkeypatch):
    ctx = _conv(1000)
    times = {"O0": (1.0, 0.7), "O0_cpu_gemm_conv": (1.5, 0.1), "O1": (3.5, 0.1), "thor": (9.0, 0.7),
             "grad_accumulation_2": (1.4, 0.7)}
    report, probed = _scripted_trial(monkeypatch, ctx, times, measure_progress=False, time_budget=False)
    cands = default_candidates(ctx)
    want = ["thor" if "thor" in cands[i].name else cands[i].name for i in probe_order(cands, ctx)]
    assert probed == want and probed[0] == "O0_cpu_gemm_conv" and report.pick == "O0_cpu_gemm_conv"


def test_with_the_time_budget_the_next_probe_is_ranked_on_the_measured_scale(monkeypatch, o1_fast):
    # priors: O0 (1, 1), O1_fast (5, 0.5), accumulation (1.15, 1.3); GEMM ResNet, 1000 steps, a budget that pays
    ctx = _gemm(1000)
    names = ("O0", "O1_fast", "grad_accumulation_2")
    cands = [get_candidate(n) for n in names]
    assert [names[i] for i in probe_order(cands, ctx)] == ["O0", "O1_fast", "grad_accumulation_2"]
    times = {"O0": (1.0, 0.1), "O1": (4.0, 0.04), "grad_accumulation_2": (1.1, 0.13)}
    report, probed = _scripted_trial(monkeypatch, ctx, times, budget=0.3, measure_progress=False, candidates=names)
    scale = (1.0, 0.1)  # O0 measured: compile 1 s (10 of its steps, not 200), step 0.1 s
    runs = {n: predicted_run(prior_figures(c.compile_prior(ctx), c.step_prior(ctx), progress_of(c, ctx), scale), 1000)
            for n, c in zip(names[1:], cands[1:])}
    assert min(runs, key=runs.get) == "O1_fast" and probed[:2] == ["O0", "O1"]
    assert report.pick == "O1_fast"
    assert "no candidate left is predicted to save time" in report.candidate("grad_accumulation_2").reason


def test_no_trial_trains_the_shortest_prior_run(monkeypatch):
    report, probed = _scripted_trial(monkeypatch, _conv(40), {})  # 5% of 40 steps: 2, below one probe's 3
    want = _numpy_prior_runs(_conv(40))
    assert probed == [] and report.pick == min(want, key=want.get) and not report.measured
    assert "the shortest run its priors predict" in report.notes[0]


def test_the_trial_reads_only_the_batches_its_budget_can_use():
    opts = AutotuneOptions()  # budget 5%, probes of 3 steps, progress windows of at least 4 steps, 2 held out
    assert batches_needed(opts, 40) == (0, 1)      # 2 steps: no probe (one batch tells the batch size)
    assert batches_needed(opts, 138) == (0, 3)     # 6 steps: one probe, no room for two windows of 4
    assert batches_needed(opts, 220) == (2, 11)    # 11 steps: a probe and two windows of 4
    assert batches_needed(opts, 5000) == (2, 50)   # at most max_trial_steps
    assert batches_needed(AutotuneOptions(measure_progress=False), 5000) == (0, 3)


class _FakeLearner(_FakeRun):
    """A fake step whose held-out loss falls by ``rate`` per step (the progress a window measures)."""

    rate = 0.01

    def holdout_loss(self, batches) -> float:
        return 2.0 - self.rate * self.calls


@pytest.mark.parametrize("ratio", [2.0, 20.0])
def test_a_short_conv_run_measures_o1_only_when_asked_and_picks_it_only_past_the_break_even_gain(monkeypatch, ratio):
    # digits/conv's shape: 138 steps, the rewrite cheap to compile and fast, O1 a dearer compile for about its step
    ctx, n = _conv(138), 138
    times = {"O0": (0.65, 0.05), "O0_cpu_gemm_conv": (1.0, 0.009), "O1": (1.5, 0.0085), "thor": (6.0, 0.05),
             "grad_accumulation_2": (1.0, 0.05)}
    report, probed = _scripted_trial(monkeypatch, ctx, times)  # the defaults: one probe, the rewrite
    assert probed == ["O0_cpu_gemm_conv"] and report.pick == "O0_cpu_gemm_conv"
    assert "no candidate left is predicted to save time" in report.candidate("O1").reason
    # a larger budget alone does not probe O1: its predicted run exceeds what the rewrite still needs
    report, probed = _scripted_trial(monkeypatch, ctx, times, budget=0.5)
    assert probed == ["O0_cpu_gemm_conv"]

    # time budget off, the two plans named, 15% of the run: both probed and O1's progress measured on a window
    clock, log = _Clock(), []
    monkeypatch.setattr(engine, "time", clock)

    def build(boost, on_originals):
        name = _plan_name(boost)
        log.append(name)
        run = _FakeLearner(clock, *times[name], log, name)
        run.rate = 0.01 * (ratio if name == "O1" else 1.0)
        return run

    batches = [(np.zeros(1),)] * 60
    options = AutotuneOptions(budget=0.15, time_budget=False, candidates=("O0_cpu_gemm_conv", "O1"))
    report = engine.run_trials(build, ctx, options, batches, batches[:2])
    assert log == ["O0_cpu_gemm_conv", "O1"]
    o1 = report.candidate("O1")
    assert o1.gain_from == "measured"
    # numpy: the window is (20 steps - 2 probes x 3) // 2 = 7; gain = ratio^a 0.9^(1-a), a = 7 / 27
    a = 7 / (7 + 20)
    gain = float(np.exp(a * np.log(ratio) + (1 - a) * np.log(0.9)))
    assert o1.figures.gain == pytest.approx(gain, rel=1e-6)
    runs = {"O0_cpu_gemm_conv": 1.0 + n * 0.009, "O1": 1.5 + n * 0.0085 / gain}
    assert report.candidate("O1").run_seconds(n) == pytest.approx(runs["O1"], rel=1e-6)
    # O1 wins only when its measured gain makes its run shorter (by more than the 2% tolerance): 20x, not 2x
    assert report.pick == ("O1" if ratio == 20.0 else "O0_cpu_gemm_conv")
    assert (runs["O1"] < runs["O0_cpu_gemm_conv"] / 1.02) is (ratio == 20.0)


# ------------------------------------------------------------------------- O1's progress prior, by what LessBN changes
#: what LessBN's preview says of the time-to-accuracy page's networks: the conv net (three nn.Conv2d + BatchNorm
#: stages, no residual addition: every BatchNorm kept, its Dense head replaced by the FN head) and the GEMM ResNet-10
#: (12 BatchNorm layers, the first of each of its 4 basic blocks removed)
KEEPS_BN = {"less_bn": {"batchnorm": 3, "removed_bn": 0, "fn_head": 1}}
RESNET = {"less_bn": {"batchnorm": 12, "removed_bn": 4, "fn_head": 1}}


@pytest.mark.parametrize("previews, want", [
    (KEEPS_BN, 1.2),                                                    # O1 = the FN head + GC on the same net
    (RESNET, 0.9),                                                      # BatchNorm layers removed
    ({}, 0.9),                                                          # nothing known
    ({"less_bn": {"batchnorm": 3, "removed_bn": 0, "fn_head": 0}}, 0.9),  # no FN head (fn_flag off, no Dense)
    ({"less_bn": {"batchnorm": 0, "removed_bn": 0, "fn_head": 1}}, 0.9),  # no BatchNorm at all: not measured
])
def test_o1_and_o2_progress_priors_follow_what_lessbn_would_change(previews, want):
    ctx = replace(_conv(940), previews=previews, ranks=2)
    assert progress_of(get_candidate("O1"), ctx) == want and progress_of(get_candidate("O2"), ctx) == want
    # the others keep their numbers, whatever the network
    assert [progress_of(get_candidate(n), ctx) for n in ("O0", "grad_accumulation_2", "thor_d0.03_f5")] == \
        [1.0, 0.6, 1.5]


def test_progress_of_takes_a_number_or_a_function_and_refuses_anything_else():
    ctx = _conv(940)
    o0 = get_candidate("O0")
    assert progress_of(replace(o0, name="mine", progress_prior=2), ctx) == 2.0  # a user's number still works
    assert progress_of(replace(o0, name="mine", progress_prior=lambda c: c.planned_steps / 470), ctx) == 2.0
    assert prior_run(replace(o0, name="mine", progress_prior=2.0), ctx) == pytest.approx(10.0 + 940 / 2.0)
    for bad in (0, -1.0, float("nan"), float("inf"), "1", True, None):
        with pytest.raises(ValueError, match=r"candidate 'mine': progress_prior=.* is not allowed; allowed: a number "
                                             r"> 0, or a function"):
            progress_of(replace(o0, name="mine", progress_prior=lambda c, b=bad: b), ctx)


@pytest.mark.parametrize("ctx, first, runs", [
    # mnist5k/conv, the long form (940 steps): the GEMM rewrite 1.5 x 10 + 940 x 0.15 = 156; O1 3.5 x 10 +
    # 940 x 0.15 / 1.2 = 152.5 (with the flat 0.9: 191.7)
    (replace(_conv(940), previews=KEEPS_BN), "O1", {"O0_cpu_gemm_conv": 156.0, "O1": 152.5}),
    # digits/conv, the quick form (138 steps): the rewrite 15 + 20.7 = 35.7; O1 35 + 20.7 / 1.2 = 52.25: the
    # cheaper compile is kept
    (replace(_conv(138), previews=KEEPS_BN), "O0_cpu_gemm_conv", {"O0_cpu_gemm_conv": 35.7, "O1": 52.25}),
    # the GEMM ResNet-10 (940 steps): O0 200 + 940 = 1140; O1 1.4 x 200 + 940 x 1.1 / 0.9 = 1428.9 (unchanged; with
    # a flat 1.2 it would be 1141.7, with 1.3 1075.4: ahead of O0)
    (replace(_gemm(940), previews=RESNET), "O0", {"O0": 1140.0, "O1": 280.0 + 940 * 1.1 / 0.9}),
])
def test_the_first_probe_on_the_pages_networks_with_the_network_dependent_prior(ctx, first, runs):
    cands = default_candidates(ctx)
    assert {n: prior_run(get_candidate(n), ctx) for n in runs} == pytest.approx(runs, rel=1e-12)
    assert cands[probe_order(cands, ctx)[0]].name == first


# the idle figures of the conv net on CPU (docs/autotune.md): O0 0.65 s compile and 50 ms steps, the GEMM rewrite
# 1.0 s and 9 ms, O1 2.0 s and 8.5 ms; the GEMM ResNet: O0 2.9 s and 11 ms, O1 4 s and 13 ms
CONV_TIMES = {"O0": (0.65, 0.05), "O0_cpu_gemm_conv": (1.0, 0.009), "O1": (2.0, 0.0085), "thor": (5.7, 0.05),
              "grad_accumulation_2": (0.9, 0.05)}
GEMM_TIMES = {"O0": (2.9, 0.011), "O1": (4.0, 0.013), "thor": (16.0, 0.026), "grad_accumulation_2": (3.3, 0.014)}


def test_a_long_conv_run_where_lessbn_keeps_every_batchnorm_probes_and_trains_o1(monkeypatch):
    report, probed = _scripted_trial(monkeypatch, replace(_conv(940), previews=KEEPS_BN), CONV_TIMES)
    assert probed == ["O1"] and report.pick == "O1"
    # after O1's probe the rewrite cannot save time: on the measured scale (K = 2.0 / 3.5, T = 0.0085 / 0.15) its
    # run is 1.5 K + 940 x 0.15 T = 8.85 s against the 940 x 0.0085 / 1.2 = 6.66 s O1 still needs
    assert "no candidate left is predicted to save time" in report.candidate("O0_cpu_gemm_conv").reason
    assert report.candidate("O1").figures.gain == 1.2 and report.candidate("O1").gain_from == "prior"
    # the same network without the preview (nothing known of it): the GEMM rewrite, as before
    report, probed = _scripted_trial(monkeypatch, _conv(940), CONV_TIMES)
    assert probed == ["O0_cpu_gemm_conv"] and report.pick == "O0_cpu_gemm_conv"


@pytest.mark.parametrize("ctx, times, pick", [
    (replace(_conv(138), previews=KEEPS_BN), CONV_TIMES, "O0_cpu_gemm_conv"),  # a short run: the cheaper compile
    (replace(_gemm(940), previews=RESNET), GEMM_TIMES, "O0"),                  # LessBN removes BatchNorm: as before
])
def test_short_conv_runs_and_the_gemm_resnet_keep_their_pick(monkeypatch, ctx, times, pick):
    report, probed = _scripted_trial(monkeypatch, ctx, times)
    assert probed == [pick] and report.pick == pick
    assert report.candidate("O1").reason.startswith("dropped: not probed")

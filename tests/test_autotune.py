"""ms_boost.autotune: the decision rules against numpy, option errors, and trials that pick, drop and agree.

The constructed cases use test-only candidates registered here: ``O0_slow`` is the plain step made slower on
purpose (it sleeps 0.4 s after each step), ``O0_fails`` raises in its second
step, ``O0_nan`` reports a non-finite loss in its third. Same starting weights and data order mean ``O0`` and
``O0_slow`` measure identical held-out losses; only their time differs. Nets are tiny and trials a few steps.
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
import yaml
from mindspore import Tensor, nn

from ms_boost import AutoBoost, Model, autotune_plan
from ms_boost.autotune import Candidate, register_candidate, unregister_candidate
from ms_boost.autotune.candidates import (
    TrialContext,
    candidate_names,
    candidate_plan,
    default_candidates,
    get_candidate,
    prior_run,
    probe_order,
)
from ms_boost.autotune.decide import (
    NO_ESTIMATE,
    Figures,
    TrialRecord,
    best_run,
    over_time_budget,
    pack,
    pick,
    predicted_run,
    seconds_per_step,
    smoothed_progress,
    step_times,
    summarize,
    trial_waste,
    unpack,
    with_gains,
)
from ms_boost.autotune.engine import eval_steps, plan_dict
from ms_boost.autotune.options import AutotuneOptions, parse_options, split_auto_config
from ms_boost.validation import BoostConfigError
from tests.helpers.loopback import run_ranks
from tests.helpers.nets import all_params, dataset, learnable_data, make_net

MODES = [ms.PYNATIVE_MODE, ms.GRAPH_MODE]
BATCH = 16


# ------------------------------------------------------------------------------------- test-only candidates
SLEEP = 0.4  # seconds O0_slow adds to every step (fixed: in the loopback world a rank's step time includes the
# other rank's turn, so a sleep proportional to it would grow step after step)


def _slow(step):
    def slow_step(*batch):
        out = step(*batch)
        out.asnumpy()
        time.sleep(SLEEP)
        return out
    return slow_step


def _fails(step):
    calls = []

    def failing_step(*batch):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("constructed failure")
        return step(*batch)
    return failing_step


def _nan(step):
    calls = []

    def nan_step(*batch):
        calls.append(1)
        out = step(*batch)
        return Tensor(np.float32("nan")) if len(calls) == 3 else out
    return nan_step


TEST_CANDIDATES = [Candidate("O0_slow", "O0", lambda ctx: {}, "plain step + 0.4 s, slow on purpose", wrap_step=_slow),
                   Candidate("O0_fails", "O0", lambda ctx: {}, "raises in step 2", wrap_step=_fails),
                   Candidate("O0_nan", "O0", lambda ctx: {}, "non-finite loss in step 3", wrap_step=_nan)]


@pytest.fixture(scope="module", autouse=True)
def test_candidates():
    for cand in TEST_CANDIDATES:
        register_candidate(cand)
    yield
    for cand in TEST_CANDIDATES:
        unregister_candidate(cand.name)


def _setup(mode, n=256, seed=0):
    ms.set_context(mode=mode)
    net = make_net(width=4)
    opt = nn.Momentum(net.trainable_params(), 0.05, 0.9)
    x, y = learnable_data(n, seed=seed)
    return net, opt, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), x, y


def _options(candidates, **extra):
    """Trial options of the constructed cases: every candidate tried (no time budget), no simplicity tolerance; on
    16 planned steps the step budget (14) pays for two probes of 3 steps and two progress windows of 4."""
    return {"autotune": {"budget": 0.9, "candidates": candidates, "max_trial_steps": 4, "tolerance": 0.0,
                         "time_budget": False, **extra}}


# ------------------------------------------------------------------------------------- the decision, pure
def test_smoothed_progress_is_minus_the_least_squares_slope():
    steps, losses = [0, 2, 4, 6, 8], [2.0, 1.7, 1.75, 1.3, 1.2]
    assert smoothed_progress(steps, losses) == pytest.approx(-np.polyfit(steps, losses, 1)[0], rel=1e-12)
    with pytest.raises(ValueError):
        smoothed_progress([3], [1.0])


def test_step_times_split_compile_and_amortize_it():
    steady, compile_s = step_times([5.0, 1.0, 2.0, 3.0])
    assert (steady, compile_s) == (2.0, 3.0)
    assert step_times([0.5, 1.0, 1.0]) == (1.0, 0.0)  # a first step faster than the rest compiles nothing
    assert seconds_per_step(2.0, 3.0, 300) == pytest.approx(2.01)


def test_probe_order_skips_gemm_conv_without_conv2d():
    gemm = TrialContext(ranks=1, batch_size=64, planned_steps=100, device="CPU", conv2d_layers=0)
    cands = default_candidates(gemm)
    assert "O0_cpu_gemm_conv" not in [c.name for c in cands] and cands[probe_order(cands, gemm)[0]].name == "O0"
    assert get_candidate("O0_cpu_gemm_conv").unavailable(gemm).startswith("cpu_gemm_conv rewrites nn.Conv2d")


class _Residual(nn.Cell):
    """conv-BN-ReLU-conv-BN plus the input, ReLU, then a Dense head: LessBN removes the block's first BatchNorm."""

    def __init__(self, width: int = 4):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 3, 3, pad_mode="same", has_bias=False)
        self.bn1 = nn.BatchNorm2d(3)
        self.conv2 = nn.Conv2d(3, 3, 3, pad_mode="same", has_bias=False)
        self.bn2 = nn.BatchNorm2d(3)
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(3 * 8 * 8, width)

    def construct(self, x):
        out = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
        return self.fc(self.flatten(self.relu(out + x)))


def test_lessbn_preview_counts_what_it_would_change_and_changes_nothing():
    from ms_boost.less_bn import preview_less_bn
    from ms_boost.pipeline import preview_network

    for net, want in ((make_net(width=4), {"batchnorm": 2, "removed_bn": 0, "fn_head": 1}),
                      (_Residual(), {"batchnorm": 2, "removed_bn": 1, "fn_head": 1})):
        cells = [(name, type(cell)) for name, cell in net.cells_and_names()]
        assert preview_less_bn(net, fn_flag=True) == want
        assert preview_less_bn(net) == {**want, "fn_head": 0}  # fn_flag off: no head
        # through the registry, with the user's less_bn section (fn_flag on by default)
        assert preview_network(AutoBoost("O0"), net) == {"less_bn": want}
        assert preview_network(AutoBoost("O0", {"less_bn": {"fn_flag": False}}), net) == \
            {"less_bn": {**want, "fn_head": 0}}
        assert [(name, type(cell)) for name, cell in net.cells_and_names()] == cells  # left as it was
    with pytest.raises(TypeError, match="network must be a mindspore.nn.Cell"):
        preview_less_bn("net")


def test_a_preview_that_fails_is_left_out_with_a_warning(caplog):
    import dataclasses
    import logging

    from ms_boost import registry
    from ms_boost.pipeline import preview_network
    from ms_boost.spec import AlgorithmSpec

    @dataclasses.dataclass(frozen=True)
    class _Nothing:
        pass

    def broken(network, cfg):
        raise RuntimeError("cannot read this network")

    spec = AlgorithmSpec(name="broken_preview", section=_Nothing, order=90, preview=broken)
    with registry.registered(spec), caplog.at_level(logging.WARNING, logger="ms_boost"):
        previews = preview_network(AutoBoost("O0"), make_net(width=4))
    assert previews == {"less_bn": {"batchnorm": 2, "removed_bn": 0, "fn_head": 1}}
    assert "preview of algorithm 'broken_preview' failed (RuntimeError: cannot read this network)" in caplog.text


@pytest.mark.parametrize("mode", MODES)
def test_model_auto_gives_its_trial_what_lessbn_would_change_and_trains(mode, monkeypatch):
    import ms_boost.model as model_module

    seen = []
    real = model_module.run_trials

    def spy(build, ctx, *args, **kwargs):
        seen.append(ctx)
        return real(build, ctx, *args, **kwargs)

    monkeypatch.setattr(model_module, "run_trials", spy)
    net, opt, loss, x, y = _setup(mode, n=128)
    before = all_params(net)["fc.weight"]
    model = Model(net, loss, opt, metrics={"acc"}, boost_level="auto",
                  boost_config_dict={"autotune": {"budget": 0.75, "candidates": ["O0", "O1"], "time_budget": False,
                                                  "measure_progress": False}})
    model.train(1, dataset(x, y, BATCH))
    ctx = seen[0]
    # SmallConvNet: two nn.Conv2d + BatchNorm, no residual addition, a Dense head: LessBN keeps both BatchNorm layers
    assert ctx.previews == {"less_bn": {"batchnorm": 2, "removed_bn": 0, "fn_head": 1}}
    assert ctx.conv2d_layers == 2 and model.autotune_report.pick in ("O0", "O1")
    assert model.autotune_report.candidate("O1").figures.gain == 1.2  # its prior here (progress not measured)
    assert not np.array_equal(all_params(net)["fc.weight"], before)  # trained
    assert model.eval(dataset(x, y, BATCH))["acc"] >= 0.0


def test_gains_put_measured_progress_on_the_scale_of_the_exact_reference():
    figs = [Figures(True, progress=0.02, step_s=0.1, measured=True),     # O0: the reference
            Figures(True, step_s=0.05),                                   # O0_cpu_gemm_conv: exact, not measured
            Figures(True, progress=0.03, step_s=0.2, measured=True),     # thor: measured
            Figures(True, step_s=0.02)]                                   # O1: prior only
    gains = [f.gain for f in with_gains(figs, [True, True, False, False], [1.0, 1.0, 1.5, 0.9])]
    assert gains == pytest.approx([1.0, 1.0, 1.5, 0.9])
    figs[2] = Figures(True, progress=0.01, step_s=0.2, measured=True)
    assert with_gains(figs, [True, True, False, False], [1.0, 1.0, 1.5, 0.9])[2].gain == pytest.approx(0.5)
    # a window of w steps: the measured ratio 0.5 and the prior 1.5 combined in log space, weight w / (w + 20)
    a = 5 / 25
    assert with_gains(figs, [True, True, False, False], [1.0, 1.0, 1.5, 0.9], window=5)[2].gain == \
        pytest.approx(0.5 ** a * 1.5 ** (1 - a), rel=1e-12)
    figs[2] = Figures(True, progress=-0.01, step_s=0.2, measured=True)  # no progress stays no progress
    assert with_gains(figs, [True, True, False, False], [1.0, 1.0, 1.5, 0.9], window=5)[2].gain == \
        pytest.approx(-0.5)
    # the reference made no progress in its window: measured progress cannot be scaled, the prior is used
    figs[2] = Figures(True, progress=0.03, step_s=0.2, measured=True)
    figs[0] = Figures(True, progress=-0.01, step_s=0.1, measured=True)
    assert with_gains(figs, [True, True, False, False], [1.0, 1.0, 1.5, 0.9])[2].gain == 1.5


def test_predicted_run_and_the_waste_refund_the_best_plans_compile():
    o0 = Figures(True, step_s=0.3, compile_s=2.0, gain=1.0)
    o1 = Figures(True, step_s=0.025, compile_s=18.0, gain=0.9)
    assert predicted_run(o0, 140) == pytest.approx(2.0 + 140 * 0.3)
    assert predicted_run(o1, 140) == pytest.approx(18.0 + 140 * 0.025 / 0.9)
    assert best_run([o0, o1, Figures(False, reason="x")], 140) == (1, pytest.approx(18.0 + 140 * 0.025 / 0.9))
    assert best_run([Figures(False, reason="x")], 140) == (None, NO_ESTIMATE)
    # 25 s spent: O1 is the best so far, its 18 s compile is the run's own
    assert trial_waste(25.0, [o0, o1], 140) == pytest.approx(7.0)
    assert over_time_budget(7.0, 2.0, 21.9, budget=0.05) is True
    assert over_time_budget(0.1, 0.5, 21.9, budget=0.05) is False


def test_pick_prefers_the_best_score_a_simpler_near_tie_and_drops_failures():
    names = ["O0", "O1", "thor", "broken"]
    figs = [Figures(True, step_s=0.10, compile_s=1.0, gain=1.0),    # 1 / 0.101 = 9.90
            Figures(True, step_s=0.10, compile_s=50.0, gain=1.2),   # 1.2 / 0.15 = 8.0
            Figures(True, step_s=0.25, compile_s=0.0, gain=3.0),    # 3 / 0.25 = 12.0
            Figures(False, reason="failed at step 2: RuntimeError: x")]
    decision = pick(names, figs, planned_steps=1000, tolerance=0.0)
    assert decision.index == 2 and decision.measured
    assert decision.reasons[3].startswith("dropped: failed at step 2")
    assert decision.reasons[0] == f"{(1.0 / 0.101) / 12.0:.2f}x the pick's progress per second"
    # O0 is within 20% of thor's score and simpler
    assert pick(names, figs, 1000, tolerance=0.2).index == 0
    # compile amortized over a short run makes O1 lose more: its score drops below O0's
    assert pick(names[:2], figs[:2], 10, 0.0).index == 0
    nothing = [Figures(True, step_s=0.1, gain=-0.5), Figures(False, reason="diverged")]
    fallback = pick(["O0", "x"], nothing, 100, 0.0)
    assert fallback.index == 0 and not fallback.measured and fallback.reasons[0].startswith("fallback")


def test_summarize_drops_non_finite_and_diverged_trials():
    ok = summarize(TrialRecord((0, 2, 4), (2.0, 1.5, 1.0), (3.0, 1.0, 1.0, 1.0)), divergence_ratio=1.5)
    assert ok.ok and ok.measured and ok.progress == pytest.approx(0.25) and (ok.step_s, ok.compile_s) == (1.0, 2.0)
    probe = summarize(TrialRecord(step_seconds=(3.0, 1.0, 1.0)), 1.5, prior=0.9)  # a probe: time only
    assert probe.ok and not probe.measured and (probe.step_s, probe.compile_s, probe.gain) == (1.0, 2.0, 0.9)
    nan = summarize(TrialRecord((0, 2), (2.0, math.nan), (1.0, 1.0)), 1.5)
    assert not nan.ok and "not finite at step 2" in nan.reason
    up = summarize(TrialRecord((0, 2), (1.0, 1.6), (1.0, 1.0)), 1.5)
    assert not up.ok and up.reason.startswith("diverged: held-out loss rose")
    assert summarize(TrialRecord(error="failed to build: X"), 1.5).reason == "failed to build: X"


def test_ranks_agree_on_means_and_drop_what_any_rank_dropped():
    rank0 = [Figures(True, 0.02, 0.1, 1.0, 2.0, 1.8, 1.0, True), Figures(True, 0.01, 0.2, 0.0, 2.0, 1.9)]
    rank1 = [Figures(True, 0.04, 0.3, 3.0, 2.2, 1.6, 1.0, True), Figures(False, reason="diverged")]
    summed = np.add(pack(rank0), pack(rank1)).tolist()
    mine = unpack(summed, rank0, 2)
    theirs = unpack(summed, rank1, 2)
    assert mine[0] == theirs[0] and mine[0].ok and mine[0].measured
    got = [mine[0].progress, mine[0].step_s, mine[0].compile_s, mine[0].loss_start, mine[0].loss_end, mine[0].gain]
    assert got == pytest.approx([0.03, 0.2, 2.0, 2.1, 1.7, 1.0], rel=1e-12)
    assert not mine[1].ok and not theirs[1].ok and theirs[1].reason == "diverged"
    assert mine[1].reason == "dropped on 1 other rank(s)"


def test_eval_steps_start_at_zero_and_end_at_the_last_step():
    assert eval_steps(10, 4) == [0, 2, 5, 8, 10]
    assert eval_steps(3, 4) == [0, 1, 2, 3]


# ------------------------------------------------------------------------------------- options and errors
@pytest.mark.parametrize("budget", [0, 0.0, -0.1, 1, 1.0, 2.5])
def test_budget_outside_zero_one_names_the_key(budget):
    with pytest.raises(BoostConfigError, match=r"autotune\.budget=.* allowed: 0\.0 < value < 1\.0"):
        parse_options({"budget": budget})


def test_bad_options_name_the_key(tmp_path):
    with pytest.raises(TypeError, match=r"autotune\.budget must be a number"):
        parse_options({"budget": "5%"})
    with pytest.raises(BoostConfigError, match=r"unknown candidate 'O3'; allowed: \['O0', 'O0_cpu_gemm_conv', 'O1'"):
        parse_options({"candidates": ["O0", "O3"]})
    with pytest.raises(BoostConfigError, match=r"\['autotune\.budgett'\]; allowed keys"):
        parse_options({"budgett": 0.1})
    with pytest.raises(BoostConfigError, match="names a candidate twice"):
        parse_options({"candidates": ["O0", "O0"]})
    with pytest.raises(BoostConfigError, match=r"autotune\.max_trial_steps=2 is out of range"):
        parse_options({"max_trial_steps": 2})
    with pytest.raises(BoostConfigError, match="the autotune chooses the switches"):
        split_auto_config({"boost": {"mode": "manual", "thor": True}})
    # journeys, second round: a folder as save_path failed with IsADirectoryError once the trial had run; a saved pick
    # given back with boost_level auto is named as such
    with pytest.raises(BoostConfigError, match=r"^boost config autotune\.save_path='.*' is a folder; allowed: the "
                                               r"path of a file to write the pick to, e\.g\. '.*autotune\.yaml'\.$"):
        parse_options({"save_path": str(tmp_path)})
    with pytest.raises(TypeError, match=r"^boost config autotune\.candidates='O0, O1' is one string; give a list of "
                                        r"candidate names, e\.g\. \['O0', 'O1'\]\.$"):
        parse_options({"candidates": "O0, O1"})  # was "unknown candidate 'O0, O1'"
    with pytest.raises(BoostConfigError, match=r"a saved pick .* is reused without a trial as Model\(\.\.\., "
                                               r"boost_level='O0', boost_config_dict=<the file>\)"):
        split_auto_config({"boost": {"mode": "manual", "less_bn": False, "thor": False}})
    options, sections = split_auto_config({"boost": {"mode": "auto"}, "grad_freeze": {"param_groups": 2},
                                           "autotune": {"budget": 0.1}})
    assert options.budget == 0.1 and sections == {"grad_freeze": {"param_groups": 2}}


def test_model_auto_checks_its_options_and_optimizer_when_built():
    net, opt, loss, _, _ = _setup(ms.PYNATIVE_MODE)
    with pytest.raises(BoostConfigError, match=r"autotune\.budget"):
        Model(net, loss, opt, boost_level="auto", boost_config_dict={"autotune": {"budget": 1.0}})
    with pytest.raises(BoostConfigError, match="unknown candidate"):
        Model(net, loss, opt, boost_level="auto", boost_config_dict={"autotune": {"candidates": ["fastest"]}})
    with pytest.raises(ValueError, match="first-order optimizer"):
        Model(net, loss, None, boost_level="auto")
    model = Model(net, loss, opt, boost_level="auto")
    with pytest.raises(RuntimeError, match="chosen when train"):
        model.train_network(Tensor(np.zeros((2, 3, 8, 8), np.float32)), Tensor(np.zeros(2, np.int32)))


def test_model_auto_refuses_an_optimizer_whose_hooks_say_it_is_not_first_order():
    from ms_boost.stages import OptimizerHooks, optimizer_hooks
    from ms_boost.thor import thor

    class SecondOrder(nn.Momentum, OptimizerHooks):
        def is_first_order(self) -> bool:
            return False

    net, _, loss, _, _ = _setup(ms.PYNATIVE_MODE)
    with pytest.raises(ValueError, match="first-order optimizer .*got SecondOrder"):
        Model(net, loss, SecondOrder(net.trainable_params(), 0.05, 0.9), boost_level="auto")
    thor_opt = thor(net, 0.05, 0.05, 0.9, frequency=2)
    assert optimizer_hooks(thor_opt).is_first_order() is False
    assert optimizer_hooks(nn.Momentum(net.trainable_params(), 0.05, 0.9)).is_first_order() is True
    with pytest.raises(ValueError, match="first-order optimizer .*got THOR"):
        Model(net, loss, thor_opt, boost_level="auto")


def test_candidate_registry_refuses_taken_names_and_builtins():
    with pytest.raises(ValueError, match="taken by a built-in"):
        register_candidate(Candidate("O1", "O1", lambda ctx: {}, "x"))
    with pytest.raises(ValueError, match="is a built-in"):
        unregister_candidate("O0")
    assert candidate_names()[:4] == ["O0", "O0_cpu_gemm_conv", "O1", "O2"]
    cpu = TrialContext(ranks=1, batch_size=64, planned_steps=100, device="CPU", conv2d_layers=2)
    assert [c.name for c in default_candidates(cpu)] == ["O0", "O0_cpu_gemm_conv", "O1", "thor_d0.03_f5",
                                                         "thor_d0.03_f20", "thor_d0.3_f5"]
    small = TrialContext(ranks=2, batch_size=32, planned_steps=100, device="GPU")
    assert [c.name for c in default_candidates(small)] == ["O0", "O1", "O2", "grad_accumulation_2", "thor_d0.03_f5",
                                                           "thor_d0.03_f20", "thor_d0.3_f5"]


@pytest.mark.parametrize("name", ["O0", "O0_cpu_gemm_conv", "O1", "O2", "grad_accumulation_2", "thor_d0.03_f5",
                                  "thor_d0.3_f5"])
def test_saved_yaml_of_every_builtin_plan_reproduces_it(tmp_path, name):
    ctx = TrialContext(ranks=2, batch_size=16, planned_steps=500, user_sections={"grad_freeze": {"param_groups": 3}})
    level, config = candidate_plan(get_candidate(name), ctx)
    boost = AutoBoost(level, config)
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan_dict(boost)), encoding="utf-8")
    again = AutoBoost("O0", str(path))  # a fixed level: the file's manual switches decide
    assert again.boost_config == boost.boost_config and again.common == boost.common
    for spec in boost.enabled_specs():  # every algorithm that runs has the same values
        assert again.section(spec.name) == boost.section(spec.name)
    if name in ("O1", "O2"):
        assert again.grad_freeze.param_groups == 3 and again.grad_freeze.total_steps == 500


# ------------------------------------------------------------------------------------- trials
@pytest.mark.parametrize("mode", MODES)
def test_trial_picks_the_faster_of_two_equal_plans_and_leaves_the_start_untouched(mode):
    net, opt, loss, x, y = _setup(mode)
    before = {**all_params(net), **all_params(opt)}
    report = autotune_plan(net, loss, opt, dataset(x, y, BATCH), 1, _options(["O0_slow", "O0"]))
    slow, fast = report.candidate("O0_slow"), report.candidate("O0")
    assert report.pick == "O0" and report.measured and report.trial_steps == 2 * 3 + 2 * 4
    # same start, same batches: identical progress (measured, on O0's scale: gain 1); only the time differs
    assert (slow.figures.loss_start, slow.figures.loss_end, slow.figures.progress) == \
           (fast.figures.loss_start, fast.figures.loss_end, fast.figures.progress)
    assert slow.figures.progress > 0 and slow.gain_from == "measured" and fast.gain_from == "exact"
    assert slow.figures.gain == pytest.approx(1.0)
    assert slow.figures.step_s >= SLEEP  # each of its steps sleeps that long (no bound on the plain step: load)
    assert slow.reason.endswith("x the pick's progress per second")
    after = {**all_params(net), **all_params(opt)}
    assert before.keys() == after.keys() and all(np.array_equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("mode", MODES)
def test_a_restored_step_trains_again_from_the_start_and_its_snapshot_stays_put(mode):
    from ms_boost import build_train_network
    from ms_boost.autotune.cells import CellTrialRun

    net, opt, loss, x, y = _setup(mode, n=32)
    run = CellTrialRun(build_train_network(net, opt, loss))
    params = list(run.train_cell.get_parameters())
    start = {p.name: p.asnumpy().copy() for p in params}
    xb, yb = Tensor(x[:BATCH]), Tensor(y[:BATCH])
    first = [float(run.step(xb, yb).asnumpy()) for _ in range(3)]
    assert first[2] < first[0]  # it trains (the weights and the momentum moved)
    for _ in range(2):  # twice: a step after a restore must not train the remembered values themselves
        run.restore()
        assert all(np.array_equal(p.asnumpy(), start[p.name]) for p in params)
        assert list(run.train_cell.get_parameters()) == params  # the same Parameters, written in place
        again = [float(run.step(xb, yb).asnumpy()) for _ in range(3)]
        assert again == first  # the compiled step reads the restored values: the same losses, step by step


def test_failing_and_diverging_candidates_are_dropped_with_the_reason():
    net, opt, loss, x, y = _setup(ms.PYNATIVE_MODE)
    report = autotune_plan(net, loss, opt, dataset(x, y, BATCH), 1, _options(["O0_fails", "O0_nan", "O0"]))
    assert report.pick == "O0"
    assert report.candidate("O0_fails").reason == ("dropped: failed at step 2: RuntimeError: constructed failure")
    assert report.candidate("O0_nan").reason == "dropped: diverged: training loss nan at step 3"
    assert "O0_fails" in report.table() and "constructed failure" in report.table()


def test_the_time_budget_probes_no_plan_predicted_to_save_nothing():
    net, opt, loss, x, y = _setup(ms.GRAPH_MODE)
    # 16 planned steps, budget 0.375: the step budget (6 steps) pays for both probes of 3 steps, but O0_slow has O0's
    # priors: after O0's probe (compile k, step t) it is predicted to run k + 16t, not below the 16t O0 still needs
    # (its step is compiled), whatever the machine's load
    report = autotune_plan(net, loss, opt, dataset(x, y, BATCH), 1,
                           _options(["O0", "O0_slow"], time_budget=True, budget=0.375))
    assert report.pick == "O0" and report.trial_steps == 3
    assert report.candidate("O0_slow").reason.startswith("dropped: not probed: no candidate left is predicted to save")
    assert report.train_network is not None  # O0 ran on net/opt themselves: its compiled step is handed over
    assert report.trial_run.on_originals


@pytest.mark.parametrize("mode", MODES)
def test_a_picked_o0_trains_with_the_step_its_trial_compiled_exactly_as_plain_o0(mode):
    net, opt, loss, x, y = _setup(mode, n=128)
    model = Model(net, loss, opt, boost_level="auto",
                  boost_config_dict=_options(["O0", "O0_slow"], budget=0.75))
    model.train(1, dataset(x, y, BATCH))
    assert model.autotune_report.pick == "O0" and model.train_network is model.autotune_report.train_network
    plain_net, plain_opt, _, _, _ = _setup(mode, n=128)
    Model(plain_net, loss, plain_opt).train(1, dataset(x, y, BATCH))
    auto_state, plain_state = {**all_params(net), **all_params(opt)}, {**all_params(plain_net), **all_params(plain_opt)}
    assert auto_state.keys() == plain_state.keys()
    assert all(np.array_equal(auto_state[k], plain_state[k]) for k in auto_state)


@pytest.mark.parametrize("samples", [64, 640])
def test_a_budget_too_small_for_one_probe_trains_the_shortest_prior_run_unmeasured(samples):
    net, opt, loss, x, y = _setup(ms.PYNATIVE_MODE, n=samples)
    report = autotune_plan(net, loss, opt, dataset(x, y, BATCH), 1, _options(["O0", "O1"], budget=0.05))
    # nn.Conv2d layers on CPU; 4 or 40 planned steps, 5% of which pays for no probe of 3 steps
    ctx = TrialContext(ranks=1, batch_size=BATCH, planned_steps=samples // BATCH, device="CPU", conv2d_layers=2,
                       previews={"less_bn": {"batchnorm": 2, "removed_bn": 0, "fn_head": 1}})
    runs = {name: prior_run(get_candidate(name), ctx) for name in ("O0", "O1")}
    assert report.pick == min(runs, key=runs.get) and not report.measured and report.trial_steps == 0
    assert "no trial" in report.notes[0] and report.boost_config_dict["boost"].get("less_bn", False) == \
        (report.pick == "O1")


@pytest.mark.parametrize("mode", MODES)
def test_model_auto_trains_the_pick_on_its_trial_step_and_its_yaml_reruns_it_without_a_trial(mode, tmp_path):
    path = tmp_path / "run" / "autotune.yaml"
    net, opt, loss, x, y = _setup(mode, n=128)
    # the plain step fails in its trial: accumulation over 2 batches is the pick, the run goes on
    model = Model(net, loss, opt, metrics={"acc"}, boost_level="auto",
                  boost_config_dict=_options(["O0_fails", "grad_accumulation_2"], save_path=str(path), budget=0.75))
    model.train(1, dataset(x, y, BATCH))
    report = model.autotune_report
    assert report.pick == "grad_accumulation_2" and report.saved_to == str(path)
    # the run trained the copies the trial compiled (at the starting state); net and opt got their values after
    assert model.train_network is report.train_network and not report.trial_run.on_originals
    assert model.boost.enabled("grad_accumulation") and model.boost.grad_accumulation.grad_accumulation_step == 2
    auto_weights = all_params(net)
    assert all(np.array_equal(v, all_params(model.train_network)[k]) for k, v in auto_weights.items())
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# ms_boost autotune pick: grad_accumulation_2") and "constructed failure" in text

    rerun_net, rerun_opt, _, _, _ = _setup(mode, n=128)
    rerun = Model(rerun_net, loss, rerun_opt, boost_level=report.level, boost_config_dict=str(path))
    assert rerun.boost.to_dict() == model.boost.to_dict()
    rerun.train(1, dataset(x, y, BATCH))
    assert all(np.array_equal(auto_weights[k], v) for k, v in all_params(rerun_net).items())
    plain_net, plain_opt, _, _, _ = _setup(mode, n=128)
    Model(plain_net, loss, plain_opt).train(1, dataset(x, y, BATCH))
    assert not np.array_equal(all_params(plain_net)["fc.weight"], auto_weights["fc.weight"])


def test_a_picked_copy_is_rebuilt_on_the_users_objects_when_the_user_gave_an_eval_network():
    net, opt, loss, x, y = _setup(ms.PYNATIVE_MODE, n=128)
    eval_net = nn.WithEvalCell(net, loss)  # reads net's own Parameters: the run must train those
    model = Model(net, loss, opt, metrics={"acc"}, eval_network=eval_net, boost_level="auto",
                  boost_config_dict=_options(["grad_accumulation_2"], budget=0.75))
    model.train(1, dataset(x, y, BATCH))
    assert model.autotune_report.pick == "grad_accumulation_2" and not model.autotune_report.trial_run.on_originals
    assert model.train_network is not model.autotune_report.train_network  # built anew on net and opt
    fixed_net, fixed_opt, _, _, _ = _setup(ms.PYNATIVE_MODE, n=128)
    Model(fixed_net, loss, fixed_opt, boost_level="O0", boost_config_dict=model.autotune_report.boost_config_dict
          ).train(1, dataset(x, y, BATCH))
    assert all(np.array_equal(v, all_params(net)[k]) for k, v in all_params(fixed_net).items())


def test_loopback_ranks_run_the_same_trials_and_agree_on_one_pick():
    x, y = learnable_data(512, seed=0)
    size = 2
    ms.set_context(mode=ms.PYNATIVE_MODE)  # the loopback world's collectives are Python

    def rank_fn(rank):
        net, opt, loss, _, _ = _setup(ms.PYNATIVE_MODE)
        rows = slice(rank * 256, (rank + 1) * 256)  # each rank its own shard: local figures differ
        report = autotune_plan(net, loss, opt, dataset(x[rows], y[rows], BATCH), 1, _options(["O0_slow", "O0"]))
        start = net  # untouched by the trial: its held-out loss at the start is this rank's own
        held = [(Tensor(x[rows][i * BATCH:(i + 1) * BATCH]), Tensor(y[rows][i * BATCH:(i + 1) * BATCH]))
                for i in range(2)]
        cell = nn.WithLossCell(start, loss)
        cell.set_train(False)
        own_start = np.mean([float(cell(*b).asnumpy()) for b in held])
        return report, own_start

    results = run_ranks(size, rank_fn)
    (r0, s0), (r1, s1) = results
    assert r0.pick == r1.pick == "O0" and r0.ranks == r1.ranks == size
    assert [c.figures for c in r0.candidates] == [c.figures for c in r1.candidates]
    assert s0 != s1  # the ranks' own held-out losses differ ...
    assert r0.candidate("O0").figures.loss_start == pytest.approx((s0 + s1) / 2, rel=1e-5)  # ... agreed: the mean


def test_options_defaults_are_the_documented_ones():
    opts = AutotuneOptions()
    assert (opts.budget, opts.candidates, opts.holdout_batches, opts.eval_points, opts.probe_steps, opts.time_budget,
            opts.measure_progress) == (0.05, (), 2, 4, 3, True, True)
    with pytest.raises(TypeError, match=r"autotune\.time_budget must be a bool"):
        parse_options({"time_budget": 1})


# ------------------------------------------------------------------------------------- the model zoo
@pytest.mark.slow
def test_zoo_boost_level_auto_trains_the_pick_and_autotune_plan_reruns_it(tmp_path):
    from tests.test_zoo_journey import run, small, state

    def args(out, *extra):
        shrink = small(tmp_path / "cache", out, mode="pynative", epochs=1)
        shrink[shrink.index("--steps_per_epoch") + 1] = "5"
        return [*shrink, "--boost_level", "auto", *extra]

    first = run("resnet18_synthetic_quickstart.yaml", args(
        tmp_path / "auto", "--autotune.candidates", "[O0, O1]", "--autotune.probe_steps", "2",
        "--autotune.time_budget", "false",
        "--autotune.holdout_batches", "1", "--autotune.budget", "0.8"))
    plan = tmp_path / "auto" / "autotune.yaml"
    text = plan.read_text(encoding="utf-8")
    assert "2 candidate(s), 4 trial steps in all" in text  # the table, as comments
    saved = yaml.safe_load(text)
    picked = text.splitlines()[0].split()[4]  # "# ms_boost autotune pick: <name> (boost_level ..."
    assert picked in ("O0", "O1") and saved["boost"]["less_bn"] == (picked == "O1")
    assert first["model"].boost.boost_config == {k: v for k, v in saved["boost"].items() if k != "mode"}
    again = run("resnet18_synthetic_quickstart.yaml", args(tmp_path / "rerun", "--autotune.plan", str(plan)))
    assert "autotune: no trial" in again["stdout"] and not (tmp_path / "rerun" / "autotune.yaml").exists()
    assert again["model"].boost.boost_config == first["model"].boost.boost_config
    left, right = state(Path(first["last_checkpoint"])), state(Path(again["last_checkpoint"]))
    assert sorted(left) == sorted(right) and all(np.array_equal(left[k], right[k]) for k in left)


@pytest.mark.slow
def test_zoo_boost_level_auto_compiles_the_picks_train_step_once_in_graph_mode(tmp_path, monkeypatch):
    """The zoo trains the pick on the step its trial compiled: no train step compiles after the trial."""
    import mindspore.nn.cell as cell_module

    from ms_boost import model as model_module
    from tests.test_zoo_journey import run, small

    executor = type(cell_module._cell_graph_executor)
    original, events = executor.compile, []

    def counting(self, obj, *args, **kwargs):
        phase, new = original(self, obj, *args, **kwargs)
        if new and type(obj).__name__.startswith("BoostTrainOneStep"):
            events.append(f"compile {type(obj).__name__} {phase.split('.')[0]}")
        return phase, new

    trial = model_module.Model.autotune

    def marked(self, *args, **kwargs):
        report = trial(self, *args, **kwargs)
        events.append("trial done")
        return report

    monkeypatch.setattr(executor, "compile", counting)
    monkeypatch.setattr(model_module.Model, "autotune", marked)
    shrink = small(tmp_path / "cache", tmp_path / "auto", mode="graph", epochs=1)
    shrink[shrink.index("--steps_per_epoch") + 1] = "5"
    # one candidate that trains copies (accumulation over 2 batches): a 2-step probe, then the run's 5 steps
    result = run("resnet18_synthetic_quickstart.yaml", [
        *shrink, "--boost_level", "auto", "--autotune.candidates", "[grad_accumulation_2]",
        "--autotune.probe_steps", "2", "--autotune.holdout_batches", "1", "--autotune.budget", "0.8"])
    report = result["model"].autotune_report
    assert report is not None and report.pick == "grad_accumulation_2" and report.trial_run is not None
    assert result["model"].train_network is report.train_network  # the trial's compiled step trained the run
    done = events.index("trial done")
    assert done >= 1 and all(e.startswith("compile BoostTrainOneStep") for e in events[:done])
    assert events[done + 1:] == []  # before: the zoo built a second Model, whose step compiled again here
    assert len(result["losses"]) == 5

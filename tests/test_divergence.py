"""ms_boost.divergence: the spike rule against a numpy reference, the policy's checks, and a run healed by
rolling back (Graph and PyNative, one rank and a loopback world of two ranks where only one rank diverges).

The healed runs are a small conv net (tests/helpers/nets.py) on a learnable data set with a per-step learning
rate whose entry at a known step is multiplied by 1e4: the step after it has a non-finite or spiking loss.
"""
from __future__ import annotations

import re

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn
from mindspore.train import Callback

from ms_boost import Model
from ms_boost.divergence import DivergencePolicy, DivergenceRollback, LossSpikeDetector, learning_rates_of
from tests.helpers.loopback import run_ranks
from tests.helpers.nets import dataset, learnable_data, make_net

STEPS_PER_EPOCH, EPOCHS, LR, SPIKE_STEP = 4, 6, 0.05, 9  # the lr of step 9 (1-based) is multiplied by 1e4


# -- the spike rule -----------------------------------------------------------------------------------------
def reference_verdicts(losses, factor, window):
    """numpy reference: bad = non-finite, or > factor x median of the last `window` accepted losses (once full)."""
    accepted, bad = [], []
    for loss in losses:
        recent = accepted[-window:]
        flag = not np.isfinite(loss) or (factor > 0 and len(recent) == window and loss > factor * np.median(recent))
        bad.append(bool(flag))
        if not flag:
            accepted.append(loss)
    return bad


@pytest.mark.parametrize("factor,window", [(3.0, 4), (10.0, 1), (0.0, 5)])
def test_spike_detector_matches_numpy_median(factor, window):
    rng = np.random.default_rng(7)
    losses = list(np.exp(rng.normal(0.0, 0.8, 200)))
    losses[50], losses[120], losses[121] = float("nan"), float("inf"), 1e6
    detector, seen = LossSpikeDetector(factor, window), []
    for loss in losses:
        verdict = detector.verdict(float(loss))
        seen.append(verdict is not None)
        if verdict is None:
            detector.accept(float(loss))
    expected = reference_verdicts(losses, factor, window)
    assert seen == expected
    if factor:
        assert seen[121]  # 1e6 is a spike whatever the median
    else:
        assert not seen[121] and sum(seen) == 2  # spike detection off: only NaN and Inf


def test_spike_message_names_loss_factor_and_median():
    detector = LossSpikeDetector(4.0, 3)
    for loss in (1.0, 2.0, 3.0):
        detector.accept(loss)
    assert detector.verdict(8.0) is None  # 8 = 4 x 2 is not above
    assert detector.verdict(8.5) == "loss 8.5 is above 4 x its running median 2"
    assert detector.verdict(float("nan")) == "loss is nan"


@pytest.mark.parametrize("key,value,allowed", [
    ("action", "retry", "stop, rollback"),
    ("spike_factor", 1.0, "a float > 1, or 0"),
    ("window", 0, "an int >= 1"),
    ("window", 2.5, "an int >= 1"),
    ("max_rollbacks", -1, "an int >= 0"),
    ("lr_factor", 0.0, "a float in (0, 1]"),
    ("lr_factor", 1.5, "a float in (0, 1]"),
    ("damping_factor", 0.5, "a float >= 1"),
    ("snapshot_steps", 0, "an int >= 1"),
    ("snapshot_steps", True, "an int >= 1"),
    ("spike_factor", float("nan"), "a float > 1"),
])
def test_policy_refuses_bad_values_naming_key_value_and_range(key, value, allowed):
    with pytest.raises(ValueError, match="^" + re.escape(f"divergence_{key}={value!r} is not allowed; allowed: "
                                                         f"{allowed}")):
        DivergencePolicy.from_mapping({key: value}, names={k: f"divergence_{k}" for k in (
            "action", "spike_factor", "window", "max_rollbacks", "lr_factor", "damping_factor", "snapshot_steps")})
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['windows'\]"):
        DivergencePolicy.from_mapping({"windows": 3})


# -- healed runs ----------------------------------------------------------------------------------------------
class StateLog(Callback):
    """Every Parameter of the train network after every step (placed before or after the healer)."""

    def __init__(self):
        super().__init__()
        self.states = {}

    def on_train_step_end(self, run_context):
        params = run_context.original_args()
        self.states[int(params.cur_step_num)] = {p.name: p.asnumpy().copy()
                                                 for p in params.train_network.get_parameters()}


def lr_schedule(spike_steps=()) -> np.ndarray:
    lr = np.full(STEPS_PER_EPOCH * EPOCHS, LR, np.float32)
    for step in spike_steps:
        lr[step - 1] *= 1e4
    return lr


def train_run(lr: np.ndarray, policy: DivergencePolicy, seed: int = 3, data_seed: int = 0, log=None):
    """Train the small net with the healer first among the callbacks; returns (model, healer, before, after)."""
    x, y = learnable_data(STEPS_PER_EPOCH * 16, seed=data_seed)
    net = make_net(seed)
    opt = nn.Momentum(net.trainable_params(), ms.Tensor(lr), 0.9)
    model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), opt, metrics={"acc"})
    lines = []
    healer = DivergenceRollback(policy, log=lines.append if log is None else log)
    before, after = StateLog(), StateLog()
    model.train(EPOCHS, dataset(x, y), callbacks=[before, healer, after], dataset_sink_mode=False)
    healer.lines = lines
    return model, healer, before, after, (x, y)


def accuracy(model, data) -> float:
    return float(model.eval(dataset(*data), dataset_sink_mode=False)["acc"])


POLICY = DivergencePolicy(spike_factor=5.0, window=4, max_rollbacks=2, lr_factor=0.5, snapshot_steps=3)


@pytest.mark.parametrize("mode", [ms.PYNATIVE_MODE, ms.GRAPH_MODE], ids=["pynative", "graph"])
def test_lr_spike_is_rolled_back_and_the_run_reaches_the_clean_accuracy(mode):
    ms.set_context(mode=mode)
    try:
        clean_model, clean, *_ , data = train_run(lr_schedule(), POLICY)
        model, healer, before, after, _ = train_run(lr_schedule([SPIKE_STEP]), POLICY)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    assert clean.rollbacks == [] and clean.failure is None
    assert healer.failure is None and len(healer.rollbacks) == 1
    record = healer.rollbacks[0]
    # the huge update of step 9 shows in the loss of step 10; the last confirmed snapshot is step 6 (every 3
    # steps; the one of step 9 holds the spiked weights and is never confirmed)
    assert record["step"] == SPIKE_STEP + 1 and record["restored_step"] == 6 and record["skipped_steps"] == 4
    assert record["kind"] == "rollback" and record["rollback"] == 1
    assert len(healer.lines) == 1 and healer.lines[0].startswith(f"divergence: step {SPIKE_STEP + 1}: loss ")
    assert "rolled back to the state of step 6 (rollback 1/2), learning rate x 0.5" in healer.lines[0]
    # restored: every Parameter but the step counter and the learning rate equals the state after step 6
    restored, saved = after.states[SPIKE_STEP + 1], before.states[6]
    lr_names = {p.name for p in learning_rates_of(model.train_network)}
    for name, value in restored.items():
        if name in lr_names:
            np.testing.assert_allclose(value, lr_schedule([SPIKE_STEP]) * 0.5, rtol=1e-6)
        elif name.endswith("global_step"):
            assert int(value.reshape(-1)[0]) == SPIKE_STEP + 1  # the data position goes on: the window is skipped
        else:
            np.testing.assert_array_equal(value, saved[name], err_msg=name)
    assert not all(np.isfinite(v).all() and np.array_equal(v, saved[k])
                   for k, v in before.states[SPIKE_STEP + 1].items() if k not in lr_names)
    # training goes on from the restored state (a restore that replaced the Parameters' memory would leave the
    # compiled step updating a copy: the weights would stay at step 6's), every weight at the end is finite and
    # the accuracy is in the clean run's band
    last = after.states[STEPS_PER_EPOCH * EPOCHS]
    assert all(np.isfinite(v).all() for v in last.values())
    assert not np.array_equal(last["fc.weight"], restored["fc.weight"])
    clean_acc, healed_acc = accuracy(clean_model, data), accuracy(model, data)
    assert clean_acc >= 0.9, clean_acc  # the task is learnt
    assert healed_acc >= clean_acc - 0.1, (healed_acc, clean_acc)


def test_gives_up_after_max_rollbacks_and_stop_action_stops_at_once():
    lr = lr_schedule()
    lr[SPIKE_STEP - 1:] = 1e37  # every step from 9 on overflows the weights, lowered lr or not
    _, healer, _, after, _ = train_run(lr, POLICY)
    assert len(healer.rollbacks) == 2 and healer.failure is not None
    assert healer.failure.startswith("training diverged: at step ")
    assert healer.failure.endswith("(2 rollback(s) done, max_rollbacks=2)")
    assert max(after.states) < STEPS_PER_EPOCH * EPOCHS  # stopped early
    _, stopper, _, after, _ = train_run(lr_schedule([SPIKE_STEP]), DivergencePolicy(action="stop", window=4))
    assert stopper.rollbacks == [] and stopper.failure.startswith(f"training diverged: at step {SPIKE_STEP + 1} ")
    assert stopper.failure.endswith("(action=stop)") and max(after.states) == SPIKE_STEP + 1


def test_lr_schedule_without_parameter_is_refused_when_it_should_be_lowered():
    x, y = learnable_data(32)
    net = make_net()
    opt = nn.Momentum(net.trainable_params(), nn.CosineDecayLR(0.001, 0.05, 8), 0.9)
    model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), opt)
    with pytest.raises(ValueError, match=r"lr_factor=0.5 cannot be applied: the optimizer's learning rate is a "
                                         r"LearningRateSchedule"):
        model.train(1, dataset(x, y), callbacks=[DivergenceRollback(POLICY)], dataset_sink_mode=False)


def test_every_rank_rolls_back_together_when_one_rank_diverges():
    """Loopback world of 2 ranks (PyNative): rank 1's lr spikes, rank 0's does not; one collective per step
    makes both roll back at the same step to the same snapshot step, and both continue to the end."""
    def rank_fn(rank):
        model, healer, before, after, data = train_run(lr_schedule([SPIKE_STEP] if rank == 1 else []), POLICY,
                                                       data_seed=rank)
        return {"rollbacks": healer.rollbacks, "failure": healer.failure, "last": max(after.states),
                "finite": all(np.isfinite(v).all() for v in after.states[max(after.states)].values())}

    results = run_ranks(2, rank_fn)
    for result in results:
        assert result["failure"] is None and result["last"] == STEPS_PER_EPOCH * EPOCHS and result["finite"]
        assert [(r["step"], r["restored_step"]) for r in result["rollbacks"]] == [(SPIKE_STEP + 1, 6)]
    assert results[0]["rollbacks"][0]["reason"].startswith("another rank's")
    assert results[1]["rollbacks"][0]["reason"].startswith("loss ")


def test_thor_rollback_restores_its_inverses_and_raises_the_damping():
    """THOR (factors refreshed every 2 steps): the same spike; the rollback restores the weights and THOR's
    inverses of the snapshot, halves the learning rate and doubles every damping value; training goes on."""
    from ms_boost.divergence import dampings_of
    from ms_boost.thor import ConvertModelUtils, thor

    x, y = learnable_data(STEPS_PER_EPOCH * 16)
    net = make_net(3)
    lr, damping = lr_schedule([SPIKE_STEP]), np.linspace(0.05, 0.01, STEPS_PER_EPOCH * EPOCHS).astype(np.float32)
    opt = thor(net, ms.Tensor(lr), ms.Tensor(damping), 0.9, frequency=2)
    ce = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    model = ConvertModelUtils().convert_to_thor_model(Model(net, ce, opt), net, ce, opt)
    healer, before, after = DivergenceRollback(POLICY, log=None), StateLog(), StateLog()
    model.train(EPOCHS, dataset(x, y), callbacks=[before, healer, after], dataset_sink_mode=False)
    assert healer.failure is None and len(healer.rollbacks) == 1
    step, restored = healer.rollbacks[0]["step"], healer.rollbacks[0]["restored_step"]
    (damping_param,) = dampings_of(model.train_network)
    np.testing.assert_allclose(damping_param.asnumpy(), damping * 2.0, rtol=1e-6)
    lr_names = {p.name for p in learning_rates_of(model.train_network)}
    inverses = [name for name in after.states[step] if "inverse" in name]
    assert inverses
    for name, value in after.states[step].items():
        if name in lr_names:
            np.testing.assert_allclose(value, lr * 0.5, rtol=1e-6)
        elif name != damping_param.name and not name.endswith("global_step"):
            np.testing.assert_array_equal(value, before.states[restored][name], err_msg=name)
    last = after.states[STEPS_PER_EPOCH * EPOCHS]
    assert all(np.isfinite(v).all() for v in last.values())
    assert not np.array_equal(last["fc.weight"], after.states[step]["fc.weight"])


# Graph mode under a real 2-worker msrun job (only rank 1's lr spikes, both ranks roll back together): the
# ``divergence`` scenario of the one Graph-mode msrun job:
# tests/test_msrun_e2e.py::test_msrun_graph_ranks_roll_back_together


def test_thor_damping_hook_names_what_a_rollback_can_raise():
    """THOR says through its optimizer hooks which Parameter holds its damping (an array: the per-step values, a
    float: one value); a LearningRateSchedule damping has none, and a rollback that should raise it is refused
    before the first step."""
    from ms_boost.divergence import dampings_of, fixed_dampings
    from ms_boost.stages import optimizer_hooks
    from ms_boost.thor import ConvertModelUtils, thor

    damping = np.array([0.3, 0.2, 0.1], np.float32)
    net = make_net(3)
    (values,) = optimizer_hooks(thor(net, 0.01, ms.Tensor(damping), 0.9)).damping_parameters()
    np.testing.assert_array_equal(values.asnumpy(), damping)
    (value,) = optimizer_hooks(thor(make_net(3), 0.01, 0.03, 0.9)).damping_parameters()
    np.testing.assert_allclose(value.asnumpy(), [0.03], rtol=1e-7)
    assert optimizer_hooks(nn.Momentum(net.trainable_params(), 0.01, 0.9)).damping_parameters() == ()

    x, y = learnable_data(32)
    net = make_net(3)
    opt = thor(net, 0.01, nn.CosineDecayLR(0.01, 0.05, 8), 0.9)
    assert optimizer_hooks(opt).damping_parameters() is None
    ce = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    model = ConvertModelUtils().convert_to_thor_model(Model(net, ce, opt), net, ce, opt)
    assert fixed_dampings(model.train_network) and dampings_of(model.train_network) == []
    with pytest.raises(ValueError, match=r"damping_factor=2.0 cannot be applied: THOR's damping is a "
                                         r"LearningRateSchedule"):
        model.train(1, dataset(x, y), callbacks=[DivergenceRollback(POLICY)], dataset_sink_mode=False)

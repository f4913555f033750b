"""Tests of ms_boost.grad_freeze: schedules, parameter groups, FreezeOpt, GradientFreeze, freeze_cell."""
from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn, ops

from ms_boost import AutoBoost
from ms_boost.grad_freeze import (
    FreezeOpt,
    FreezeSchedule,
    GradientFreeze,
    apply_grad_freeze,
    freeze_cell,
    freeze_schedule,
    partition_parameters,
)
from ms_boost.grad_process import CentralizedGradients, OptimizerProcess
from ms_boost.stages import OptimizerUpdate
from ms_boost.train_cell import BoostTrainOneStepCell, BoostTrainOneStepWithLossScaleCell
from tests.helpers.nets import SmallConvNet


# ---------------------------------------------------------------------------------------------- reference
def continuous_reference(groups, p, steps):
    """Upstream's '00001234' pattern: z zeros then 1..G-1, repeated; z = round(p (G-1) / (1-p))."""
    z = int(round(p * (groups - 1) / (1 - p)))
    period = [0] * z + list(range(1, groups))
    out = (period * (steps // len(period) + 1))[:steps]
    out[-1] = 0
    return np.array(out)


def momentum_reference(w, v, g, lr, momentum, weight_decay=0.0):
    """MindSpore's Momentum step: the decay added to the gradient, then the momentum update."""
    v = momentum * v + g + weight_decay * w
    return w - lr * v, v


def dense_stack(n=6, width=3):
    ms.set_seed(5)
    return nn.SequentialCell([nn.Dense(width, width) for _ in range(n)])


# ---------------------------------------------------------------------------------------------- schedule
def test_continuous_schedule_matches_upstream_pattern():
    for groups, p in [(4, 0.7), (10, 0.5), (3, 0.0), (5, 0.9)]:
        np.testing.assert_array_equal(freeze_schedule(groups, 0, p, 100), continuous_reference(groups, p, 100))


@pytest.mark.parametrize("freeze_type", [0, 1])
def test_schedule_invariants(freeze_type):
    groups, p, steps = 10, 0.7, 5000
    s = freeze_schedule(groups, freeze_type, p, steps, seed=3)
    assert s.shape == (steps,) and s.dtype == np.int32
    assert s.min() == 0 and s.max() <= groups - 1
    assert s[-1] == 0  # every group trains again before the schedule ends
    assert abs(np.mean(s == 0) - p) < 0.02  # freeze_p is the share of steps training every group (as upstream)
    # no group stays frozen long: the longest run of steps freezing group 0 is short
    runs, run = [], 0
    for v in s:
        run = run + 1 if v > 0 else 0
        runs.append(run)
    assert max(runs) <= groups


def test_interval_schedule_is_seeded_and_follows_the_level_distribution():
    a = freeze_schedule(6, 1, 0.3, 20000, seed=7)
    np.testing.assert_array_equal(a, freeze_schedule(6, 1, 0.3, 20000, seed=7))
    assert not np.array_equal(a, freeze_schedule(6, 1, 0.3, 20000, seed=8))
    levels = a[a > 0]
    freq = np.bincount(levels, minlength=6)[1:] / len(levels)
    expected = np.array([5, 4, 3, 2, 1]) / 15.0  # P(s) proportional to G - s
    np.testing.assert_allclose(freq, expected, atol=0.015)
    # the decisions (freeze or not) keep the frozen share at 1 - p at every prefix
    frozen_share = np.cumsum(a > 0) / np.arange(1, len(a) + 1)
    assert np.abs(frozen_share[100:-1] - 0.7).max() < 0.01


def test_degenerate_schedules():
    assert not freeze_schedule(1, 1, 0.2, 50).any()  # one group: never frozen
    assert not freeze_schedule(5, 0, 1.0, 50).any()  # p = 1: never frozen
    s = freeze_schedule(5, 1, 0.0, 50)
    assert s[0] == 0 and s[-1] == 0 and (s[1:-1] > 0).all()
    assert list(freeze_schedule(3, 0, 0.5, 1)) == [0]


@pytest.mark.parametrize("kwargs,exc,match", [
    ({"freeze_p": 1.5}, ValueError, "freeze_p=1.5"),
    ({"freeze_p": -0.1}, ValueError, "freeze_p"),
    ({"param_groups": 0}, ValueError, "param_groups=0"),
    ({"freeze_type": 2}, ValueError, "freeze_type=2"),
    ({"total_steps": 0}, ValueError, "total_steps"),
    ({"param_groups": 2.0}, TypeError, "param_groups"),
    ({"freeze_p": "0.5"}, TypeError, "freeze_p"),
    ({"seed": -1}, ValueError, "seed"),
])
def test_bad_values_are_clear_errors(kwargs, exc, match):
    args = {"param_groups": 4, "freeze_type": 1, "freeze_p": 0.5, "total_steps": 10, "seed": 0}
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        freeze_schedule(**args)
    with pytest.raises(exc, match=match):
        GradientFreeze(**args)


def test_more_groups_than_parameters_is_clamped_impossible_values_stay_errors():
    """Upstream's documented GradientFreeze(10, 1, 0.5, 2000) runs on any network: more groups than trainable
    parameters become one group per parameter (issue 11); 0, negative and non-integer counts stay errors."""
    net = dense_stack(2)  # 4 trainable parameters
    opt = nn.SGD(net.trainable_params(), 0.1)
    _, clamped = GradientFreeze(5, 1, 0.5, 10).freeze_generate(net, opt)
    _, exact = GradientFreeze(4, 1, 0.5, 10).freeze_generate(net, opt)  # per parameter
    assert clamped.n_atoms == exact.n_atoms == 4 and clamped.groups_num == exact.groups_num == 4
    one = nn.Dense(3, 1, has_bias=False)  # a one-parameter network
    _, freeze_opt = GradientFreeze(10, 1, 0.5, 2000).freeze_generate(one, nn.SGD(one.trainable_params(), 0.1))
    assert freeze_opt.n_atoms == 1 and freeze_opt.groups_num == 1
    with pytest.raises(ValueError, match="param_groups=5 is more than the 4 trainable parameters"):
        partition_parameters(net.trainable_params(), 5, OptimizerProcess.build_params_dict(net))
    for bad, kind in ((0, ValueError), (-3, ValueError), (2.0, TypeError), (True, TypeError)):
        with pytest.raises(kind, match="param_groups"):
            GradientFreeze(bad, 1, 0.5, 10)


# ---------------------------------------------------------------------------------------------- groups
def test_partition_keeps_layers_together():
    net = SmallConvNet()  # conv1, bn1(gamma, beta), conv2, bn2, fc(weight, bias)
    owners = OptimizerProcess.build_params_dict(net)
    params = net.trainable_params()
    groups = partition_parameters(params, 3, owners)
    assert [[p.name for p in g] for g in groups] == [
        ["conv1.weight", "bn1.gamma", "bn1.beta"], ["conv2.weight", "bn2.gamma", "bn2.beta"],
        ["fc.weight", "fc.bias"]]
    groups = partition_parameters(params, 2, owners)
    assert sum(groups, []) == params and all(groups)
    groups = partition_parameters(params, 5, owners)  # more groups than layers: split between parameters
    assert sum(groups, []) == params and len(groups) == 5 and all(groups)


def test_split_parameters_groups_are_suffixes():
    net = dense_stack(4)
    groups = GradientFreeze(4, 1, 0.5, 10).split_parameters_groups(net, 4)
    params = net.trainable_params()
    assert [len(g) for g in groups] == [8, 6, 4, 2]
    assert all(g == params[len(params) - len(g):] for g in groups)


# ---------------------------------------------------------------------------------------------- FreezeOpt
def _run_and_check(freeze_opt, steps, lr_of_step, momentum=0.9, seed=0, **update):
    """Drive the FreezeOpt with random gradients; check every step against a numpy reference in which
    a frozen group's weights and momentum are untouched."""
    params = list(freeze_opt.parameters)
    rng = np.random.default_rng(seed)
    w = [p.asnumpy().copy() for p in params]
    v = [np.zeros_like(x) for x in w]
    group_of = np.zeros(len(params), int)
    for a, indices in enumerate(freeze_opt.atom_indices):
        group_of[list(indices)] = a
    for t in range(steps):
        grads = [rng.normal(size=p.shape).astype(np.float32) for p in params]
        trained = freeze_opt.trained_atoms(t)
        before = [p.asnumpy().copy() for p in params]
        moments = {p.name: p.asnumpy().copy() for p in freeze_opt.get_parameters() if "moments" in p.name}
        freeze_opt(ms.mutable(tuple(Tensor(g) for g in grads)))
        for i, p in enumerate(params):
            if trained[group_of[i]]:
                w[i], v[i] = momentum_reference(w[i], v[i], grads[i], lr_of_step(t), momentum, **update)
            changed = not np.array_equal(before[i], p.asnumpy())
            assert changed == bool(trained[group_of[i]]), (t, p.name)
            np.testing.assert_allclose(p.asnumpy(), w[i], rtol=1e-5, atol=1e-6)
        for p in freeze_opt.get_parameters():
            if "moments" in p.name:
                owner = next(i for i, q in enumerate(params) if p.name.endswith("moments." + q.name))
                changed = not np.array_equal(moments[p.name], p.asnumpy())
                assert changed == bool(trained[group_of[owner]]), (t, p.name)
    assert int(freeze_opt.global_step.asnumpy()[0]) == steps


def test_freeze_opt_updates_exactly_the_scheduled_groups(mode):
    net = dense_stack(6)
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9)
    _, freeze_opt = GradientFreeze(3, 1, 0.4, 8, seed=2).freeze_generate(net, opt)
    assert freeze_opt.n_atoms == 3
    schedule = freeze_opt.train_strategy.asnumpy()
    assert (schedule > 0).any() and schedule[-1] == 0
    _run_and_check(freeze_opt, 10, lambda t: 0.1)  # 10 > 8 steps: the schedule repeats


def test_freeze_opt_momentum_with_weight_decay_freezes_exactly(mode):
    """The Graph-mode Momentum path (no control flow: a frozen group's ApplyMomentum gets a zero gradient, a zero
    learning rate and a momentum of one) with weight decay: trained groups follow the reference, frozen groups
    keep their weights and moments bit for bit although the decay term is not zero."""
    net = dense_stack(6)
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.8, weight_decay=0.01)
    _, freeze_opt = GradientFreeze(4, 1, 0.3, 12, seed=3).freeze_generate(net, opt)
    assert freeze_opt.momentum_fast and (freeze_opt.train_strategy.asnumpy() > 0).sum() >= 6
    _run_and_check(freeze_opt, 12, lambda t: 0.1, momentum=0.8, weight_decay=0.01)


def test_freeze_opt_momentum_is_read_live_and_the_fast_path_tables_exist_only_where_used(mode):
    """Every inner optimizer's momentum changed after the FreezeOpt was built (as a callback writing the momentum
    Parameters does): groups that some steps freeze and the group that always trains both step with the new value
    (numpy reference), and frozen ones stay put. Graph mode's factor table belongs to its Momentum fast path only."""
    net = dense_stack(6)
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9)
    _, freeze_opt = GradientFreeze(3, 1, 0.4, 8, seed=2).freeze_generate(net, opt)
    assert freeze_opt.momentum_fast and freeze_opt.train_factor.shape == (3, 3)
    assert freeze_opt.always_trained == (False, False, True)
    for inner in freeze_opt.opts:
        inner.momentum.set_data(Tensor(0.5, ms.float32))
    _run_and_check(freeze_opt, 10, lambda t: 0.1, momentum=0.5)
    _, sgd = GradientFreeze(3, 1, 0.4, 8, seed=2).freeze_generate(net, nn.SGD(net.trainable_params(), 0.1))
    assert not sgd.momentum_fast and not hasattr(sgd, "train_factor") and not hasattr(sgd, "unstack")


def test_freeze_opt_dynamic_lr_follows_global_step(mode):
    net = dense_stack(4)
    lrs = [0.1, 0.1, 0.05, 0.05, 0.02, 0.02, 0.01, 0.01]
    opt = nn.Momentum(net.trainable_params(), learning_rate=lrs, momentum=0.9)
    freeze_opt = FreezeOpt(opt, [net.trainable_params(), net.trainable_params()[4:]], [1, 0, 1, 1, 0, 1, 0, 1])
    assert freeze_opt.n_atoms == 2 and not freeze_opt.sync_lr
    _run_and_check(freeze_opt, 8, lambda t: lrs[t])


def test_freeze_opt_learning_rate_parameter_drives_all_groups(mode):
    net = dense_stack(2)
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    freeze_opt = FreezeOpt(opt, [net.trainable_params()[:2], net.trainable_params()[2:]], [0, 1])
    assert isinstance(freeze_opt.learning_rate, Parameter)
    ops.assign(freeze_opt.learning_rate, Tensor(0.5, ms.float32))  # as a LearningRateScheduler callback does
    params = list(freeze_opt.parameters)
    before = [p.asnumpy().copy() for p in params]
    grads = ms.mutable(tuple(ops.ones_like(p) for p in params))
    freeze_opt(grads)
    freeze_opt(grads)
    for b, p in zip(before, params):
        np.testing.assert_allclose(b - p.asnumpy(), 0.5, rtol=1e-6)


def test_freeze_opt_upstream_api_defaults_and_errors():
    net = dense_stack(2)
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    single = FreezeOpt(opt)  # one group, every step
    assert single.n_atoms == 1 and list(single.train_strategy.asnumpy()) == [0]
    scaled = FreezeOpt(nn.Momentum(net.trainable_params(), 0.1, 0.9, loss_scale=128.0))
    assert scaled.loss_scale == 128.0 and scaled.opts[0].loss_scale == 128.0
    round_robin = FreezeOpt(opt, [net.trainable_params()[:2], net.trainable_params()])
    assert list(round_robin.train_strategy.asnumpy()) == [0, 1]
    with pytest.raises(ValueError, match="without train_parameter_groups"):
        FreezeOpt(opt, None, [0])
    with pytest.raises(ValueError, match=r"train_strategy holds \[2\]"):
        FreezeOpt(opt, [net.trainable_params()], [0, 2])
    with pytest.raises(ValueError, match="in no train parameter group"):
        FreezeOpt(opt, [net.trainable_params()[:2]], [0])
    with pytest.raises(ValueError, match="does not update"):
        FreezeOpt(opt, [net.trainable_params() + [Parameter(Tensor(1.0), name="stranger")]], [0])
    with pytest.raises(TypeError, match="Optimizer"):
        FreezeOpt(nn.Dense(2, 2))
    with pytest.raises(TypeError, match="train_strategy"):
        FreezeOpt(opt, [net.trainable_params()], "0")


def test_freeze_opt_keeps_group_settings_and_gc():
    net = SmallConvNet()
    convs = [p for p in net.trainable_params() if "conv" in p.name]
    rest = [p for p in net.trainable_params() if "conv" not in p.name]
    opt = nn.Momentum([{"params": convs, "lr": 0.01}, {"params": rest}], learning_rate=0.1, momentum=0.9)
    process = OptimizerProcess(opt)
    process.add_grad_centralization(net)
    gc_opt = process.generate_new_optimizer()
    _, freeze_opt = GradientFreeze(3, 0, 0.5, 6).freeze_generate(net, gc_opt)
    for inner in freeze_opt.opts:
        assert isinstance(inner, CentralizedGradients) and isinstance(inner, nn.Momentum)
        for p in inner.parameters:
            expected = 0.01 if "conv" in p.name else 0.1
            assert float(inner.get_lr_parameter(p).asnumpy()) == pytest.approx(expected)
        flags = dict(zip([p.name for p in inner.parameters], inner.grad_centralization_flags))
        assert all(flag == (name.endswith("weight") and "bn" not in name) for name, flag in flags.items())
    # inner optimizer state names are unique and the user's parameter names unchanged
    names = [p.name for p in freeze_opt.get_parameters()]
    assert len(names) == len(set(names))
    assert {p.name for p in net.trainable_params()} <= set(names)


def test_apply_grad_freeze_with_config_and_update_stage(mode):
    net = dense_stack(4)
    boost = AutoBoost("O1", {"grad_freeze": {"param_groups": 4, "freeze_p": 0.5, "total_steps": 6, "seed": 1}})
    network, freeze_opt = apply_grad_freeze(net, nn.Momentum(net.trainable_params(), 0.1, 0.9), boost.grad_freeze)
    assert network is net and isinstance(freeze_opt, FreezeOpt)
    np.testing.assert_array_equal(freeze_opt.train_strategy.asnumpy(), freeze_schedule(4, 1, 0.5, 6, seed=1))
    stage = OptimizerUpdate(freeze_opt)  # the core's update stage drives it like any optimizer
    params = list(freeze_opt.parameters)
    for t in range(6):
        before = [p.asnumpy().copy() for p in params]
        stage(Tensor(0.0), ms.mutable(tuple(ops.ones_like(p) for p in params)))
        changed = [not np.array_equal(b, p.asnumpy()) for b, p in zip(before, params)]
        frozen = int(freeze_opt.train_strategy.asnumpy()[t])
        assert changed == [i // 2 >= frozen for i in range(len(params))], t
    # graph_variants: None (auto) by default, the section's value otherwise
    assert boost.grad_freeze.graph_variants is None and freeze_opt.graph_variants is None
    for value in (True, False):
        cfg = AutoBoost("O1", {"grad_freeze": {"graph_variants": value}}).grad_freeze
        assert apply_grad_freeze(net, nn.Momentum(net.trainable_params(), 0.1, 0.9), cfg)[1].graph_variants is value
    with pytest.raises(TypeError, match="grad_freeze.graph_variants"):
        AutoBoost("O1", {"grad_freeze": {"graph_variants": "yes"}})


def test_auto_graph_variants_follow_the_run_length():
    """Auto: a graph per train set from runs of AUTO_VARIANTS_MIN_STEPS optimizer steps; the run's length comes from
    Model.train's callback (epochs x an epoch's steps); unknown (a cell stepped without that Model), the one masked
    graph, whatever the schedule's length; True/False decide."""
    from types import SimpleNamespace

    from ms_boost.grad_freeze.optimizer import AUTO_VARIANTS_MIN_STEPS

    net = dense_stack(3)
    long_run = GradientFreeze(3, 1, 0.4, AUTO_VARIANTS_MIN_STEPS, seed=2)
    _, freeze_opt = long_run.freeze_generate(net, nn.Momentum(net.trainable_params(), 0.1, 0.9))
    assert freeze_opt.graph_variants is None and not freeze_opt.uses_graph_variants()  # run length unknown
    (callback,) = freeze_opt.callbacks()
    run = SimpleNamespace(original_args=lambda: SimpleNamespace(epoch_num=3, batch_num=7))
    callback.on_train_begin(run)
    assert freeze_opt.planned_steps == 21 and not freeze_opt.uses_graph_variants()
    callback.on_train_begin(SimpleNamespace(original_args=lambda: SimpleNamespace(
        epoch_num=AUTO_VARIANTS_MIN_STEPS // 100, batch_num=100)))
    assert freeze_opt.uses_graph_variants()
    freeze_opt.graph_variants = False
    assert not freeze_opt.uses_graph_variants()
    _, short = GradientFreeze(3, 1, 0.4, AUTO_VARIANTS_MIN_STEPS - 1, seed=2).freeze_generate(
        net, nn.Momentum(net.trainable_params(), 0.1, 0.9))
    short.planned_steps = AUTO_VARIANTS_MIN_STEPS - 1
    assert not short.uses_graph_variants()
    short.graph_variants = True
    assert short.uses_graph_variants()
    ms.set_context(mode=ms.GRAPH_MODE)
    try:  # the plan names the set of the coming step; off, there is none
        assert short.plan_graph_step(True) == ("freeze_set0", None)
        short.end_step()
        assert short.plan_graph_step(False) is None  # a stage before it in the chain may read every gradient
        short.graph_variants = False
        assert short.plan_graph_step(True) is None
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)


def test_freeze_cell_trains_one_group_each(mode):
    ms.set_seed(1)
    net = nn.SequentialCell([nn.Dense(4, 4), nn.ReLU(), nn.Dense(4, 2)])
    loss_net = nn.WithLossCell(net, nn.MSELoss())
    _, freeze_opt = GradientFreeze(2, 0, 0.5, 4).freeze_generate(loss_net, nn.SGD(net.trainable_params(), 0.1))
    cells = freeze_cell(False, loss_net, freeze_opt, 1.0, ops.GradOperation(get_by_list=True, sens_param=True),
                        False)
    assert len(cells) == 2
    x = Tensor(np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32))
    y = Tensor(np.zeros((8, 2), np.float32))
    params = list(freeze_opt.parameters)
    for group, cell in enumerate(cells):
        before = [p.asnumpy().copy() for p in params]
        expected = ms.grad(loss_net, grad_position=None, weights=params)(x, y)
        loss = cell(x, y)
        assert np.isfinite(loss.asnumpy()).all()
        for i, (b, p) in enumerate(zip(before, params)):
            trains = i >= 2 * group
            np.testing.assert_allclose(b - p.asnumpy(), 0.1 * expected[i].asnumpy() if trains else 0.0,
                                       rtol=1e-5, atol=1e-7)
    with pytest.raises(TypeError, match="FreezeOpt"):
        freeze_cell(False, loss_net, nn.SGD(net.trainable_params(), 0.1), 1.0, None, False)


def test_freeze_opt_rebuilds_lars_around_each_group():
    """LARS (no CPU kernel, so construction only): every group gets LARS around the user's optimizer class."""
    net = dense_stack(4)
    opt = nn.LARS(nn.Momentum(net.trainable_params(), 0.1, 0.9))
    _, freeze_opt = GradientFreeze(2, 0, 0.5, 4).freeze_generate(net, opt)
    assert all(isinstance(o, nn.LARS) and isinstance(o.opt, nn.Momentum) for o in freeze_opt.opts)
    names = [p.name for p in freeze_opt.get_parameters()]
    assert len(names) == len(set(names))
    assert [p.name for p in freeze_opt.parameters] == [p.name for p in net.trainable_params()]


def test_freeze_cell_with_gradient_accumulation():
    ms.set_seed(1)
    net = nn.SequentialCell([nn.Dense(4, 4), nn.ReLU(), nn.Dense(4, 2)])
    loss_net = nn.WithLossCell(net, nn.MSELoss())
    _, freeze_opt = GradientFreeze(2, 0, 0.5, 4).freeze_generate(loss_net, nn.SGD(net.trainable_params(), 0.1))
    cells = freeze_cell(False, loss_net, freeze_opt, 1.0, ops.GradOperation(get_by_list=True, sens_param=True),
                        True, max_accumulation_step=2)
    rng = np.random.default_rng(0)
    xs = [Tensor(rng.normal(size=(8, 4)).astype(np.float32)) for _ in range(2)]
    y = Tensor(np.zeros((8, 2), np.float32))
    params = list(freeze_opt.parameters)
    grads = [ms.grad(loss_net, grad_position=None, weights=params)(x, y) for x in xs]
    before = [p.asnumpy().copy() for p in params]
    cells[1](xs[0], y)  # group 1: the output-side layer only
    assert all(np.array_equal(b, p.asnumpy()) for b, p in zip(before, params))  # accumulating
    cells[1](xs[1], y)
    for i, (b, p) in enumerate(zip(before, params)):
        mean = (grads[0][i].asnumpy() + grads[1][i].asnumpy()) / 2 if i >= 2 else 0.0
        np.testing.assert_allclose(b - p.asnumpy(), 0.1 * mean, rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------------------------------------- lazy schedule
def eager_reference(groups, kind, p, steps, seed):
    """The schedule built step by step (the definition): O(steps), for comparison with the lazy form."""
    out = np.zeros(steps, np.int32)
    if groups == 1 or p == 1.0:
        return out
    if kind == 0:
        out[:] = continuous_reference(groups, p, steps + 1)[:steps]
    else:
        levels = np.arange(1, groups)
        weights = (groups - levels).astype(np.float64)
        freezing = np.zeros(steps, bool)
        frozen = 0
        for t in range(1, steps):
            if frozen < (1.0 - p) * t:
                freezing[t] = True
                frozen += 1
        rng = np.random.default_rng(seed)
        out[freezing] = rng.choice(levels, size=int(freezing.sum()), p=weights / weights.sum())
    out[-1] = 0
    return out


def test_lazy_schedule_equals_the_step_by_step_definition():
    rng = np.random.default_rng(11)
    for groups, kind, p, steps, seed in [(10, 1, 0.7, 5000, 0), (6, 1, 0.3, 3001, 7), (4, 0, 0.5, 77, 0),
                                         (5, 1, 0.0, 50, 2), (7, 1, 0.123, 4097, 5), (3, 1, 0.999, 2000, 9)]:
        ref = eager_reference(groups, kind, p, steps, seed)
        np.testing.assert_array_equal(freeze_schedule(groups, kind, p, steps, seed), ref)
        lazy = FreezeSchedule(groups, kind, p, steps, seed)
        picks = rng.integers(0, steps, 64)
        assert [lazy[int(t)] for t in picks] == ref[picks].tolist()
        np.testing.assert_array_equal(lazy.values(steps // 3, steps // 2), ref[steps // 3:steps // 3 + steps // 2])


def test_huge_total_steps_is_lazy():
    import time

    start = time.perf_counter()
    lazy = FreezeSchedule(10, 1, 0.7, 10 ** 12, seed=3)  # 3.6 TiB as an int32 array
    values = [lazy[t] for t in (0, 12345, 1_500_000_000, 10 ** 12 - 1)]
    assert time.perf_counter() - start < 2.0
    assert values[0] == 0 and values[-1] == 0 and all(0 <= v <= 9 for v in values)
    # the same entries as the definition on a prefix long enough to cross several cache blocks
    np.testing.assert_array_equal(lazy.values(0, 10000), eager_reference(10, 1, 0.7, 10001, 3)[:10000])
    net = dense_stack(3)
    _, freeze_opt = GradientFreeze(3, 1, 0.7, 10 ** 12).freeze_generate(net, nn.SGD(net.trainable_params(), 0.1))
    assert freeze_opt.period == 10 ** 12 and not freeze_opt.table_complete
    with pytest.raises(ValueError, match="total_steps"):
        freeze_schedule(10, 1, 0.7, 2 ** 63)


def test_freeze_opt_with_lazy_schedule_longer_than_the_device_table(monkeypatch):
    """PyNative selects on the host from the lazy schedule at any position; Graph mode refuses clearly."""
    import ms_boost.grad_freeze.optimizer as gf  # FreezeOpt reads the table size there

    monkeypatch.setattr(gf, "DEVICE_TABLE_MAX", 4)
    net = dense_stack(3)
    _, freeze_opt = GradientFreeze(3, 1, 0.4, 10 ** 6, seed=2).freeze_generate(
        net, nn.SGD(net.trainable_params(), 0.1))
    assert not freeze_opt.table_complete and freeze_opt.train_strategy.shape == (4,)
    params = list(freeze_opt.parameters)
    lazy = FreezeSchedule(3, 1, 0.4, 10 ** 6, seed=2)
    start = 777_777
    ops.assign(freeze_opt.global_step, Tensor([start], ms.int32))  # as a resumed checkpoint
    ms.set_context(mode=ms.PYNATIVE_MODE)
    for t in range(start, start + 6):
        before = [p.asnumpy().copy() for p in params]
        freeze_opt(ms.mutable(tuple(ops.ones_like(p) for p in params)))
        changed = [not np.array_equal(b, p.asnumpy()) for b, p in zip(before, params)]
        assert changed == [i // 2 >= lazy[t] for i in range(len(params))], t
    assert int(freeze_opt.global_step.asnumpy()[0]) == start + 6
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        with pytest.raises(ValueError, match="runs only in PYNATIVE_MODE"):
            freeze_opt(ms.mutable(tuple(ops.ones_like(p) for p in params)))
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)


def test_pynative_step_position_follows_checkpoint_loads_and_in_place_writes():
    """PyNative reads the schedule position from global_step: a checkpoint load and an in-place write are
    both followed by the next step; weights loaded into the trained network are what the next step updates."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        net = dense_stack(4)
        strategy = [1, 0, 1, 1, 0, 0, 1, 0]  # 1: only the second set (output side) trains
        freeze_opt = FreezeOpt(nn.Momentum(net.trainable_params(), 0.1, 0.9),
                               [net.trainable_params(), net.trainable_params()[4:]], strategy)
        params = list(freeze_opt.parameters)

        def step_trains_input_side():
            before = params[0].asnumpy().copy()
            freeze_opt(ms.mutable(tuple(ops.ones_like(p) for p in params)))
            return not np.array_equal(before, params[0].asnumpy())

        assert [step_trains_input_side() for _ in range(3)] == [s == 0 for s in strategy[:3]]
        ms.load_param_into_net(freeze_opt, {"global_step": Parameter(Tensor([5], ms.int32), name="global_step")})
        assert [step_trains_input_side() for _ in range(2)] == [s == 0 for s in strategy[5:7]]
        ops.assign(freeze_opt.global_step, Tensor([2], ms.int32))  # in place
        assert [step_trains_input_side() for _ in range(2)] == [s == 0 for s in strategy[2:4]]
        assert int(freeze_opt.global_step.asnumpy()[0]) == 4
        # the weights replaced by a checkpoint load into the trained network: the next (compiled) step updates
        # the loaded values (a step compiled before the load wrote to the old memory: the update was lost)
        # (weights 3, momenta 1, gradient 1: momentum 0.9 * 1 + 1 = 1.9, weight 3 - 0.1 * 1.9)
        moments = [m for m in freeze_opt.get_parameters() if m.name.startswith("moments.")] or \
            [m for o in freeze_opt.opts for m in o.moments]
        assert len(moments) >= len(params)
        ms.load_param_into_net(freeze_opt, {
            **{p.name: Parameter(Tensor(np.full(p.shape, 3.0, np.float32)), name=p.name) for p in params},
            **{m.name: Parameter(Tensor(np.full(m.shape, 1.0, np.float32)), name=m.name) for m in moments}})
        freeze_opt(ms.mutable(tuple(ops.ones_like(p) for p in params)))  # strategy[4] == 0: every weight trains
        for p in params:
            np.testing.assert_allclose(p.asnumpy(), np.full(p.shape, 3.0 - 0.1 * 1.9), rtol=1e-6, err_msg=p.name)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)


def test_default_o1_on_a_network_with_fewer_parameters_than_groups():
    """O1's default param_groups=10 (which the user never set) on a 4-parameter network: clamped, trains."""
    net = dense_stack(2)
    loss_net = nn.WithLossCell(net, nn.MSELoss())
    boost = AutoBoost("O1")
    assert boost.grad_freeze.param_groups == 10
    train_net, freeze_opt = boost.network_auto_process_train(loss_net, nn.SGD(net.trainable_params(), 0.1))
    assert isinstance(freeze_opt, FreezeOpt) and freeze_opt.groups_num == len(train_net.trainable_params())
    before = [p.asnumpy().copy() for p in train_net.trainable_params()]
    step = BoostTrainOneStepCell(train_net, freeze_opt, boost_config=boost)
    x, y = Tensor(np.ones((2, 3), np.float32)), Tensor(np.zeros((2, 3), np.float32))
    step(x, y)
    after = [p.asnumpy() for p in train_net.trainable_params()]
    assert all(np.isfinite(a).all() for a in after) and any(np.abs(a - b).max() > 0 for a, b in zip(after, before))


def _linear_stack_gradients(ws, bs, x, y):
    """numpy: gradients of mean((x W_1^T + b_1 ... W_n^T + b_n - y)^2) with respect to every W_k and b_k."""
    hs = [x]
    for w, b in zip(ws, bs):
        hs.append(hs[-1] @ w.T + b)
    d = 2.0 * (hs[-1] - y) / y.size
    gw, gb = [None] * len(ws), [None] * len(ws)
    for k in reversed(range(len(ws))):
        gw[k], gb[k] = d.T @ hs[k], d.sum(axis=0)
        d = d @ ws[k]
    return gw, gb


@pytest.mark.parametrize("scaled", [False, True], ids=["plain", "loss_scale"])
def test_train_cell_differentiates_only_the_scheduled_group(mode, scaled, monkeypatch):
    """The boost train cells with a FreezeOpt: every step equals numpy SGD on the scheduled group's weights (the
    frozen ones stay put); in PyNative only that group's weights are differentiated (the frozen layers' weight
    gradients are never computed, as upstream's per-group cells), in Graph mode one compiled step does all."""
    net = dense_stack(4)
    loss_net = nn.WithLossCell(net, nn.MSELoss())
    _, freeze_opt = GradientFreeze(4, 1, 0.4, 8, seed=2).freeze_generate(loss_net, nn.SGD(net.trainable_params(), 0.1))
    schedule = [int(v) for v in freeze_opt.train_strategy.asnumpy()]
    assert min(schedule) == 0 and max(schedule) >= 2  # some steps freeze several layers
    if scaled:
        cell = BoostTrainOneStepWithLossScaleCell(loss_net, freeze_opt, Tensor(8.0, ms.float32))
    else:
        cell = BoostTrainOneStepCell(loss_net, freeze_opt)
    counted = []
    if mode == "pynative":
        real = ops.value_and_grad

        def counting(fn, grad_position=None, weights=None, has_aux=False):
            counted.append(len(weights))
            return real(fn, grad_position, weights, has_aux=has_aux)

        monkeypatch.setattr(ops, "value_and_grad", counting)
    rng = np.random.default_rng(3)
    dense = [net[k] for k in range(4)]
    for t in range(10):  # the 8-step schedule, then it repeats
        x = rng.normal(size=(5, 3)).astype(np.float32)
        y = rng.normal(size=(5, 3)).astype(np.float32)
        ws = [d.weight.asnumpy().copy() for d in dense]
        bs = [d.bias.asnumpy().copy() for d in dense]
        gw, gb = _linear_stack_gradients(ws, bs, x, y)
        cell(Tensor(x), Tensor(y))
        frozen = schedule[t % 8]  # layers below this index are frozen at step t
        for k in range(4):
            lr = 0.1 if k >= frozen else 0.0
            np.testing.assert_allclose(dense[k].weight.asnumpy(), ws[k] - lr * gw[k], rtol=1e-5, atol=1e-6,
                                       err_msg=f"step {t} layer {k}")
            np.testing.assert_allclose(dense[k].bias.asnumpy(), bs[k] - lr * gb[k], rtol=1e-5, atol=1e-6,
                                       err_msg=f"step {t} layer {k}")
    if mode == "pynative":
        assert counted == [2 * (4 - schedule[t % 8]) for t in range(10)]


@pytest.mark.parametrize("scaled", [False, True], ids=["plain", "loss_scale"])
def test_graph_variants_equal_the_masked_graph_one_graph_per_train_set(scaled, monkeypatch):
    """Graph mode: the train cell runs, per step, the graph compiled for the step's train set (its phase names the
    set; one graph per set the schedule reached, the default phase back after each step); the weights and moments
    equal those of the one masked graph (variants off) after every step, Momentum with weight decay, and with a
    loss scale. Checkpoint-style writes of global_step move the position of the next step in both."""
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        rng = np.random.default_rng(4)
        batches = [(rng.normal(size=(5, 3)).astype(np.float32), rng.normal(size=(5, 3)).astype(np.float32))
                   for _ in range(10)]
        runs = {}
        for variants in (True, False):
            net = dense_stack(4)
            loss_net = nn.WithLossCell(net, nn.MSELoss())
            opt = nn.Momentum(net.trainable_params(), 0.1, 0.9, weight_decay=0.01)
            _, freeze_opt = GradientFreeze(4, 1, 0.4, 8, seed=2).freeze_generate(loss_net, opt)
            freeze_opt.graph_variants = variants
            if scaled:
                cell = BoostTrainOneStepWithLossScaleCell(loss_net, freeze_opt, Tensor(8.0, ms.float32))
            else:
                cell = BoostTrainOneStepCell(loss_net, freeze_opt)
            base = cell.phase
            phases = []
            real_compile = cell.compile

            def recording(*args, _cell=cell, _real=real_compile, _phases=phases, **kwargs):
                _phases.append(_cell.phase)
                return _real(*args, **kwargs)

            monkeypatch.setattr(cell, "compile", recording)
            states = []
            for t, (x, y) in enumerate(batches):
                if t == 8:  # as a resumed checkpoint: the next step is the schedule's step 3
                    ops.assign(freeze_opt.global_step, Tensor([3], ms.int32))
                cell(Tensor(x), Tensor(y))
                assert cell.phase == base
                states.append([p.asnumpy().copy() for p in freeze_opt.get_parameters()])
            runs[variants] = (states, phases, [int(v) for v in freeze_opt.train_strategy.asnumpy()])
        (on, on_phases, schedule), (off, off_phases, _) = runs[True], runs[False]
        positions = list(range(8)) + [3, 4]
        assert on_phases == [f"{base}_freeze_set{schedule[t]}" for t in positions] and set(off_phases) == {base}
        assert len(set(schedule)) >= 3
        for t, (a, b) in enumerate(zip(on, off)):
            for u, v in zip(a, b):
                np.testing.assert_allclose(u, v, rtol=1e-6, atol=1e-7, err_msg=f"step {t}")
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)


class _FailingMomentum(nn.Momentum):
    """Momentum whose update does not compile when ``fail`` is set (on one inner optimizer of a FreezeOpt)."""

    fail = False

    def construct(self, gradients):
        if self.fail:
            raise ValueError("no kernel for this update")
        return super().construct(gradients)


def test_a_late_group_update_that_does_not_compile_names_its_group():
    """Issue 30: in PyNative mode each inner optimizer's update is compiled on the first step whose train group
    holds it, possibly late in training (here step 2: steps 0 and 1 train group 1 only). A failure there names the
    train group, the parameters and the step, not a MindSpore source line; the groups trained before were
    updated."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = dense_stack(4)
    params = net.trainable_params()
    freeze_opt = FreezeOpt(_FailingMomentum(params, 0.1, 0.9), [params, params[4:]], [1, 1, 0])
    assert freeze_opt.group_atoms == ((0, 1), (1,))
    freeze_opt.opts[0].fail = True
    grads = ms.mutable(tuple(Tensor(np.ones(p.shape, np.float32)) for p in params))
    before = [p.asnumpy().copy() for p in params]
    freeze_opt(grads)
    freeze_opt(grads)
    assert all(np.array_equal(b, p.asnumpy()) == (i < 4) for i, (b, p) in enumerate(zip(before, params)))
    with pytest.raises(RuntimeError, match=r"grad_freeze: compiling the update of train parameter group\(s\) \[0\] "
                                           r"\(inner optimizer 0 of 2: 4 parameter\(s\), \['0.weight', '0.bias', "
                                           r"'1.weight', '1.bias'\]\) failed at step 2: ValueError: .*no kernel"):
        freeze_opt(grads)

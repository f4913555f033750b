"""ms_boost.Model and build_train_network: drop-in behaviour, loss scaling, overflow, bad input."""
from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn
from mindspore.train import DynamicLossScaleManager, FixedLossScaleManager
from mindspore.train import Model as MsModel

from ms_boost import BoostTrainOneStepCell, BoostTrainOneStepWithLossScaleCell, Model, build_train_network
from tests.helpers.nets import all_params, dataset, learnable_data, make_net, weights


def ce():
    return nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def test_o0_matches_mindspore_model_step_for_step(mode):
    x, y = learnable_data(64)
    results = []
    for model_cls in (MsModel, Model):
        net = make_net()
        opt = nn.Momentum(net.trainable_params(), 0.05, 0.9)
        model = model_cls(net, ce(), opt, metrics={"acc"})
        model.train(2, dataset(x, y), dataset_sink_mode=False)
        results.append(weights(net))
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


def test_o0_without_metrics_and_with_sink(mode):
    x, y = learnable_data(64)
    net = make_net()
    model = Model(net, ce(), nn.Momentum(net.trainable_params(), 0.05, 0.9))
    before = weights(net)
    model.train(1, dataset(x, y), dataset_sink_mode=True)
    assert any(np.abs(a - b).max() > 0 for a, b in zip(before, weights(net)))


def _train_one_epoch(optimizer: str, opt_scale: float = 1.0, **kwargs) -> list:
    """make_net() trained one epoch (2 steps) by ms_boost.Model with SGD(0.1) or Momentum(0.05, 0.9)."""
    x, y = learnable_data(32)
    net = make_net()
    if optimizer == "sgd":
        opt = nn.SGD(net.trainable_params(), 0.1, loss_scale=opt_scale)
    else:
        opt = nn.Momentum(net.trainable_params(), 0.05, 0.9, loss_scale=opt_scale)
    Model(net, ce(), opt, **kwargs).train(1, dataset(x, y), dataset_sink_mode=False)
    return weights(net)


@pytest.fixture(scope="module")
def unscaled():
    """The runs without loss scale, trained once per (mode, optimizer) and shared by the loss-scale tests."""
    cache = {}

    def get(mode: str, optimizer: str) -> list:
        if (mode, optimizer) not in cache:
            cache[mode, optimizer] = _train_one_epoch(optimizer)
        return cache[mode, optimizer]

    return get


@pytest.mark.parametrize("manager", ["dynamic", "fixed_drop", "fixed_nodrop"])
def test_loss_scale_managers_work_on_cpu_and_match_unscaled(mode, manager, unscaled):
    """Every loss-scale manager trains on CPU; with no overflow, loss scaling changes nothing (1e-5)."""
    lsm = {"dynamic": DynamicLossScaleManager(2.0 ** 10, 2, 100),
           "fixed_drop": FixedLossScaleManager(128.0, drop_overflow_update=True),
           "fixed_nodrop": FixedLossScaleManager(128.0, drop_overflow_update=False)}[manager]
    scaled = _train_one_epoch("sgd", loss_scale_manager=lsm)
    for a, b in zip(unscaled(mode, "sgd"), scaled):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("manager_drop,opt_scale", [(False, 128.0), (True, 1.0), (True, 128.0)])
def test_optimizer_loss_scale_convention(mode, manager_drop, opt_scale, unscaled):
    """Momentum(loss_scale=S) with FixedLossScaleManager(S, drop_overflow_update=False), the tutorials'
    pairing, trains exactly like no loss scale; so does every other pairing."""
    scaled = _train_one_epoch("momentum", opt_scale, loss_scale_manager=FixedLossScaleManager(128.0, manager_drop))
    for a, b in zip(unscaled(mode, "momentum"), scaled):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


class _InfLoss(nn.Cell):
    """Loss network whose loss becomes inf when the batch's first label is negative (injected overflow)."""

    def __init__(self, net):
        super().__init__()
        self.net = net
        self.ce = ce()

    def construct(self, x, y):
        factor = ms.ops.select(y[0] < 0, Tensor(float("inf"), ms.float32), Tensor(1.0, ms.float32))
        y = ms.ops.abs(y)
        return self.ce(self.net(x), y) * factor


@pytest.mark.parametrize("dynamic", [True, False])
def test_injected_overflow_changes_no_weight_or_state(mode, dynamic):
    x, y = learnable_data(16)
    net = make_net()
    opt = nn.Momentum(net.trainable_params(), 0.05, 0.9)
    if dynamic:
        scale = ms.nn.DynamicLossScaleUpdateCell(loss_scale_value=1024.0, scale_factor=2, scale_window=1000)
    else:
        scale = Tensor(1024.0)
    cell = BoostTrainOneStepWithLossScaleCell(_InfLoss(net),
                                              opt, scale_sense=scale)
    cell.set_train()
    xs, ys = Tensor(x), Tensor(y)
    _, overflow, _ = cell(xs, ys)  # one good step: momentum state becomes non-zero
    assert not bool(overflow.asnumpy())
    before = all_params(cell)
    y_bad = y.copy()
    y_bad[0] = -1 - y[0]
    loss, overflow, used_scale = cell(xs, Tensor(y_bad))
    assert bool(overflow.asnumpy())
    after = all_params(cell)
    scale_machinery = ("scale_sense", "current_iterator_step", "last_overflow_iterator_step")
    for name, value in before.items():
        if name in scale_machinery or name.startswith("overflow_shadow"):
            continue
        np.testing.assert_array_equal(value, after[name], err_msg=name)
    if dynamic:
        assert after["scale_sense"] == before["scale_sense"] / 2
    # training goes on
    _, overflow, _ = cell(xs, ys)
    assert not bool(overflow.asnumpy())
    assert np.abs(all_params(cell)["net.fc.weight"] - after["net.fc.weight"]).max() > 0


def test_build_train_network_returns_boost_cells():
    net = make_net()
    cell = build_train_network(net, nn.SGD(net.trainable_params(), 0.1), ce(), level="O0", boost_level="O0")
    assert isinstance(cell, BoostTrainOneStepCell) and not isinstance(cell, BoostTrainOneStepWithLossScaleCell)
    net = make_net()
    cell = build_train_network(net, nn.SGD(net.trainable_params(), 0.1), ce(), level="O0",
                               loss_scale_manager=DynamicLossScaleManager())
    assert isinstance(cell, BoostTrainOneStepWithLossScaleCell)


def test_model_bad_inputs():
    net = make_net()
    opt = nn.SGD(net.trainable_params(), 0.1)
    with pytest.raises(ValueError, match="boost_level='O4'"):
        Model(net, ce(), opt, boost_level="O4")
    with pytest.raises(ValueError, match=r"grad_freeze\.freeze_p=2 is out of range"):
        Model(net, ce(), opt, boost_level="O1", boost_config_dict={"grad_freeze": {"freeze_p": 2}})
    # no optimizer is an evaluation Model, not an error (the evaluation rewrites only: test_less_bn.py's
    # test_eval_only_model_with_boost_level_evaluates_a_trained_o1_checkpoint)
    assert Model(make_net(), ce(), None, boost_level="O1").boost.level == "O1"
    with pytest.raises(ValueError, match="loss_scale_group is enabled but loss_scale_manager"):
        Model(net, ce(), opt, boost_config_dict={"boost": {"mode": "manual", "loss_scale_group": True}})
    with pytest.raises(ValueError, match="amp_level='O5'"):
        build_train_network(net, opt, ce(), level="O5")
    with pytest.raises(TypeError, match="loss_scale_manager must be"):
        build_train_network(net, opt, ce(), loss_scale_manager=3)
    with pytest.raises(TypeError, match="scale_sense must be"):
        BoostTrainOneStepWithLossScaleCell(nn.WithLossCell(net, ce()), opt, scale_sense="big")
    with pytest.raises(ValueError, match="positive finite"):
        BoostTrainOneStepWithLossScaleCell(nn.WithLossCell(net, ce()), opt, scale_sense=Tensor(-1.0))


def test_upstream_per_algorithm_entry_points_of_the_train_cell(mode):
    """mindspore.boost.BoostTrainOneStepCell's documented methods exist and act: check_adasum_enable /
    check_dim_reduce_enable report the plan (AdaSum off on one process even at O2); gradient_freeze_process is a
    training step; gradient_accumulation_process on caller-computed gradients (computed with sens 4) accumulates
    two calls, then makes one SGD step with their mean (numpy), unscaled by sens."""
    from mindspore import ops

    x, y = learnable_data(16)
    net = nn.Dense(8 * 8 * 3, 4)
    flat = lambda a: Tensor(a.reshape(len(a), -1))  # noqa: E731
    cell = BoostTrainOneStepCell(nn.WithLossCell(net, ce()), nn.SGD(net.trainable_params(), 0.5), boost_config="O2")
    assert cell.check_adasum_enable() is False and cell.check_dim_reduce_enable() is False
    before = [p.asnumpy().copy() for p in net.trainable_params()]
    loss = cell.gradient_freeze_process(flat(x), Tensor(y))
    assert np.isfinite(float(loss.asnumpy()))

    net = nn.Dense(8 * 8 * 3, 4)
    for p, b in zip(net.trainable_params(), before):
        p.set_data(Tensor(b))
    boost = {"boost": {"mode": "manual", "grad_accumulation": True}, "grad_accumulation": {"grad_accumulation_step": 2}}
    from ms_boost import AutoBoost

    cell = BoostTrainOneStepCell(nn.WithLossCell(net, ce()), nn.SGD(net.trainable_params(), 0.5),
                                 boost_config=AutoBoost("O0", boost))
    loss_net = nn.WithLossCell(net, ce())
    def scaled_loss(a, b):  # the loss times sens = 4
        return loss_net(a, b) * 4.0

    grad_fn = ops.value_and_grad(scaled_loss, None, net.trainable_params())
    seen = []
    for half in (slice(0, 8), slice(8, 16)):
        loss, grads = grad_fn(flat(x[half]), Tensor(y[half]))
        loss = loss / 4.0
        seen.append([g.asnumpy() / 4.0 for g in grads])
        cell.gradient_accumulation_process(loss, grads, Tensor(4.0), flat(x[half]), Tensor(y[half]))
        if half.start == 0:  # first micro-step: accumulated, not applied
            for p, b in zip(net.trainable_params(), before):
                np.testing.assert_array_equal(p.asnumpy(), b)
    for p, b, g0, g1 in zip(net.trainable_params(), before, *seen):
        np.testing.assert_allclose(p.asnumpy(), b - 0.5 * (g0 + g1) / 2, rtol=1e-5, atol=1e-6)


def test_a_hand_built_train_cell_says_which_rewrites_it_was_not_given():
    """``BoostTrainOneStepCell(net, opt, boost_config="O1")`` on a network and optimizer that did not go through
    ``network_auto_process_train`` cannot run LessBN or gradient freezing (they rewrite the pair): a warning names
    them and the way out; after the rewrite, and at O0, it says nothing."""
    import warnings

    from ms_boost import AutoBoost

    def built(boost, loss_net, opt) -> list:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            BoostTrainOneStepCell(loss_net, opt, boost_config=boost)
        return [str(w.message) for w in seen if "given unrewritten" in str(w.message)]

    net = make_net()
    loss_net, opt = nn.WithLossCell(net, ce()), nn.Momentum(net.trainable_params(), 0.05, 0.9)
    said = built("O1", loss_net, opt)
    assert len(said) == 1 and said[0].startswith("boost plan O1: less_bn, grad_freeze rewrite the network and "
                                                 "optimizer, which this train cell was given unrewritten")
    assert "network_auto_process_train(network, optimizer)" in said[0]
    freeze_only = AutoBoost("O0", {"boost": {"mode": "manual", "grad_freeze": True}})
    assert built(freeze_only, loss_net, opt) == [
        "boost plan O0: grad_freeze rewrites the network and optimizer, which this train cell was given unrewritten, "
        "so it does not run here. Pass the pair through AutoBoost(...).network_auto_process_train(network, "
        "optimizer) first, or train with ms_boost.Model(..., boost_level=...), which does."]
    assert built("O0", loss_net, opt) == []
    boost = AutoBoost("O1")
    assert built(boost, *boost.network_auto_process_train(loss_net, opt)) == []


@pytest.mark.parametrize("amp_level", ["O1", "O2"])
def test_model_with_amp_and_o1_says_nothing_of_unrewritten_pairs(amp_level, tmp_path, monkeypatch):
    """Model rewrites the pair itself; amp then casts (O2) or rewrites (O1) the network, which may no longer hold the
    LessBN wrapper: the hand-built cell's warning must not fire for Model's own train cell."""
    import warnings

    from mindspore.train import FixedLossScaleManager

    monkeypatch.chdir(tmp_path)  # amp O1's rewrite writes rewritten_network/ into the working folder
    net = make_net()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        Model(net, ce(), nn.Momentum(net.trainable_params(), 0.05, 0.9), amp_level=amp_level, boost_level="O1",
              loss_scale_manager=FixedLossScaleManager(128.0, drop_overflow_update=False))
    assert not [str(w.message) for w in seen if "given unrewritten" in str(w.message)]


def test_an_o1_checkpoint_serves_inference_in_the_eval_rewritten_network(mode, tmp_path):
    """Inference outside Model (the README's way): the network built by ``AutoBoost("O1").network_auto_process_eval``
    and loaded from an O1 checkpoint gives Model.predict's logits exactly; a plain network does not (LessBN's FN head
    normalises the classifier's input features, which no plain Dense reproduces)."""
    import mindspore as ms

    from ms_boost import AutoBoost

    x, y = learnable_data(32)
    net = make_net()
    model = Model(net, ce(), nn.Momentum(net.trainable_params(), 0.05, 0.9), boost_level="O1")
    model.train(1, dataset(x, y), dataset_sink_mode=False)
    expected = model.predict(Tensor(x[:8])).asnumpy()
    path = str(tmp_path / "o1.ckpt")
    ms.save_checkpoint(model.train_network, path)
    served = AutoBoost("O1").network_auto_process_eval(make_net(seed=7))
    weights_not_loaded, _ = ms.load_param_into_net(served, ms.load_checkpoint(path))
    assert weights_not_loaded == []
    served.set_train(False)
    np.testing.assert_array_equal(served(Tensor(x[:8])).asnumpy(), expected)
    plain = make_net(seed=7)
    ms.load_param_into_net(plain, ms.load_checkpoint(path))
    plain.set_train(False)
    assert np.abs(plain(Tensor(x[:8])).asnumpy() - expected).max() > 1e-3

"""THOR through Model: the tutorial's usage pattern, dataset sink, the boost configuration, dynamic loss scale."""
from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn
from mindspore.train import Model as MsModel

from ms_boost import Model
from ms_boost.thor import THOR, ConvertModelUtils, thor
from tests.helpers.nets import dataset, learnable_data, make_net


def ce():
    return nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def _graph(fn):
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        return fn()
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)


def test_tutorial_usage_pattern_on_cpu():
    """build ResNet; thor(...split_indices=[26, 53]...); convert_to_thor_model(Model(...)); train; eval."""
    from model_zoo.resnet.src.resnet import BasicBlock, ResNet

    def run():
        ms.set_seed(0)
        net = ResNet(BasicBlock, (1, 1, 1, 1), class_num=4, base_width=4)
        before = [p.asnumpy().copy() for p in net.trainable_params()]
        steps = 4
        lr = Tensor(np.linspace(0.05, 0.01, steps).astype(np.float32))
        damping = Tensor(np.linspace(0.03, 0.01, steps).astype(np.float32))
        loss = ce()
        loss_scale = ms.FixedLossScaleManager(128, drop_overflow_update=False)
        opt = thor(net, lr, damping, 0.9, 1e-4, 128, 8, split_indices=[26, 53], frequency=3)
        model = ConvertModelUtils().convert_to_thor_model(
            model=MsModel(net, loss_fn=loss, optimizer=opt, loss_scale_manager=loss_scale, metrics={"acc"},
                          amp_level="O2", keep_batchnorm_fp32=False),
            network=net, loss_fn=loss, optimizer=opt, loss_scale_manager=loss_scale, metrics={"acc"}, amp_level="O2",
            keep_batchnorm_fp32=False)
        assert isinstance(model, Model)
        x, y = learnable_data(16, size=16)
        model.train(2, dataset(x, y, batch_size=8), dataset_sink_mode=True)
        result = model.eval(dataset(x, y, batch_size=8), dataset_sink_mode=False)
        assert set(result) == {"acc"} and 0.0 <= result["acc"] <= 1.0
        assert int(opt.global_step.asnumpy()[0]) == steps
        assert len(opt.thor_layers) == 13
        after = [p.asnumpy() for p in net.trainable_params()]
        assert all(np.all(np.isfinite(a)) for a in after)
        assert all(not np.array_equal(a, b) for a, b in zip(after, before))
        assert all(np.abs(p.asnumpy()).sum() > 0 for p in opt.a_inverses)

    _graph(run)


def _train_small(sink: bool, epochs: int = 1):
    net = make_net()
    opt = thor(net, 0.05, 0.05, 0.9, weight_decay=1e-3, frequency=3)
    model = ConvertModelUtils().convert_to_thor_model(Model(net, ce(), opt), net, ce(), opt)
    x, y = learnable_data(80)
    model.train(epochs, dataset(x, y), dataset_sink_mode=sink)
    return [p.asnumpy().copy() for p in net.trainable_params()], opt


def test_dataset_sink_equals_step_by_step():
    """Frequency need not divide the 5 steps per epoch; sinking the epoch changes nothing."""
    def run():
        plain, opt = _train_small(False, 2)
        sunk, _ = _train_small(True, 2)
        assert int(opt.global_step.asnumpy()[0]) == 10
        for a, b in zip(plain, sunk):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)

    _graph(run)


def test_boost_config_turns_thor_on():
    """Model(..., boost_config_dict={"boost": {"thor": True}, "thor": {...}}) trains with THOR and the user's lr."""
    net = make_net()
    before = [p.asnumpy().copy() for p in net.trainable_params()]
    lr = Tensor(np.full(8, 0.02, np.float32))
    user_opt = nn.Momentum(net.trainable_params(), lr, 0.8, weight_decay=1e-4)
    model = Model(net, ce(), user_opt, boost_config_dict={"boost": {"mode": "manual", "thor": True},
                                                          "thor": {"damping": 0.05, "frequency": 2}})
    opt = model.train_network.optimizer
    assert isinstance(opt, THOR) and opt.get_frequency() == 2
    assert abs(float(opt.momentum.asnumpy()) - 0.8) < 1e-6 and abs(opt.weight_decay - 1e-4) < 1e-9
    assert opt.learning_rate is user_opt.learning_rate
    assert [p.name for p in opt.parameters] == [p.name for p in user_opt.parameters]
    x, y = learnable_data(64)
    model.train(1, dataset(x, y), dataset_sink_mode=False)
    assert int(opt.global_step.asnumpy()[0]) == 4
    assert all(not np.array_equal(p.asnumpy(), b) for p, b in zip(net.trainable_params(), before))
    assert type(net.conv1) is nn.Conv2d  # the user's network keeps its layers


def test_dynamic_loss_scale_is_unscaled_in_the_factors():
    """With a DynamicLossScaleManager the captured G is divided by the scale the backward used (the scaled run
    takes the compiled PyNative step, the unscaled reference runs op by op)."""
    def run(manager):
        net = make_net()
        opt = thor(net, 0.05, 0.05, 0.9, frequency=2)
        opt.compile_pynative_step = manager is not None
        kwargs = {"loss_scale_manager": manager} if manager is not None else {}
        model = ConvertModelUtils().convert_to_thor_model(Model(net, ce(), opt, **kwargs), net, ce(), opt,
                                                          **kwargs)
        x, y = learnable_data(48)
        model.train(1, dataset(x, y), dataset_sink_mode=False)
        layer = opt.thor_layers[-1]
        return [p.asnumpy().copy() for p in net.trainable_params()], layer

    plain, _ = run(None)
    scaled, layer = run(ms.DynamicLossScaleManager(2.0 ** 12, scale_factor=2, scale_window=2))
    assert layer.g_capture.loss_scale.name == "scale_sense"
    for a, b in zip(plain, scaled):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_deep_network_compiles_in_graph_mode_and_matches_pynative(monkeypatch):
    """A 13-layer THOR net (26 parameters; the smallest chain above the 12-layer threshold in
    ``ms_boost.thor.optimizer._ensure_call_depth``, so the raise is exercised) with a fixed loss scale: Graph mode
    compiles (per-parameter work is mapped, not unrolled, and the call-depth limit is raised with the layer count;
    ResNet-50's 54 layers exceeded the default limit of 1000 before) and makes the same two steps as PyNative op by
    op."""
    from mindspore.train import FixedLossScaleManager

    from ms_boost.thor import optimizer as thor_optimizer

    before = thor_optimizer._CALL_DEPTH["raised_to"]  # pylint: disable=protected-access

    def run():
        # count only what this chain raises (monkeypatch puts the record back after the test)
        monkeypatch.setitem(thor_optimizer._CALL_DEPTH, "raised_to", 0)  # pylint: disable=protected-access
        ms.set_seed(0)
        cells = []
        for _ in range(12):
            cells += [nn.Dense(6, 6), nn.Tanh()]
        net = nn.SequentialCell(cells + [nn.Dense(6, 3)])
        opt = thor(net, 0.05, 0.05, 0.9, 1e-4, 16.0, 8, frequency=1)
        # PyNative op by op: compiled, the PyNative step is this same Graph-mode graph (compiled == op by op:
        # test_thor_optimizer.py::test_pynative_compiled_step_equals_op_by_op_and_follows_set_data)
        opt.compile_pynative_step = False
        model = Model(opt.thor_network, ce(), opt,
                      loss_scale_manager=FixedLossScaleManager(16.0, drop_overflow_update=False))
        rng = np.random.default_rng(0)
        x = rng.normal(size=(16, 6)).astype(np.float32)
        y = (np.arange(16) % 3).astype(np.int32)
        model.train(1, dataset(x, y, batch_size=8), dataset_sink_mode=False)
        assert len(opt.thor_layers) == 13
        # this chain raised the graph call-depth limit (ms_boost records it; MindSpore has no getter)
        assert thor_optimizer._CALL_DEPTH["raised_to"] > 1000  # pylint: disable=protected-access
        return [p.asnumpy().copy() for p in net.trainable_params()]

    try:
        graph = _graph(run)
        pynative = run()
    finally:
        if before > thor_optimizer._CALL_DEPTH["raised_to"]:  # pylint: disable=protected-access
            ms.set_recursion_limit(before)  # a bigger net in this process had raised it further
    for g, p in zip(graph, pynative):
        np.testing.assert_allclose(g, p, rtol=1e-4, atol=1e-6)
    assert any(np.abs(g).sum() > 0 for g in graph)

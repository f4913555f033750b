"""Tests of ms_boost.grad_process: gradient centralization, OptimizerProcess, ParameterProcess."""
from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn
from mindspore.ops import composite as C

import ms_boost.grad_process as grad_process
from ms_boost import Model
from ms_boost.grad_process import (
    CentralizedGradients,
    OptimizerProcess,
    ParameterProcess,
    centralize_gradient,
    with_gradient_centralization,
)
from tests.helpers.nets import dataset, learnable_data
from tests.test_less_bn import TinyResNet


# ---------------------------------------------------------------------------------------------- reference
def gc_reference(g: np.ndarray) -> np.ndarray:
    """Gradient centralization (Yong et al. 2020): subtract the mean over all axes but axis 0."""
    if g.ndim < 2:
        return g
    return g - g.reshape(g.shape[0], -1).mean(axis=1).reshape((-1,) + (1,) * (g.ndim - 1))


def momentum_reference(w, v, g, lr, momentum):
    """MindSpore ApplyMomentum: v = momentum * v + g ; w = w - lr * v."""
    v = momentum * v + g
    return w - lr * v, v


class GCNet(nn.Cell):
    """conv (GC) -> depthwise conv (no GC) -> BN (no GC) -> dense (GC on weight, not bias)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, has_bias=True)
        self.depthwise = nn.Conv2d(4, 4, 3, group=4)
        self.bn = nn.BatchNorm2d(4)
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(4 * 6 * 6, 5)

    def construct(self, x):
        return self.fc(self.flatten(self.bn(self.depthwise(self.conv(x)))))


GC_EXPECTED = {"conv.weight": True, "conv.bias": False, "depthwise.weight": False, "bn.gamma": False,
               "bn.beta": False, "fc.weight": True, "fc.bias": False}


class Centralize(nn.Cell):
    def construct(self, g):
        return centralize_gradient(g)


# ---------------------------------------------------------------------------------------------- math
@pytest.mark.parametrize("shape", [(4, 3, 3, 3), (5, 7), (6,), (2, 3, 4)])
def test_centralize_gradient_matches_numpy(mode, shape):
    g = np.random.default_rng(1).normal(size=shape).astype(np.float32) + 3.0
    out = Centralize()(Tensor(g)).asnumpy()
    np.testing.assert_allclose(out, gc_reference(g), rtol=1e-5, atol=1e-5)
    if len(shape) >= 2:
        means = out.reshape(shape[0], -1).mean(axis=1)
        np.testing.assert_allclose(means, 0.0, atol=1e-5)


# ---------------------------------------------------------------------------------------------- optimizer
def _gc_optimizer(net, **kwargs):
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9, **kwargs)
    process = OptimizerProcess(opt)
    process.add_grad_centralization(net)
    return opt, process.generate_new_optimizer()


def test_gc_flags_follow_gc_rules():
    net = GCNet()
    _, new = _gc_optimizer(net)
    flags = dict(zip([p.name for p in new.parameters], new.grad_centralization_flags))
    assert flags == GC_EXPECTED
    # the parameter order of the optimizer is the network's
    assert [p.name for p in new.parameters] == [p.name for p in net.trainable_params()]


def test_gc_optimizer_keeps_class_and_hyper_parameters():
    net = GCNet()
    old, new = _gc_optimizer(net, weight_decay=0.0, use_nesterov=True)
    assert isinstance(new, nn.Momentum) and isinstance(new, CentralizedGradients)
    assert type(new).__name__ == "Momentum"
    assert new.use_nesterov is True
    assert float(new.momentum.asnumpy()) == pytest.approx(0.9)
    assert float(new.learning_rate.asnumpy()) == pytest.approx(0.1)
    assert new is not old and old.grad_centralization is False  # the user's optimizer is untouched
    assert with_gradient_centralization(type(new)) is type(new)


def test_gc_momentum_steps_match_numpy(mode):
    net = GCNet()
    _, opt = _gc_optimizer(net)
    params = list(opt.parameters)
    rng = np.random.default_rng(2)
    w = {p.name: p.asnumpy().copy() for p in params}
    v = {p.name: np.zeros_like(w[p.name]) for p in params}
    for _ in range(3):
        grads = [rng.normal(size=p.shape).astype(np.float32) + 1.0 for p in params]
        before = {p.name: p.asnumpy().copy() for p in params}
        opt(ms.mutable(tuple(Tensor(g) for g in grads)))
        for p, g in zip(params, grads):
            g_used = gc_reference(g) if GC_EXPECTED[p.name] else g
            w[p.name], v[p.name] = momentum_reference(w[p.name], v[p.name], g_used, 0.1, 0.9)
            np.testing.assert_allclose(p.asnumpy(), w[p.name], rtol=1e-5, atol=1e-5)
            if GC_EXPECTED[p.name]:  # invariant: a centralised update has zero mean per output channel
                step = (before[p.name] - p.asnumpy()).reshape(p.shape[0], -1)
                assert np.abs(step.mean(axis=1)).max() < 1e-5 * max(1.0, np.abs(step).max())


# Gradient centralization written the straightforward way (a mean over axes 1..r-1 of the gradient as it is, a
# broadcast subtraction: the form ms_boost used before its cheaper 2-D one), and a control that does nothing.
_reference_gc = C.MultitypeFuncGraph("test_reference_gc")
_no_gc = C.MultitypeFuncGraph("test_no_gc")


@_reference_gc.register("Bool", "Tensor")
def _reference_gc_one(flag, grad):
    if flag:
        return grad - grad.mean(axis=tuple(range(1, len(grad.shape))), keep_dims=True)
    return grad


@_no_gc.register("Bool", "Tensor")
def _no_gc_one(flag, grad):  # pylint: disable=unused-argument
    return grad


def _o1_weights(monkeypatch, form) -> dict:
    """TinyResNet's weights after 3 O1 steps (LessBN with GC, frozen groups) with GC computed by ``form``."""
    if form is not None:
        monkeypatch.setattr(grad_process, "_centralize_where_flagged", form)
    ms.set_seed(0)
    net = TinyResNet()
    model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                  nn.Momentum(net.trainable_params(), 0.05, 0.9), boost_level="O1",
                  boost_config_dict={"grad_freeze": {"total_steps": 3}})
    x, y = learnable_data(48, size=10)
    model.train(1, dataset(x, y), dataset_sink_mode=False)
    monkeypatch.undo()
    return {p.name: p.asnumpy().copy() for p in net.trainable_params()}


@pytest.fixture(scope="module")
def gc_reference_and_control() -> tuple:
    """The reference form's and the control's weights, trained once in PyNative mode for both modes' tests: the
    three forms give the same weights in Graph mode to 3e-8 (measured when this was shared), far inside the
    comparison's 1e-6."""
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        with pytest.MonkeyPatch.context() as patch:
            return _o1_weights(patch, _reference_gc), _o1_weights(patch, _no_gc)
    finally:
        ms.set_context(mode=previous)


def test_o1_training_numbers_equal_the_reference_gc(mode, monkeypatch, gc_reference_and_control):
    """O1 training with ms_boost's GC gives the reference form's weights up to round-off (FreezeOpt's groups,
    LessBN's groups and flags included); the control without GC shows the comparison can fail."""
    ours = _o1_weights(monkeypatch, None)
    reference, control = gc_reference_and_control
    assert ours.keys() == reference.keys()
    for name, value in ours.items():
        np.testing.assert_allclose(value, reference[name], rtol=1e-5, atol=1e-6, err_msg=name)
    centred = [name for name in ours if name.endswith("conv1.weight")]
    assert centred and all(np.abs(ours[name] - control[name]).max() > 1e-4 for name in centred)


def test_gc_keeps_user_group_settings():
    net = GCNet()
    conv = [p for p in net.trainable_params() if p.name.startswith("conv")]
    rest = [p for p in net.trainable_params() if not p.name.startswith("conv")]
    opt = nn.SGD([{"params": conv, "lr": 0.5, "weight_decay": 0.01}, {"params": rest}], learning_rate=0.1)
    process = OptimizerProcess(opt)
    process.add_grad_centralization(net)
    groups = [g for g in process.origin_params if "params" in g]
    for group in groups:
        names = {p.name for p in group["params"]}
        if names & {"conv.weight", "conv.bias"}:
            assert group["lr"] == 0.5 and group["weight_decay"] == 0.01
        else:
            assert "lr" not in group
        assert all(GC_EXPECTED[n] == group["grad_centralization"] for n in names)
    new = process.generate_new_optimizer()
    assert isinstance(new, nn.SGD)
    lrs = {p.name: float(new.get_lr_parameter(p).asnumpy()) for p in new.parameters}
    assert lrs["conv.weight"] == pytest.approx(0.5) and lrs["fc.weight"] == pytest.approx(0.1)


def test_optimizer_process_rejects_non_optimizer():
    with pytest.raises(TypeError, match="mindspore.nn.Optimizer"):
        OptimizerProcess(nn.Dense(2, 2))
    with pytest.raises(TypeError, match="Optimizer subclass"):
        with_gradient_centralization(nn.Dense)


def test_build_params_dict_maps_owner_cells():
    net = GCNet()
    owners = OptimizerProcess.build_params_dict(net)
    assert owners[id(net.conv.weight)] is net.conv
    assert owners[id(net.bn.gamma)] is net.bn
    assert owners[id(net.fc.bias)] is net.fc


# ---------------------------------------------------------------------------------------------- parameters
def _params(n):
    return [Parameter(Tensor(np.zeros(2, np.float32)), name=f"p{i}") for i in range(n)]


def test_assign_parameter_group_sets_fusion_ids():
    params = _params(7)
    ParameterProcess().assign_parameter_group(params, [2, 5])
    assert [p.comm_fusion for p in params] == [1, 1, 2, 2, 2, 3, 3]
    params = _params(6)
    ParameterProcess().assign_parameter_group(params)  # default: one split in the middle
    assert [p.comm_fusion for p in params] == [1, 1, 1, 2, 2, 2]
    params = _params(5)
    ParameterProcess().assign_parameter_group(params, 3)  # an int is one split point (upstream: TypeError)
    assert [p.comm_fusion for p in params] == [1, 1, 1, 2, 2]
    params = _params(4)
    ParameterProcess().assign_parameter_group(params, (50, 100))  # beyond the end: one group
    assert [p.comm_fusion for p in params] == [1, 1, 1, 1]


def test_assign_parameter_group_continues_fusion_ids_across_calls():
    process = ParameterProcess()
    a, b = _params(4), _params(4)
    process.assign_parameter_group(a, [2])
    process.assign_parameter_group(b, [2])
    assert [p.comm_fusion for p in a] == [1, 1, 2, 2]
    assert [p.comm_fusion for p in b] == [2, 2, 3, 3]


def test_assign_parameter_group_bad_split_points():
    with pytest.raises(TypeError, match="split_point"):
        ParameterProcess().assign_parameter_group(_params(3), "2")
    with pytest.raises(TypeError, match="split_point"):
        ParameterProcess().assign_parameter_group(_params(3), [1.5])
    with pytest.raises(ValueError, match="non-negative"):
        ParameterProcess().assign_parameter_group(_params(3), [-1])


def test_generate_group_params_plain_list():
    params = _params(3)
    assert ParameterProcess.generate_group_params(params, _params(2)) == [{"params": params}]


def test_generate_group_params_carries_settings_by_identity_and_name():
    old = _params(4)
    origin = [{"params": old[:2], "lr": 0.5}, {"params": old[2:3], "weight_decay": 0.1}, {"params": old[3:]},
              {"order_params": old}]
    renamed_copy = Parameter(Tensor(np.zeros(2, np.float32)), name="p1")  # matched by name
    brand_new = Parameter(Tensor(np.zeros(2, np.float32)), name="multiplier")
    new = [old[0], renamed_copy, old[2], brand_new]  # old[3] was removed (e.g. a BatchNorm LessBN dropped)
    groups = ParameterProcess.generate_group_params(new, origin)
    assert groups[0] == {"params": [old[0], renamed_copy], "lr": 0.5}
    assert groups[1] == {"params": [old[2]], "weight_decay": 0.1}
    assert groups[2] == {"params": [brand_new]}  # new parameters: optimizer defaults
    assert groups[3] == {"order_params": new}
    assert len(groups) == 4  # the emptied group is dropped
    # the origin is untouched
    assert origin[0]["params"] == old[:2] and len(origin) == 4


def test_generate_group_params_errors():
    with pytest.raises(ValueError, match="empty"):
        ParameterProcess.generate_group_params(_params(1), [])
    with pytest.raises(TypeError, match="all Parameter or all dict"):
        ParameterProcess.generate_group_params(_params(1), [1, 2])


def adam_weight_decay_reference(w, m, v, g, lr, wd, beta1, beta2, eps):
    """MindSpore AdamWeightDecay (no bias correction): m, v moments; w -= lr * (m / (sqrt(v) + eps) + wd * w)."""
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    return w - lr * (m / (np.sqrt(v) + eps) + wd * w), m, v


def test_optimizer_without_recorded_arguments_is_rebuilt_with_its_groups_and_hyper_parameters():
    """``nn.AdamWeightDecay`` keeps no ``init_args`` (no ``@opt_init_args_register``): its arguments are read back
    from the instance and its groups from the per-parameter settings, so the rebuilt optimizer steps as numpy's
    AdamWeightDecay with the user's per-group lr / weight decay, beta1 and eps (the usual decay / no-decay split)."""
    net = nn.SequentialCell([nn.Dense(4, 3), nn.Dense(3, 2)])
    params = net.trainable_params()
    weights, biases = [p for p in params if "weight" in p.name], [p for p in params if "bias" in p.name]
    opt = nn.AdamWeightDecay([{"params": weights, "weight_decay": 0.1}, {"params": biases, "lr": 0.05},
                              {"order_params": params}], learning_rate=0.01, beta1=0.8, eps=1e-5)
    assert not hasattr(opt, "init_args")
    new = OptimizerProcess(opt).generate_new_optimizer()
    assert type(new) is nn.AdamWeightDecay and new is not opt
    assert [p.name for p in new.parameters] == [p.name for p in params]
    rng = np.random.default_rng(5)
    settings = {p.name: (0.01, 0.1) if "weight" in p.name else (0.05, 0.0) for p in params}
    state = {p.name: (p.asnumpy().astype(np.float64), 0.0, 0.0) for p in params}
    for _ in range(3):
        grads = [rng.normal(size=p.shape).astype(np.float32) for p in params]
        new(ms.mutable(tuple(Tensor(g) for g in grads)))
        for p, g in zip(params, grads):
            lr, wd = settings[p.name]
            state[p.name] = adam_weight_decay_reference(*state[p.name], g, lr, wd, 0.8, 0.999, 1e-5)
            np.testing.assert_allclose(p.asnumpy(), state[p.name][0], rtol=1e-5, atol=1e-5, err_msg=p.name)


def test_adam_kwargs_are_passed_on_and_unreadable_arguments_are_named():
    """``nn.Adam`` records its ``**kwargs`` as a literal ``kwargs`` key: passed on unpacked (it was passed as
    ``kwargs=...`` and Adam refused it). ``nn.AdamOffload`` keeps ``use_locking`` nowhere readable: named."""
    net = nn.Dense(4, 3)
    opt = nn.Adam(net.trainable_params(), learning_rate=0.02, beta1=0.7, use_amsgrad=False)
    new = OptimizerProcess(opt).generate_new_optimizer()
    assert type(new) is nn.Adam and float(new.beta1.asnumpy()) == pytest.approx(0.7)
    assert float(new.learning_rate.asnumpy()) == pytest.approx(0.02)
    with pytest.raises(TypeError, match=r"AdamOffload .*\['use_locking', 'use_nesterov'\].*less_bn, grad_freeze"):
        OptimizerProcess(nn.AdamOffload(net.trainable_params(), 0.01))


@pytest.mark.parametrize("name", ["Adam", "AdamWeightDecay"])
def test_default_o1_trains_with_adam_family_optimizers(name, mode):
    """The default O1 (LessBN + gradient freezing) rebuilds the optimizer: with nn.Adam and nn.AdamWeightDecay
    it trains (both raised before), and every weight moves over a full freezing period."""
    from ms_boost import Model

    ms.set_seed(0)
    net = nn.SequentialCell([nn.Dense(6, 8), nn.ReLU(), nn.Dense(8, 3)])
    before = {p.name: p.asnumpy().copy() for p in net.trainable_params()}
    opt = getattr(nn, name)(net.trainable_params(), learning_rate=0.01)
    model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), opt, boost_level="O1")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 6)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32)
    data = ms.dataset.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(16)
    model.train(3, data, dataset_sink_mode=False)
    moved = {p.name: not np.array_equal(p.asnumpy(), before[p.name]) for p in net.trainable_params()
             if p.name in before}
    assert all(moved.values()), moved
    assert all(np.isfinite(p.asnumpy()).all() for p in net.trainable_params())

"""Tests of ms_boost.less_bn: BatchNorm reduction, the FN head, apply_less_bn / apply_less_bn_eval."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops

from ms_boost.config import AutoBoost
from ms_boost.grad_process import CentralizedGradients
from ms_boost.less_bn import CommonHeadLastFN, LessBN, apply_less_bn, apply_less_bn_eval, convert_less_bn
from tests.helpers.nets import SmallConvNet, learnable_data

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------- networks
class Bottleneck(nn.Cell):
    """ResNet-50 style block (model_zoo layout): conv-bn x3 on the main path, conv-bn down-sample."""

    def __init__(self, cin, cout, down):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 1)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3)
        self.bn2 = nn.BatchNorm2d(cout)
        self.conv3 = nn.Conv2d(cout, cout, 1)
        self.bn3 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.down = down
        if down:
            self.down_sample_layer = nn.SequentialCell([nn.Conv2d(cin, cout, 1), nn.BatchNorm2d(cout)])

    def construct(self, x):
        identity = x
        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)
        out = self.conv2(out)
        out = self.bn2(out)
        out = self.relu(out)
        out = self.conv3(out)
        out = self.bn3(out)
        if self.down:
            identity = self.down_sample_layer(identity)
        out = out + identity
        out = self.relu(out)
        return out


class TinyResNet(nn.Cell):
    """stem conv-bn-relu, two bottleneck blocks, global mean pool, dense head."""

    def __init__(self, num_classes=4):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        self.layer1 = nn.SequentialCell([Bottleneck(8, 16, True), Bottleneck(16, 16, False)])
        self.end_point = nn.Dense(16, num_classes)

    def construct(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer1(x)
        x = x.mean(axis=(2, 3))
        return self.end_point(x)


class BasicBlock(nn.Cell):
    """Two-convolution block with the residual written as ops.add and an identity shortcut."""

    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3)
        self.bn2 = nn.BatchNorm2d(c)
        self.relu = nn.ReLU()

    def construct(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(ops.add(out, x))


class SequentialBranchBlock(nn.Cell):
    """Main branch in a SequentialCell, shortcut conv-bn in another; residual through an Add primitive."""

    def __init__(self, c):
        super().__init__()
        self.residual = nn.SequentialCell([nn.Conv2d(c, c, 3), nn.BatchNorm2d(c), nn.ReLU(),
                                           nn.Conv2d(c, c, 3), nn.BatchNorm2d(c), nn.ReLU(),
                                           nn.Conv2d(c, c, 1), nn.BatchNorm2d(c)])
        self.shortcut = nn.SequentialCell([nn.Conv2d(c, c, 1), nn.BatchNorm2d(c)])
        self.add = ops.Add()
        self.relu = nn.ReLU()

    def construct(self, x):
        return self.relu(self.add(self.residual(x), self.shortcut(x)))


class AugAssignBlock(nn.Cell):
    """Residual as ``out += x``, with the main path through a helper cell (conv-bn-relu)."""

    def __init__(self, c):
        super().__init__()
        self.unit = ConvBNReLU(c)
        self.conv = nn.Conv2d(c, c, 3)
        self.bn = nn.BatchNorm2d(c)

    def construct(self, x):
        out = self.unit(x)
        out = self.bn(self.conv(out))
        out += x
        return out


class ConvBNReLU(nn.Cell):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3)
        self.bn = nn.BatchNorm2d(c)
        self.relu = nn.ReLU()

    def construct(self, x):
        return self.relu(self.bn(self.conv(x)))


class SharedBNBlock(BasicBlock):
    """bn1's output is both the shortcut and the input of the main path: bn1 must be kept."""

    def construct(self, x):
        y = self.bn1(self.conv1(x))
        out = self.bn2(self.conv2(y))
        return out + y


def bn_names(net):
    return sorted(name for name, cell in net.cells_and_names() if isinstance(cell, nn.BatchNorm2d))


def identity_names(net):
    return sorted(name for name, cell in net.cells_and_names() if isinstance(cell, nn.Identity))


# ---------------------------------------------------------------------------------------------- BN reduction
def test_bottleneck_resnet_matches_upstream_pattern():
    net = TinyResNet()
    report = convert_less_bn(net)
    # upstream's pass: in each bottleneck, the BN of conv1 and conv2 go, conv3's BN (before the addition),
    # the down-sample BN and the stem BN stay
    removed = ["layer1.0.bn1", "layer1.0.bn2", "layer1.1.bn1", "layer1.1.bn2"]
    assert sorted(report.removed_bn) == removed
    assert identity_names(net) == removed
    assert bn_names(net) == ["bn1", "layer1.0.bn3", "layer1.0.down_sample_layer.1", "layer1.1.bn3"]
    assert report.fn_head is None


@pytest.mark.parametrize("block,removed,kept", [
    (BasicBlock, ["bn1"], ["bn2"]),
    (SequentialBranchBlock, ["residual.1", "residual.4"], ["residual.7", "shortcut.1"]),
    (AugAssignBlock, ["unit.bn"], ["bn"]),
    (SharedBNBlock, [], ["bn1", "bn2"]),
])
def test_residual_forms(block, removed, kept):
    net = block(4)
    report = convert_less_bn(net)
    assert sorted(report.removed_bn) == removed
    assert identity_names(net) == removed
    assert bn_names(net) == kept
    out = net(Tensor(np.ones((2, 4, 8, 8), np.float32)))
    assert np.isfinite(out.asnumpy()).all()


def test_plain_conv_net_keeps_all_batchnorms():
    net = SmallConvNet()
    report = convert_less_bn(net, fn_flag=True)
    assert report.removed_bn == []
    assert bn_names(net) == ["bn1", "bn2"]
    assert report.fn_head == "fc" and isinstance(net.fc, CommonHeadLastFN)


def test_conversion_is_in_place_and_idempotent():
    net = TinyResNet()
    weight = net.end_point.weight
    names_before = {p.name for p in net.trainable_params()}
    wrapper = LessBN(net, fn_flag=True)
    assert wrapper.network is net and isinstance(net.end_point, CommonHeadLastFN)
    assert net.end_point.weight is weight and weight.name == "end_point.weight"  # same Parameter, same name
    assert net.end_point.multiplier.name == "end_point.multiplier"
    names_after = {p.name for p in net.trainable_params()}
    assert names_after == (names_before - {"end_point.bias"} - {
        f"layer1.{i}.bn{j}.{k}" for i in (0, 1) for j in (1, 2) for k in ("gamma", "beta")}) | {"end_point.multiplier"}
    assert {p.name for p in wrapper.trainable_params()} == names_after  # the wrapper adds no prefix
    again = convert_less_bn(net, fn_flag=True)
    assert again.removed_bn == [] and again.fn_head is None
    assert {p.name for p in net.trainable_params()} == names_after


@pytest.mark.parametrize("fn_scale", [None, 1.0, 7.5])
def test_fn_head_starts_at_the_adacos_scale_unless_told(fn_scale):
    """The new head's multiplier starts at sqrt(2) ln(C - 1) (AdaCos) for C classes, at fn_scale when given
    (1.0: upstream's start); through the boost config too."""
    net = SmallConvNet(num_classes=10)
    classes = net.fc.out_channels
    convert_less_bn(net, fn_flag=True, fn_scale=fn_scale)
    expected = max(1.0, np.sqrt(2.0) * np.log(classes - 1)) if fn_scale is None else fn_scale
    np.testing.assert_allclose(net.fc.multiplier.asnumpy(), [expected], rtol=1e-6)
    boost = AutoBoost("O1", {} if fn_scale is None else {"less_bn": {"fn_scale": fn_scale}})
    other = SmallConvNet(num_classes=10)
    apply_less_bn_eval(other, boost.less_bn)
    np.testing.assert_allclose(other.fc.multiplier.asnumpy(), [expected], rtol=1e-6)


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), "7", True])
def test_fn_scale_bad_values_are_clear_errors(bad):
    with pytest.raises((TypeError, ValueError), match="fn_scale"):
        AutoBoost("O1", {"less_bn": {"fn_scale": bad}})
    with pytest.raises(ValueError, match="fn_scale"):
        convert_less_bn(SmallConvNet(), fn_flag=True, fn_scale=bad)


def test_fn_flag_skips_dense_with_activation():
    net = nn.SequentialCell([nn.Flatten(), nn.Dense(12, 3, activation="relu")])
    report = convert_less_bn(net, fn_flag=True)
    assert report.fn_head is None and "activation" in report.notes[0]


def test_bad_arguments():
    with pytest.raises(TypeError, match="Cell"):
        convert_less_bn("net")
    with pytest.raises(TypeError, match="fn_flag"):
        convert_less_bn(SmallConvNet(), fn_flag=1)


# ---------------------------------------------------------------------------------------------- FN head
def fn_reference(x, w, b, m):
    """m * (x/|x| @ (w/|w|)^T + b), rows normalised."""
    xn = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    wn = w / np.maximum(np.linalg.norm(w, axis=1, keepdims=True), 1e-12)
    return m * (xn @ wn.T + b)


@pytest.mark.parametrize("has_bias", [True, False])
def test_common_head_last_fn_matches_numpy(mode, has_bias):
    rng = np.random.default_rng(0)
    head = CommonHeadLastFN(6, 3, weight_init=Tensor(rng.normal(size=(3, 6)).astype(np.float32)),
                            bias_init=Tensor(rng.normal(size=3).astype(np.float32)), has_bias=has_bias)
    head.multiplier.set_data(Tensor(np.array([2.5], np.float32)))
    x = rng.normal(size=(5, 6)).astype(np.float32) * 10
    out = head(Tensor(x)).asnumpy()
    b = head.bias.asnumpy() if has_bias else 0.0
    np.testing.assert_allclose(out, fn_reference(x, head.weight.asnumpy(), b, 2.5), rtol=1e-5, atol=1e-5)
    assert np.abs(out / 2.5 - b).max() <= 1.0 + 1e-5  # cosine similarities


def test_common_head_last_fn_gradients_match_finite_differences(mode):
    """Gradients of sum(r * head(x)) for x, the weight and the multiplier against central differences of
    :func:`fn_reference` in float64; a zero feature row stays finite (the norm's floor)."""
    rng = np.random.default_rng(1)
    w = rng.normal(size=(3, 4)).astype(np.float32)
    head = CommonHeadLastFN(4, 3, weight_init=Tensor(w), has_bias=False)
    head.multiplier.set_data(Tensor(np.array([1.5], np.float32)))
    x = rng.normal(size=(5, 4)).astype(np.float32)
    x[2] = 0.0
    r = rng.normal(size=(5, 3))

    def objective(xv, wv, mv):
        return float((r * fn_reference(xv, wv, 0.0, mv)).sum())

    def numeric(values, index):
        out = np.zeros_like(values[index], np.float64)
        for pos in np.ndindex(out.shape):
            hi = [np.array(v, np.float64) for v in values]
            lo = [np.array(v, np.float64) for v in values]
            hi[index][pos] += 1e-5
            lo[index][pos] -= 1e-5
            out[pos] = (objective(*hi) - objective(*lo)) / 2e-5
        return out

    loss = lambda xt: (head(xt) * Tensor(r.astype(np.float32))).sum()  # noqa: E731
    gx, (gw, gm) = ops.grad(loss, grad_position=0, weights=[head.weight, head.multiplier])(Tensor(x))
    values = [x.astype(np.float64), w.astype(np.float64), np.array([1.5])]
    np.testing.assert_allclose(gx.asnumpy()[[0, 1, 3, 4]], numeric(values, 0)[[0, 1, 3, 4]], rtol=1e-3, atol=1e-4)
    assert np.isfinite(gx.asnumpy()[2]).all()
    np.testing.assert_allclose(gw.asnumpy(), numeric(values, 1), rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(gm.asnumpy(), numeric(values, 2), rtol=1e-3, atol=1e-4)


def _typed_and_drained() -> tuple:
    """Seconds until the head's output is typed, and until the queue drained (PyNative, asynchronous launch)."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    conv = nn.Conv2d(16, 16, 3, pad_mode="same", has_bias=False)
    x = Tensor(np.random.default_rng(0).normal(size=(8, 16, 32, 32)).astype(np.float32))
    head = CommonHeadLastFN(16, 10, has_bias=False)

    def features():  # a few convolutions still queued when the head is called
        y = x
        for _ in range(4):
            y = conv(y)
        return y.mean(axis=(2, 3))

    head(features()).asnumpy()  # warm-up
    queued = features()
    start = time.perf_counter()
    out = head(queued)
    ops.typeof(out)
    typed = time.perf_counter() - start
    out.asnumpy()
    drained = time.perf_counter() - start
    return typed, drained


def test_common_head_last_fn_output_is_typed_without_waiting_for_the_queue():
    """PyNative: the head's output type is known when it is launched. (A product with a transposed view
    made the loss's ``ops.typeof`` input check wait until the whole forward pass had executed, which
    serialised the rest of every training step.) In a process of its own with MindSpore's asynchronous launch
    (the default; the test processes launch synchronously, tests/conftest.py)."""
    code = "from tests.test_less_bn import _typed_and_drained; print('TIMES', *_typed_and_drained())"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, MS_DEV_LAUNCH_BLOCKING="0", GLOG_v="3",
                                   PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])))
    assert proc.returncode == 0, proc.stderr[-3000:]
    times = next(line for line in proc.stdout.splitlines() if line.startswith("TIMES "))
    typed, drained = map(float, times.split()[1:])
    assert typed < 0.5 * drained, f"typeof waited {typed:.3f} s of the {drained:.3f} s the queue took"


def test_common_head_last_fn_rejects_wrong_weight_shape():
    with pytest.raises(ValueError, match="shape"):
        CommonHeadLastFN(4, 3, weight_init=ms.Parameter(Tensor(np.ones((4, 3), np.float32)), name="w"))


# ---------------------------------------------------------------------------------------------- AutoBoost hooks
def test_apply_less_bn_rebuilds_optimizer():
    net = TinyResNet()
    loss_net = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    convs = [p for p in net.trainable_params() if "conv" in p.name]
    rest = [p for p in net.trainable_params() if "conv" not in p.name]
    opt = nn.Momentum([{"params": convs, "lr": 0.05}, {"params": rest}], learning_rate=0.1, momentum=0.9)
    boost = AutoBoost("O1", {"common": {"gradient_split_groups": [3, 9]}})
    network, new_opt = apply_less_bn(loss_net, opt, boost.less_bn, boost.common)
    assert isinstance(network, LessBN) and network.network is loss_net
    assert isinstance(new_opt, nn.Momentum) and isinstance(new_opt, CentralizedGradients)
    # the optimizer updates exactly the converted network's parameters, in the user's optimizer order
    kept = {id(p) for p in network.trainable_params()}
    expected = [p.name for p in opt.parameters if id(p) in kept] + ["end_point.multiplier"]
    assert [p.name for p in new_opt.parameters] == expected
    assert sorted(expected) == sorted(p.name for p in network.trainable_params())
    # user group settings kept; the new multiplier takes the optimizer default
    lr = {p.name: float(new_opt.get_lr_parameter(p).asnumpy()) for p in new_opt.parameters}
    assert lr["conv1.weight"] == pytest.approx(0.05) and lr["layer1.0.conv3.weight"] == pytest.approx(0.05)
    assert lr["bn1.gamma"] == pytest.approx(0.1) and lr["end_point.multiplier"] == pytest.approx(0.1)
    gc = dict(zip([p.name for p in new_opt.parameters], new_opt.grad_centralization_flags))
    assert gc["conv1.weight"] and gc["layer1.0.conv2.weight"]
    assert not gc["bn1.gamma"] and not gc["end_point.weight"] and not gc["end_point.multiplier"]
    # gradient-split groups: fusion ids switch at parameters 3 and 9
    fusion = [p.comm_fusion for p in network.trainable_params()]
    assert fusion == [1] * 3 + [2] * 6 + [3] * (len(fusion) - 9)


def test_apply_less_bn_without_gc_and_fn():
    net = TinyResNet()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    boost = AutoBoost("O1", {"less_bn": {"fn_flag": False, "gc_flag": False}})
    network, new_opt = apply_less_bn(net, opt, boost.less_bn, boost.common)
    assert isinstance(net.end_point, nn.Dense)
    assert type(new_opt) is nn.SGD
    assert len(identity_names(net)) == 4


def test_apply_less_bn_keeps_the_users_parameter_selection():
    net = TinyResNet()
    head_only = [net.end_point.weight, net.end_point.bias]  # fine-tuning the head only
    boost = AutoBoost("O1")
    _, new_opt = apply_less_bn(net, nn.SGD(head_only, learning_rate=0.1), boost.less_bn, boost.common)
    assert [p.name for p in new_opt.parameters] == ["end_point.weight", "end_point.multiplier"]
    # a second conversion (a second Model on the same net and optimizer): the multiplier is not new any more,
    # and the user's optimizer never held it; it is still trained
    _, again = apply_less_bn(net, nn.SGD(head_only, learning_rate=0.1), boost.less_bn, boost.common)
    assert [p.name for p in again.parameters] == ["end_point.weight", "end_point.multiplier"]


def test_eval_conversion_loads_trained_checkpoint(mode):
    boost = AutoBoost("O1")
    ms.set_seed(1)
    trained = TinyResNet()
    apply_less_bn(trained, nn.SGD(trained.trainable_params(), 0.1), boost.less_bn, boost.common)
    trained.end_point.multiplier.set_data(Tensor(np.array([3.0], np.float32)))
    state = {p.name: Tensor(p.asnumpy()) for p in trained.get_parameters()}
    fresh = TinyResNet()  # e.g. a new process evaluating the LessBN checkpoint
    evaluated = apply_less_bn_eval(fresh, boost.less_bn)
    not_loaded, _ = ms.load_param_into_net(fresh, {k: ms.Parameter(v, name=k) for k, v in state.items()})
    assert not_loaded == []
    trained.set_train(False)
    evaluated.set_train(False)
    x = Tensor(np.random.default_rng(3).normal(size=(2, 3, 12, 12)).astype(np.float32))
    np.testing.assert_allclose(evaluated(x).asnumpy(), trained(x).asnumpy(), rtol=1e-5, atol=1e-5)
    assert apply_less_bn_eval(evaluated, boost.less_bn) is evaluated


def test_less_bn_resnet_trains(mode):
    ms.set_seed(0)
    net = TinyResNet()
    loss_net = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    boost = AutoBoost("O1")
    network, opt = apply_less_bn(loss_net, nn.Momentum(net.trainable_params(), 0.05, 0.9), boost.less_bn,
                                 boost.common)
    train = nn.TrainOneStepCell(network, opt)
    x, y = learnable_data(32, size=8)
    losses = [float(train(Tensor(x), Tensor(y)).asnumpy()) for _ in range(12)]
    assert np.isfinite(losses).all()
    assert np.mean(losses[-3:]) < 0.8 * np.mean(losses[:3]), losses


def test_eval_only_model_with_boost_level_evaluates_a_trained_o1_checkpoint(mode, tmp_path):
    """docs/light_algorithms.md: evaluating an O1 checkpoint with ``Model(net, loss, metrics=..., boost_level="O1")``
    and no optimizer (an evaluation script). The Model applies the evaluation rewrites (BatchNorm removal, FN
    head) to ``net`` in place, the checkpoint loads with nothing left over and the accuracy equals the trained
    Model's; before, Model refused to be built without an optimizer."""
    from ms_boost import Model

    ms.set_seed(1)
    x, y = learnable_data(48)
    data = lambda: ms.dataset.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(16)  # noqa: E731
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    trained = TinyResNet()
    model = Model(trained, loss, nn.Momentum(trained.trainable_params(), 0.05, 0.9), metrics={"acc"},
                  boost_level="O1")
    model.train(2, data(), dataset_sink_mode=False)
    path = str(tmp_path / "o1.ckpt")
    ms.save_checkpoint(trained, path)
    expected = model.eval(data(), dataset_sink_mode=False)

    fresh = TinyResNet()
    evaluator = Model(fresh, loss, metrics={"acc"}, boost_level="O1")
    assert "no boost algorithm takes part in training" in evaluator._plan_text()  # pylint: disable=protected-access
    not_loaded, unused = ms.load_param_into_net(fresh, ms.load_checkpoint(path))
    assert not_loaded == [] and unused == []
    assert evaluator.eval(data(), dataset_sink_mode=False) == expected

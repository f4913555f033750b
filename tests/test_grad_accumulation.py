"""Tests of ms_boost.grad_accumulation: k micro-steps of batch b equal one step on batch k*b."""
from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops

from ms_boost.grad_accumulation import AccumulateUpdate, GradientAccumulation
from ms_boost.stages import OptimizerUpdate


class ConvHead(nn.Cell):
    """conv -> relu -> dense: no BatchNorm, so micro-batches and the big batch see the same function."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, has_bias=True)
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(4 * 8 * 8, 3)

    def construct(self, x):
        return self.fc(self.flatten(self.relu(self.conv(x))))


def make_loss_net(seed=11):
    ms.set_seed(seed)
    return nn.WithLossCell(ConvHead(), nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))


def data(n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 3, 8, 8)).astype(np.float32), rng.integers(0, 3, n).astype(np.int32)


class StageStep(nn.Cell):
    """A tiny train step: loss, gradients, then an update stage (as the core's train cell does); with
    ``upstream_api`` the gradients go to the upstream-API GradientAccumulation(k, optimizer) instead."""

    upstream_api = False

    def __init__(self, loss_net, optimizer, k):
        super().__init__(auto_prefix=False)
        self.loss_net = loss_net
        self.weights = optimizer.parameters
        self.grad = ops.GradOperation(get_by_list=True)
        if self.upstream_api:
            self.accumulate = GradientAccumulation(k, optimizer)
        else:
            self.stage = AccumulateUpdate(OptimizerUpdate(optimizer), self.weights, k)

    def construct(self, x, y):
        loss = self.loss_net(x, y)
        grads = self.grad(self.loss_net, self.weights)(x, y)
        if self.upstream_api:
            return self.accumulate(loss, grads)
        return ops.depend(loss, self.stage(loss, grads, x, y))


class UpstreamStep(StageStep):
    upstream_api = True


def big_batch_reference(loss_net, x, y, lr, momentum, updates):
    """Plain numpy SGD/momentum on full-batch gradients (gradients from MindSpore, one per big batch)."""
    params = loss_net.trainable_params()
    w = [p.asnumpy().copy() for p in params]
    v = [np.zeros_like(a) for a in w]
    for u in range(updates):
        xb, yb = x[u], y[u]
        # a new grad function each time: in Graph mode a reused ms.grad function keeps returning the
        # gradients at the weights it was first compiled with (MindSpore 2.10)
        grad_fn = ms.grad(loss_net, grad_position=None, weights=params)
        grads = [g.asnumpy() for g in grad_fn(Tensor(xb), Tensor(yb))]
        for i, g in enumerate(grads):
            v[i] = momentum * v[i] + g
            w[i] = w[i] - lr * v[i]
        for p, a in zip(params, w):
            p.assign_value(Tensor(a))
    return w


@pytest.mark.parametrize("step_cls", [StageStep, UpstreamStep])
def test_k_micro_steps_equal_one_big_batch_step(mode, step_cls):
    """Momentum 0.9: the accumulated gradient also drives the optimizer state (plain SGD, momentum 0, is the same
    code path with one term fewer; k = 1 against TrainOneStepCell+SGD: test_k_equal_one_updates_every_step)."""
    k, b, updates, lr, momentum = 4, 4, 2, 0.5, 0.9
    x, y = data(k * b * updates)
    big_x = x.reshape(updates, k * b, 3, 8, 8)
    big_y = y.reshape(updates, k * b)
    reference = big_batch_reference(make_loss_net(), big_x, big_y, lr, momentum, updates)

    loss_net = make_loss_net()
    opt = nn.Momentum(loss_net.trainable_params(), learning_rate=lr, momentum=momentum)
    step = step_cls(loss_net, opt, k)
    params = loss_net.trainable_params()
    for j in range(k * updates):
        before = [p.asnumpy().copy() for p in params]
        xs, ys = Tensor(x[j * b:(j + 1) * b]), Tensor(y[j * b:(j + 1) * b])
        expected_loss = float(loss_net(xs, ys).asnumpy())
        loss = float(step(xs, ys).asnumpy())
        assert loss == pytest.approx(expected_loss, rel=1e-5)  # each step reports its micro-batch's loss
        changed = any(not np.array_equal(a, p.asnumpy()) for a, p in zip(before, params))
        assert changed == ((j + 1) % k == 0), j  # weights move only on every k-th micro-step
    for p, ref in zip(params, reference):
        np.testing.assert_allclose(p.asnumpy(), ref, rtol=1e-5, atol=1e-5)


def test_state_is_in_parameters_and_cleared_after_update(mode):
    loss_net = make_loss_net()
    opt = nn.SGD(loss_net.trainable_params(), learning_rate=0.1)
    step = StageStep(loss_net, opt, 3)
    x, y = data(12)
    names = {p.name for p in step.get_parameters()}
    assert "accumulation_step" in names and any(n.startswith("grad_accumulation.") for n in names)
    grad_fn = ms.grad(loss_net, grad_position=None, weights=loss_net.trainable_params())
    expected = [np.zeros(p.shape, np.float32) for p in loss_net.trainable_params()]
    for j in range(2):
        xs, ys = Tensor(x[4 * j:4 * j + 4]), Tensor(y[4 * j:4 * j + 4])
        for e, g in zip(expected, grad_fn(xs, ys)):
            e += g.asnumpy()
        step(xs, ys)
        assert int(step.stage.counter.asnumpy()) == j + 1
        for acc, e in zip(step.stage.accumulators, expected):
            np.testing.assert_allclose(acc.asnumpy(), e, rtol=1e-5, atol=1e-6)
    step(Tensor(x[8:]), Tensor(y[8:]))
    assert int(step.stage.counter.asnumpy()) == 0
    assert all(not acc.asnumpy().any() for acc in step.stage.accumulators)


def test_k_equal_one_updates_every_step(mode):
    loss_net = make_loss_net()
    reference = make_loss_net()
    opt = nn.SGD(loss_net.trainable_params(), learning_rate=0.1)
    ref_step = nn.TrainOneStepCell(reference, nn.SGD(reference.trainable_params(), learning_rate=0.1))
    step = StageStep(loss_net, opt, 1)
    x, y = data(8)
    for j in range(2):
        step(Tensor(x[4 * j:4 * j + 4]), Tensor(y[4 * j:4 * j + 4]))
        ref_step(Tensor(x[4 * j:4 * j + 4]), Tensor(y[4 * j:4 * j + 4]))
    for p, q in zip(loss_net.trainable_params(), reference.trainable_params()):
        np.testing.assert_allclose(p.asnumpy(), q.asnumpy(), rtol=1e-6, atol=1e-7)


def test_bad_step_counts():
    opt = nn.SGD(make_loss_net().trainable_params(), learning_rate=0.1)
    with pytest.raises(ValueError, match=r"grad_accumulation\.grad_accumulation_step=0 is out of range"):
        GradientAccumulation(0, opt)
    with pytest.raises(TypeError, match=r"grad_accumulation\.grad_accumulation_step must be an int"):
        GradientAccumulation(2.5, opt)
    with pytest.raises(ValueError, match="grad_accumulation_step=-1"):
        AccumulateUpdate(OptimizerUpdate(opt), opt.parameters, -1)
    with pytest.raises(TypeError, match="parameters"):
        GradientAccumulation(2, object())

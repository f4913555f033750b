"""Tests of ms_boost.loss_scale_group: GroupLossScaleManager in upstream's documented usage."""
from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops

from ms_boost.loss_scale_group import GroupLossScaleManager, group_scale_update, is_group_manager, require_group_manager

ALPHA = 2.0 ** (1.0 / 1000.0)
BETA = 2.0 ** -0.5


# ---------------------------------------------------------------------------------------------- networks
class AmpNet(nn.Cell):
    """Upstream's documented pattern: the manager is called between the layer groups."""

    def __init__(self, amp):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, has_bias=True)
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc1 = nn.Dense(4 * 8 * 8, 8)
        self.fc2 = nn.Dense(8, 3)
        self.amp = amp

    def construct(self, x):
        x = self.amp(x, 0, 1)
        x = self.flatten(self.relu(self.conv(x)))
        x = self.amp(x, 1, 2)
        x = self.fc2(self.relu(self.fc1(x)))
        x = self.amp(x, 2, 3)
        return x


class PlainNet(AmpNet):
    """The same network without markers (the unscaled reference)."""

    def __init__(self):
        super().__init__(None)

    def construct(self, x):
        x = self.flatten(self.relu(self.conv(x)))
        return self.fc2(self.relu(self.fc1(x)))


def build(init_scale=1024.0, seed=4, **kwargs):
    """The documented usage: a manager with no groups, the net, then the groups assigned."""
    ms.set_seed(seed)
    manager = GroupLossScaleManager(init_scale, [], **kwargs)
    net = AmpNet(manager)
    convs = [p for p in net.trainable_params() if "conv" in p.name]
    dense = [p for p in net.trainable_params() if "conv" not in p.name]
    manager.loss_scale_groups = [convs, dense]
    return manager, net


def plain(seed=4):
    ms.set_seed(seed)
    return PlainNet()


LOSS = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


class GroupScaleStep(nn.Cell):
    """The train step the core's loss-scale cell runs with a GroupLossScaleManager."""

    def __init__(self, loss_net, optimizer, manager):
        super().__init__(auto_prefix=False)
        self.loss_net = loss_net
        self.optimizer = optimizer
        self.weights = optimizer.parameters
        self.manager = manager.bind(self.weights)
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)

    def construct(self, x, y):
        loss = self.loss_net(x, y)
        grads = self.grad(self.loss_net, self.weights)(x, y, ops.ones_like(loss))
        grads, overflow = self.manager.unscale_and_update(grads)
        if not overflow:
            loss = ops.depend(loss, self.optimizer(grads))
        return loss, overflow


def data(n=8, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    return Tensor(rng.normal(size=(n, 3, 8, 8)).astype(np.float32) * scale), Tensor(rng.integers(0, 3, n).astype(
        np.int32))


# ---------------------------------------------------------------------------------------------- scaling
def test_markers_scale_each_group_by_its_loss_scale(mode):
    manager, net = build()
    manager.scales.set_data(Tensor(np.array([1.0, 256.0, 8.0, 1.0], np.float32)))
    reference = plain()
    x, y = data()
    loss_net = nn.WithLossCell(net, LOSS)
    got = ms.grad(loss_net, grad_position=0, weights=net.trainable_params())(x, y)
    want = ms.grad(nn.WithLossCell(reference, LOSS), grad_position=0, weights=reference.trainable_params())(x, y)
    np.testing.assert_allclose(got[0].asnumpy(), want[0].asnumpy(), rtol=1e-4, atol=1e-7)  # input: unscaled
    for p, g, w in zip(net.trainable_params(), got[1], want[1]):
        scale = 256.0 if "conv" in p.name else 8.0
        np.testing.assert_allclose(g.asnumpy(), scale * w.asnumpy(), rtol=1e-4, atol=1e-6)


def assert_trains_as_unscaled(manager, net, steps: int) -> None:
    """``steps`` group-scaled steps of ``net`` give the losses and weights of plain unscaled training, no overflow."""
    reference = plain()
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.05, momentum=0.9)
    step = GroupScaleStep(nn.WithLossCell(net, LOSS), opt, manager)
    ref_step = nn.TrainOneStepCell(nn.WithLossCell(reference, LOSS),
                                   nn.Momentum(reference.trainable_params(), learning_rate=0.05, momentum=0.9))
    for i in range(steps):
        x, y = data(seed=i)
        loss, overflow = step(x, y)
        ref_loss = ref_step(x, y)
        assert not bool(overflow.asnumpy())
        np.testing.assert_allclose(loss.asnumpy(), ref_loss.asnumpy(), rtol=1e-5)
    for p, q in zip(net.trainable_params(), reference.trainable_params()):
        np.testing.assert_allclose(p.asnumpy(), q.asnumpy(), rtol=1e-5, atol=1e-6)


def test_matches_unscaled_training_when_no_overflow(mode):
    manager, net = build(init_scale=[4096.0, 16.0])
    assert_trains_as_unscaled(manager, net, 5)
    np.testing.assert_allclose(manager.group_loss_scales(), [4096.0 * ALPHA ** 5, 16.0 * ALPHA ** 5], rtol=1e-5)


def test_overflow_in_one_group_skips_the_step_and_backs_off_that_group(mode):
    manager, net = build(max_loss_scale=2.0 ** 120)
    manager.scales.set_data(Tensor(np.array([1.0, 2.0 ** 100, 8.0, 1.0], np.float32)))
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.05, momentum=0.9)
    step = GroupScaleStep(nn.WithLossCell(net, LOSS), opt, manager)
    state = {p.name: p.asnumpy().copy() for p in step.get_parameters() if "scales" not in p.name}
    x, y = data(scale=1e10)  # conv gradients ~ x * 2**100: inf in float32; dense ones stay finite
    _, overflow = step(x, y)
    assert bool(overflow.asnumpy())
    for p in step.get_parameters():  # weights, moments, step counter: untouched
        if p.name in state:
            np.testing.assert_array_equal(p.asnumpy(), state[p.name], err_msg=p.name)
    np.testing.assert_allclose(manager.group_loss_scales(), [2.0 ** 100 * BETA, 8.0 * ALPHA], rtol=1e-6)
    np.testing.assert_array_equal(manager.scales.asnumpy()[[0, 3]], [1.0, 1.0])
    _, overflow = step(*data())  # a normal batch trains again
    assert not bool(overflow.asnumpy())
    assert any(not np.array_equal(p.asnumpy(), state[p.name]) for p in net.trainable_params())


def test_scales_are_bounded(mode):
    manager, net = build(init_scale=2.0, min_loss_scale=1.0, max_loss_scale=2.0 ** 3)
    opt = nn.SGD(net.trainable_params(), learning_rate=0.0)
    step = GroupScaleStep(nn.WithLossCell(net, LOSS), opt, manager)
    manager.scales.set_data(Tensor(np.array([1.0, np.inf, 2.0 ** 3, 1.0], np.float32)))
    _, overflow = step(*data())
    assert bool(overflow.asnumpy())  # an infinite scale makes infinite gradients...
    np.testing.assert_allclose(manager.group_loss_scales(), [2.0 ** 3, 2.0 ** 3])  # ...and is brought back


class ScaleUpdate(nn.Cell):
    def construct(self, scales, overflow):
        return group_scale_update(scales, overflow, ALPHA, BETA, 1.0, 2.0 ** 10)


def test_group_scale_update_matches_numpy(mode):
    scales = np.array([1.0, 1.2, 700.0, 1000.0, 2.0 ** 10, 3.0], np.float32)
    overflow = np.array([True, True, False, False, False, True])
    want = np.clip(np.where(overflow, scales * BETA, scales * ALPHA), 1.0, 2.0 ** 10)
    got = ScaleUpdate()(Tensor(scales), Tensor(overflow)).asnumpy()
    np.testing.assert_allclose(got, want, rtol=1e-6)


# ---------------------------------------------------------------------------------------------- API
def test_upstream_api_and_groups():
    manager, net = build(init_scale=512)
    assert manager.get_loss_scale() == 512
    assert manager.get_update_cell() is manager
    assert manager.get_drop_overflow_update() is True
    assert manager.loss_scale_number == 2
    np.testing.assert_allclose(manager.scales.asnumpy(), [1.0, 512.0, 512.0, 1.0])
    manager.update_loss_scale(False)  # Model's host-side hook: counts, the train step owns the update
    manager.update_loss_scale(True)
    np.testing.assert_allclose(manager.group_loss_scales(), [512.0] * 2)
    assert (manager.steps_seen, manager.overflow_steps) == (2, 1)
    manager.set_loss_scale_status(3, [1.0, 2.0, 4.0])
    np.testing.assert_allclose(manager.scales.asnumpy(), [1.0, 1.0, 2.0, 4.0, 1.0])
    manager.loss_scale_groups = [net.trainable_params()]  # assigning groups resets the scales
    np.testing.assert_allclose(manager.scales.asnumpy(), [1.0, 512.0, 1.0])
    # the manager inside the network adds no trainable parameter and renames none
    assert [p.name for p in net.trainable_params()] == ["conv.weight", "conv.bias", "fc1.weight", "fc1.bias",
                                                         "fc2.weight", "fc2.bias"]
    assert is_group_manager(manager) and not is_group_manager(nn.FixedLossScaleUpdateCell(8.0))


def test_update_loss_scale_status(mode):
    manager, _ = build(init_scale=64)
    new = manager.update_loss_scale_status(1, 0.5)
    assert float(new.asnumpy()) == pytest.approx(32.0)
    np.testing.assert_allclose(manager.scales.asnumpy(), [1.0, 64.0, 32.0, 1.0])


def test_bad_arguments():
    with pytest.raises(ValueError, match="init_loss_scale"):
        GroupLossScaleManager(0, [])
    with pytest.raises(TypeError, match="init_loss_scale"):
        GroupLossScaleManager("8", [])
    with pytest.raises(TypeError, match="list of parameter lists"):
        GroupLossScaleManager(8, "conv")
    with pytest.raises(TypeError, match=r"loss_scale_groups\[0\]"):
        GroupLossScaleManager(8, [[1, 2]])
    net = PlainNet()
    p = net.trainable_params()
    with pytest.raises(ValueError, match="conv.weight"):
        GroupLossScaleManager(8, [p[:2], p[:1]])
    with pytest.raises(ValueError, match="2 values for 3"):
        GroupLossScaleManager([8.0, 4.0], [p[:1], p[1:2], p[2:]])
    with pytest.raises(ValueError, match="growth_factor"):
        GroupLossScaleManager(8, [], growth_factor=0.5)
    manager = GroupLossScaleManager(8, [p])
    with pytest.raises(RuntimeError, match="bind"):
        manager.unscale_and_update(tuple(ops.ones_like(q) for q in p))


def test_require_group_manager():
    manager, _ = build()
    assert require_group_manager(manager) is manager
    with pytest.raises(ValueError, match="loss_scale_group.*GroupLossScaleManager"):
        require_group_manager(None)
    with pytest.raises(ValueError, match="DynamicLossScaleManager"):
        require_group_manager(ms.amp.DynamicLossScaleManager())


# ---------------------------------------------------------------------------------------------- multi-rank
def overflow_on_rank_1(rank: int) -> dict:
    """One step of the group loss-scale cell where only rank 1's batch overflows the conv group."""
    manager, net = build(max_loss_scale=2.0 ** 120)
    manager.scales.set_data(ms.Tensor(np.array([1.0, 2.0 ** 100, 8.0, 1.0], np.float32)))
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    step = GroupScaleStep(nn.WithLossCell(net, LOSS), opt, manager)
    before = np.concatenate([p.asnumpy().ravel() for p in net.trainable_params()])
    _, overflow = step(*data(scale=1e10 if rank == 1 else 1.0))
    after = np.concatenate([p.asnumpy().ravel() for p in net.trainable_params()])
    return {"overflow": np.array(bool(overflow.asnumpy())), "scales": manager.group_loss_scales(),
            "moved": np.array(np.abs(after - before).max())}


def check_overflow_on_one_rank(results: list) -> None:
    for rank, r in enumerate(results):
        assert bool(r["overflow"]), rank
        assert float(r["moved"]) == 0.0, rank
        np.testing.assert_allclose(r["scales"], [2.0 ** 100 * BETA, 8.0 * ALPHA], rtol=1e-6)


def test_overflow_on_one_rank_skips_every_rank():
    """2 simulated ranks (tests/helpers/loopback.py, PyNative); Graph mode: the msrun job of
    tests/test_msrun_e2e.py."""
    from tests.helpers.loopback import run_ranks

    check_overflow_on_one_rank(run_ranks(2, overflow_on_rank_1))

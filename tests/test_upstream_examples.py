"""Upstream ``mindspore.boost`` / THOR API reference examples, run with ``ms_boost`` in place of ``mindspore.boost``.

Each test is a divergence found by running an example of the API reference as written (docs/compatibility.md,
"Upstream's API examples"), reduced to the call that differed, with the nets the examples use (a bare ``MatMul``
weight, a two-group marker net) filled in at the smallest size.
"""
from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn

import ms_boost as boost


class _GroupNet(nn.Cell):
    """The GroupLossScaleManager example's net at the smallest size: two Dense groups between markers."""

    def __init__(self, enhanced_amp):
        super().__init__()
        self.fc1 = nn.Dense(8, 6)
        self.fc2 = nn.Dense(6, 3)
        self.relu = nn.ReLU()
        self.enhanced_amp = enhanced_amp

    def construct(self, x):
        x = self.enhanced_amp(x, 0, 1)
        x = self.relu(self.fc1(x))
        x = self.enhanced_amp(x, 1, 2)
        x = self.fc2(x)
        return self.enhanced_amp(x, 2, 3)


def test_group_loss_scale_cell_reports_the_first_groups_current_scale(mode):
    """The loss-scale cell's third output is "the current loss scale"; with a GroupLossScaleManager upstream returns
    the first group's scale after the step's update. It was the cell's unused whole-loss scale, always 1.0."""
    ms.set_seed(3)
    manager = boost.GroupLossScaleManager(4096, [])
    net = _GroupNet(manager)
    manager.loss_scale_groups = [[net.fc1.weight, net.fc1.bias], [net.fc2.weight, net.fc2.bias]]
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
    loss_net = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    cell = boost.BoostTrainOneStepWithLossScaleCell(loss_net, opt, scale_sense=manager)
    rng = np.random.RandomState(0)
    x = Tensor(rng.normal(size=(4, 8)).astype(np.float32))
    y = Tensor(rng.randint(0, 3, 4).astype(np.int32))
    for step in range(1, 3):
        loss, overflow, scale = cell(x, y)
        assert np.isfinite(loss.asnumpy()).all() and not bool(overflow.asnumpy())
        scales = manager.group_loss_scales()
        np.testing.assert_allclose(scales, [4096.0 * 2.0 ** (step / 1000.0)] * 2, rtol=1e-6)
        assert float(np.asarray(scale.asnumpy()).reshape(())) == float(scales[0])


def test_train_cell_built_on_network_auto_process_train_output_follows_that_plan(mode):
    """Upstream's lower-level pattern: ``AutoBoost(level, dict)``, ``network_auto_process_train``, then
    ``BoostTrainOneStepCell(network, optimizer)`` with no plan: upstream's cell read the AutoBoost it had just
    configured (a process-wide singleton). ms_boost's cell built the O0 plan instead and silently ignored the dict's
    gradient accumulation; it now takes the plan that prepared the network."""
    cfg = {"boost": {"mode": "manual", "less_bn": False, "grad_freeze": False, "adasum": False,
                     "grad_accumulation": True, "dim_reduce": False},
           "grad_accumulation": {"grad_accumulation_step": 2}}
    plan = boost.AutoBoost("O1", cfg)
    net = nn.Dense(4, 2, weight_init="ones", has_bias=False)
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    loss_net, opt = plan.network_auto_process_train(nn.WithLossCell(net, nn.MSELoss()), opt)
    cell = boost.BoostTrainOneStepCell(loss_net, opt)
    x = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    y = np.zeros((3, 2), np.float32)
    w0 = net.weight.asnumpy().copy()
    cell(Tensor(x), Tensor(y))
    np.testing.assert_array_equal(net.weight.asnumpy(), w0)  # first of two accumulated steps: no update
    cell(Tensor(x), Tensor(y))
    grad = 2.0 / y.size * (x @ w0.T - y).T @ x  # d mean((x W^T - y)^2) / dW; the same batch twice: mean = grad
    np.testing.assert_allclose(net.weight.asnumpy(), w0 - 0.1 * grad, rtol=1e-5)


def test_a_loss_cell_wrapped_around_the_prepared_backbone_follows_its_plan(mode):
    """The same pattern with the backbone prepared alone and the loss wrapped around it afterwards
    (``net, opt = plan.network_auto_process_train(net, opt)``; ``WithLossCell(net, loss)``): the cell finds the plan
    on the wrapped backbone (it had taken O0, silently)."""
    cfg = {"boost": {"mode": "manual", "less_bn": False, "grad_freeze": False, "adasum": False,
                     "grad_accumulation": True, "dim_reduce": False},
           "grad_accumulation": {"grad_accumulation_step": 2}}
    plan = boost.AutoBoost("O1", cfg)
    net = nn.Dense(4, 2, weight_init="ones", has_bias=False)
    net, opt = plan.network_auto_process_train(net, nn.SGD(net.trainable_params(), learning_rate=0.1))
    cell = boost.BoostTrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), opt)
    assert cell.boost is plan
    x = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4) / 10)
    w0 = net.weight.asnumpy().copy()
    cell(x, Tensor(np.zeros((3, 2), np.float32)))
    np.testing.assert_array_equal(net.weight.asnumpy(), w0)  # first of two accumulated steps: no update
    assert boost.BoostTrainOneStepCell(nn.WithLossCell(nn.Dense(4, 2), nn.MSELoss()),
                                       opt).boost.level == "O0"  # a network the plan never saw: O0

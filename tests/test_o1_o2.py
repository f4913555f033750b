"""Model-level acceptance of the light boost algorithms: boost_level O1 / O2 and manual mode, on CPU."""
from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn
from mindspore.train import Callback

from ms_boost import Model
from ms_boost.grad_freeze import FreezeOpt
from ms_boost.grad_process import CentralizedGradients
from ms_boost.less_bn import CommonHeadLastFN
from ms_boost.loss_scale_group import GroupLossScaleManager
from tests.helpers.nets import dataset, learnable_data, weights
from tests.test_less_bn import TinyResNet
from tests.test_loss_scale import AmpNet
from tests.workers.common import make_plain_net

EPOCHS = 4
MANUAL_EPOCHS = 3


class LossLog(Callback):
    """Collects the loss of every step."""

    def __init__(self):
        super().__init__()
        self.losses = []

    def on_train_step_end(self, run_context):
        out = run_context.original_args().net_outputs
        loss = out[0] if isinstance(out, (tuple, list)) else out
        self.losses.append(float(np.asarray(loss.asnumpy()).mean()))


def ce():
    return nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def data(n=48, size=10, batch=16):
    x, y = learnable_data(n, size=size)
    return dataset(x, y, batch_size=batch)


def epoch_means(losses, epochs=EPOCHS):
    per = len(losses) // epochs
    return [float(np.mean(losses[e * per:(e + 1) * per])) for e in range(epochs)]


def train(model, epochs=EPOCHS, **data_kwargs):
    log = LossLog()
    model.train(epochs, data(**data_kwargs), callbacks=[log], dataset_sink_mode=False)
    assert np.isfinite(log.losses).all(), log.losses
    return epoch_means(log.losses, epochs)


def boost_level_model(level: str):
    """TinyResNet in ms_boost.Model at ``level``; checks that what the level turns on is in the train network."""
    ms.set_seed(0)
    net = TinyResNet()
    model = Model(net, ce(), nn.Momentum(net.trainable_params(), 0.05, 0.9), metrics={"acc"}, boost_level=level,
                  boost_config_dict={"grad_freeze": {"total_steps": 20}})
    assert isinstance(model._optimizer, FreezeOpt)  # pylint: disable=protected-access
    assert all(isinstance(o, CentralizedGradients) for o in model._optimizer.opts)  # pylint: disable=protected-access
    assert isinstance(net.end_point, CommonHeadLastFN)
    assert sum(isinstance(c, nn.Identity) for _, c in net.cells_and_names()) == 4
    stages = {type(c).__name__ for _, c in model.train_network.cells_and_names()}
    assert ("AdaSumUpdate" in stages) == (level == "O2") and model.boost.enabled("adasum") == (level == "O2")
    return net, model


# One level per mode: on one process O2's chain is O1's (LessBN, centralized gradients, frozen groups) inside a
# no-op AdaSumUpdate, so Graph-mode O2 trains O1's chain too; PyNative AdaSumUpdate around an optimizer trains in
# tests/test_adasum.py::test_tutorial_usage_on_one_process_runs_with_one_warning[pynative] and in the zoo's O2
# journey (tests/test_zoo_journey.py). The other level's train network is built and checked in each case.
@pytest.mark.parametrize("mode_name,level,other", [("pynative", "O1", "O2"), ("graph", "O2", "O1")])
def test_boost_level_trains_small_resnet(mode_name, level, other):
    boost_level_model(other)
    ms.set_context(mode=ms.GRAPH_MODE if mode_name == "graph" else ms.PYNATIVE_MODE)
    try:
        _, model = boost_level_model(level)
        means = train(model)
        assert means[-1] < 0.75 * means[0], means
        accuracy = model.eval(data(), dataset_sink_mode=False)["acc"]
        assert accuracy > 0.5, accuracy  # four classes: chance is 0.25
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)


# One mode per algorithm here (the Model and manual-mode code is host code, the same in both modes); each
# algorithm trains in both modes in its own file: tests/test_less_bn.py::test_less_bn_resnet_trains,
# tests/test_grad_freeze.py::test_freeze_opt_updates_exactly_the_scheduled_groups,
# tests/test_grad_accumulation.py::test_k_micro_steps_equal_one_big_batch_step, and O1 (LessBN + freezing through
# Model) in PyNative above.
@pytest.mark.parametrize("algorithm,mode_name", [("less_bn", "graph"), ("grad_freeze", "graph"),
                                                 ("grad_accumulation", "pynative")])
def test_manual_mode_each_algorithm_alone(algorithm, mode_name):
    ms.set_context(mode=ms.GRAPH_MODE if mode_name == "graph" else ms.PYNATIVE_MODE)
    try:
        _manual_mode_trains(algorithm)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)


def _manual_mode_trains(algorithm):
    ms.set_seed(0)
    net = TinyResNet()
    config = {"boost": {"mode": "manual", algorithm: True},
              "grad_freeze": {"param_groups": 4, "total_steps": 20},
              "grad_accumulation": {"grad_accumulation_step": 2}}
    model = Model(net, ce(), nn.Momentum(net.trainable_params(), 0.05, 0.9), boost_level="O0",
                  boost_config_dict=config)
    assert [k for k, v in model.boost.boost_config.items() if v] == [algorithm]
    optimizer = model._optimizer  # pylint: disable=protected-access
    identities = sum(isinstance(c, nn.Identity) for _, c in net.cells_and_names())
    cells = {type(c).__name__ for _, c in model.train_network.cells_and_names()}
    if algorithm == "less_bn":
        assert identities == 4 and isinstance(optimizer, CentralizedGradients)
    else:
        assert identities == 0 and not isinstance(optimizer, CentralizedGradients)
    assert isinstance(optimizer, FreezeOpt) == (algorithm == "grad_freeze")
    assert ("AccumulateUpdate" in cells) == (algorithm == "grad_accumulation")
    means = train(model, epochs=MANUAL_EPOCHS)
    assert means[-1] < 0.9 * means[0], means


def test_manual_mode_loss_scale_group(mode):
    """Upstream's documented GroupLossScaleManager usage, passed to ms_boost.Model, on CPU."""
    ms.set_seed(0)
    manager = GroupLossScaleManager(4096, [])
    net = AmpNet(manager)
    convs = [p for p in net.trainable_params() if "conv" in p.name]
    dense = [p for p in net.trainable_params() if "conv" not in p.name]
    manager.loss_scale_groups = [convs, dense]
    model = Model(net, ce(), nn.Momentum(net.trainable_params(), 0.02, 0.9), loss_scale_manager=manager,
                  boost_config_dict={"boost": {"mode": "manual", "loss_scale_group": True}})
    means = train(model, size=8)
    assert means[-1] < 0.75 * means[0], means
    steps = EPOCHS * 3
    np.testing.assert_allclose(manager.group_loss_scales(), [4096 * 2 ** (steps / 1000)] * 2, rtol=1e-5)


def test_model_loss_scale_group_overflow_backs_off_one_group(mode):
    """Through ms_boost.Model: a batch overflowing the conv group skips the step and backs off that group only."""
    ms.set_seed(0)
    manager = GroupLossScaleManager(8, [], max_loss_scale=2.0 ** 120)
    net = AmpNet(manager)
    manager.loss_scale_groups = [net.trainable_params()[:2], net.trainable_params()[2:]]
    model = Model(net, ce(), nn.Momentum(net.trainable_params(), 0.02, 0.9), loss_scale_manager=manager,
                  boost_config_dict={"boost": {"mode": "manual", "loss_scale_group": True}})
    manager.scales.set_data(ms.Tensor(np.array([1.0, 2.0 ** 100, 8.0, 1.0], np.float32)))
    before = [p.asnumpy().copy() for p in net.trainable_params()]
    x, y = learnable_data(16, size=8)
    model.train(1, dataset(x * 1e10, y), dataset_sink_mode=False)  # conv gradients ~ 1e10 * 2**100: inf
    for b, p in zip(before, net.trainable_params()):
        np.testing.assert_array_equal(b, p.asnumpy())
    np.testing.assert_allclose(manager.group_loss_scales(), [2.0 ** 100 * 2 ** -0.5, 8.0 * 2 ** 0.001], rtol=1e-6)


def test_loss_scale_group_without_group_manager_is_an_error():
    net = TinyResNet()
    config = {"boost": {"mode": "manual", "loss_scale_group": True}}
    with pytest.raises(ValueError, match="GroupLossScaleManager"):
        Model(net, ce(), nn.Momentum(net.trainable_params(), 0.05, 0.9), boost_config_dict=config)
    with pytest.raises(ValueError, match="GroupLossScaleManager"):
        Model(net, ce(), nn.Momentum(net.trainable_params(), 0.05, 0.9), boost_config_dict=config,
              loss_scale_manager=ms.amp.DynamicLossScaleManager())


# ---------------------------------------------------------------------------------------------- multi-rank
LIGHT_O1 = {"boost": {"mode": "manual", "less_bn": True, "grad_freeze": True},
            "grad_freeze": {"param_groups": 2, "freeze_p": 0.5, "total_steps": 3, "seed": 4},
            "common": {"gradient_split_groups": [2]}}


def light_o1_reference(steps: int, batch: int, workers: int) -> list:
    """One process on the concatenated batch (checks the LIGHT_O1 pipeline it builds)."""
    x, y = learnable_data(steps * batch * workers, seed=1)
    net = make_plain_net()
    model = Model(net, ce(), nn.Momentum(net.trainable_params(), 0.1, 0.9), boost_config_dict=LIGHT_O1)
    assert isinstance(model._optimizer, FreezeOpt)  # pylint: disable=protected-access
    assert [p.comm_fusion for p in net.trainable_params()] == [1, 1, 2, 2]
    model.train(1, dataset(x, y, batch_size=batch * workers), dataset_sink_mode=False)
    return weights(net)


def check_light_o1_ranks(ranks: list, reference: list) -> None:
    assert len(ranks[0]) == len(reference) == 4  # conv weight/bias, FN head weight and multiplier
    for i, w in enumerate(reference):
        for r in range(1, len(ranks)):
            np.testing.assert_array_equal(ranks[0][i], ranks[r][i])
        np.testing.assert_allclose(ranks[0][i], w, rtol=0, atol=1e-5)


def test_two_ranks_light_o1_equals_one_process_on_the_big_batch():
    """LessBN head + gradient centralization + freezing + gradient-split groups, data parallel on 2 simulated
    ranks (tests/helpers/loopback.py, PyNative): the ranks stay identical and equal one process on the
    concatenated batch (no BatchNorm in this net). Graph mode: the msrun job of tests/test_msrun_e2e.py."""
    from tests.helpers.loopback import run_ranks
    from tests.test_data_parallel import BATCH, STEPS, train_rank

    ranks = run_ranks(2, lambda rank: train_rank(rank, 2, LIGHT_O1))
    check_light_o1_ranks(ranks, light_o1_reference(STEPS, BATCH, 2))

"""Users' scripts, fourteenth round (docs/compatibility.md): ``Model.fit`` with validation and MindSpore's callbacks,
sink sizes, amp and loss-scale forms.

Each test is a finding of such a script, reduced to its smallest form, against plain MindSpore.
"""
from __future__ import annotations

import mindspore.dataset as ds
import numpy as np
from mindspore import nn
from mindspore.train import LambdaCallback

from ms_boost import Model
from tests.test_user_scripts import ce


class _Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(8, 8)
        self.relu = nn.ReLU()
        self.fc2 = nn.Dense(8, 3)

    def construct(self, x):
        return self.fc2(self.relu(self.fc1(x)))


def _data(n: int = 48, seed: int = 0):
    rng = np.random.RandomState(seed)
    x = rng.normal(size=(n, 8)).astype(np.float32)
    y = np.argmax(x @ np.random.RandomState(9).normal(size=(8, 3)), axis=1).astype(np.int32)
    return ds.NumpySlicesDataset({"data": x, "label": y}, shuffle=False).batch(8)


def test_auto_plans_the_steps_mindspore_trains_when_sink_size_is_given_on_cpu(mode):
    """``train(epochs, data, dataset_sink_mode=True, sink_size=k)``: MindSpore 2.10's Model does not sink on CPU and
    trains the whole data set each epoch whatever ``sink_size`` says. ``boost_level="auto"`` planned its run as
    ``epochs * sink_size`` steps (here 4 where 12 are trained), so it weighed compile time against a run 3x shorter
    than the one that followed. It now plans the steps MindSpore trains."""
    steps = []
    net = _Net()
    model = Model(net, ce(), nn.Momentum(net.trainable_params(), 0.05, 0.9), boost_level="auto",
                  boost_config_dict={"autotune": {"candidates": ["O0"], "time_budget": False}})
    model.train(2, _data(), callbacks=[LambdaCallback(on_train_step_end=lambda rc: steps.append(1))],
                dataset_sink_mode=True, sink_size=2)
    assert len(steps) == 12  # MindSpore's doing: 6 batches an epoch, sink_size not applied on CPU
    assert model.autotune_report.planned_steps == len(steps)


def test_gradient_freezing_is_told_the_steps_mindspore_trains_when_sink_size_is_given_on_cpu(mode):
    """The same for gradient freezing, which reads the run's length when training begins (to choose one graph per
    train set only for long runs): it took ``epoch_num * batch_num`` from MindSpore's callback parameters, and on CPU
    ``batch_num`` says ``sink_size`` while each epoch trains the whole data set."""
    steps = []
    net = _Net()
    model = Model(net, ce(), nn.Momentum(net.trainable_params(), 0.05, 0.9), boost_level="O1",
                  boost_config_dict={"boost": {"mode": "manual", "grad_freeze": True}})
    model.train(2, _data(), callbacks=[LambdaCallback(on_train_step_end=lambda rc: steps.append(1))],
                dataset_sink_mode=True, sink_size=2)
    assert len(steps) == 12
    assert model.train_network.optimizer.planned_steps == len(steps)

"""Users' scripts, thirteenth round (docs/compatibility.md): fine-tuning with a frozen backbone, MindSpore's standard
data-set loaders, functional mixed precision beside Model, checkpoint forms, parallel settings on one process.

Each test is a finding of such a script, reduced to its smallest form, against plain MindSpore.
"""
from __future__ import annotations

import mindspore.dataset as ds
import numpy as np
from mindspore import nn

from ms_boost import Model
from ms_boost.autotune.cells import clone_for_trial
from tests.test_user_scripts import _dense_data, ce


class _FineTuneNet(nn.Cell):
    """A Dense-BN backbone and a replaced head, the backbone frozen as the transfer tutorials freeze it."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(8, 8)
        self.bn = nn.BatchNorm1d(8)
        self.relu = nn.ReLU()
        self.head = nn.Dense(8, 3)

    def construct(self, x):
        return self.head(self.relu(self.bn(self.fc1(x))))


def _frozen_backbone():
    net = _FineTuneNet()
    for param in net.get_parameters():
        if not param.name.startswith("head."):
            param.requires_grad = False
    return net


def _data(n: int = 32):
    x, y = _dense_data(n, features=8, classes=3)
    return ds.NumpySlicesDataset({"data": x, "label": y}, shuffle=False).batch(8)


def test_an_optimizer_built_from_a_filter_can_be_copied_for_the_trial():
    """The tutorials build the fine-tuning optimizer over ``filter(lambda p: p.requires_grad,
    net.get_parameters())``; MindSpore's optimizer records that (consumed) iterator as its ``params`` argument, and
    ``boost_level="auto"``'s trial, which trains copies of the network and optimizer, could not copy it ("cannot
    pickle 'generator' object"): every candidate was dropped and the run fell back to O0 untried. The copy now
    shares the exhausted iterator and holds the copied network's trainable Parameters only."""
    net = _frozen_backbone()
    opt = nn.Momentum(filter(lambda p: p.requires_grad, net.get_parameters()), 0.05, 0.9)
    net_copy, opt_copy = clone_for_trial(net, opt)
    copied = {id(p) for p in net_copy.get_parameters()}
    assert [p.name for p in opt_copy.parameters] == ["head.weight", "head.bias"]
    assert all(id(p) in copied for p in opt_copy.parameters)
    assert not any(id(p) in {id(q) for q in net.get_parameters()} for p in opt_copy.parameters)


def test_auto_tries_its_candidates_on_a_frozen_backbone_optimizer_built_from_a_filter(mode):
    """End to end: ``Model(net, loss, Momentum(filter(...)), boost_level="auto")`` on a fine-tuning net trials O1
    (it was dropped, "failed to build: ... cannot be copied"); whatever it picks, the frozen backbone stays as
    loaded and the head trains."""
    net = _frozen_backbone()
    frozen = {p.name: p.asnumpy().copy() for p in net.get_parameters() if p.name.startswith(("fc1.", "bn.gamma",
                                                                                            "bn.beta"))}
    head = net.head.weight.asnumpy().copy()
    opt = nn.Momentum(filter(lambda p: p.requires_grad, net.get_parameters()), 0.05, 0.9)
    model = Model(net, ce(), opt, boost_level="auto",
                  boost_config_dict={"autotune": {"budget": 0.75, "candidates": ["O0", "O1"], "time_budget": False,
                                                  "measure_progress": False}})
    model.train(2, _data(64), dataset_sink_mode=False)
    assert not model.autotune_report.candidate("O1").reason.startswith("dropped"), \
        model.autotune_report.candidate("O1").reason
    params = {p.name: p.asnumpy() for p in net.get_parameters()}
    assert all(np.array_equal(params[name], value) for name, value in frozen.items())
    assert not np.array_equal(params["head.weight"], head)


def test_an_optimizer_holding_no_parameters_is_said():
    """41: parameter groups whose ``params`` are iterators give MindSpore's optimizer no parameters at all (its
    constructor consumes them before storing them), and MindSpore's Model then trains nothing without a word. ms_boost's
    Model says so and how to write the groups; the same groups as lists say nothing."""
    import warnings

    net = _FineTuneNet()

    def groups(wrap):
        return [{"params": wrap(p for p in net.trainable_params() if "head" not in p.name), "lr": 0.0},
                {"params": wrap(p for p in net.trainable_params() if "head" in p.name)}]

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        empty = nn.Momentum(groups(iter), 0.1, 0.9)
        assert len(empty.parameters) == 0  # MindSpore's own doing
        Model(net, ce(), empty)
        Model(net, ce(), nn.Momentum(groups(list), 0.1, 0.9))
    said = [str(w.message) for w in seen if "holds no parameters" in str(w.message)]
    assert len(said) == 1 and "Momentum" in said[0] and "list(filter(...))" in said[0], said

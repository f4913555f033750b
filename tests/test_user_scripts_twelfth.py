"""Users' scripts, twelfth round (docs/compatibility.md): dynamic shapes, recomputation, MindRecord data, the profiler
and jit settings, padded batches, optimizers of the script's own, mixed-precision forms.

Each test is a finding of such a script, reduced to its smallest form, against plain MindSpore.
"""
from __future__ import annotations

import mindspore.dataset as ds
import numpy as np
import pytest
from mindspore import Tensor, nn
from mindspore.train import Model as MsModel

from ms_boost import Model
from ms_boost.thor import thor
from tests.test_user_scripts import _dense_data, _StepLosses, ce


def _data(n: int = 32):
    x, y = _dense_data(n, features=8, classes=3)
    return ds.NumpySlicesDataset({"data": x, "label": y}, shuffle=False).batch(16)


class _Block(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(8, 8)
        self.bn = nn.BatchNorm1d(8)
        self.act = nn.ReLU()

    def construct(self, x):
        return self.act(self.bn(self.fc(x)))


class _RecomputedNet(nn.Cell):
    """A block (Dense-BN-ReLU), then a Dense head, both with ``recompute(**options)`` (None: not recomputed)."""

    def __init__(self, options):
        super().__init__()
        self.block = _Block()
        self.head = nn.Dense(8, 3)
        if options is not None:
            self.block.recompute(**options)
            self.head.recompute(**options)
        rng = np.random.RandomState(0)
        for p in self.trainable_params():
            if "gamma" not in p.name and "beta" not in p.name:
                p.set_data(Tensor(rng.normal(0, 0.3, p.shape).astype(np.float32)))

    def construct(self, x):
        return self.head(self.block(x))


def test_thor_on_a_recomputed_block_trains_what_it_trains_without_recomputation():
    """``block.recompute()`` (gradient checkpointing), then ``thor(net, ...)`` + ``Model``: in PyNative mode the
    block's THOR copy kept the original block's recompute wrapper, which calls the original's ``construct``: the
    original Dense (no statistics captured) and BatchNorm in the original's evaluation mode (the first loss was the
    moving-statistics loss, 2.09 against 1.57 on the tutorial-like script). Recomputation changes no number: the
    losses and the captured statistics are those of the net without it (MindSpore's own Model: the same), for both
    forms of the wrapper (``use_reentrant`` True: a child Cell; False: a closure)."""
    def train(recompute):
        net = _RecomputedNet(recompute)
        opt = thor(net, 0.05, 0.03, 0.9, 1e-4, 1.0, 16, frequency=1)
        losses = _StepLosses()
        model = Model(net, ce(), opt)
        model.train(1, _data(16), callbacks=[losses], dataset_sink_mode=False)  # one step, its statistics captured
        stats = {p.name: p.asnumpy() for p in model.train_network.get_parameters() if "_batch" in p.name}
        return losses.losses, stats

    plain_losses, plain_stats = train(None)
    for options in ({}, {"use_reentrant": False}):
        losses, stats = train(options)
        assert losses == plain_losses, options
        assert sorted(stats) == sorted(plain_stats) and stats
        for name, value in stats.items():
            np.testing.assert_array_equal(value, plain_stats[name], err_msg=f"{name} {options}")


def test_lars_around_thor_is_refused_saying_why():
    """``nn.LARS(thor(net, ...))``: MindSpore's LARS reads the wrapped optimizer's recorded ``init_params`` and
    failed with the bare "The 'THOR' object has no attribute 'init_params'" (upstream's THOR the same). The message
    now says that THOR cannot be wrapped and what to give instead; reading the attribute with a default (as the
    optimizer rebuild does) still gets the default."""
    opt = thor(nn.Dense(4, 2), 0.05, 0.03, 0.9)
    with pytest.raises(AttributeError, match=r"cannot be wrapped by an optimizer wrapper such as nn\.LARS"):
        nn.LARS(opt)
    assert getattr(opt, "init_params", None) is None


def test_thor_layers_keep_the_recomputation_set_on_the_cells_they_replace():
    """**Silent**: THOR's new layers dropped the recomputation the script set: ``dense.recompute()`` on a Dense that
    THOR converts (PyNative: no recompute wrapper; Graph: no recompute scope), and a Dense inside a recomputed block
    (Graph mode recomputes a block's operators by the marks ``recompute()`` puts on its children). The THOR layer
    now carries them as the replaced cell did; the numbers do not change (the test above, and the script's runs in
    both modes)."""
    net = _RecomputedNet({})
    opt = thor(net, 0.05, 0.03, 0.9)
    head, inner = opt.thor_network.head, opt.thor_network.block.fc
    assert type(head).__name__ == "DenseThor" and type(inner).__name__ == "DenseThor"
    assert head._recompute_cell is not None and head._recompute_cell.net.function.__self__ is head
    for layer in (head, inner):
        assert layer._has_config_recompute and layer._scope.startswith("recompute_")


FREEZE_ALL = {"boost": {"mode": "manual", "less_bn": False, "grad_freeze": True}, "grad_freeze": {"freeze_p": 1.0}}


def _plain_net() -> nn.Cell:
    net = nn.SequentialCell(nn.Dense(8, 8), nn.ReLU(), nn.Dense(8, 3))
    rng = np.random.RandomState(1)
    for p in net.trainable_params():
        p.set_data(Tensor(rng.normal(0, 0.3, p.shape).astype(np.float32)))
    return net


def test_freezing_keeps_each_parameter_groups_own_learning_rate(mode):
    """**Silent**: the docs' parameter groups with a fixed rate each (``{"params": weights, "lr": 0.1},
    {"params": biases, "lr": 0.01}``) under gradient freezing: each rebuilt optimizer took its state from the
    script's optimizer by name, and the per-group rates are named by group index (``learning_rate_group_0``), so
    every rebuilt optimizer (one group each) trained with the first group's rate. With ``freeze_p: 1.0`` (every
    layer trained at every step) the run is MindSpore's Model bit for bit again."""
    def train(model_class, **kw):
        net = _plain_net()
        weights = [p for p in net.trainable_params() if "weight" in p.name]
        biases = [p for p in net.trainable_params() if "bias" in p.name]
        opt = nn.Momentum([{"params": weights, "lr": 0.1}, {"params": biases, "lr": 0.01}], 0.5, 0.9)
        losses = _StepLosses()
        model_class(net, ce(), opt, **kw).train(1, _data(48), callbacks=[losses], dataset_sink_mode=False)
        return losses.losses, {p.name: p.asnumpy() for p in net.trainable_params()}

    expected_losses, expected = train(MsModel)
    losses, got = train(Model, boost_level="O1", boost_config_dict=FREEZE_ALL)
    assert losses == expected_losses
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)

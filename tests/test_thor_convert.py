"""ConvertNetUtils: conversion by type, on a copy sharing every Parameter; the report."""
from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops

from ms_boost.thor import Conv2dThor, ConvertNetUtils, DenseThor, EmbeddingThor


class MyDense(nn.Dense):
    """A subclass with its own construct: must not be converted (conversion is by exact type)."""

    def construct(self, x):
        return super().construct(x) * 2.0


class Block(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, (3, 1), stride=(1, 2), pad_mode="pad", padding=(1, 1, 0, 0), dilation=(1, 1),
                              group=2, has_bias=True)
        self.bn = nn.BatchNorm2d(4)

    def construct(self, x):
        return ops.relu(self.bn(self.conv(x)))


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.stem = nn.SequentialCell([nn.Conv2d(3, 4, 3, pad_mode="same", dilation=2, weight_init="HeNormal"),
                                       nn.ReLU()])
        self.block = Block()
        self.frozen = nn.Conv2d(4, 4, 1, has_bias=False)
        self.frozen.weight.requires_grad = False
        self.head = nn.Dense(4 * 6 * 3, 5, activation="tanh")
        self.extra = MyDense(5, 5)
        self.emb = nn.Embedding(7, 5, padding_idx=0)
        self.flatten = nn.Flatten()

    def construct(self, x, ids):
        h = self.block(self.frozen(self.stem(x)))  # a block called twice: tests/test_user_scripts_tenth.py
        out = self.extra(self.head(self.flatten(h)))
        return out + self.emb(ids).mean(1)


def test_convert_on_a_copy_sharing_parameters(mode):
    ms.set_seed(0)
    net = Net()
    original_types = {name: type(cell) for name, cell in net.cells_and_names()}
    original_params = {p.name: p for p in net.get_parameters()}
    utils = ConvertNetUtils()
    thor_net = utils.convert_to_thor_net(net)
    # the user's network is untouched
    assert {name: type(cell) for name, cell in net.cells_and_names()} == original_types
    assert {p.name: p for p in net.get_parameters()} == original_params
    # conversion by type, with the report
    converted = {e.path: (e.source, e.target) for e in utils.report if e.target}
    assert converted == {"stem.0": ("Conv2d", "Conv2dThor"), "block.conv": ("Conv2d", "Conv2dThor"),
                         "head": ("Dense", "DenseThor"), "emb": ("Embedding", "EmbeddingThor")}
    assert [(e.path, e.reason) for e in utils.report if not e.target] == [("frozen", "frozen weight")]
    assert isinstance(thor_net.stem[0], Conv2dThor) and isinstance(thor_net.block.conv, Conv2dThor)
    assert isinstance(thor_net.head, DenseThor) and isinstance(thor_net.emb, EmbeddingThor)
    assert type(thor_net.extra) is MyDense and type(thor_net.frozen) is nn.Conv2d
    # every unconverted cell is a copy of its own (amp's in-place casts of the THOR network leave net alone) sharing
    # the Parameters
    original_cells = {id(cell) for _, cell in net.cells_and_names()}
    assert not any(id(cell) in original_cells for _, cell in thor_net.cells_and_names())
    assert thor_net.frozen.weight is net.frozen.weight and thor_net.block.bn.moving_mean is net.block.bn.moving_mean
    # hyper-parameters kept
    conv = thor_net.block.conv
    assert (conv.kernel_size, conv.stride, conv.pad_mode, conv.padding, conv.group, conv.has_bias) == \
        ((3, 1), (1, 2), "pad", (1, 1, 0, 0), 2, True)
    assert thor_net.stem[0].dilation == (2, 2) and thor_net.stem[0].pad_mode == "same"
    # the very Parameter objects, names unchanged; new THOR state named after the layer
    for name, param in original_params.items():
        assert any(p is param for p in thor_net.get_parameters()), name
    names = [p.name for p in thor_net.get_parameters()]
    assert len(names) == len(set(names))
    assert "block.conv.matrix_a_batch" in names and "head.thor_capture" in names
    # same function: outputs agree in evaluation and in training mode
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((2, 3, 6, 6)).astype(np.float32))
    ids = Tensor(rng.integers(0, 7, (2, 3)).astype(np.int32))
    for train in (False, True):
        net.set_train(train)
        thor_net.set_train(train)
        np.testing.assert_allclose(thor_net(x, ids).asnumpy(), net(x, ids).asnumpy(), rtol=1e-5, atol=1e-6)


def test_nothing_to_convert_and_leaf_root():
    relu = nn.ReLU()
    assert ConvertNetUtils().convert_to_thor_net(relu) is relu
    dense = nn.Dense(3, 2)
    converted = ConvertNetUtils().convert_to_thor_net(dense)
    assert isinstance(converted, DenseThor) and converted.weight is dense.weight and converted.bias is dense.bias
    with pytest.raises(TypeError, match="net"):
        ConvertNetUtils().convert_to_thor_net("net")


def test_training_the_copy_trains_the_original():
    """An optimizer step on the converted network moves the user's Parameters (they are the same objects)."""
    from ms_boost.thor import thor

    ms.set_seed(0)
    net = nn.SequentialCell([nn.Dense(4, 3), nn.ReLU(), nn.Dense(3, 2)])
    before = net[0].weight.asnumpy().copy()
    opt = thor(net, 0.1, 0.1, 0.0, frequency=2)
    opt.compile_pynative_step = False  # op by op: what is shown here does not need the compiled step
    loss = nn.WithLossCell(opt.thor_network, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    cell = nn.TrainOneStepCell(loss, opt)
    cell.set_train()
    cell(Tensor(np.ones((4, 4), np.float32)), Tensor(np.array([0, 1, 0, 1], np.int32)))
    assert not np.allclose(net[0].weight.asnumpy(), before)
    assert type(net[0]) is nn.Dense and isinstance(opt.thor_network[0], DenseThor)
    assert isinstance(opt.thor_network.cell_list[0], DenseThor)


def test_convert_to_thor_model_with_another_optimizer_warns_and_returns_the_model():
    """Journeys, second round: docs/thor.md's convert_to_thor_model given a Momentum optimizer (a THOR optimizer
    forgotten) returned the model unchanged without a word, as upstream does; it still returns it, and says so."""
    from mindspore.train import Model

    from ms_boost.thor import ConvertModelUtils

    net = nn.Dense(3, 2)
    loss = nn.MSELoss()
    opt = nn.Momentum(net.trainable_params(), 0.1, 0.9)
    model = Model(net, loss, opt)
    with pytest.warns(UserWarning, match=r"^convert_to_thor_model: the optimizer is Momentum, not THOR, so the model "
                                         r"is returned unchanged and trains with it; build the optimizer with "
                                         r"ms_boost\.thor\.thor\("):
        assert ConvertModelUtils().convert_to_thor_model(model, net, loss, opt) is model

"""Users' scripts, tenth round (docs/compatibility.md): network families -- recurrent nets, attention, grouped and
1d/3d/transposed convolutions, norms other than BatchNorm, shared and frozen weights, several inputs and outputs,
float16.

Each test is a finding of such a script, reduced to its smallest form, against plain MindSpore or an independent
reference.
"""
from __future__ import annotations

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import Tensor, nn, ops
from mindspore.train import Model as MsModel

from ms_boost import Model, thor
from ms_boost.thor import ConvertNetUtils
from ms_boost.thor.call_sites import forward_calls
from tests.test_user_scripts import _dense_data, _StepLosses, ce


class _SharedDense(nn.Cell):
    """The tutorials' weight sharing: one Dense applied twice in a forward pass."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(16, 8)
        self.shared = nn.Dense(8, 8)
        self.out = nn.Dense(8, 4)

    def construct(self, x):
        h = ops.relu(self.fc1(x))
        h = ops.relu(self.shared(h))
        return self.out(ops.relu(self.shared(h)))


def _seeded(net: nn.Cell, seed: int = 0) -> nn.Cell:
    rng = np.random.RandomState(seed)
    for p in net.trainable_params():
        p.set_data(Tensor(rng.normal(0, 0.3, p.shape).astype(np.float32)))
    return net


def _data(n: int = 32):
    x, y = _dense_data(n)
    return ds.NumpySlicesDataset({"data": x, "label": y}, shuffle=False).batch(16)


def _thor(net):
    return thor(net, Tensor(0.05, ms.float32), Tensor(0.03, ms.float32), 0.9, 1e-4, 1.0, 16, frequency=2)


def test_thor_leaves_a_dense_called_twice_as_it_is(mode):
    """THOR on a net that applies one ``nn.Dense`` twice (shared weights).

    Before: Graph mode failed to compile ("Graph cycle exists": both calls write the layer's statistic buffers), and
    PyNative trained with the input statistic of the second call paired with the output-gradient statistic of the
    first, without a word. The converter now keeps such a layer as ``nn.Dense`` (THOR's first-order update trains
    it), says why in its report and log, and converts the others; both modes train to the same numbers.
    """
    utils = ConvertNetUtils()
    converted = utils.convert_to_thor_net(_seeded(_SharedDense()))
    kept = {e.path: e.reason for e in utils.report if not e.target}
    assert set(kept) == {"shared"} and "called 2 times in one forward pass" in kept["shared"]
    assert type(converted.shared) is nn.Dense and type(converted.fc1).__name__ == "DenseThor"

    net = _seeded(_SharedDense())
    before = net.shared.weight.asnumpy().copy()
    opt = _thor(net)
    assert type(opt.thor_network.shared) is nn.Dense
    losses = _StepLosses()
    Model(net, ce(), opt).train(2, _data(), callbacks=[losses])
    assert np.all(np.isfinite(losses.losses)) and len(losses.losses) == 4
    assert not np.array_equal(net.shared.weight.asnumpy(), before)  # the shared layer trains
    assert losses.losses[-1] < losses.losses[0]


def test_forward_calls_counts_call_sites_loops_branches_helpers_and_shared_children():
    """The static count behind the rule above, on the forms a forward pass calls a cell with."""

    class Block(nn.Cell):
        def __init__(self, fc):
            super().__init__()
            self.fc = fc
            self.once = nn.Dense(4, 4)
            self.branch = nn.Dense(4, 4)
            self.looped = nn.Dense(4, 4)

        def helper(self, x):
            return self.fc(x)

        def construct(self, x):
            x = self.helper(self.once(x))
            if x.shape[0] > 1:
                x = self.branch(x)
            else:
                x = self.branch(x) * 2
            for _ in range(3):
                x = self.looped(x)
            return x

    class Top(nn.Cell):
        def __init__(self):
            super().__init__()
            fc = nn.Dense(4, 4)
            self.block = Block(fc)
            self.seq = nn.SequentialCell([fc, nn.ReLU()])
            self.single = nn.Dense(4, 4)

        def construct(self, x):
            return self.single(self.seq(self.block(self.block(x))))

    top = Top()
    calls = forward_calls(top)
    block = top.block
    assert calls[id(block)] == 2
    assert calls[id(block.once)] == 2 and calls[id(block.branch)] == 2  # two block calls, one branch each
    assert calls[id(block.looped)] == 4  # a loop counts at least twice, per block call
    assert calls[id(block.fc)] == 3  # twice through the helper of the block, once in the SequentialCell
    assert calls[id(top.single)] == 1


class _DenseBN(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(16, 32)
        self.bn = nn.BatchNorm1d(32)
        self.fc2 = nn.Dense(32, 4)

    def construct(self, x):
        return self.fc2(ops.relu(self.bn(self.fc1(x))))


def test_thor_on_a_float16_network_keeps_its_precision(mode):
    """THOR on a network cast with ``net.to_float(ms.float16)`` (the tutorials' float16 training without amp).

    Before: the THOR layers replacing the Dense layers were new cells without the cast flag, so in Graph mode a
    float16 input met the float32 weight ("For 'MatMul', the type of 'x2' should be same as 'x1'"); PyNative ran (the
    same numbers before and after). The converted layers now carry the precision the original cells had; in both
    modes the first step's loss is MindSpore's (the same float16 forward pass) and training moves the weights.
    """
    net = _seeded(_DenseBN()).to_float(ms.float16)
    converted = ConvertNetUtils().convert_to_thor_net(net)
    assert type(converted.fc1).__name__ == "DenseThor" and converted.fc1.get_flags().get("fp16") is True
    assert converted.fc2.get_flags().get("fp16") is True

    results = []
    for use_thor in (False, True):
        net = _seeded(_DenseBN()).to_float(ms.float16)
        before = net.fc1.weight.asnumpy().copy()
        opt = _thor(net) if use_thor else nn.Momentum(net.trainable_params(), 0.05, 0.9)
        losses = _StepLosses()
        (Model if use_thor else MsModel)(net, ce(), opt).train(3, _data(), callbacks=[losses])
        results.append(losses.losses)
        assert np.all(np.isfinite(losses.losses)) and not np.array_equal(net.fc1.weight.asnumpy(), before)
    plain, with_thor = results
    assert with_thor[0] == plain[0]  # the same float16 forward pass
    assert min(with_thor[-2:]) < with_thor[0]


class _OnlyShared(nn.Cell):
    def __init__(self):
        super().__init__()
        self.shared = nn.Dense(16, 16)
        self.out = nn.Dense(16, 4)
        self.out.weight.requires_grad = False  # frozen: not converted either
        self.out.bias.requires_grad = False

    def construct(self, x):
        return self.out(ops.relu(self.shared(ops.relu(self.shared(x)))))


def test_thor_without_any_thor_layer_trains_as_momentum(mode):
    """THOR on a network with nothing to convert (here: its one trainable Dense is called twice, the other frozen).

    THOR warns that it reduces to Momentum, and ``Model`` then refused its own train cell ("holds a THOR optimizer but
    does not call its THOR layers"): there are none to call. It now trains, as Momentum with THOR's rate and momentum.
    """
    results = []
    for use_thor in (False, True):
        net = _seeded(_OnlyShared())
        for frozen in (net.out.weight, net.out.bias):
            frozen.set_data(Tensor(np.random.RandomState(1).normal(0, 0.3, frozen.shape).astype(np.float32)))
        params = net.trainable_params()
        opt = _thor(net) if use_thor else nn.Momentum(params, 0.05, 0.9)
        losses = _StepLosses()
        (Model if use_thor else MsModel)(net, ce(), opt).train(2, _data(), callbacks=[losses])
        results.append((losses.losses, [p.asnumpy() for p in params]))
    (plain, plain_w), (with_thor, thor_w) = results
    np.testing.assert_allclose(with_thor, plain, rtol=1e-4)  # float round-off: THOR orders its update otherwise
    for a, b in zip(plain_w, thor_w):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)


def test_thor_leaves_multihead_attentions_out_proj_as_it_is():
    """THOR on ``nn.TransformerEncoderLayer``: ``nn.MultiheadAttention`` computes with its ``out_proj`` Dense's weight
    and never calls the Dense.

    Before: ``out_proj`` became a THOR layer that no forward pass called, so its statistics stayed zero and THOR
    preconditioned its gradient with the damping alone (its weights moved 4x as far as Momentum's in one epoch),
    without a word. It is now kept as it is, with the reason in the report; the layers that are called convert.

    PyNative mode only (both modes until 2026-11-28): the finding is the converter's choice, read from the source
    before anything runs, the same in either mode; the Graph-mode half compiled the encoder's THOR step (~8 CPU-s)
    to show two finite losses, and THOR's Dense layers on 3-d inputs (the encoder's) are checked against numpy in
    both modes by tests/test_thor_layers.py ``test_dense_three_dim_input_and_activation``, a THOR training through
    ``Model`` in both modes by tests/test_thor_model.py
    ``test_tutorial_model_call_trains_thor_without_convert_and_takes_frequency``.
    """
    class Encoder(nn.Cell):
        def __init__(self):
            super().__init__()
            self.enc = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
            self.fc = nn.Dense(16, 4)

        def construct(self, x):
            return self.fc(self.enc(x).mean(1))

    class Outer(nn.Cell):  # a call into a child's child: the child counts as called
        def __init__(self):
            super().__init__()
            self.inner = Encoder()

        def construct(self, x):
            return self.inner.fc(self.inner.enc(x).mean(1))

    utils = ConvertNetUtils()
    converted = utils.convert_to_thor_net(_seeded(Encoder()))
    kept = {e.path: e.reason for e in utils.report if not e.target}
    assert set(kept) == {"enc.self_attn.out_proj"} and kept["enc.self_attn.out_proj"].startswith("never called")
    assert {e.path for e in utils.report if e.target} == {"enc.dense1", "enc.dense2", "fc"}
    assert type(converted.enc.self_attn.out_proj) is nn.Dense
    outer = ConvertNetUtils()
    outer.convert_to_thor_net(Outer())
    assert {e.path for e in outer.report if e.target} == {"inner.enc.dense1", "inner.enc.dense2", "inner.fc"}

    rng = np.random.RandomState(0)
    x = rng.normal(size=(32, 6, 16)).astype(np.float32)
    y = (x[:, -1, 0] > 0).astype(np.int32)
    net = _seeded(Encoder())
    losses = _StepLosses()
    Model(net, ce(), _thor(net)).train(1, ds.NumpySlicesDataset({"d": x, "l": y}, shuffle=False).batch(16),
                                       callbacks=[losses])
    assert np.all(np.isfinite(losses.losses)) and len(losses.losses) == 2

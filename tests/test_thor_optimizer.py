"""THOR optimizer: one step against numpy, inverse reuse, schedules, momentum, overflow, argument checks."""
from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops

from ms_boost.thor import THOR, thor
from ms_boost.thor.variants import ThorTrainStep
from tests.helpers.nets import MLP
from tests.test_thor_math import np_diagonal_blocks


# ----------------------------------------------------------------------------- numpy references
def np_softmax_ce_grad(logits, labels):
    """Mean softmax cross entropy: (loss, d loss / d logits)."""
    z = logits - logits.max(1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    n = logits.shape[0]
    loss = -np.log(p[np.arange(n), labels]).mean()
    d = p.copy()
    d[np.arange(n), labels] -= 1
    return loss, d / n


def np_damped_inverse(f, damping, block):
    d = f.shape[0]
    step = d if d <= block else block
    out = np.zeros((d, d))
    for s in range(0, d, step):
        sl = slice(s, min(s + step, d))
        out[sl, sl] = np.linalg.inv(f[sl, sl] + np.sqrt(damping) * np.eye(sl.stop - sl.start))
    return out


def np_mlp_thor_step(w1, b1, w2, b2, x, y, lr, damping, momentum, weight_decay, block):
    """One THOR step of x -> Dense -> tanh -> Dense -> CE (moments start at 0), biases not decayed."""
    n = x.shape[0]
    h_pre = x @ w1.T + b1
    h = np.tanh(h_pre)
    logits = h @ w2.T + b2
    _, d2 = np_softmax_ce_grad(logits, y)
    d1 = (d2 @ w2) * (1 - h ** 2)
    out = []
    for w, b, a_in, dy in ((w1, b1, x, d1), (w2, b2, h, d2)):
        a_aug = np.concatenate([a_in, np.ones((n, 1))], 1)
        fa = a_aug.T @ a_aug / n
        fg = n * dy.T @ dy
        grad = np.concatenate([dy.T @ a_in, dy.sum(0)[:, None]], 1)
        p = np_damped_inverse(fg, damping, block) @ grad @ np_damped_inverse(fa, damping, block)
        gw = p[:, :-1] + weight_decay * w
        gb = p[:, -1]
        out += [w - lr * gw, b - lr * gb]
    return out


def _mlp_data(seed=0, n=8):
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((6, 5)) * 0.5).astype(np.float32)
    b1 = (rng.standard_normal(6) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((4, 6)) * 0.5).astype(np.float32)
    b2 = (rng.standard_normal(4) * 0.1).astype(np.float32)
    x = rng.standard_normal((n, 5)).astype(np.float32)
    y = rng.integers(0, 4, n).astype(np.int32)
    return (w1, b1, w2, b2), x, y


def _train_cell(net, opt):
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    cell = nn.TrainOneStepCell(nn.WithLossCell(net, loss), opt)
    cell.set_train()
    return cell


def _no_bias(p):
    return "bias" not in p.name


# ----------------------------------------------------------------------------- tests
@pytest.mark.parametrize("dense_blocks", [THOR.dense_inverse_blocks, 0])
def test_steps_match_numpy_with_blocks_loss_scale_and_damping_schedule(mode, dense_blocks, monkeypatch):
    """The first step against numpy with block-diagonal factors (block 4 below the factor sizes 6 and 7; untiled
    factors, block >= size, are checked against numpy in test_thor_robust.py::test_trust_region_scales_the_step_as_numpy
    (PyNative) and ::test_graph_step_matches_numpy (Graph)), weight decay on the weights only, and the
    ``FixedLossScaleManager(S, drop_overflow_update=False)`` pattern: gradients and captured output gradients
    arrive multiplied by S = 256 and are divided out, so the step equals numpy's unscaled step. Then a
    LearningRateSchedule damping: the refresh of step 2 inverts with lambda_2. Both ways to multiply by the
    2-block inverses: written out (``THOR.dense_inverse_blocks``, one product) and as blocks."""
    monkeypatch.setattr(THOR, "dense_inverse_blocks", dense_blocks)
    weights, x, y = _mlp_data()
    net = MLP(*weights)
    scale = 256.0
    opt = thor(net, 0.1, nn.ExponentialDecayLR(0.2, 0.5, 1), 0.9, weight_decay=0.01, loss_scale=scale,
               decay_filter=_no_bias, frequency=2, block_size=4,
               kl_clip=None)  # the numpy reference has no trust region
    # A of fc1 (6 wide), of fc2 (7) and G of fc1 (6) are 2 blocks; G of fc2 (4) is one
    assert [p.name for p in opt.dense_inverses] == (
        ["thor_a_dense.fc1", "thor_g_dense.fc1", "thor_a_dense.fc2"] if dense_blocks >= 2 else [])
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    cell = nn.TrainOneStepCell(nn.WithLossCell(opt.thor_network, loss), opt, sens=scale)
    cell.set_train()
    cell = ThorTrainStep(cell, opt)  # Graph mode: the step variants, which multiply by the written-out inverses
    cell(Tensor(x), Tensor(y))
    expected = np_mlp_thor_step(*[w.astype(np.float64) for w in weights], x.astype(np.float64), y, 0.1, 0.2, 0.9,
                                0.01, 4)  # damping of step 0: 0.2
    got = [p.asnumpy() for p in (net.fc1.weight, net.fc1.bias, net.fc2.weight, net.fc2.bias)]
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=2e-4, atol=2e-5)
    # the user's net kept its classes and shares the trained Parameters
    assert type(net.fc1) is nn.Dense and opt.thor_network.fc1.weight is net.fc1.weight
    for _ in range(2):
        cell(Tensor(x), Tensor(y))
    g = opt.thor_layers[1].matrix_g_batch.asnumpy()[0].astype(np.float64)  # 4 x 4: one block
    lam = 0.2 * 0.5 ** 2  # refreshed at step 2
    np.testing.assert_allclose(opt.g_inverses[1].asnumpy()[0, 0], np.linalg.inv(g + np.sqrt(lam) * np.eye(4)),
                               rtol=1e-3, atol=1e-4)
    assert int(opt.global_step.asnumpy()[0]) == 3
    for k, dense in enumerate(opt.dense_inverses):  # rebuilt at the refresh: the stored blocks written out
        blocks = (opt.a_inverses if opt.dense_slot[k] == 0 else opt.g_inverses)[opt.dense_layer[k]].asnumpy()[0]
        expected = np.zeros((8, 8), np.float32)
        expected[:4, :4], expected[4:, 4:] = blocks
        dim = opt.dense_dims[k]
        np.testing.assert_array_equal(dense.asnumpy()[0], expected[:dim, :dim])


def _expected_layer_update(opt, net_grads, layer_index, w_grad, b_grad, damping):
    """numpy G^-1 [gW|gb] A^-1 per channel group from the captured factors."""
    layer = opt.thor_layers[layer_index]
    a = layer.matrix_a_batch.asnumpy().astype(np.float64)
    g = layer.matrix_g_batch.asnumpy().astype(np.float64)
    groups = a.shape[0]
    gw = w_grad.reshape(groups, g.shape[1], -1)
    gb = b_grad.reshape(groups, g.shape[1], 1)
    p = np.stack([np.linalg.inv(g[j] + np.sqrt(damping) * np.eye(g.shape[1])) @ np.concatenate([gw[j], gb[j]], 1)
                  @ np.linalg.inv(a[j] + np.sqrt(damping) * np.eye(a.shape[1])) for j in range(groups)])
    return p[:, :, :-1].reshape(w_grad.shape), p[:, :, -1].reshape(b_grad.shape)


def test_inverses_reused_running_average_damping_array_and_nesterov(mode):
    """Seven steps, refresh every 3rd: between refreshes the update (Nesterov) uses the stored inverses and
    moments (numpy at steps 1 and 4); the inverses change exactly on refresh steps and the capture flags go up
    before them; on refresh steps the factor is the running average (decay 0.5) of the captures and its inverse
    uses that step's damping from the per-step array (its last value past its end, step 6)."""
    weights, _, _ = _mlp_data()
    net = MLP(*weights)
    damping = [0.5, 0.45, 0.4, 0.35, 0.3]
    opt = thor(net, 0.05, damping, 0.9, frequency=3, use_nesterov=True, kl_clip=None, factor_decay=0.5)
    cell = _train_cell(opt.thor_network, opt)
    loss_net = cell.network
    layer = opt.thor_layers[1]
    rng = np.random.default_rng(7)
    history, captured = [], []
    for step in range(7):
        x = Tensor(rng.standard_normal((8, 5)).astype(np.float32))
        y = Tensor(rng.integers(0, 4, 8).astype(np.int32))
        inverses = [p.asnumpy().copy() for p in (*opt.a_inverses, *opt.g_inverses)]
        if step in (1, 4):  # a step between refreshes: numpy update from the stored inverses and moments
            w, b = net.fc2.weight.asnumpy().copy(), net.fc2.bias.asnumpy().copy()
            grads = ms.grad(loss_net, None, opt.parameters)(x, y)
            gw, gb = grads[2].asnumpy(), grads[3].asnumpy()
            a_inv, g_inv = opt.a_inverses[1].asnumpy()[0, 0], opt.g_inverses[1].asnumpy()[0, 0]
            p = g_inv @ np.concatenate([gw, gb[:, None]], 1) @ a_inv
            v_w = 0.9 * opt.moments[2].asnumpy() + p[:, :-1]
            v_b = 0.9 * opt.moments[3].asnumpy() + p[:, -1]
        cell(x, y)
        if step in (1, 4):
            np.testing.assert_allclose(net.fc2.weight.asnumpy(), w - 0.05 * (p[:, :-1] + 0.9 * v_w), rtol=1e-4,
                                       atol=1e-6)
            np.testing.assert_allclose(net.fc2.bias.asnumpy(), b - 0.05 * (p[:, -1] + 0.9 * v_b), rtol=1e-4,
                                       atol=1e-6)
        if step % 3 == 0:  # a refresh: running average of the captures, inverted with this step's damping
            captured.append(layer.matrix_a_batch.asnumpy().astype(np.float64)[0])
            expected = captured[0]
            for c in captured[1:]:
                expected = 0.5 * expected + 0.5 * c
            np.testing.assert_allclose(layer.matrix_a.asnumpy()[0], expected, rtol=1e-5, atol=1e-6)
            lam = damping[min(step, len(damping) - 1)]
            inv = np.linalg.inv(expected + np.sqrt(lam) * np.eye(expected.shape[0]))
            np.testing.assert_allclose(opt.a_inverses[1].asnumpy()[0, 0], inv, rtol=1e-3, atol=1e-4)
        after = [p.asnumpy().copy() for p in (*opt.a_inverses, *opt.g_inverses)]
        history.append((inverses, after, [bool(f.asnumpy()) for f in opt.capture_flags]))
    assert len(captured) == 3
    for step, (before, after, flags) in enumerate(history):
        changed = any(not np.array_equal(b, a) for b, a in zip(before, after))
        assert changed == (step % 3 == 0), step
        # after step t the layers capture in step t+1 only when t+1 is a refresh step
        assert flags == [(step + 1) % 3 == 0] * 2, (step, flags)
    assert int(opt.global_step.asnumpy()[0]) == 7


# An overflow step (loss-scale cell) changes no THOR state, in both modes:
# tests/test_thor_robust.py::test_nonfinite_update_with_loss_scale_skips_the_whole_step.


def test_argument_errors():
    weights, _, _ = _mlp_data()
    net = MLP(*weights)
    cases = [
        (dict(damping=0.0), ValueError, "damping"),
        (dict(damping=[0.1, -1.0]), ValueError, "damping"),
        (dict(damping="x"), TypeError, "damping"),
        (dict(momentum=-0.1), ValueError, "momentum"),
        (dict(frequency=0), ValueError, "frequency"),
        (dict(weight_decay=-1.0), ValueError, "weight_decay"),
        (dict(batch_size=0), ValueError, "batch_size"),
        (dict(use_nesterov=1), TypeError, "use_nesterov"),
        (dict(split_indices=[3, 1]), ValueError, "split_indices"),
        (dict(split_indices="0"), TypeError, "split_indices"),
        (dict(block_size=0), ValueError, "thor.block_size=0"),
        (dict(stat_fraction=0), ValueError, r"thor\.stat_fraction=0 is out of range; allowed: 0 < value <= 1"),
        (dict(stat_fraction=1.5), ValueError, r"thor\.stat_fraction=1\.5 is out of range; allowed: 0 < value <= 1"),
        (dict(stat_fraction="half"), TypeError, r"thor\.stat_fraction must be a number, got 'half'"),
        (dict(stat_fraction=True), TypeError, r"thor\.stat_fraction must be a number"),
    ]
    for kwargs, error, word in cases:
        args = dict(learning_rate=0.1, damping=0.1, momentum=0.9)
        args.update(kwargs)
        with pytest.raises(error, match=word):
            thor(net, **args)
    with pytest.raises(TypeError, match="net"):
        THOR("net", 0.1, 0.1, 0.9)


class ConvEmbNet(nn.Cell):
    """A grouped, strided, dilated convolution with bias and BatchNorm under a Dense head, plus an embedding under a
    Dense head whose bias is frozen (captured in A, not trained: A loses its bias row/column)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 6, (3, 2), stride=(2, 1), pad_mode="same", dilation=(1, 2), group=2, has_bias=True)
        self.bn = nn.BatchNorm2d(6)
        self.fc = nn.Dense(6 * 3 * 4, 3)
        self.flatten = nn.Flatten()
        self.emb = nn.Embedding(7, 4)
        self.fc_e = nn.Dense(4, 3)
        self.fc_e.bias.requires_grad = False

    def construct(self, x, ids):
        return self.fc(self.flatten(ops.relu(self.bn(self.conv(x))))) + self.fc_e(self.emb(ids).mean(1))


class _LossOfTwoInputs(nn.Cell):
    def __init__(self, net):
        super().__init__()
        self.net = net
        self.ce = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def construct(self, x, ids, y):
        return self.ce(self.net(x, ids), y)


def test_conv_groups_bias_batchnorm_embedding_and_frozen_bias_step(mode):
    """One step against numpy from the captured factors: the convolution per channel group with its bias in the
    factor, the Dense layers, the embedding (diagonal A = token frequencies, checked against numpy too), the Dense
    layer whose frozen bias is dropped from A, BatchNorm's plain gradient."""
    ms.set_seed(1)
    net = ConvEmbNet()
    rng = np.random.default_rng(1)
    x = Tensor(rng.standard_normal((4, 4, 6, 4)).astype(np.float32))
    ids = Tensor(np.array([[1, 2, 2], [0, 6, 1], [3, 3, 3], [1, 5, 0]], np.int32))
    y = Tensor(rng.integers(0, 3, 4).astype(np.int32))
    damping, lr = 0.1, 0.05
    # reference without trust region; block size 128: every factor here is whole (the reference reads them so)
    opt = thor(net, lr, damping, 0.0, frequency=3, kl_clip=None, block_size=128)
    names = [p.name for p in opt.parameters]
    assert "fc_e.bias" not in names and "emb.embedding_table" in names
    loss_net = _LossOfTwoInputs(opt.thor_network)
    loss_net.set_train()
    params = opt.parameters
    before = [p.asnumpy().astype(np.float64) for p in params]
    # gradients at the current weights (the BatchNorm batch statistics do not depend on the step)
    grads = [g.asnumpy().astype(np.float64) for g in ms.grad(loss_net, None, params)(x, ids, y)]
    cell = nn.TrainOneStepCell(loss_net, opt)
    cell.set_train()
    cell(x, ids, y)
    idx = {n: i for i, n in enumerate(names)}
    conv, fc, emb, fc_e = opt.thor_layers
    thor_net = opt.thor_network
    assert all(a is b for a, b in zip((conv, fc, emb, fc_e), (thor_net.conv, thor_net.fc, thor_net.emb, thor_net.fc_e)))
    expected = {}
    expected["conv.weight"], expected["conv.bias"] = _expected_layer_update(
        opt, None, 0, grads[idx["conv.weight"]], grads[idx["conv.bias"]], damping)
    expected["fc.weight"], expected["fc.bias"] = _expected_layer_update(
        opt, None, 1, grads[idx["fc.weight"]], grads[idx["fc.bias"]], damping)
    freq = emb.matrix_a_batch.asnumpy().astype(np.float64)
    np.testing.assert_allclose(freq, np.bincount(ids.asnumpy().ravel(), minlength=7) / 12)
    s = np.sqrt(damping)
    g_emb = emb.matrix_g_batch.asnumpy()[0].astype(np.float64)
    expected["emb.embedding_table"] = (np.diag(1 / (freq + s)) @ grads[idx["emb.embedding_table"]]
                                       @ np.linalg.inv(g_emb + s * np.eye(4)))
    a_fc = fc_e.matrix_a_batch.asnumpy()[0].astype(np.float64)  # its frozen bias is not captured in A
    assert a_fc.shape == (4, 4)
    g_fc = fc_e.matrix_g_batch.asnumpy()[0].astype(np.float64)
    expected["fc_e.weight"] = (np.linalg.inv(g_fc + s * np.eye(3)) @ grads[idx["fc_e.weight"]]
                               @ np.linalg.inv(a_fc + s * np.eye(4)))
    for name in names:
        step = expected.get(name, grads[idx[name]])  # BatchNorm gamma/beta: plain gradient
        np.testing.assert_allclose(params[idx[name]].asnumpy(), before[idx[name]] - lr * step, rtol=1e-3,
                                   atol=1e-5, err_msg=name)
    assert set(expected) | {"bn.gamma", "bn.beta"} == set(names)


def _conv_emb_run(seed_data, **kwargs) -> dict:
    """Three steps of THOR (frequency 1: every step captures and refreshes) on ConvEmbNet: every state value."""
    ms.set_seed(1)
    net = ConvEmbNet()
    rng = np.random.default_rng(seed_data)
    x = Tensor(rng.standard_normal((4, 4, 6, 4)).astype(np.float32))
    ids = Tensor(np.array([[1, 2, 2], [0, 6, 1], [3, 3, 3], [1, 5, 0]], np.int32))
    y = Tensor(rng.integers(0, 3, 4).astype(np.int32))
    opt = thor(net, 0.05, 0.1, 0.9, frequency=1, block_size=8, **kwargs)
    cell = nn.TrainOneStepCell(_LossOfTwoInputs(opt.thor_network), opt)
    cell.set_train()
    for _ in range(3):
        cell(x, ids, y)
    state = {p.name: p.asnumpy() for p in opt.parameters}
    for layer in opt.thor_layers:
        state.update({f"{layer.cls_name}{id(layer)}.{k}": v.asnumpy() for k, v in layer.thor_parameters().items()})
    state.update({f"inv{i}": p.asnumpy() for i, p in enumerate(tuple(opt.a_inverses) + tuple(opt.g_inverses))})
    return {"opt": opt, "values": list(state.values())}


def test_stat_fraction_one_is_the_whole_batch_bit_for_bit(mode):
    """The default (1: the whole batch) and a fraction whose ceil(f N) is N (0.9 of 4 samples: the layers' capture
    specs change, their statistics must not) train bit-identically (weights, moments, factors, inverses); 0.5 (2 of 4
    samples) changes the factors. The layers follow the optimizer's fraction.

    The 0.5 training runs in PyNative mode only, after the default one in the same process: there THOR's compiled
    statistics are cached per capture spec, so a cache that ignored the fraction would hand 0.5 the whole-batch
    graph. In Graph mode each training compiles its own step from the layers' cells, whose sub-batch statistics are
    checked against numpy in both modes (tests/test_thor_layers.py ``test_sub_batch_statistics_*``); there the 0.9
    run checks the fraction on the layers and the unchanged training (one THOR compile fewer than before)."""
    fractions = (None, 0.9, 0.5) if mode == "pynative" else (None, 0.9)
    runs = {f: _conv_emb_run(3, **({} if f is None else {"stat_fraction": f})) for f in fractions}
    assert runs[None]["opt"].stat_fraction == 1.0
    assert all(layer.stat_fraction == 0.9 for layer in runs[0.9]["opt"].thor_layers)
    for got, want in zip(runs[0.9]["values"], runs[None]["values"]):
        np.testing.assert_array_equal(got, want)
    if 0.5 in runs:
        assert all(layer.stat_fraction == 0.5 for layer in runs[0.5]["opt"].thor_layers)
        conv = runs[0.5]["opt"].thor_layers[0]
        assert not np.allclose(conv.matrix_a_batch.asnumpy(),
                               runs[None]["opt"].thor_layers[0].matrix_a_batch.asnumpy())


def test_wide_factors_are_captured_as_their_diagonal_blocks_and_old_checkpoints_are_refused(mode):
    """With block size 4 the layers capture only the diagonal blocks of their factors wider than 4 (numpy: the blocks
    cut from the full factors); A of the layer whose bias is frozen leaves the bias column out, and G of width 4 is
    stored whole. A checkpoint holding a factor in the earlier full layout is refused with an error naming it."""
    weights, x, y = _mlp_data()
    net = MLP(*weights)
    net.fc1.bias.requires_grad = False
    opt = thor(net, 0.1, 0.1, 0.9, frequency=2, block_size=4)
    cell = _train_cell(opt.thor_network, opt)
    cell(Tensor(x), Tensor(y))
    w1, b1, w2, b2 = [w.astype(np.float64) for w in weights]
    n = x.shape[0]
    h_pre = x @ w1.T + b1
    h = np.tanh(h_pre)
    _, d2 = np_softmax_ce_grad(h @ w2.T + b2, y)
    d1 = (d2 @ w2) * (1 - h ** 2)
    h_aug = np.concatenate([h, np.ones((n, 1))], 1)
    fc1, fc2 = opt.thor_layers
    want = {(fc1, "a"): np_diagonal_blocks(x.T.astype(np.float64) @ x / n, 4),  # 5 wide: no bias column
            (fc1, "g"): np_diagonal_blocks(n * d1.T @ d1, 4),
            (fc2, "a"): np_diagonal_blocks(h_aug.T @ h_aug / n, 4)}
    for (layer, which), blocks in want.items():
        got = (layer.matrix_a_batch if which == "a" else layer.matrix_g_batch).asnumpy()
        assert got.shape == (1, 2, 4, 4)
        np.testing.assert_allclose(got[0], blocks, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(fc2.matrix_g_batch.asnumpy()[0], n * d2.T @ d2, rtol=1e-4, atol=1e-6)
    old = {"fc2.matrix_a_batch": ms.Parameter(Tensor(np.zeros((1, 7, 7), np.float32)), name="fc2.matrix_a_batch")}
    with pytest.raises(RuntimeError, match=r"fc2\.matrix_a_batch.*\(1, 2, 4, 4\).*\(1, 7, 7\)"):
        ms.load_param_into_net(opt.thor_network, old)


def test_pynative_compiled_step_equals_op_by_op_and_follows_set_data():
    """PyNative: the compiled step (THOR called in Graph mode) and the capture gate give the op-by-op numbers,
    capture only on the steps the flags ask for, and follow ``set_data`` between steps (a checkpoint load).

    The step is compiled at step 0 and again only at step 2, the one after a ``set_data`` (one phase each): the
    in-place writes compile nothing. Not compiling at step 2 (keying the compiled step by shapes and dtypes instead
    of memory) fails at step 3: after the in-place sentinel write and the capture, that graph refreshes from the
    sentinel, not from the captured factor (MindSpore 2.10; docs/thor.md "PyNative recompiles")."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    weights, x, y = _mlp_data(seed=3)
    nets, opts, cells = [], [], []
    for compiled in (True, False):
        net = MLP(*weights)
        opt = thor(net, 0.05, 0.1, 0.9, frequency=3)
        opt.compile_pynative_step = compiled
        if not compiled:
            for layer in opt.thor_layers:
                layer.set_capture_gate(None)  # every capture cell tests its flag itself
        nets.append(net)
        opts.append(opt)
        cells.append(_train_cell(opt.thor_network, opt))
    rng = np.random.default_rng(0)
    compiled = []
    for step in range(5):
        if step == 2:  # new weights and moments between steps, as load_param_into_net writes them
            states = [(*net.trainable_params(), *opt.moments) for net, opt in zip(nets, opts)]
            for a, b in zip(*states):
                value = a.asnumpy() + 0.01 * rng.standard_normal(a.shape).astype(np.float32)
                a.set_data(Tensor(value))
                b.set_data(Tensor(value.copy()))
        sentinel = np.full(opts[0].a_batches[0].shape, 7.0, np.float32)
        for opt in opts:
            if step == 2:  # replaced with the weights, as a checkpoint load replaces it
                opt.a_batches[0].set_data(Tensor(sentinel))
            else:  # written in place
                ops.assign(opt.a_batches[0], Tensor(sentinel))
        captures = [bool(f.asnumpy()) for f in opts[0].capture_flags]
        for cell in cells:
            cell(Tensor(x), Tensor(y))
        compiled.append(opts[0]._compiled)
        assert len(compiled[-1].compile_cache) == 1, step
        for opt in opts:  # scratch written exactly on the steps whose flag was set (steps 0 and 3 here)
            assert (opt.a_batches[0].asnumpy() == sentinel).all() != captures[0], (step, captures)
        assert captures[0] == (step % 3 == 0)
        for a, b in zip(nets[0].trainable_params(), nets[1].trainable_params()):
            np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-5, atol=1e-6, err_msg=f"step {step}")
    assert int(opts[0].global_step.asnumpy().reshape(-1)[0]) == 5
    assert [c is compiled[0] for c in compiled] == [True, True, False, False, False] and compiled[2] is compiled[4]


def test_a_per_step_learning_rate_keeps_its_last_value_after_its_end(mode):
    """docs/thor.md: ``lr`` may be a per-step array whose last value is kept after its end, as the damping's is.
    Journeys, second round: a 2-value array on a 4-step run stopped at step 3 with MindSpore's "For 'Gather', the
    'input_indices' should be in the range [0, 2), but got 2". Now it trains exactly as the array padded with its
    last value: the four steps equal numpy's THOR with the rates 0.3, 0.2, 0.2, 0.2 (one trained model against the
    reference, not a second model trained with the padded array: one THOR compile instead of two); a str learning
    rate is refused naming the argument (was "could not convert string to float")."""
    from ms_boost.thor.optimizer import DEFAULT_KL_CLIP
    from tests.test_thor_model import np_chain_thor_steps

    weights, x, y = _mlp_data()
    net = MLP(*weights)
    opt = thor(net, [0.3, 0.2], 0.05, 0.9, frequency=2)
    cell = _train_cell(opt.thor_network, opt)
    for _ in range(4):
        cell(Tensor(x), Tensor(y))
    expected = np_chain_thor_steps(weights, [(x, y)] * 4, [0.3, 0.2], 0.05, 0.9, 0.0, DEFAULT_KL_CLIP, 2)
    for got, want in zip([p.asnumpy() for p in net.trainable_params()], expected):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    with pytest.raises(TypeError, match=r"^thor: learning_rate='0\.1' \(str\) is not allowed; allowed: a float >= 0, "
                                        r"a per-step array"):
        thor(MLP(*weights), "0.1", 0.05, 0.9)

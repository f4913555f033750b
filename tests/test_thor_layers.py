"""THOR layers: captured Kronecker factors against numpy (im2col reference in tests/test_thor_math.py), both modes."""
from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops

from ms_boost.thor import Conv2dThor, DenseThor, EmbeddingThor
from tests.test_thor_math import np_im2col, np_pads

# numpy references: explicit-loop im2col and padding rules (tests/test_thor_math.py)


class _Probe(nn.Cell):
    """Loss = sum(layer(x) * R) / N, so the output gradient is exactly R / N."""

    def __init__(self, layer, probe):
        super().__init__()
        self.layer = layer
        self.probe = Tensor(probe)

    def construct(self, x):
        y = self.layer(x)
        return (y * self.probe).sum() / y.shape[0]


def _backward(layer, x, probe, sens=1.0):
    net = _Probe(layer, probe)
    net.set_train()
    grad = ops.GradOperation(get_by_list=True, sens_param=True)
    weights = ms.ParameterTuple(layer.trainable_params())
    return grad(net, weights)(Tensor(x), Tensor(np.float32(sens)))


# ----------------------------------------------------------------------------- dense
@pytest.mark.parametrize("has_bias", [True, False])
def test_dense_factors(mode, has_bias):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 5)).astype(np.float32)
    probe = rng.standard_normal((6, 3)).astype(np.float32)
    layer = DenseThor(5, 3, weight_init=Tensor(rng.standard_normal((3, 5)).astype(np.float32)), has_bias=has_bias)
    _backward(layer, x, probe)
    xa = np.concatenate([x, np.ones((6, 1), np.float32)], 1) if has_bias else x
    np.testing.assert_allclose(layer.matrix_a_batch.asnumpy()[0], xa.T @ xa / 6, rtol=1e-5, atol=1e-6)
    dy = probe / 6
    np.testing.assert_allclose(layer.matrix_g_batch.asnumpy()[0], 6 * dy.T @ dy, rtol=1e-5, atol=1e-7)


def test_dense_three_dim_input_and_activation(mode):
    """Rows are all leading positions, N the first axis; G is taken before the activation."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 4, 5)).astype(np.float32)
    w = rng.standard_normal((3, 5)).astype(np.float32)
    probe = rng.standard_normal((2, 4, 3)).astype(np.float32)
    layer = DenseThor(5, 3, weight_init=Tensor(w), has_bias=False, activation="relu")
    _backward(layer, x, probe)
    rows = x.reshape(8, 5)
    np.testing.assert_allclose(layer.matrix_a_batch.asnumpy()[0], rows.T @ rows / 8, rtol=1e-5, atol=1e-6)
    pre = rows @ w.T
    dy = (probe.reshape(8, 3) / 2) * (pre > 0)
    np.testing.assert_allclose(layer.matrix_g_batch.asnumpy()[0], 2 * dy.T @ dy, rtol=1e-5, atol=1e-7)


def test_loss_scale_is_divided_out(mode):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    probe = rng.standard_normal((4, 2)).astype(np.float32)
    layer = DenseThor(3, 2, has_bias=False)
    _backward(layer, x, probe)
    reference = layer.matrix_g_batch.asnumpy().copy()
    layer.bind_loss_scale(Tensor(np.float32(1024.0)))
    _backward(layer, x, probe, sens=1024.0)
    np.testing.assert_allclose(layer.matrix_g_batch.asnumpy(), reference, rtol=1e-5)


# ----------------------------------------------------------------------------- convolution
CONV = [
    # kernel, stride, dilation, pad_mode, padding, group, bias
    ((3, 2), (2, 1), (1, 2), "same", 0, 2, True),
    ((3, 3), (1, 1), (1, 1), "pad", (1, 0, 2, 1), 1, False),
    ((2, 3), (2, 2), (1, 1), "valid", 0, 4, True),
    ((3, 3), (1, 1), (2, 2), "pad", 2, 1, True),
]


@pytest.mark.parametrize("case", CONV, ids=lambda c: f"{c[3]}-k{c[0]}-s{c[1]}-d{c[2]}-g{c[5]}-b{int(c[6])}")
def test_conv_factors(mode, case):
    k, s, d, pad_mode, padding, group, bias = case
    rng = np.random.default_rng(3)
    n, cin, cout, hw = 2, 4, 8, (7, 6)
    x = rng.standard_normal((n, cin) + hw).astype(np.float32)
    w = rng.standard_normal((cout, cin // group) + k).astype(np.float32)
    layer = Conv2dThor(cin, cout, k, stride=s, pad_mode=pad_mode, padding=padding, dilation=d, group=group,
                       has_bias=bias, weight_init=Tensor(w))
    y_shape = layer(Tensor(x)).shape
    probe = rng.standard_normal(y_shape).astype(np.float32)
    _backward(layer, x, probe)

    rows, _ = np_im2col(x, k, s, d, np_pads(pad_mode, padding, hw, k, s, d))
    positions = rows.shape[0]
    assert positions == n * y_shape[2] * y_shape[3]
    per_group = cin // group * k[0] * k[1]
    a = layer.matrix_a_batch.asnumpy()
    g = layer.matrix_g_batch.asnumpy()
    dy = (probe / n).transpose(0, 2, 3, 1).reshape(-1, cout)
    for j in range(group):
        cols = rows[:, j * per_group:(j + 1) * per_group]
        if bias:
            cols = np.concatenate([cols, np.ones((positions, 1), np.float32)], 1)
        np.testing.assert_allclose(a[j], cols.T @ cols / positions, rtol=1e-4, atol=1e-5)
        out = dy[:, j * cout // group:(j + 1) * cout // group]
        np.testing.assert_allclose(g[j], n * out.T @ out, rtol=1e-4, atol=1e-7)


def test_conv_gradient_matches_the_factor_convention(mode):
    """The weight gradient is sum_r delta_r a_r^T: the rows the factors are built from are the right ones."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 3, 5, 5)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    layer = Conv2dThor(3, 4, 3, stride=2, pad_mode="same", has_bias=True, weight_init=Tensor(w))
    probe = rng.standard_normal(layer(Tensor(x)).shape).astype(np.float32)
    grads = _backward(layer, x, probe)
    rows, _ = np_im2col(x, (3, 3), (2, 2), (1, 1), np_pads("same", 0, (5, 5), (3, 3), (2, 2), (1, 1)))
    dy = (probe / 2).transpose(0, 2, 3, 1).reshape(-1, 4)
    np.testing.assert_allclose(grads[0].asnumpy().reshape(4, -1), dy.T @ rows, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(grads[1].asnumpy(), dy.sum(0), rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- embedding
class _EmbProbe(nn.Cell):
    def __init__(self, layer, probe):
        super().__init__()
        self.layer = layer
        self.probe = Tensor(probe)

    def construct(self, ids):
        y = self.layer(ids)
        return (y * self.probe).sum() / y.shape[0]


def test_embedding_factors(mode):
    rng = np.random.default_rng(5)
    ids = np.array([[1, 2, 2], [0, 6, 1]], np.int32)
    probe = rng.standard_normal((2, 3, 4)).astype(np.float32)
    layer = EmbeddingThor(7, 4)
    net = _EmbProbe(layer, probe)
    net.set_train()
    ops.GradOperation(get_by_list=True)(net, ms.ParameterTuple(layer.trainable_params()))(Tensor(ids))
    np.testing.assert_allclose(layer.matrix_a_batch.asnumpy(), np.bincount(ids.ravel(), minlength=7) / 6)
    dy = (probe / 2).reshape(6, 4)
    np.testing.assert_allclose(layer.matrix_g_batch.asnumpy()[0], 2 * dy.T @ dy, rtol=1e-5, atol=1e-7)


# ----------------------------------------------------------------------------- capture switches
def test_no_capture_when_flag_off_or_in_eval(mode):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    probe = rng.standard_normal((4, 2)).astype(np.float32)
    layer = DenseThor(3, 2)
    ops.assign(layer.thor_capture, Tensor(False))
    _backward(layer, x, probe)
    assert not layer.matrix_a_batch.asnumpy().any() and not layer.matrix_g_batch.asnumpy().any()
    ops.assign(layer.thor_capture, Tensor(True))
    layer.set_train(False)
    layer(Tensor(x))
    assert not layer.matrix_a_batch.asnumpy().any()
    _backward(layer, x, probe)  # _Probe switches to training: now it captures
    assert layer.matrix_a_batch.asnumpy().any() and layer.matrix_g_batch.asnumpy().any()


def test_static_capture_modes_compile_the_capture_in_or_out_whatever_the_flag():
    """Graph mode, as the step variants compile a layer: ``set_static_capture(True)`` captures A and G without testing
    the flag (its flag is False here: the capturing variant's forward and output-gradient hook have no branch), False
    captures nothing with the flag on; the values are the numpy factors and the layer's gradients are unchanged."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((6, 5)).astype(np.float32)
    probe = rng.standard_normal((6, 3)).astype(np.float32)
    w = rng.standard_normal((3, 5)).astype(np.float32)
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        never = DenseThor(5, 3, weight_init=Tensor(w))
        never.set_static_capture(False)
        reference = _backward(never, x, probe)
        assert not never.matrix_a_batch.asnumpy().any() and not never.matrix_g_batch.asnumpy().any()
        always = DenseThor(5, 3, weight_init=Tensor(w))
        ops.assign(always.thor_capture, Tensor(False))
        always.set_static_capture(True)
        grads = _backward(always, x, probe)
    finally:
        ms.set_context(mode=previous)
    xa = np.concatenate([x, np.ones((6, 1), np.float32)], 1)
    np.testing.assert_allclose(always.matrix_a_batch.asnumpy()[0], xa.T @ xa / 6, rtol=1e-5, atol=1e-6)
    dy = probe / 6
    np.testing.assert_allclose(always.matrix_g_batch.asnumpy()[0], 6 * dy.T @ dy, rtol=1e-5, atol=1e-7)
    for got, want in zip(grads, reference):
        np.testing.assert_array_equal(got.asnumpy(), want.asnumpy())


def test_capture_gate_reads_the_flags_once_per_step_and_layers_follow_it():
    """CaptureGate (PyNative): the first question of a step reads every flag; later changes are seen only after
    clear(); a flag the gate does not hold is read directly. With the gate set, a PyNative forward pass captures
    exactly when the gate's value says so (in Graph mode the gate is not used)."""
    from ms_boost.thor.layers import CaptureGate

    ms.set_context(mode=ms.PYNATIVE_MODE)
    layers = [DenseThor(3, 2), DenseThor(2, 2)]
    for layer, on in zip(layers, (True, False)):
        ops.assign(layer.thor_capture, Tensor(on))
    gate = CaptureGate([layer.thor_capture for layer in layers])
    assert [gate.is_on(layer.thor_capture) for layer in layers] == [True, False]
    ops.assign(layers[1].thor_capture, Tensor(True))
    assert gate.is_on(layers[1].thor_capture) is False  # cached for this step
    gate.clear()
    assert gate.is_on(layers[1].thor_capture) is True
    stranger = DenseThor(2, 2)
    ops.assign(stranger.thor_capture, Tensor(False))
    assert gate.is_on(stranger.thor_capture) is False
    with pytest.raises(ValueError, match="does not hold this layer's thor_capture"):
        stranger.set_capture_gate(gate)

    x = Tensor(np.random.default_rng(7).standard_normal((4, 3)).astype(np.float32))
    layer = layers[0]
    layer.set_train(True)  # statistics are captured in training only
    layer.set_capture_gate(gate)
    gate.clear()
    ops.assign(layer.thor_capture, Tensor(False))
    layer(x)  # the gate reads False now
    assert not layer.matrix_a_batch.asnumpy().any()
    ops.assign(layer.thor_capture, Tensor(True))
    layer(x)  # same step: the gate still says False
    assert not layer.matrix_a_batch.asnumpy().any()
    gate.clear()
    layer(x)
    xs = x.asnumpy()
    expect = np.concatenate([xs, np.ones((4, 1), np.float32)], axis=1)
    np.testing.assert_allclose(layer.matrix_a_batch.asnumpy()[0], expect.T @ expect / 4, rtol=1e-5, atol=1e-6)


def test_layer_argument_errors():
    with pytest.raises(ValueError, match="group"):
        Conv2dThor(3, 4, 3, group=2)
    with pytest.raises(ValueError, match="padding"):
        Conv2dThor(3, 4, 3, pad_mode="same", padding=1)
    with pytest.raises(ValueError, match="pad_mode"):
        Conv2dThor(3, 4, 3, pad_mode="reflect")
    with pytest.raises(ValueError, match="factor_decay"):
        DenseThor(3, 4, factor_decay=1.0)
    with pytest.raises(ValueError, match="weight_init"):
        DenseThor(3, 4, weight_init=Tensor(np.zeros((3, 4), np.float32)))
    with pytest.raises(ValueError, match="padding_idx"):
        EmbeddingThor(5, 2, padding_idx=5)


# ----------------------------------------------------------------------------- sub-batch statistics
def _np_blocks(full: np.ndarray, block: int) -> np.ndarray:
    """numpy: the ``(n_b, b, b)`` diagonal blocks THOR stores for a factor wider than ``block`` (last one completed
    with the identity)."""
    dim = full.shape[0]
    n_b = -(-dim // block)
    out = np.zeros((n_b, block, block), np.float32)
    for j in range(n_b):
        part = full[j * block:(j + 1) * block, j * block:(j + 1) * block]
        out[j] = np.eye(block, dtype=np.float32)
        out[j][:part.shape[0], :part.shape[1]] = part
    return out


def test_sub_batch_statistics_dense(mode):
    """stat_fraction 0.4 of a batch of 6: A and G from the first ceil(2.4) = 3 samples; G = N^2/k sum delta delta^T
    (the per-sample second moment, the loss still averaged over all N), against numpy."""
    rng = np.random.default_rng(6)
    n, k = 6, 3
    x = rng.standard_normal((n, 2, 5)).astype(np.float32)  # rows: every leading position of the first k samples
    probe = rng.standard_normal((n, 2, 3)).astype(np.float32)
    layer = DenseThor(5, 3, weight_init=Tensor(rng.standard_normal((3, 5)).astype(np.float32)), has_bias=True)
    layer.set_stat_fraction(0.4)
    assert layer.stat_fraction == 0.4 and layer.capture_spec[-1] == 0.4
    rows = np.concatenate([x[:k].reshape(-1, 5), np.ones((2 * k, 1), np.float32)], 1)
    dy = (probe[:k] / n).reshape(-1, 3)
    for _ in _capture_paths(layer):
        _backward(layer, x, probe)
        np.testing.assert_allclose(layer.matrix_a_batch.asnumpy()[0], rows.T @ rows / (2 * k), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(layer.matrix_g_batch.asnumpy()[0], n * n / k * dy.T @ dy, rtol=1e-5, atol=1e-7)


def _capture_paths(layer):
    """Run the caller's capture once through the layer's cells; in PyNative mode once more through the compiled
    writers a CaptureGate selects (what THOR's PyNative steps use), the buffers zeroed in between."""
    from ms_boost.thor.layers import CaptureGate

    yield "cells"
    if ms.get_context("mode") == ms.PYNATIVE_MODE:
        for param in (layer.matrix_a_batch, layer.matrix_g_batch):
            ops.assign(param, ops.zeros_like(param))
        layer.set_capture_gate(CaptureGate([layer.thor_capture]))
        yield "gate"


def test_sub_batch_statistics_conv_as_blocks(mode):
    """A strided, padded convolution with bias, its 37-wide A stored as 8-blocks, at stat_fraction 0.5 of 4 samples:
    the first 2 samples' im2col rows and output gradients, against numpy."""
    rng = np.random.default_rng(7)
    n, k, cin, cout, hw = 4, 2, 4, 8, (6, 5)
    x = rng.standard_normal((n, cin) + hw).astype(np.float32)
    w = rng.standard_normal((cout, cin, 3, 3)).astype(np.float32)
    layer = Conv2dThor(cin, cout, 3, stride=2, pad_mode="pad", padding=1, has_bias=True, weight_init=Tensor(w))
    layer.set_factor_layout(8, True)
    layer.set_stat_fraction(0.5)
    y_shape = layer(Tensor(x)).shape
    probe = rng.standard_normal(y_shape).astype(np.float32)
    rows, _ = np_im2col(x[:k], (3, 3), (2, 2), (1, 1), np_pads("pad", 1, hw, (3, 3), (2, 2), (1, 1)))
    assert rows.shape[0] == k * y_shape[2] * y_shape[3]
    rows = np.concatenate([rows, np.ones((rows.shape[0], 1), np.float32)], 1)
    dy = (probe[:k] / n).transpose(0, 2, 3, 1).reshape(-1, cout)
    for _ in _capture_paths(layer):
        _backward(layer, x, probe)
        a = layer.matrix_a_batch.asnumpy()
        assert a.shape == (1, 5, 8, 8)
        np.testing.assert_allclose(a[0], _np_blocks(rows.T @ rows / rows.shape[0], 8), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(layer.matrix_g_batch.asnumpy()[0], n * n / k * dy.T @ dy, rtol=1e-4, atol=1e-7)


def test_sub_batch_statistics_embedding_keep_whole_batch_token_frequencies(mode):
    """An embedding at stat_fraction 0.5: G from the first sample of 2, the token frequencies from the whole batch
    (a token of the second sample has a gradient: a frequency of 0 would scale its row by 1/sqrt(damping))."""
    rng = np.random.default_rng(8)
    ids = np.array([[1, 2, 2], [0, 6, 1]], np.int32)
    probe = rng.standard_normal((2, 3, 4)).astype(np.float32)
    layer = EmbeddingThor(7, 4)
    layer.set_stat_fraction(0.5)
    net = _EmbProbe(layer, probe)
    net.set_train()
    ops.GradOperation(get_by_list=True)(net, ms.ParameterTuple(layer.trainable_params()))(Tensor(ids))
    np.testing.assert_allclose(layer.matrix_a_batch.asnumpy(), np.bincount(ids.ravel(), minlength=7) / 6)
    dy = (probe[:1] / 2).reshape(3, 4)
    np.testing.assert_allclose(layer.matrix_g_batch.asnumpy()[0], 2 * 2 / 1 * dy.T @ dy, rtol=1e-5, atol=1e-7)


def test_stat_fraction_of_a_layer_refuses_bad_values():
    layer = DenseThor(3, 2)
    for bad in (0.0, 1.5, -0.1, True, "half"):
        with pytest.raises(ValueError, match=r"DenseThor.set_stat_fraction: fraction=.* must be a float in \(0, 1\]"):
            layer.set_stat_fraction(bad)

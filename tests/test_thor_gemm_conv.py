"""Conv2dThor's CPU path (im2col + GEMM, ms_boost/gemm_conv.py) against a numpy convolution, both modes.

The reference loops over the kernel taps in float64 (no im2col) with explicit (top, bottom, left, right) padding,
stride and dilation: output, input gradient and weight gradient of ``sum(conv(x) * r)`` for a random ``r``.
"""
from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn

from ms_boost.thor import Conv2dThor, ConvertNetUtils


def np_conv_and_grads(x, w, stride, dilation, pads, r=None):
    """Cross-correlation of x (N,C,H,W) with w (O,C,kh,kw); with ``r``, also d sum(y r)/dx and /dw."""
    top, bottom, left, right = pads
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    oh = (h + top + bottom - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + left + right - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    y = np.zeros((n, o, oh, ow))
    dxp, dw = np.zeros_like(xp), np.zeros_like(w)
    for i in range(kh):
        for j in range(kw):
            rows = slice(i * dilation[0], i * dilation[0] + stride[0] * (oh - 1) + 1, stride[0])
            cols = slice(j * dilation[1], j * dilation[1] + stride[1] * (ow - 1) + 1, stride[1])
            y += np.einsum("nchw,oc->nohw", xp[:, :, rows, cols], w[:, :, i, j])
            if r is not None:
                dxp[:, :, rows, cols] += np.einsum("nohw,oc->nchw", r, w[:, :, i, j])
                dw[:, :, i, j] = np.einsum("nohw,nchw->oc", r, xp[:, :, rows, cols])
    return y, dxp[:, :, top:top + h, left:left + wd], dw


class _Weighted(nn.Cell):
    def __init__(self, layer, r):
        super().__init__()
        self.layer = layer
        self.r = Tensor(r)

    def construct(self, x):
        return (self.layer(x) * self.r).sum()


CASES = [  # in, out, kernel, stride, pad_mode, padding, dilation, bias, size, pads the reference applies
    (3, 5, 3, 2, "pad", 1, 1, True, 7, (1, 1, 1, 1)),
    (4, 8, 3, 1, "pad", 2, 2, False, 5, (2, 2, 2, 2)),  # dilated
    (3, 4, 2, 2, "valid", 0, 1, False, 6, (0, 0, 0, 0)),
    (4, 16, 3, 2, "pad", (1, 1, 2, 2), 1, True, 5, (1, 1, 2, 2)),  # L = 12 < O = 16: batch folded into columns
    (4, 6, 1, 1, "valid", 0, 1, False, 4, (0, 0, 0, 0)),  # pointwise: no unfold
]


def test_conv2d_thor_gemm_path_matches_numpy(mode):
    rng = np.random.default_rng(5)
    for cin, cout, k, s, pad_mode, padding, d, bias, size, pads in CASES:
        case = f"k={k} s={s} d={d} {pad_mode} {padding} bias={bias} ({mode})"
        w = rng.standard_normal((cout, cin, k, k)).astype(np.float32)
        b = rng.standard_normal(cout).astype(np.float32)
        layer = Conv2dThor(cin, cout, k, stride=s, pad_mode=pad_mode, padding=padding, dilation=d, has_bias=bias,
                           weight_init=Tensor(w), bias_init=Tensor(b))
        assert layer.gemm, case  # the suite runs on CPU
        layer.set_train()
        x = rng.standard_normal((2, cin, size, size)).astype(np.float32)
        want, _, _ = np_conv_and_grads(x.astype(np.float64), w.astype(np.float64), (s, s), (d, d), pads)
        if bias:
            want = want + b[None, :, None, None]
        r = rng.standard_normal(want.shape).astype(np.float32)
        _, want_dx, want_dw = np_conv_and_grads(x.astype(np.float64), w.astype(np.float64), (s, s), (d, d), pads,
                                                r.astype(np.float64))
        got = layer(Tensor(x)).asnumpy()
        assert got.shape == want.shape, case
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=case)
        _, (dx, dparams) = ms.value_and_grad(_Weighted(layer, r), 0, layer.trainable_params())(Tensor(x))
        np.testing.assert_allclose(dx.asnumpy(), want_dx, rtol=1e-4, atol=1e-4, err_msg=case)
        np.testing.assert_allclose(dparams[0].asnumpy(), want_dw, rtol=1e-4, atol=1e-3, err_msg=case)
        if bias:
            np.testing.assert_allclose(dparams[1].asnumpy(), r.sum(axis=(0, 2, 3)), rtol=1e-4, atol=1e-4,
                                       err_msg=case)
        # the factor capture still sees the layer's input: A from the same patches as the product
        assert np.abs(layer.matrix_a_batch.asnumpy()).sum() > 0, case


def test_unsupported_configurations_keep_conv2d_and_zoo_layers_use_gemm():
    from model_zoo.resnet.src.resnet import create_model

    grouped = Conv2dThor(4, 4, 3, group=2)
    assert not grouped.gemm
    # "same" and asymmetric padding keep Conv2D (a Graph-mode dataset-sink run hung with them on the GEMM path)
    assert not Conv2dThor(4, 4, 3, pad_mode="same").gemm
    assert not Conv2dThor(4, 4, 3, pad_mode="pad", padding=(0, 1, 0, 1)).gemm
    x = Tensor(np.random.default_rng(0).standard_normal((1, 4, 5, 5)).astype(np.float32))
    assert grouped(x).shape == (1, 4, 5, 5)
    thor_net = ConvertNetUtils().convert_to_thor_net(create_model("resnet10", class_num=3, base_width=4))
    convs = [c for _, c in thor_net.cells_and_names() if isinstance(c, Conv2dThor)]
    assert len(convs) == 12 and all(c.gemm for c in convs)

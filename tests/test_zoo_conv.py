"""The zoo's im2col + GEMM convolution (model_zoo/resnet/src/conv.py) against a numpy convolution.

The reference is a direct loop over the kernel taps in float64 (no im2col; ``np_conv_and_grads`` of
tests/test_thor_gemm_conv.py): output, input gradient and
weight gradient of ``sum(conv(x) * r)`` for a random ``r``, in PyNative and Graph mode, for every shape the
ResNets use (7x7/2 stem, 3x3/1, 3x3/2, 1x1/1, 1x1/2) plus bias, 'valid' and unequal row/column padding,
with both ways of forming the product (weight broadcast over the batch, or batch folded into the columns).
"""
from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

from model_zoo.resnet.src.conv import GemmConv2d, resolve_conv_impl
from model_zoo.resnet.src.resnet import create_model
from tests.test_cpu_gemm_conv import outputs_and_grads
from tests.test_thor_gemm_conv import np_conv_and_grads

CASES = [  # in, out, kernel, stride, pad_mode, padding, bias, size
    (3, 5, 7, 2, "pad", 3, False, 11),
    (4, 6, 3, 1, "pad", 1, True, 6),
    (4, 6, 3, 2, "pad", 1, False, 7),
    (4, 6, 1, 1, "valid", 0, True, 5),
    (4, 6, 1, 2, "valid", 0, False, 6),
    (3, 4, 3, 2, "pad", (1, 1, 2, 2), False, 7),
    (3, 4, 2, 1, "valid", 0, False, 5),
    (4, 8, 3, 2, "pad", 1, True, 3),  # fewer output positions (4) than channels (8): batch folded into columns
    (4, 8, 1, 1, "valid", 0, False, 2),
]


def test_gemm_conv_matches_numpy_forward_and_gradients(mode):
    """Every case's layer in one outputs cell and one gradient cell (tests/test_cpu_gemm_conv.py
    ``outputs_and_grads``: two Graph-mode compiles for the nine layers, whose gradients of the summed loss are each
    layer's own)."""
    rng = np.random.default_rng(3)
    layers, xs, rs, wants = [], [], [], []
    for cin, cout, k, s, pad_mode, padding, bias, size in CASES:
        layer = GemmConv2d(cin, cout, k, stride=s, pad_mode=pad_mode, padding=padding, has_bias=bias,
                           weight_init=Tensor(rng.standard_normal((cout, cin, k, k)).astype(np.float32)),
                           bias_init=Tensor(rng.standard_normal(cout).astype(np.float32)) if bias else "zeros")
        x = rng.standard_normal((2, cin, size, size)).astype(np.float64)
        w = layer.weight.asnumpy().astype(np.float64)
        pads = (padding,) * 4 if isinstance(padding, int) else padding
        want = np_conv_and_grads(x, w, (s, s), (1, 1), pads)[0]
        if bias:
            want = want + layer.bias.asnumpy()[None, :, None, None]
        r = rng.standard_normal(want.shape)
        _, want_dx, want_dw = np_conv_and_grads(x, w, (s, s), (1, 1), pads, r)
        layers.append(layer)
        xs.append(x.astype(np.float32))
        rs.append(r.astype(np.float32))
        wants.append((want, want_dx, want_dw, r))
    runs = outputs_and_grads(layers, xs, rs)
    for (_, _, k, s, pad_mode, padding, bias, _), (want, want_dx, want_dw, r), (got, dx, dparams) in zip(
            CASES, wants, runs):
        case = f"k={k} s={s} {pad_mode} {padding} bias={bias} ({mode})"
        assert got.shape == want.shape and len(dparams) == 1 + bias, case
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=case)
        np.testing.assert_allclose(dx, want_dx, rtol=1e-4, atol=1e-4, err_msg=case)
        np.testing.assert_allclose(dparams[0], want_dw, rtol=1e-4, atol=1e-3, err_msg=case)
        if bias:
            np.testing.assert_allclose(dparams[1], r.sum(axis=(0, 2, 3)), rtol=1e-4, atol=1e-4, err_msg=case)


def test_gemm_conv_refuses_what_it_does_not_implement():
    for kwargs, named in (({"group": 2}, "group=2"), ({"dilation": 2}, "dilation"),
                          ({"pad_mode": "same"}, "pad_mode='same'"),
                          ({"pad_mode": "pad", "padding": (1, 0, 1, 1)}, "asymmetric")):
        with pytest.raises(ValueError, match=named):
            GemmConv2d(4, 4, 3, **kwargs)


def test_conv_impl_choice_and_checkpoint_interchange():
    assert resolve_conv_impl("auto") == "gemm"  # the suite runs on CPU
    assert resolve_conv_impl(None) == "gemm"
    assert resolve_conv_impl("native") == "native"
    with pytest.raises(ValueError, match=r"conv_impl='fast'.*auto, native, gemm"):
        resolve_conv_impl("fast")
    with pytest.raises(ValueError, match="conv_impl"):
        create_model("resnet10", class_num=3, base_width=4, conv_impl="cudnn")
    gemm = create_model("resnet10", class_num=3, base_width=4)
    native = create_model("resnet10", class_num=3, base_width=4, conv_impl="native")
    convs = [c for _, c in gemm.cells_and_names() if isinstance(c, nn.Conv2d)]
    assert convs and all(isinstance(c, GemmConv2d) for c in convs)
    assert not any(isinstance(c, GemmConv2d) for _, c in native.cells_and_names())
    # same parameter names and shapes: a checkpoint of one loads into the other, outputs agree
    assert [(p.name, p.shape) for p in gemm.get_parameters()] == [(p.name, p.shape) for p in native.get_parameters()]
    assert ms.load_param_into_net(native, {p.name: p for p in gemm.get_parameters()}) == ([], [])
    gemm.set_train(False)
    native.set_train(False)
    x = Tensor(np.random.default_rng(0).standard_normal((2, 3, 16, 16)).astype(np.float32))
    np.testing.assert_allclose(gemm(x).asnumpy(), native(x).asnumpy(), rtol=1e-4, atol=1e-5)


def test_thor_converts_gemm_convolutions_and_refuses_unrelated_registrations():
    from ms_boost.thor import Conv2dThor, ConvertNetUtils, DenseThor, register_convertible

    net = create_model("resnet10", class_num=3, base_width=4)
    convs = sum(isinstance(c, GemmConv2d) for _, c in net.cells_and_names())
    utils = ConvertNetUtils()
    thor_net = utils.convert_to_thor_net(net)
    layers = [c for _, c in thor_net.cells_and_names() if isinstance(c, (Conv2dThor, DenseThor))]
    assert convs == 12 and len(layers) == convs + 1, [(e.path, e.source, e.target) for e in utils.report]
    register_convertible(GemmConv2d, nn.Conv2d)  # again: no-op
    with pytest.raises(TypeError, match="subclass of Dense"):
        register_convertible(GemmConv2d, nn.Dense)
    with pytest.raises(TypeError, match="as_type"):
        register_convertible(GemmConv2d, nn.Cell)

r"""2-D convolution (NCHW, group 1) as im2col + matrix product: the fast convolution on CPU.

Why: on CPU, MindSpore 2.10 hands ``Conv2D`` (and its input gradient) to oneDNN with the plain NCHW layout, for
which oneDNN picks its reference-like ``jit_uni_ncsp`` kernel (0.5-6 GFLOPS measured on ResNet layers), while
the same products as one matrix multiplication run at GEMM speed. With the input unfolded into columns
:math:`X_{col}` (``Im2Col``: ``(N, C k_h k_w, L)``, :math:`L = H_{out} W_{out}`) and the kernel flattened to
:math:`W` ``(C_{out}, C k_h k_w)``,

.. math::
    y[n, :, \ell] = W \, X_{col}[n, :, \ell],

the same convolution to float rounding; the gradients follow by automatic differentiation (``Col2Im`` for the
input). Used by the model zoo's ``GemmConv2d`` and by :class:`ms_boost.thor.Conv2dThor` on CPU.

Two implementation choices, both measured on a ResNet-18 (width 16, 32 px, batch 32):

* The product. ``(O, K) @ (N, K, L)`` broadcasts the weight to ``N`` copies (and reduces its gradient over
  them); folding the batch into the columns instead (``(K, N L)``, one 2-D product, transposed back) moves
  ``N K L + N O L`` values. Folding is taken where ``L < O`` (the deep, small-image layers): Graph step
  65 -> 37 ms against always broadcasting.
* PyNative mode. MindSpore re-initialises the CPU ``Im2Col`` kernel whenever consecutive calls change the
  kernel size, stride or padding (~100 ms each; every layer of a ResNet does), so in PyNative mode the
  unfold + product runs as one small compiled function per (shapes, kernel, stride, dilation, padding).
"""
from __future__ import annotations

from typing import Sequence, Tuple

import mindspore as ms
from mindspore import Tensor, ops

__all__ = ["unfold_columns", "conv2d_gemm", "output_size"]


def unfold_columns(x: Tensor, kernel_size: Sequence[int], stride: Sequence[int], dilation: Sequence[int],
                   pads: Sequence[int]) -> Tensor:
    r"""Convolution patches as columns: ``(N, C, H, W)`` -> ``(N, C k_h k_w, H_out W_out)``.

    Column :math:`\ell = (i, j)` of sample :math:`n` holds the receptive field of output position
    :math:`(i, j)`, rows ordered channel-major like a kernel ``(C_out, C, k_h, k_w)`` reshaped to
    ``(C_out, C k_h k_w)``. ``pads`` is (top, bottom, left, right) zero padding: symmetric padding is left to
    ``Im2Col``, asymmetric padding (``"same"`` with an odd total) is applied with ``pad`` first.
    """
    top, bottom, left, right = pads
    if top == bottom and left == right:
        padding = (top, left)
    else:
        x = ops.Pad(((0, 0), (0, 0), (top, bottom), (left, right)))(x)
        padding = (0, 0)
    # the Im2Col primitive, not ops.unfold: the wrapper's argument checks compile ~25 ms slower per call site
    cols = ops.Im2Col(ksizes=tuple(kernel_size), strides=tuple(stride), dilations=tuple(dilation),
                      pads=padding)(x)  # (N, C, k_h k_w, L)
    return cols.reshape(x.shape[0], x.shape[1] * kernel_size[0] * kernel_size[1], -1)


def output_size(in_hw: Sequence[int], kernel_size: Sequence[int], stride: Sequence[int],
                dilation: Sequence[int], pads: Sequence[int]) -> Tuple[int, int]:
    r"""``(H_out, W_out)``: :math:`\lfloor (H + p_t + p_b - d (k - 1) - 1) / s \rfloor + 1` per axis."""
    out_h = (in_hw[0] + pads[0] + pads[1] - dilation[0] * (kernel_size[0] - 1) - 1) // stride[0] + 1
    out_w = (in_hw[1] + pads[2] + pads[3] - dilation[1] * (kernel_size[1] - 1) - 1) // stride[1] + 1
    return out_h, out_w


def _product(weight_matrix: Tensor, columns: Tensor, out_shape: tuple) -> Tensor:
    """``weight_matrix (O, K) @ columns (N, K, L)`` as ``out_shape`` ``(N, O, H_out, W_out)``.

    Computed in the lower of the two precisions (PyNative mixed precision casts a layer's input, not its float32
    weight); the batch is folded into the columns when ``L < O`` (see the module docstring).
    """
    if columns.dtype != weight_matrix.dtype:
        if weight_matrix.dtype == ms.float32:
            weight_matrix = weight_matrix.astype(columns.dtype)
        else:
            columns = columns.astype(weight_matrix.dtype)
    n, k, length = columns.shape
    out_channels = weight_matrix.shape[0]
    if length < out_channels:
        out = ops.matmul(weight_matrix, columns.transpose(1, 0, 2).reshape(k, n * length))
        return out.reshape(out_channels, n, length).transpose(1, 0, 2).reshape(out_shape)
    return ops.matmul(weight_matrix, columns).reshape(out_shape)


def _unfold_product(x, weight_matrix, kernel_size, stride, dilation, pads):
    n, _, h, w = x.shape
    out_h, out_w = output_size((h, w), kernel_size, stride, dilation, pads)
    columns = unfold_columns(x, kernel_size, stride, dilation, pads)
    return _product(weight_matrix, columns, (n, weight_matrix.shape[0], out_h, out_w))


_unfold_product_compiled = ms.jit(_unfold_product)


def conv2d_gemm(x: Tensor, weight: Tensor, kernel_size: Sequence[int], stride: Sequence[int] = (1, 1),
                pads: Sequence[int] = (0, 0, 0, 0), dilation: Sequence[int] = (1, 1),
                pynative: bool = False) -> Tensor:
    r"""Cross-correlation ``y = conv2d(x, weight)`` (NCHW, group 1, no bias) as im2col + GEMM.

    Callable from a Cell's ``construct`` in both modes; all arguments but ``x`` and ``weight`` must be Python
    constants (fixed when the layer is built).

    Args:
        x: ``(N, C, H, W)`` input.
        weight: ``(O, C, k_h, k_w)`` kernel (a Parameter is fine: it is reshaped before any compiled call).
        kernel_size, stride, dilation: (height, width) int pairs.
        pads: explicit (top, bottom, left, right) zero padding (see :func:`ms_boost.thor.math.conv_pads` for
            the ``"same"``/``"valid"``/``"pad"`` modes).
        pynative: True when called in PyNative mode: the unfold + product then runs as one compiled function
            per configuration (decide it once, when the layer is built).

    Returns:
        ``(N, O, H_out, W_out)`` (:func:`output_size`), in the lower precision of ``x`` and ``weight``.
    """
    weight_matrix = weight.reshape(weight.shape[0], -1)
    n, c, h, w = x.shape
    if tuple(kernel_size) == (1, 1) and tuple(stride) == (1, 1) and tuple(pads) == (0, 0, 0, 0):
        return _product(weight_matrix, x.reshape(n, c, h * w), (n, weight_matrix.shape[0], h, w))
    if pynative:
        return _unfold_product_compiled(x, weight_matrix, tuple(kernel_size), tuple(stride), tuple(dilation),
                                        tuple(pads))
    return _unfold_product(x, weight_matrix, kernel_size, stride, dilation, pads)

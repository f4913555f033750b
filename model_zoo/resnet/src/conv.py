"""Convolution as im2col + GEMM for CPU training, a drop-in subclass of ``nn.Conv2d``.

Why: on CPU, MindSpore 2.10 hands ``Conv2D`` (and its input gradient) to oneDNN with the plain NCHW
layout, for which oneDNN picks its reference-like ``jit_uni_ncsp`` kernel: measured here (ResNet-18,
base width 16, 32 px, batch 32) the 20 forward convolutions take ~200 ms of a 300 ms training step, at
0.5-6 GFLOPS, while the same products as a matrix multiplication run at GEMM speed. Unfolding the input
into columns (``Im2Col``) and multiplying by the ``(out, in * kh * kw)`` weight matrix gives the same
convolution (to float rounding) with a ~4x faster Graph-mode step and ~1.6x faster PyNative step.

The layer keeps ``nn.Conv2d``'s parameters, names and shapes, so checkpoints, ``isinstance`` checks
(weight initialisation, LessBN) and export are unchanged; only ``construct`` differs. THOR's converter,
which replaces layers by exact type, is told that this class is an ``nn.Conv2d``
(:func:`ms_boost.thor.register_convertible`).

PyNative note: MindSpore re-initialises the CPU ``Im2Col`` kernel whenever consecutive calls change the
kernel size, stride or padding (~100 ms each, every layer of a ResNet does), so in PyNative mode the
unfold + product runs as one small compiled function per (shape, kernel, stride, padding).
"""
from __future__ import annotations

from typing import Optional

import mindspore as ms
from mindspore import nn, ops

from ms_boost.thor import register_convertible

__all__ = ["GemmConv2d", "CONV_IMPLS", "resolve_conv_impl"]

CONV_IMPLS = ("auto", "native", "gemm")


def resolve_conv_impl(conv_impl: Optional[str]) -> str:
    """``"native"`` or ``"gemm"`` for ``conv_impl``; ``"auto"`` (or None) is ``"gemm"`` on CPU only.

    Raises:
        ValueError: ``conv_impl`` is not one of :data:`CONV_IMPLS`.
    """
    impl = "auto" if conv_impl is None else conv_impl
    if impl not in CONV_IMPLS:
        raise ValueError(f"conv_impl={conv_impl!r} is not supported; allowed: {', '.join(CONV_IMPLS)} "
                         "(auto = gemm on CPU, native elsewhere).")
    if impl == "auto":
        return "gemm" if ms.get_context("device_target") == "CPU" else "native"
    return impl


def _product(weight_matrix, columns, out_shape):
    """``weight_matrix (O, K) @ columns (N, K, L)`` reshaped to ``out_shape`` ``(N, O, H, W)``.

    A batched product broadcasts the weight to ``N`` copies (``N O K`` values, and a reduction over the
    batch for its gradient); folding the batch into the columns instead transposes ``N K L`` + ``N O L``
    values. The cheaper is taken per layer (shapes are static): folding wins once ``L < O``, i.e. in the
    deep, small-image stages (measured: ResNet-18 width 16 Graph step 65 -> 37 ms against always
    broadcasting).
    """
    n, k, length = columns.shape
    out_channels = weight_matrix.shape[0]
    if length < out_channels:
        out = ops.matmul(weight_matrix, columns.transpose(1, 0, 2).reshape(k, n * length))
        return out.reshape(out_channels, n, length).transpose(1, 0, 2).reshape(out_shape)
    return ops.matmul(weight_matrix, columns).reshape(out_shape)


@ms.jit
def _unfold_matmul(x, weight_matrix, kernel, stride, padding, out_shape):
    """One compiled unfold + product per (shapes, kernel, stride, padding): PyNative's path."""
    columns = ops.unfold(x, kernel_size=kernel, dilation=1, padding=padding, stride=stride)
    if columns.dtype != weight_matrix.dtype:  # PyNative mixed precision: compute in the lower precision
        if weight_matrix.dtype == ms.float32:
            weight_matrix = weight_matrix.astype(columns.dtype)
        else:
            columns = columns.astype(weight_matrix.dtype)
    return _product(weight_matrix, columns, out_shape)


class GemmConv2d(nn.Conv2d):
    """``nn.Conv2d`` computed as im2col + matrix product (group 1, dilation 1, NCHW, pad modes pad/valid).

    Takes ``nn.Conv2d``'s arguments. Symmetric padding only (``padding`` an int, or top = bottom and
    left = right).

    Raises:
        ValueError: an argument this layer does not implement (group, dilation, data format, pad mode
            ``same``, asymmetric padding); use ``nn.Conv2d`` for those.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        unsupported = []
        if self.group != 1:
            unsupported.append(f"group={self.group}")
        if tuple(self.dilation) not in ((1, 1), (1, 1, 1, 1)):
            unsupported.append(f"dilation={self.dilation}")
        if self.data_format != "NCHW":
            unsupported.append(f"data_format={self.data_format!r}")
        if self.pad_mode not in ("pad", "valid"):
            unsupported.append(f"pad_mode={self.pad_mode!r}")
        padding = self.padding if isinstance(self.padding, (tuple, list)) else (self.padding,) * 4
        if self.pad_mode == "valid":
            padding = (0, 0, 0, 0)
        if padding[0] != padding[1] or padding[2] != padding[3]:
            unsupported.append(f"padding={self.padding} (asymmetric)")
        if unsupported:
            raise ValueError(f"GemmConv2d does not implement {', '.join(unsupported)}; allowed: group=1, "
                             "dilation=1, data_format='NCHW', pad_mode 'pad' (symmetric) or 'valid'. "
                             "Use nn.Conv2d.")
        self._kernel = (int(self.kernel_size[0]), int(self.kernel_size[1]))
        self._stride = (int(self.stride[0]), int(self.stride[-1]))
        self._padding = (int(padding[0]), int(padding[2]))
        self._pointwise = self._kernel == (1, 1) and self._stride == (1, 1) and self._padding == (0, 0)
        self._pynative = ms.get_context("mode") == ms.PYNATIVE_MODE

    def construct(self, x):
        n, _, h, w = x.shape
        out_h = (h + 2 * self._padding[0] - self._kernel[0]) // self._stride[0] + 1
        out_w = (w + 2 * self._padding[1] - self._kernel[1]) // self._stride[1] + 1
        weight = self.weight.reshape(self.out_channels, -1)
        if self._pointwise:
            out = _product(weight, x.reshape(n, self.in_channels, h * w), (n, self.out_channels, h, w))
        elif self._pynative:
            out = _unfold_matmul(x, weight, self._kernel, self._stride, self._padding,
                                 (n, self.out_channels, out_h, out_w))
        else:
            columns = ops.unfold(x, kernel_size=self._kernel, dilation=1, padding=self._padding,
                                 stride=self._stride)
            out = _product(weight, columns, (n, self.out_channels, out_h, out_w))
        if self.has_bias:
            out = out + self.bias.reshape(1, -1, 1, 1)
        return out


register_convertible(GemmConv2d, nn.Conv2d)

"""Convolution as im2col + GEMM for CPU training, a drop-in subclass of ``nn.Conv2d``.

Why: on CPU, MindSpore 2.10 hands ``Conv2D`` (and its input gradient) to oneDNN with the plain NCHW
layout, for which oneDNN picks its reference-like ``jit_uni_ncsp`` kernel: measured here (ResNet-18,
base width 16, 32 px, batch 32) the 20 forward convolutions take ~200 ms of a 300 ms training step, at
0.5-6 GFLOPS, while the same products as a matrix multiplication run at GEMM speed. Unfolding the input
into columns (``Im2Col``) and multiplying by the ``(out, in * kh * kw)`` weight matrix gives the same
convolution (to float rounding) with a ~9x faster Graph-mode step and ~2x faster PyNative step.

The computation itself is :func:`ms_boost.gemm_conv.conv2d_gemm` (shared with THOR's ``Conv2dThor``,
which uses it on CPU; its docstring explains the product form and the compiled PyNative path). This
layer keeps ``nn.Conv2d``'s parameters, names and shapes, so checkpoints, ``isinstance`` checks (weight
initialisation, LessBN) and export are unchanged; only ``construct`` differs. THOR's converter, which
replaces layers by exact type, is told that this class is an ``nn.Conv2d``
(:func:`ms_boost.thor.register_convertible`).
"""
from __future__ import annotations

from typing import Optional

import mindspore as ms
from mindspore import nn

from ms_boost.gemm_conv import conv2d_gemm
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
        self._pads = tuple(int(p) for p in padding)
        self._pynative = ms.get_context("mode") == ms.PYNATIVE_MODE

    def construct(self, x):
        out = conv2d_gemm(x, self.weight, self._kernel, self._stride, self._pads, pynative=self._pynative)
        if self.has_bias:
            out = out + self.bias.reshape(1, -1, 1, 1)
        return out


register_convertible(GemmConv2d, nn.Conv2d)

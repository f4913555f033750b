"""The feature-normalised classifier head of LessBN (``fn_flag``): :func:`l2_normalize`, :class:`CommonHeadLastFN`.

A leaf module: LessBN builds the head, gradient centralization (:mod:`ms_boost.grad_process`) leaves its
weight out; neither imports the other for it.
"""
from __future__ import annotations

import math

import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common import dtype as mstype
from mindspore.common.initializer import initializer

__all__ = ["l2_normalize", "CommonHeadLastFN", "default_fn_scale"]


def default_fn_scale(classes: int) -> float:
    r"""The scale LessBN gives a new FN head: :math:`\max(1, \sqrt 2 \ln(C - 1))` for ``C`` classes.

    AdaCos's fixed scale (Zhang et al., CVPR 2019): the smallest at which a cosine classifier's softmax can come
    close to one for the true class. Upstream starts the multiplier at 1, which bounds the logits to [-1, 1]: with
    10 classes the true class's probability is at most 0.45 until the multiplier has grown, and on short runs it
    learns slowly (``docs/light_algorithms.md``).
    """
    return max(1.0, math.sqrt(2.0) * math.log(max(int(classes) - 1, 1)))


# --------------------------------------------------------------------------------------------------
def l2_normalize(x: Tensor, axis: int = 1, epsilon: float = 1e-12) -> Tensor:
    r"""Scale ``x`` to unit L2 norm along ``axis``.

    .. math::

        \operatorname{norm}(x) = \frac{x}{\max(\lVert x \rVert_2, \epsilon)}

    Args:
        x: input tensor.
        axis: axis along which the norm is taken.
        epsilon: lower bound of the norm (keeps a zero row finite).
    """
    # sqrt(max(|x|^2, eps^2)) = max(|x|, eps), with the floor inside the root: a zero row then gets a finite gradient
    # (outside, sqrt's derivative at 0 is infinite and the row's gradient NaN)
    norm = ops.sqrt(ops.maximum((x * x).sum(axis=axis, keepdims=True), epsilon * epsilon))
    return x / norm


class CommonHeadLastFN(nn.Cell):
    r"""Feature-normalised last layer: a cosine classifier with a learned scale.

    .. math::

        y = m \cdot \left(\operatorname{norm}(x)\,\operatorname{norm}(W)^\top + b\right)

    where rows of ``x`` (features) and of ``W`` (one per class) are L2-normalised
    (:func:`l2_normalize`) and ``m`` is a trainable scalar ``multiplier`` (``multiplier_init``, default 1). The
    normalisation is computed in float32 and the output cast back to the input's dtype.

    Args:
        in_channels: input features.
        out_channels: output features (classes).
        weight_init: initializer name, Tensor, number, or an existing ``Parameter`` of shape
            ``(out_channels, in_channels)``, which is then used as the weight itself (not copied).
        bias_init: initializer of the bias.
        has_bias: whether the layer has a bias ``b``.
        multiplier_init: the starting value of ``m`` (1.0, upstream's, by default; LessBN passes
            :func:`default_fn_scale` unless ``less_bn.fn_scale`` says otherwise).

    Inputs:
        - **x** (Tensor) - shape ``(N, in_channels)``.

    Outputs:
        Tensor of shape ``(N, out_channels)``.
    """

    def __init__(self, in_channels: int, out_channels: int, weight_init="normal", bias_init="zeros",
                 has_bias: bool = True, multiplier_init: float = 1.0):
        super().__init__()
        self.in_channels = int(in_channels)
        self.out_channels = int(out_channels)
        shape = (self.out_channels, self.in_channels)
        if isinstance(weight_init, Parameter):
            if tuple(weight_init.shape) != shape:
                raise ValueError(f"CommonHeadLastFN: weight_init Parameter '{weight_init.name}' has shape "
                                 f"{tuple(weight_init.shape)}, expected {shape}.")
            self.weight = weight_init
        else:
            self.weight = Parameter(initializer(weight_init, shape, mstype.float32), name="weight")
        self.multiplier = Parameter(Tensor(np.full([1], float(multiplier_init), np.float32)), name="multiplier")
        self.has_bias = bool(has_bias)
        if self.has_bias:
            if isinstance(bias_init, Parameter):
                self.bias = bias_init
            else:
                self.bias = Parameter(initializer(bias_init, (self.out_channels,), mstype.float32), name="bias")
        # The MatMul primitive with transpose_b, not ops.matmul(x, ops.transpose(w)) nor ``w.T``: in PyNative
        # mode (MindSpore 2.10) the product of a transposed view has no known shape/type until the launch
        # queue has run, so the loss's input check (ops.typeof) blocked the Python thread until the whole
        # forward pass had executed; every later operation of the step was then launched one at a time.
        self.matmul = ops.MatMul(transpose_b=True)
        # (ops.L2Normalize, one operator for the five of l2_normalize, was measured and not kept: on CPU with
        # MindSpore 2.10 it made the zoo's GEMM ResNet-10 step 1.7x O0's instead of 1.05x, bench/results/o1_parts.md)

    def construct(self, x):
        """The logits ``multiplier * normalize(x) @ normalize(W).T``."""
        dtype = x.dtype
        features = l2_normalize(x.astype(mstype.float32), 1)
        weight = l2_normalize(self.weight.astype(mstype.float32), 1)
        out = self.matmul(features, weight)
        if self.has_bias:
            out = out + self.bias.astype(mstype.float32)
        return (self.multiplier * out).astype(dtype)

    def extend_repr(self):
        """The cell's repr: its sizes."""
        return f"in_channels={self.in_channels}, out_channels={self.out_channels}, has_bias={self.has_bias}"

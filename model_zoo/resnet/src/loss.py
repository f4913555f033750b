"""Softmax cross-entropy with label smoothing (``CrossEntropySmooth`` of the ImageNet recipes)."""
from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops
from mindspore.nn.loss.loss import LossBase

__all__ = ["CrossEntropySmooth"]


class CrossEntropySmooth(LossBase):
    r"""Cross-entropy against smoothed one-hot targets.

    With ``K`` classes and smoothing factor ``s`` the target of a sample labelled ``y`` is
    :math:`t_k = 1 - s` for :math:`k = y` and :math:`t_k = s / (K - 1)` otherwise, and the loss is
    :math:`\ell = -\sum_k t_k \log \operatorname{softmax}(z)_k`, reduced over the batch.

    Args:
        sparse: labels are class indices (``True``) or already one-hot/probability rows (``False``).
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        smooth_factor: ``s`` in ``[0, 1)``.
        num_classes: ``K`` (must match the logits' last dimension).

    Inputs:
        logits: ``(N, K)``; labels: ``(N,)`` int32 when ``sparse`` else ``(N, K)``.
    """

    def __init__(self, sparse: bool = True, reduction: str = "mean", smooth_factor: float = 0.0,
                 num_classes: int = 1000):
        super().__init__()
        if reduction not in ("mean", "sum", "none"):
            raise ValueError(f"reduction={reduction!r} must be one of 'mean', 'sum', 'none'.")
        if not 0.0 <= float(smooth_factor) < 1.0:
            raise ValueError(f"smooth_factor={smooth_factor} must be in [0, 1).")
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"num_classes={num_classes!r} must be an int >= 2.")
        self.sparse = bool(sparse)
        self.num_classes = num_classes
        self.on_value = ms.Tensor(1.0 - smooth_factor, ms.float32)
        self.off_value = ms.Tensor(float(smooth_factor) / (num_classes - 1), ms.float32)
        self.onehot = ops.OneHot()
        self.ce = nn.SoftmaxCrossEntropyWithLogits(reduction=reduction)

    def construct(self, logits, labels):
        if self.sparse:
            labels = self.onehot(labels, self.num_classes, self.on_value, self.off_value)
        return self.ce(logits, ops.cast(labels, logits.dtype))

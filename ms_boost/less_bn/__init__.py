"""LessBN: fewer BatchNorm layers, a feature-normalised head, gradient centralization.

* :mod:`ms_boost.less_bn.convert` -- the BatchNorm reduction (data flow of each ``construct``), :class:`LessBN`,
  :func:`apply_less_bn` / :func:`apply_less_bn_eval` (the training and evaluation rewrites);
* :mod:`ms_boost.less_bn.spec` -- the ``less_bn`` section (:class:`LessBNConfig`) and ``SPEC``;
* shared pieces it uses: :mod:`ms_boost.fn_head` (the FN head) and :mod:`ms_boost.grad_process` (gradient
  centralization, optimizer rebuilding).
"""
from __future__ import annotations

from ms_boost.fn_head import CommonHeadLastFN, l2_normalize
from ms_boost.less_bn.convert import (
    LessBN,
    LessBNReport,
    apply_less_bn,
    apply_less_bn_eval,
    convert_less_bn,
    preview_less_bn,
)
from ms_boost.less_bn.spec import SPEC, LessBNConfig

__all__ = [
    "l2_normalize", "CommonHeadLastFN", "LessBN", "LessBNReport", "convert_less_bn", "apply_less_bn",
    "apply_less_bn_eval", "preview_less_bn", "LessBNConfig", "SPEC",
]

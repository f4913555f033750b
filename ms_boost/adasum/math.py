"""AdaSum math: pair coefficients, row-wise and segmented pair combination, the tree reduction.

Functions of tensors, usable in PyNative and inside ``construct`` in Graph mode (formulas in
:mod:`ms_boost.adasum`).
"""
from __future__ import annotations

from typing import Optional, Tuple

import mindspore as ms
from mindspore import Tensor, ops

__all__ = ["adasum_coefficients", "adasum_rows", "adasum_pair", "adasum_rows_segmented", "adasum_tree_reduce"]


#: Smallest normal float32: a squared norm below it counts as zero in the AdaSum coefficients.
_TINY = 1.1754944e-38


def _ratio(dot: Tensor, norm: Tensor) -> Tensor:
    r""":math:`a^\top b / (2\lVert a\rVert^2)` where :math:`\lVert a\rVert^2 \ge \tau`, else 0."""
    return ops.where(norm >= _TINY, dot / (2.0 * ops.maximum(norm, _TINY)), ops.zeros_like(dot))


def adasum_coefficients(dot: Tensor, norm_a: Tensor, norm_b: Tensor) -> Tuple[Tensor, Tensor]:
    r"""The two AdaSum coefficients from the inner product and the squared norms.

    .. math::

        c_a = 1 - \frac{a^\top b}{2\lVert a\rVert^2}, \qquad c_b = 1 - \frac{a^\top b}{2\lVert b\rVert^2},

    where a fraction whose squared norm is below :math:`\tau` (the smallest normal float32, so in
    particular 0) is taken as 0. A zero vector then has coefficient 1 and contributes nothing:
    :math:`\operatorname{AdaSum}(0, b) = b`, :math:`\operatorname{AdaSum}(0, 0) = 0`, never NaN. A
    vector whose squares underflow (:math:`\lVert a\rVert < \sqrt{\tau} \approx 10^{-19}`) is added
    as is, an error below :math:`10^{-19}`.

    Args:
        dot: :math:`a^\top b`.
        norm_a: :math:`\lVert a\rVert^2`.
        norm_b: :math:`\lVert b\rVert^2`.

    Returns:
        ``(c_a, c_b)``, broadcast like the inputs.
    """
    return 1.0 - _ratio(dot, norm_a), 1.0 - _ratio(dot, norm_b)


def adasum_rows(left: Tensor, right: Tensor) -> Tensor:
    r"""Row-wise AdaSum of two ``(P, n)`` matrices: row :math:`i` is :math:`\operatorname{AdaSum}(l_i, r_i)`.

    .. math::

        \operatorname{AdaSum}(l, r) = \Bigl(1 - \frac{l^\top r}{2\lVert l\rVert^2}\Bigr) l
                                   + \Bigl(1 - \frac{l^\top r}{2\lVert r\rVert^2}\Bigr) r

    Args:
        left: ``(P, n)`` float32.
        right: ``(P, n)`` float32.

    Returns:
        ``(P, n)`` float32.
    """
    dot = ops.sum(left * right, 1, keepdim=True)
    norm_l = ops.sum(left * left, 1, keepdim=True)
    norm_r = ops.sum(right * right, 1, keepdim=True)
    c_l, c_r = adasum_coefficients(dot, norm_l, norm_r)
    return c_l * left + c_r * right


def adasum_pair(a: Tensor, b: Tensor) -> Tensor:
    r"""AdaSum of two update tensors of the same shape, computed in float32.

    .. math::

        \operatorname{AdaSum}(a, b) = \Bigl(1 - \frac{a^\top b}{2\lVert a\rVert^2}\Bigr) a
                                   + \Bigl(1 - \frac{a^\top b}{2\lVert b\rVert^2}\Bigr) b

    where the inner product and norms run over all elements. Orthogonal inputs give :math:`a + b`,
    identical inputs give :math:`a`, a zero input gives the other one.

    Args:
        a: update tensor (any float dtype).
        b: update tensor of the same shape.

    Returns:
        float32 tensor of the shape of ``a``.
    """
    a32 = ops.reshape(ops.cast(a, ms.float32), (1, -1))
    b32 = ops.reshape(ops.cast(b, ms.float32), (1, -1))
    return ops.reshape(adasum_rows(a32, b32), a.shape)


def adasum_rows_segmented(left: Tensor, right: Tensor, indicator: Tensor, chunk: int) -> Tensor:
    r"""Row-wise AdaSum of two ``(P, m)`` matrices, separately on each segment (parameter tensor).

    Each row is a fused buffer of ``m = C * chunk`` elements: ``C`` chunks, chunk :math:`j` belonging to
    segment :math:`t` when :math:`E_{jt} = 1` (``indicator``, ``(C, T)``; padding chunks hold zeros).
    With :math:`\sigma_t(x) = \sum_j E_{jt} \sum_{e \in \text{chunk } j} x_e` the segment sum,

    .. math::

        \operatorname{AdaSum}(l, r)|_t = \Bigl(1 - \frac{\sigma_t(l \odot r)}{2\sigma_t(l \odot l)}\Bigr) l|_t
                                      + \Bigl(1 - \frac{\sigma_t(l \odot r)}{2\sigma_t(r \odot r)}\Bigr) r|_t .

    All segments of all rows are done with a fixed number of operations (chunk sums, one product
    with :math:`E` for the segment sums, one with :math:`E^\top` to spread the coefficients back),
    deterministic on every backend.

    Args:
        left: ``(P, m)`` float32.
        right: ``(P, m)`` float32.
        indicator: ``(C, T)`` float32 0/1.
        chunk: elements per chunk (``m / C``).

    Returns:
        ``(P, m)`` float32.
    """
    pairs = left.shape[0]
    left3 = ops.reshape(left, (pairs, -1, chunk))
    both = ops.concat((left3, ops.reshape(right, (pairs, -1, chunk))), 0)  # (2P, C, chunk): lefts, rights
    products = ops.concat((left3 * both[pairs:], both * both), 0)  # l.r, l.l, r.r
    sums = ops.matmul(ops.sum(products, -1), indicator)  # (3P, T) segment sums
    # the coefficients of lefts and rights together: 1 - dot / (2 norm), rows as in `both`
    coefficients = 1.0 - _ratio(ops.tile(sums[:pairs], (2, 1)), sums[pairs:])
    spread = ops.expand_dims(ops.matmul(coefficients, indicator.T), -1)  # (2P, C, 1) per chunk
    weighted = spread * both
    return ops.reshape(weighted[:pairs] + weighted[pairs:], (pairs, -1))


def adasum_tree_reduce(nodes: Tensor, plan: Tuple[Tuple[int, int, bool], ...], indicator: Optional[Tensor] = None,
                       chunk: int = 1) -> Tensor:
    r"""Reduce the rows of ``nodes`` (one update per server, in server order) with the AdaSum tree.

    At each level rows :math:`2i` and :math:`2i+1` are combined; with an odd number of rows the last
    one moves up unchanged:
    :math:`\operatorname{AdaSum}(g_{[0,n)}) = \operatorname{AdaSum}(\operatorname{AdaSum}(g_{[0,p)}),
    \operatorname{AdaSum}(g_{[p,n)}))`, :math:`p` the largest power of two below :math:`n`.

    Args:
        nodes: ``(n, m)`` float32, row ``s`` the update of server ``s``.
        plan: ``tuple(level.plan for level in adasum_schedule(n))``.
        indicator: ``None`` to treat each row as one vector (:func:`adasum_rows`), or the ``(C, T)``
            chunk-to-segment matrix of a fused buffer (:func:`adasum_rows_segmented`).
        chunk: elements per chunk when ``indicator`` is given.

    Returns:
        ``(m,)`` float32.
    """
    for num_nodes, num_pairs, has_carry in plan:
        left, right = nodes[0:2 * num_pairs:2], nodes[1:2 * num_pairs:2]
        if indicator is None:
            merged = adasum_rows(left, right)
        else:
            merged = adasum_rows_segmented(left, right, indicator, chunk)
        if has_carry:
            merged = ops.concat((merged, nodes[num_nodes - 1:num_nodes]), 0)
        nodes = merged
    return nodes[0]


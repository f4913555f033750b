r"""Numerical core of dimension-reduce training (stage 2), as small functions of MindSpore tensors.

Notation (one step, ``k`` = number of principal directions, ``M`` = number of trainable weights):

* :math:`P \in \mathbb{R}^{k \times M}` -- PCA matrix with orthonormal rows (top directions of the
  stage-1 weight trajectory); on rank :math:`r` of :math:`R` only a block :math:`P_r` of its rows lives.
* :math:`\nabla` -- the (rank-averaged) gradient flattened to :math:`\mathbb{R}^M`.
* :math:`g = P\nabla` -- projected gradient; :math:`B` -- inverse-Hessian approximation in
  :math:`\mathbb{R}^{k\times k}`; :math:`d = -Bg` -- quasi-Newton direction.
* Trial steps :math:`\rho^m d`, :math:`m = 0, 1, \dots`, accepted by Armijo's rule.
* Residual momentum :math:`\mu \leftarrow \gamma\mu + \nabla - P^\top g` (the part of the gradient outside
  the subspace), so that the full update is :math:`w \leftarrow w + \rho^m P^\top d - \alpha\mu`.

All functions are pure (no Parameter is touched) and run in PyNative and Graph mode; the Cell in
:mod:`ms_boost.dim_reduce.stage` holds the state and calls them.
"""
from __future__ import annotations

from typing import Tuple

from mindspore import Tensor, ops

from ms_boost.flat_buffers import flat_layout, flatten_tensors, split_flat

__all__ = [
    "curvature_ok", "bfgs_inverse_update", "quasi_newton_direction", "armijo_accepts", "project",
    "back_project", "residual_momentum", "flatten_tensors", "flat_layout", "split_flat", "local_row_block",
]


def curvature_ok(s: Tensor, y: Tensor, eps: float) -> Tensor:
    r"""Curvature condition of the BFGS update: :math:`y^\top s > \varepsilon`.

    Args:
        s: last accepted step in the subspace, shape ``(k,)``.
        y: change of the projected gradient over that step, shape ``(k,)``.
        eps: threshold (a small positive number).

    Returns:
        Boolean scalar tensor.
    """
    return ops.reduce_sum(y * s) > eps


def bfgs_inverse_update(h: Tensor, s: Tensor, y: Tensor, eps: float = 1e-20) -> Tensor:
    r"""BFGS update of the inverse-Hessian approximation, skipped when the curvature condition fails.

    .. math::
        \rho = \frac{1}{y^\top s}, \qquad
        H^+ = (I - \rho\, s y^\top)\, H\, (I - \rho\, y s^\top) + \rho\, s s^\top

    :math:`H^+` satisfies the secant condition :math:`H^+ y = s` and stays symmetric positive definite
    when :math:`H` is and :math:`y^\top s > 0`. When :math:`y^\top s \le \varepsilon` the function returns
    :math:`H` unchanged (no division by a tiny or negative number).

    Args:
        h: current approximation, shape ``(k, k)``.
        s: step, shape ``(k,)``.
        y: gradient change, shape ``(k,)``.
        eps: curvature threshold.

    Returns:
        The updated ``(k, k)`` matrix.
    """
    ok = curvature_ok(s, y, eps)
    ys = ops.reduce_sum(y * s)
    inv = 1.0 / ops.where(ok, ys, ops.ones_like(ys))
    k = h.shape[0]
    left = ops.eye(k, k, h.dtype) - inv * ops.outer(s, y)
    updated = ops.matmul(ops.matmul(left, h), left.T) + inv * ops.outer(s, s)
    return ops.where(ok, updated, h)


def quasi_newton_direction(h: Tensor, g: Tensor) -> Tensor:
    r"""Quasi-Newton direction :math:`d = -H g` (a descent direction when :math:`H \succ 0`).

    Args:
        h: inverse-Hessian approximation, ``(k, k)``.
        g: projected gradient, ``(k,)``.
    """
    return -ops.mv(h, g)


def armijo_accepts(new_loss: Tensor, old_loss: Tensor, step: Tensor, slope: Tensor, sigma: float) -> Tensor:
    r"""Armijo's sufficient-decrease test for the trial step :math:`t = \rho^m`.

    .. math::
        L(w + t P^\top d) < L(w) + \sigma\, t\, g^\top d

    (:math:`g^\top d < 0` for a descent direction, so the right side is below the current loss.)

    Args:
        new_loss: loss at the trial weights.
        old_loss: loss at the current weights.
        step: trial step length :math:`t`.
        slope: directional derivative :math:`g^\top d`.
        sigma: sufficient-decrease constant in (0, 1).

    Returns:
        Boolean scalar tensor.
    """
    return new_loss < old_loss + sigma * step * slope


def project(pca_rows: Tensor, flat: Tensor) -> Tensor:
    r"""Projection onto (a block of) the principal directions: :math:`P_r v`.

    Args:
        pca_rows: ``(c, M)`` rows of the PCA matrix.
        flat: ``(M,)`` vector.

    Returns:
        ``(c,)`` coefficients.
    """
    return ops.mv(pca_rows, flat)


def back_project(pca_rows: Tensor, coefficients: Tensor) -> Tensor:
    r"""Back-projection of coefficient vectors: :math:`C P_r = (P_r^\top C^\top)^\top`.

    Summed over all ranks' row blocks this is :math:`C P`: row :math:`j` is :math:`P^\top c_j`.

    Args:
        pca_rows: ``(c, M)`` rows of the PCA matrix.
        coefficients: ``(n, c)``, one coefficient vector per row (``n`` vectors back-projected at once).

    Returns:
        ``(n, M)``.
    """
    return ops.matmul(coefficients, pca_rows)


def residual_momentum(momentum: Tensor, grad: Tensor, grad_in_subspace: Tensor, gamma: float) -> Tensor:
    r"""Residual momentum: :math:`\mu^+ = \gamma\mu + (\nabla - P^\top P \nabla)`.

    Args:
        momentum: previous :math:`\mu` (any shape).
        grad: gradient :math:`\nabla` (same shape).
        grad_in_subspace: :math:`P^\top P\nabla` restricted to the same entries.
        gamma: decay in [0, 1).
    """
    return gamma * momentum + (grad - grad_in_subspace)


def local_row_block(n_components: int, rank: int, rank_size: int) -> Tuple[int, int, int]:
    r"""Rows of the PCA matrix held by ``rank``: the block ``[start, stop)`` and the padded block height.

    Every rank holds :math:`c = \lceil k / R \rceil` rows (zero-padded at the end when fewer remain), so
    the blocks gathered in rank order start with the ``k`` real rows: ``gathered[:k]`` is the full vector
    for any ``k`` and ``R`` (ranks past the end hold only padding).

    Args:
        n_components: ``k``.
        rank: this rank, in ``[0, R)``.
        rank_size: ``R``.

    Returns:
        ``(start, stop, c)`` with ``0 <= stop - start <= c``.
    """
    if rank_size < 1 or not 0 <= rank < rank_size:
        raise ValueError(f"rank={rank} must be in [0, rank_size={rank_size}).")
    if n_components < 1:
        raise ValueError(f"n_components={n_components} must be >= 1.")
    height = -(-n_components // rank_size)
    start = min(rank * height, n_components)
    stop = min(start + height, n_components)
    return start, stop, height

r"""Numerical core of THOR: Kronecker-factor statistics, damped block inverses, the preconditioned update.

Every function here is a pure function of tensors (no Parameters, no communication) built only from
MindSpore operators that exist on CPU, GPU and Ascend (``matmul``, ``unfold``, ``pad``, ``cholesky``,
``solve_triangular``), so it runs unchanged in PyNative and Graph mode. Shapes are static: Python integers
passed in are read at trace time.

Notation for one layer with weight :math:`W` (``d_out x d_in``; a convolution's kernel flattened to
``C_out x C_in k_h k_w``) and, if it has one, bias :math:`b` appended as an extra column
(:math:`\tilde W = [W \,|\, b]`, the input gets an extra constant 1):

* :math:`a_r` -- one *row* of the layer input: a sample for a dense layer, a sample-and-position patch
  (im2col) for a convolution; :math:`R` rows in a batch of :math:`N` samples (:math:`R = N T` for
  :math:`T` positions).
* :math:`\delta_r` -- the gradient of the (batch-mean) loss with respect to the layer output at that row.

The Fisher block of the layer is approximated (K-FAC / KFC) by :math:`F \approx A \otimes G` with

.. math::
    A = \frac{1}{R}\sum_r \tilde a_r \tilde a_r^{\top}, \qquad
    G = N \sum_r \delta_r \delta_r^{\top}.

:math:`N\delta_r` is the per-sample gradient of a mean loss, so :math:`G` is the per-sample output-gradient
second moment; for a convolution the :math:`T` positions add up (KFC's spatially uncorrelated
approximation: :math:`F \approx \bar A \otimes T \bar G`), which is exactly the formula above. Both factors
use the real number of rows and samples of each batch, so no batch size has to be configured.

*Sub-batch statistics* (:func:`stat_sample_count`, :func:`leading_samples`): the factors may be estimated on the
first :math:`k \le N` samples of the batch only (Martens & Grosse 2015 compute the curvature statistics on a part of
the mini-batch). Then :math:`A` averages the :math:`R_k` rows of those samples and

.. math::
    G = \frac{N^2}{k} \sum_{r \in \text{first } k} \delta_r \delta_r^{\top}
      = \frac{1}{k} \sum_{n < k} \sum_t (N\delta_{n,t})(N\delta_{n,t})^{\top},

the same per-sample second moment estimated on :math:`k` samples (:math:`N\delta` is still the per-sample gradient:
the loss averaged over all :math:`N`). With :math:`k = N` both are the formulas above.

The update direction with damping :math:`\lambda` is

.. math::
    \Delta \tilde W = (G + \sqrt{\lambda} I)^{-1}\, \nabla_{\tilde W} L\, (A + \sqrt{\lambda} I)^{-1},

where each damped factor larger than the block size is approximated by its diagonal blocks (inverted
independently, as upstream's ``split_dim``) and every block is inverted through its Cholesky factor
:math:`M = L L^{\top}`, :math:`M^{-1} = L^{-\top} L^{-1}` -- when that is numerically safe
(:func:`cholesky_safe`); otherwise through the symmetric eigendecomposition with the eigenvalues clamped
at 0 before the damping is added (:func:`clamped_eigen_block_inverse`), which cannot fail on finite input.
"""
from __future__ import annotations

import math
from typing import Sequence, Tuple

import mindspore as ms
from mindspore import Tensor, ops
from mindspore.ops.primitive import constexpr
from mindspore.scipy.linalg import solve_triangular

from ms_boost.gemm_conv import unfold_columns
from ms_boost.thor.assignment import block_layout

__all__ = [
    "conv_pads", "im2col", "split_groups", "append_ones", "input_factor", "output_factor", "block_gram",
    "block_input_factor", "block_output_factor", "factor_trace",
    "token_frequencies", "running_average", "block_layout", "diagonal_blocks", "diagonal_tiles", "damped_block_inverse",
    "damped_diagonal_inverse", "block_diag_left", "block_diag_right", "dense_block_diagonal", "kronecker_precondition",
    "embedding_precondition", "clip_by_norm", "momentum_step", "CHOLESKY_SAFE_RATIO", "symmetrise",
    "all_finite", "blocks_finite", "pi_damping", "cholesky_safe", "cholesky_block_inverse",
    "clamped_eigen_block_inverse",
    "trust_region_scale", "damped_blocks", "guarded_block_inverse", "narrow", "any_true", "stat_sample_count",
    "leading_samples", "last_replaced", "leading_one",
]

#: A damped block :math:`B + s I` is inverted through Cholesky only when :math:`s \ge \tau \max_i B_{ii}`
#: with :math:`\tau` = this ratio; below it fp32 round-off could make :math:`B + sI` numerically indefinite
#: (``cholesky`` then raises inside MindSpore) and the clamped eigen-inverse is used instead.
CHOLESKY_SAFE_RATIO = 2.0 ** -10

_REDUCE_MAX = ops.ReduceMax(keep_dims=False)
_REDUCE_ALL = ops.ReduceAll(keep_dims=False)
_REDUCE_ANY = ops.ReduceAny(keep_dims=False)

# Graph-mode compile time. MindSpore type-infers a Python-level wrapper (``Tensor.swapaxes``, ``ops.matmul``,
# ``ops.pad``, ``ops.eye``, tensor slicing, ``Tensor.sum(axis)``, ``ops.clamp``) anew at every call site and
# shape, 5-33 ms each, while a primitive with static arguments costs 1-2 ms (40 calls of ``x.swapaxes(-1, -2)``:
# +1.3 s, of ``Transpose`` with a static permutation: +0.05 s). THOR makes hundreds of such calls per step, so
# the math below goes through these primitives and the small helpers after them. Products stay ``ops.matmul``
# (cheap to compile; a ``BatchMatMul`` with transposed operands rounds differently on CPU).
_TRANSPOSE = ops.Transpose()
_EYE = ops.Eye()
_REDUCE_SUM = ops.ReduceSum(keep_dims=False)
_SLICE = ops.Slice()
_CONCAT_LAST = ops.Concat(-1)

# Static shape arithmetic is computed by ``constexpr`` helpers: in Graph mode, MindSpore 2.10 type-infers
# tuple slicing, concatenation and repetition (``shape[:-1] + (1,)``, ``(0,) * k``) and the builtins ``int``,
# ``float``, ``max`` through its graph machinery, about 10-20 ms per call site and shape, while a ``constexpr``
# function runs once as Python (40 call sites of ``narrow``'s bounds: +0.3-0.5 CPU-s inline, nothing measurable
# as ``constexpr``; docs/thor.md "Compile time, seventh round"). The values are the same Python ints and tuples.


@constexpr
def _last2_perm(rank: int) -> tuple:
    """The permutation swapping the last two of ``rank`` axes."""
    return tuple(range(rank - 2)) + (rank - 1, rank - 2)


@constexpr
def _last2_paddings(rank: int, rows: int, cols: int) -> tuple:
    """``Pad``'s paddings adding ``rows`` rows and ``cols`` columns at the end of the last two of ``rank`` axes."""
    return ((0, 0),) * (rank - 2) + ((0, rows), (0, cols))


@constexpr
def _narrow_bounds(shape: tuple, axis: int, start: int, count: int) -> tuple:
    """``(begin, size)`` of ``Slice`` for :func:`narrow`."""
    begin = (0,) * axis + (start,) + (0,) * (len(shape) - axis - 1)
    return begin, tuple(shape[:axis]) + (count,) + tuple(shape[axis + 1:])


@constexpr
def last_replaced(shape: tuple, last: int) -> tuple:
    """``shape`` with its last entry replaced by ``last`` (static: a ``constexpr``, see the note above)."""
    return tuple(shape[:-1]) + (last,)


@constexpr
def leading_one(shape: tuple) -> tuple:
    """``(1,) + shape`` (static: a ``constexpr``, see the note above)."""
    return (1,) + tuple(shape)


@constexpr
def _as_float(value) -> float:
    """``float(value)`` of a static number."""
    return float(value)


_static_block_layout = constexpr(block_layout)


def _transpose_last2(x: Tensor) -> Tensor:
    """``x`` with its last two axes swapped (``Transpose`` with a static permutation; see the compile-time note)."""
    return _TRANSPOSE(x, _last2_perm(x.ndim))


def _eye(n: int) -> Tensor:
    """float32 identity ``(n, n)``."""
    return _EYE(n, n, ms.float32)


def _pad_last2(x: Tensor, rows: int, cols: int) -> Tensor:
    """Zero-pad ``x`` with ``rows`` rows and ``cols`` columns at the end of its last two axes."""
    return ops.Pad(_last2_paddings(x.ndim, rows, cols))(x)


def narrow(x: Tensor, axis: int, start: int, count: int) -> Tensor:
    """``count`` entries of ``x`` from ``start`` along non-negative ``axis``: ``x[..., start:start + count, ...]``.

    One ``Slice`` with static bounds (tensor indexing compiles several times slower in Graph mode).
    """
    begin, size = _narrow_bounds(x.shape, axis, start, count)
    return _SLICE(x, begin, size)


def conv_pads(pad_mode: str, padding, in_hw: Sequence[int], kernel_size: Sequence[int],
              stride: Sequence[int], dilation: Sequence[int]) -> Tuple[int, int, int, int]:
    r"""Explicit (top, bottom, left, right) padding of a 2-D convolution, as ``Conv2D`` applies it.

    ``"valid"`` pads nothing; ``"pad"`` uses ``padding`` (an int or a (top, bottom, left, right) tuple);
    ``"same"`` pads :math:`p = \max((\lceil H/s \rceil - 1)s + (k-1)d + 1 - H, 0)` per axis, with
    :math:`\lfloor p/2 \rfloor` before and the rest after (the extra row/column goes bottom/right).

    Args:
        pad_mode: ``"same"``, ``"valid"`` or ``"pad"`` (any case).
        padding: int or 4-tuple, used by ``"pad"`` only.
        in_hw: input height and width.
        kernel_size, stride, dilation: (height, width) pairs.

    Returns:
        ``(top, bottom, left, right)`` Python ints.
    """
    mode = pad_mode.lower()
    if mode == "valid":
        return 0, 0, 0, 0
    if mode == "pad":
        if isinstance(padding, int):
            return padding, padding, padding, padding
        top, bottom, left, right = padding
        return int(top), int(bottom), int(left), int(right)
    if mode != "same":
        raise ValueError(f"conv_pads: pad_mode={pad_mode!r} is not one of 'same', 'valid', 'pad'.")
    pads = []
    for size, k, s, d in zip(in_hw, kernel_size, stride, dilation):
        out = -(-size // s)
        total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
        pads += [total // 2, total - total // 2]
    return pads[0], pads[1], pads[2], pads[3]


def im2col(x: Tensor, kernel_size: Sequence[int], stride: Sequence[int], dilation: Sequence[int],
           pads: Sequence[int]) -> Tensor:
    r"""Convolution patches as rows: ``(N, C, H, W)`` -> ``(N * H_out * W_out, C * k_h * k_w)``.

    Row :math:`r = (n, i, j)` holds the receptive field of output position :math:`(i, j)` of sample
    :math:`n`, columns ordered channel-major like a kernel ``(C_out, C, k_h, k_w)`` reshaped to
    ``(C_out, C k_h k_w)``, so that ``conv(x, W)[n, :, i, j] = W_flat @ patch_r``. Zero padding (``pads``) is
    the convolution's own (:func:`ms_boost.gemm_conv.unfold_columns`, the columns the CPU convolution
    multiplies, transposed to rows).
    """
    cols = unfold_columns(x, kernel_size, stride, dilation, pads)
    width = cols.shape[1]
    return cols.transpose(0, 2, 1).reshape(-1, width)


def split_groups(rows: Tensor, groups: int) -> Tensor:
    """``(R, groups * d)`` -> ``(groups, R, d)``: the columns of each channel group as its own batch entry."""
    count, width = rows.shape
    return rows.reshape(count, groups, width // groups).transpose(1, 0, 2)


def append_ones(rows: Tensor) -> Tensor:
    r"""Append a constant-1 column to ``(..., R, d)`` rows: :math:`\tilde a = [a; 1]`, the bias input."""
    ones = ops.ones(last_replaced(rows.shape, 1), rows.dtype)
    return _CONCAT_LAST((rows, ones))


def input_factor(rows: Tensor) -> Tensor:
    r"""Input factor :math:`A = \frac{1}{R} \tilde a^{\top} \tilde a` of ``(groups, R, d)`` rows -> ``(groups, d, d)``.

    Computed in float32 whatever the input type.
    """
    rows = ops.cast(rows, ms.float32)
    return ops.matmul(_transpose_last2(rows), rows) / rows.shape[-2]


def output_factor(rows: Tensor, n_samples: int, loss_scale: Tensor) -> Tensor:
    r"""Output-gradient factor :math:`G = N \sum_r \delta_r \delta_r^{\top}` of ``(groups, R, d)`` rows.

    The rows captured in the backward pass carry the loss scale :math:`s` (the sensitivity the backward
    started from), so they are divided by ``loss_scale`` first: :math:`\delta_r = \hat\delta_r / s`.
    Computed in float32.

    Args:
        rows: ``(groups, R, d)`` output gradients, one row per sample and position.
        n_samples: :math:`N`, the number of samples the batch-mean loss averaged over.
        loss_scale: scalar Tensor :math:`s`.
    """
    rows = ops.cast(rows, ms.float32) / ops.cast(loss_scale, ms.float32)
    return ops.matmul(_transpose_last2(rows), rows) * n_samples


def _diagonal_mask(n_blocks: int, block: int, dim: int) -> Tensor:
    """``(n_b, b, b)`` float32: ones on the diagonal entries of the blocks that belong to the ``dim``-wide factor."""
    tail = dim - (n_blocks - 1) * block
    if tail == block:
        return ops.BroadcastTo((n_blocks, block, block))(_eye(block))
    last = _pad_last2(_eye(tail), block - tail, block - tail).reshape(1, block, block)
    if n_blocks == 1:
        return last
    return ops.concat((ops.BroadcastTo((n_blocks - 1, block, block))(_eye(block)), last), 0)


def block_gram(rows: Tensor, block_size: int, scale) -> Tensor:
    r"""``scale`` times :math:`a^{\top} a` of ``(groups, R, d)`` float32 rows, as THOR stores a factor.

    ``(groups, d, d)`` when ``d <= block_size``; otherwise only the diagonal blocks,
    ``(groups, n_b, b, b)`` (:func:`~ms_boost.thor.assignment.factor_shape`): the full blocks from one batched
    product over the rows cut into ``b``-wide column tiles, the last, narrower block (when ``b`` does not
    divide ``d``) from its own product, completed with the identity -- exactly the blocks
    :func:`diagonal_blocks` cuts from the whole :math:`d \times d` product, at :math:`R\,d\,b` instead of
    :math:`R\,d^2` multiply-adds.
    """
    groups, count, dim = rows.shape
    n_blocks, block = _static_block_layout(dim, block_size)
    if n_blocks == 1:
        return ops.matmul(_transpose_last2(rows), rows) * scale
    tail = dim - (n_blocks - 1) * block
    full = n_blocks if tail == block else n_blocks - 1
    head = rows if full * block == dim else narrow(rows, 2, 0, full * block)
    tiles = _TRANSPOSE(head.reshape(groups, count, full, block), (0, 2, 1, 3))  # (groups, full, R, b)
    gram = ops.matmul(_transpose_last2(tiles), tiles) * scale
    if full == n_blocks:
        return gram
    last = narrow(rows, 2, full * block, tail)
    pad = block - tail
    last_gram = _pad_last2(ops.matmul(_transpose_last2(last), last) * scale, pad, pad)
    last_gram = last_gram + (_eye(block) - _pad_last2(_eye(tail), pad, pad))
    return ops.concat((gram, last_gram.reshape(groups, 1, block, block)), 1)


def block_input_factor(rows: Tensor, block_size: int) -> Tensor:
    r""":func:`input_factor` as THOR stores it: whole up to ``block_size``, else its diagonal blocks only."""
    rows = ops.cast(rows, ms.float32)
    return block_gram(rows, block_size, 1.0 / rows.shape[-2])


def block_output_factor(rows: Tensor, n_samples: int, loss_scale: Tensor, block_size: int,
                        stat_samples: int = 0) -> Tensor:
    r""":func:`output_factor` as THOR stores it: whole up to ``block_size``, else its diagonal blocks.

    ``stat_samples`` :math:`k`: the rows are those of the first :math:`k` of the batch's :math:`N` samples (0: all
    :math:`N`), and the factor is :math:`\frac{N^2}{k}\sum_r \delta_r\delta_r^{\top}` (module docstring,
    sub-batch statistics).
    """
    rows = ops.cast(rows, ms.float32) / ops.cast(loss_scale, ms.float32)
    if stat_samples == 0 or stat_samples == n_samples:
        return block_gram(rows, block_size, _as_float(n_samples))
    return block_gram(rows, block_size, float(n_samples) * float(n_samples) / float(stat_samples))


def stat_sample_count(batch: int, fraction: float) -> int:
    r"""The :math:`k` samples of a batch of ``batch`` that the statistics use: :math:`\lceil fN \rceil`, in [1, N].

    A fraction of 1 is the whole batch. Pure Python (the batch size is static at trace time).
    """
    if fraction >= 1.0:
        return batch
    return min(batch, max(1, math.ceil(fraction * batch - 1e-9)))


def leading_samples(x: Tensor, count: int) -> Tensor:
    """The first ``count`` samples of ``x`` (axis 0); ``x`` itself when that is all of them."""
    if count >= x.shape[0]:
        return x
    return narrow(x, 0, 0, count)


def factor_trace(factor: Tensor, dim: int) -> Tensor:
    r"""Per-group trace ``(groups,)`` of a stored factor of dimension ``dim``.

    ``factor`` is ``(groups, d, d)``, its diagonal blocks ``(groups, n_b, b, b)`` (the trace of the whole factor is
    the sum of the blocks' traces; the identity completing the last block is not counted), or a diagonal ``(d,)``
    factor (its sum, shaped ``(1,)``).
    """
    if factor.ndim == 1:
        return _REDUCE_SUM(factor, ()).reshape(1)
    factor = ops.cast(factor, ms.float32)
    if factor.ndim == 3:
        return _REDUCE_SUM(factor * _eye(factor.shape[-1]), (-1, -2))
    mask = _diagonal_mask(factor.shape[1], factor.shape[-1], dim)
    return _REDUCE_SUM(factor * mask, (1, 2, 3))


def token_frequencies(ids: Tensor, vocab_size: int) -> Tensor:
    r"""Diagonal input factor of an embedding: :math:`A_{vv} = \frac{1}{T}\,\#\{t : \mathrm{id}_t = v\}`.

    An embedding lookup is a dense layer on one-hot inputs, whose second moment is diagonal: the
    frequency of each token among the :math:`T` looked-up ids. Returns ``(vocab_size,)`` float32.
    """
    flat = ops.cast(ids.reshape(-1), ms.int32)
    counts = ops.unsorted_segment_sum(ops.ones(flat.shape, ms.float32), flat, vocab_size)
    return counts / flat.shape[0]


def running_average(old: Tensor, new: Tensor, decay: float, has_old: Tensor) -> Tensor:
    r"""Exponential running average :math:`F \leftarrow \beta F + (1-\beta) F_{new}`; the first value is taken as is.

    Args:
        old: previous factor.
        new: this step's statistics.
        decay: :math:`\beta \in [0, 1)`; 0 keeps only the newest statistics.
        has_old: boolean scalar Tensor, False before the first fold (then ``new`` is returned).
    """
    if decay == 0.0:
        return new
    weight = ops.cast(has_old, ms.float32) * decay
    return new + (old - new) * weight


def diagonal_blocks(factor: Tensor, block_size: int) -> Tensor:
    r"""Diagonal blocks of symmetric ``(groups, d, d)`` factors -> ``(groups, n_b, b, b)``.

    :math:`F` is zero-padded to :math:`n_b b` rows and columns with ones on the padded diagonal, i.e.
    :math:`\mathrm{blockdiag}(F, I)`, then cut into the :math:`n_b` diagonal :math:`b \times b` blocks
    (off-diagonal blocks are dropped: the block-diagonal approximation). The result is symmetrised,
    :math:`\frac{1}{2}(B + B^{\top})`, so rounding cannot make Cholesky see an asymmetric matrix.
    """
    return symmetrise(diagonal_tiles(factor, block_size))


def diagonal_tiles(factor: Tensor, block_size: int) -> Tensor:
    """:func:`diagonal_blocks` before the symmetrisation (a caller batching many factors symmetrises once)."""
    groups, dim = factor.shape[0], factor.shape[-1]
    n_blocks, block = _static_block_layout(dim, block_size)
    padded = n_blocks * block
    if padded != dim:
        extra = padded - dim
        pad_eye = _eye(padded) - _pad_last2(_eye(dim), extra, extra)
        factor = _pad_last2(factor, extra, extra) + pad_eye
    if n_blocks == 1:
        return factor.reshape(groups, 1, block, block)
    tiles = _TRANSPOSE(factor.reshape(groups, n_blocks, block, n_blocks, block), (0, 1, 3, 2, 4))
    mask = _eye(n_blocks).reshape(1, n_blocks, n_blocks, 1, 1)
    return _REDUCE_SUM(tiles * mask, 2)


def symmetrise(matrix: Tensor) -> Tensor:
    r""":math:`\frac{1}{2}(M + M^{\top})` over the last two axes."""
    return (matrix + _transpose_last2(matrix)) * 0.5


def all_finite(x: Tensor) -> Tensor:
    """Boolean scalar Tensor: no inf or NaN in ``x``."""
    return _REDUCE_ALL(ops.isfinite(x), ())


def any_true(x: Tensor) -> Tensor:
    """Boolean scalar Tensor: some entry of boolean ``x`` is True (the primitive: faster to compile than ``.any()``)."""
    return _REDUCE_ANY(x, ())


def blocks_finite(blocks: Tensor) -> Tensor:
    """Per ``(b, b)`` block of ``(..., b, b)`` blocks: no inf or NaN in it (boolean, shaped ``(...)``)."""
    return _REDUCE_ALL(ops.isfinite(blocks), (-2, -1))  # the primitive: compiles faster than Tensor.all(axis)


def pi_damping(a_factor: Tensor, g_factor: Tensor, low: float = 1e-3, high: float = 1e3, a_dim: int = 0,
               g_dim: int = 0) -> Tensor:
    r"""Factored Tikhonov split of the damping (Martens & Grosse 2015, sec. 6.3) -> ``(groups,)`` :math:`\pi`.

    .. math::
        \pi = \sqrt{\frac{\operatorname{tr}(A)/d_A}{\operatorname{tr}(G)/d_G}},

    :math:`A` then gets :math:`\pi\sqrt\lambda` and :math:`G` gets :math:`\sqrt\lambda/\pi` (their product
    keeps :math:`\lambda`). :math:`\pi` is clamped to ``[low, high]``, and is 1 where a trace is not
    positive and finite. A diagonal (embedding) input factor uses the sum of its entries as trace. Factors stored
    as diagonal blocks (:func:`factor_trace`) need their dimensions ``a_dim`` / ``g_dim`` (0: the last axis, allowed
    only for whole or diagonal factors: a block-stored factor without its dimension raises ``ValueError``).
    """
    if (a_factor.ndim == 4 and not a_dim) or (g_factor.ndim == 4 and not g_dim):
        raise ValueError(f"pi_damping: a factor stored as diagonal blocks (shapes {a_factor.shape}, {g_factor.shape}) "
                         f"needs its dimension: a_dim={a_dim}, g_dim={g_dim}; allowed: the factor's width d >= 1 "
                         f"(0 only for a whole (groups, d, d) or diagonal factor).")
    a_dim = a_dim or a_factor.shape[-1]
    g_dim = g_dim or g_factor.shape[-1]
    a_mean = factor_trace(ops.cast(a_factor, ms.float32), a_dim) / a_dim
    g_mean = factor_trace(ops.cast(g_factor, ms.float32), g_dim) / g_dim
    valid = ops.logical_and(ops.logical_and(a_mean > 0, g_mean > 0),
                            ops.logical_and(ops.isfinite(a_mean), ops.isfinite(g_mean)))
    ratio = ops.select(valid, a_mean / ops.select(valid, g_mean, ops.ones_like(g_mean)), ops.ones_like(a_mean))
    return ops.minimum(ops.maximum(ops.sqrt(ratio), low), high)  # ratio > 0: no NaN to treat


def cholesky_safe(blocks: Tensor, shift: Tensor, ratio: float = CHOLESKY_SAFE_RATIO) -> Tensor:
    r"""Which symmetric ``(k, b, b)`` blocks can be inverted through fp32 Cholesky after adding ``shift`` -> ``(k,)``.

    A block is *safe* when it is finite and :math:`s \ge \tau \max(\max_i |B_{ij}|, \epsilon)` with
    :math:`\tau` = ``ratio``. For a factor that is positive semi-definite up to round-off (what K-FAC
    statistics are: averages of outer products), its most negative eigenvalue is of order
    :math:`u\sqrt{R}\,\lVert B\rVert` and Cholesky's own backward error of order :math:`b\,u\lVert B \rVert`
    (:math:`u = 2^{-24}`), both far below :math:`\tau\lVert B\rVert`; :math:`\max|B_{ij}|` is the largest
    diagonal entry of a PSD matrix, within a factor :math:`b` of :math:`\lVert B\rVert_2`.
    """
    # reduction primitives, not the Tensor methods: these compile several times faster in Graph mode
    scale = _REDUCE_MAX(ops.abs(blocks), (-2, -1))
    finite = blocks_finite(blocks)
    enough = shift >= ops.maximum(scale, 1e-30) * ratio
    return ops.logical_and(ops.logical_and(finite, enough), shift > 0)


def cholesky_block_inverse(blocks: Tensor, shift: Tensor) -> Tensor:
    r"""``(k, b, b)`` inverses :math:`(B + sI)^{-1} = L^{-\top}L^{-1}`, :math:`B + sI = LL^{\top}`, ``shift`` ``(k,)``.

    Only for blocks :func:`cholesky_safe` accepts (``cholesky`` raises inside MindSpore on a matrix it
    finds indefinite).
    """
    eye = _eye(blocks.shape[-1])
    damped = blocks + eye * shift.reshape(-1, 1, 1)
    lower = ops.cholesky(damped)
    lower_inv = solve_triangular(lower, ops.BroadcastTo(damped.shape)(eye), lower=True)
    return ops.matmul(_transpose_last2(lower_inv), lower_inv)


def clamped_eigen_block_inverse(blocks: Tensor, shift: Tensor) -> Tensor:
    r"""``(k, b, b)`` inverses :math:`V \operatorname{diag}(\max(\mu, 0) + s)^{-1} V^{\top}` of symmetric blocks.

    :math:`B = V\operatorname{diag}(\mu)V^{\top}`: eigenvalues made negative by round-off are clamped at 0,
    so the damped inverse is symmetric positive definite with eigenvalues at most :math:`1/s`. Computed
    from the (batched) SVD :math:`B = U\Sigma V^{\top}`: for symmetric :math:`B`, :math:`\mu_i = \sigma_i
    \operatorname{sign}(u_i^{\top} v_i)`. Never raises on finite input.
    """
    singular, left, right = ops.svd(blocks)
    sign = ops.sign(_REDUCE_SUM(left * right, -2))
    eigen = ops.relu(singular * sign) + shift.reshape(-1, 1)
    return ops.matmul(right / eigen.reshape(eigen.shape[0], 1, eigen.shape[1]), _transpose_last2(right))


def damped_block_inverse(factor: Tensor, damping: Tensor, block_size: int) -> Tensor:
    r"""Inverses of the diagonal blocks of :math:`F + \sqrt{\lambda} I` (Cholesky, or the clamped eigen-inverse).

    For every block :math:`B` of :func:`diagonal_blocks` (symmetrised): :math:`B + \sqrt{\lambda} I = L L^{\top}`,
    :math:`L^{-1}` by a triangular solve against :math:`I`, and
    :math:`(B + \sqrt{\lambda} I)^{-1} = L^{-\top} L^{-1}`; when any block is not :func:`cholesky_safe`, all
    blocks go through :func:`clamped_eigen_block_inverse` instead. Never raises on finite input.

    Args:
        factor: ``(groups, d, d)`` symmetric positive semi-definite factor.
        damping: scalar Tensor :math:`\lambda > 0` (its square root is added).
        block_size: largest block; bigger factors are split.

    Returns:
        ``(groups, n_b, b, b)`` float32 block inverses.
    """
    groups = factor.shape[0]
    shift = ops.BroadcastTo((groups,))(ops.sqrt(ops.cast(damping, ms.float32)).reshape(1))
    inverse, _ = guarded_block_inverse(factor, shift, block_size)
    return inverse


def damped_blocks(factor: Tensor, shift: Tensor, block_size: int) -> Tuple[Tensor, Tensor]:
    """``(k, b, b)`` symmetrised diagonal blocks of ``(groups, d, d)`` ``factor`` and their ``(k,)`` shifts.

    ``shift`` is ``(groups,)`` (one damping per channel group, e.g. after :func:`pi_damping`).
    """
    blocks = diagonal_blocks(ops.cast(factor, ms.float32), block_size)
    groups, n_blocks, block = blocks.shape[0], blocks.shape[1], blocks.shape[2]
    shifts = ops.BroadcastTo((groups, n_blocks))(ops.cast(shift, ms.float32).reshape(groups, 1)).reshape(-1)
    return blocks.reshape(groups * n_blocks, block, block), shifts


def guarded_block_inverse(factor: Tensor, shift: Tensor, block_size: int) -> Tuple[Tensor, Tensor]:
    """Block inverses of ``factor + shift I`` that cannot raise, and the number of blocks that needed the fallback.

    Args:
        factor: ``(groups, d, d)`` finite factor, positive semi-definite up to round-off.
        shift: ``(groups,)`` positive damping added to each group's blocks.
        block_size: largest diagonal block.

    Returns:
        ``((groups, n_b, b, b) inverses, float32 count of blocks not Cholesky-safe)``; when that count is
        positive every block is inverted by :func:`clamped_eigen_block_inverse`.
    """
    flat, shifts = damped_blocks(factor, shift, block_size)
    groups = factor.shape[0]
    block = flat.shape[-1]
    safe = cholesky_safe(flat, shifts)
    unsafe = _REDUCE_SUM(ops.cast(ops.logical_not(safe), ms.float32), ())
    if _REDUCE_ALL(safe, ()):
        inverse = cholesky_block_inverse(flat, shifts)
    else:
        inverse = clamped_eigen_block_inverse(flat, shifts)
    return inverse.reshape(groups, -1, block, block), unsafe


def trust_region_scale(vg_sum: Tensor, lr: Tensor, kl_clip: float) -> Tensor:
    r"""Trust-region factor :math:`\nu = \min(1, \sqrt{c / (\eta^2 \sum_l \langle F_l^{-1} g_l, g_l\rangle)})`.

    :math:`c` = ``kl_clip`` bounds the predicted change of the model,
    :math:`\eta^2 \Delta^{\top} F \Delta` with :math:`\Delta = \nu F^{-1} g`, by :math:`c` (kfac-pytorch's
    ``kl_clip``, after Martens & Grosse 2015). A zero sum gives 1; a non-finite one gives a non-finite
    :math:`\nu` (the step is then skipped).

    Args:
        vg_sum: scalar :math:`\sum_l \langle F_l^{-1} g_l, g_l\rangle` over the preconditioned layers.
        lr: scalar learning rate :math:`\eta`.
        kl_clip: :math:`c > 0`.
    """
    quad = ops.abs(vg_sum) * ops.cast(lr, ms.float32) * ops.cast(lr, ms.float32)
    nu = ops.minimum(ops.sqrt(ops.reciprocal(quad + 1e-30) * kl_clip), 1.0)  # (compiles faster than ops.clamp)
    return ops.cast(nu + quad * 0.0, ms.float32)  # inf/NaN in the sum propagate (clamp would hide them)


def damped_diagonal_inverse(diagonal: Tensor, damping: Tensor) -> Tensor:
    r"""Inverse of a diagonal factor: :math:`(a + \sqrt{\lambda})^{-1}` elementwise."""
    return 1.0 / (ops.cast(diagonal, ms.float32) + ops.sqrt(ops.cast(damping, ms.float32)))


def block_diag_left(blocks: Tensor, x: Tensor) -> Tensor:
    r"""Left product by a block-diagonal matrix: ``(g, n_b, b, b)`` times ``(g, d, m)`` -> ``(g, d, m)``.

    :math:`x` is zero-padded to :math:`n_b b` rows (the padded part of the block-diagonal matrix never
    mixes with real rows), each row block multiplied by its block, and the padding cut off. ``blocks`` may
    also be the block-diagonal matrix written out, ``(g, d, d)`` (:func:`dense_block_diagonal`): one product.
    """
    if blocks.ndim == 3:
        return ops.matmul(blocks, x)
    groups, dim, width = x.shape
    n_blocks, block = blocks.shape[1], blocks.shape[2]
    if n_blocks == 1:
        return ops.matmul(blocks.reshape(groups, block, block), x)
    padded = n_blocks * block
    if padded != dim:
        x = _pad_last2(x, padded - dim, 0)
    y = ops.matmul(blocks, x.reshape(groups, n_blocks, block, width)).reshape(groups, padded, width)
    return narrow(y, 1, 0, dim) if padded != dim else y


def block_diag_right(x: Tensor, blocks: Tensor) -> Tensor:
    r"""Right product by a block-diagonal matrix: ``(g, m, d)`` times ``(g, n_b, b, b)`` or ``(g, d, d)``.

    The blocks' form pads :math:`x` to :math:`n_b b` columns, tiles it, multiplies each column block by its
    block and cuts the padding off (pad, two transposes, a batched product, a slice); the written-out form
    (:func:`dense_block_diagonal`) is one product.
    """
    if blocks.ndim == 3:
        return ops.matmul(x, blocks)
    groups, height, dim = x.shape
    n_blocks, block = blocks.shape[1], blocks.shape[2]
    if n_blocks == 1:
        return ops.matmul(x, blocks.reshape(groups, block, block))
    padded = n_blocks * block
    if padded != dim:
        x = _pad_last2(x, 0, padded - dim)
    tiles = _TRANSPOSE(x.reshape(groups, height, n_blocks, block), (0, 2, 1, 3))
    y = _TRANSPOSE(ops.matmul(tiles, blocks), (0, 2, 1, 3)).reshape(groups, height, padded)
    return narrow(y, 2, 0, dim) if padded != dim else y


def dense_block_diagonal(blocks: Tensor, dim: int) -> Tensor:
    r"""The block-diagonal matrix of ``(g, n_b, b, b)`` blocks written out and cut to ``(g, dim, dim)``.

    Off the diagonal blocks every entry is an exact zero (the blocks times a 0/1 mask), so a product with it sums
    the same nonzero terms as the blockwise product, only in another order (round-off). The identity padding of
    the last block is cut off.
    """
    groups, n_blocks, block = blocks.shape[0], blocks.shape[1], blocks.shape[2]
    mask = _eye(n_blocks).reshape(1, n_blocks, 1, n_blocks, 1)
    full = (blocks.reshape(groups, n_blocks, block, 1, block) * mask).reshape(groups, n_blocks * block,
                                                                            n_blocks * block)
    padded = n_blocks * block
    if padded == dim:
        return full
    return _SLICE(full, (0, 0, 0), (groups, dim, dim))


def kronecker_precondition(grad: Tensor, g_inverse: Tensor, a_inverse: Tensor) -> Tensor:
    r"""The THOR direction :math:`G^{-1} \nabla A^{-1}` for ``(groups, d_out, d_in)`` gradients.

    Args:
        grad: ``(g, d_out, d_in)`` gradient (bias column included when the factors include it).
        g_inverse: ``(g, n_b, b, b)`` block inverse of the damped output factor.
        a_inverse: ``(g, n_b', b', b')`` block inverse of the damped input factor.
    """
    return block_diag_right(block_diag_left(g_inverse, grad), a_inverse)


def embedding_precondition(grad: Tensor, a_inverse_diagonal: Tensor, g_inverse: Tensor) -> Tensor:
    r"""Embedding direction :math:`\mathrm{diag}(a + \sqrt\lambda)^{-1}\, \nabla E\, (G + \sqrt\lambda I)^{-1}`.

    The table gradient ``(vocab, d)`` has the input (token) dimension first, so the diagonal input factor
    acts on the left and the output factor (``(1, n_b, b, b)`` blocks) on the right.
    """
    scaled = grad * a_inverse_diagonal.reshape(-1, 1)
    return block_diag_right(scaled.reshape(leading_one(scaled.shape)), g_inverse).reshape(grad.shape)


def clip_by_norm(x: Tensor, max_norm: float) -> Tensor:
    r"""Rescale ``x`` to norm at most ``max_norm``: :math:`x \min(1, c / \lVert x \rVert_2)`."""
    norm = ops.sqrt(_REDUCE_SUM(x * x, ()))
    return x * ops.minimum(max_norm / ops.maximum(norm, 1e-12), 1.0)


def momentum_step(weight: Tensor, moment: Tensor, grad: Tensor, lr: Tensor, momentum: Tensor,
                  nesterov: bool) -> Tuple[Tensor, Tensor]:
    r"""Heavy-ball or Nesterov momentum.

    :math:`v' = m v + g`, :math:`w' = w - \eta v'` (Nesterov: :math:`w' = w - \eta (g + m v')`).

    Written out rather than ``ApplyMomentum`` because that kernel ignores ``use_nesterov`` on CPU.

    Returns:
        ``(new_weight, new_moment)``.
    """
    new_moment = moment * momentum + grad
    direction = grad + new_moment * momentum if nesterov else new_moment
    return weight - direction * lr, new_moment

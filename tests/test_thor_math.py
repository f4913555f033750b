"""ms_boost.thor.math against independent numpy references (im2col, factors, damped block inverses, update)."""
from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, ops

from ms_boost.thor import math as tm


# ----------------------------------------------------------------------------- numpy references
def np_pads(pad_mode, padding, hw, k, s, d):
    if pad_mode == "valid":
        return (0, 0, 0, 0)
    if pad_mode == "pad":
        return (padding,) * 4 if isinstance(padding, int) else tuple(padding)
    out = []
    for size, kk, ss, dd in zip(hw, k, s, d):
        o = int(np.ceil(size / ss))
        total = max((o - 1) * ss + (kk - 1) * dd + 1 - size, 0)
        out += [total // 2, total - total // 2]
    return tuple(out)


def np_im2col(x, k, s, d, pads):
    """Explicit loops: row (n, i, j) = receptive field of output (i, j), columns (c, ki, kj)."""
    top, bottom, left, right = pads
    xp = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    n, c, h, w = xp.shape
    oh = (h - (k[0] - 1) * d[0] - 1) // s[0] + 1
    ow = (w - (k[1] - 1) * d[1] - 1) // s[1] + 1
    rows = []
    for b in range(n):
        for i in range(oh):
            for j in range(ow):
                patch = np.empty((c, k[0], k[1]), x.dtype)
                for ki in range(k[0]):
                    for kj in range(k[1]):
                        patch[:, ki, kj] = xp[b, :, i * s[0] + ki * d[0], j * s[1] + kj * d[1]]
                rows.append(patch.reshape(-1))
    return np.stack(rows), (oh, ow)


def np_conv(x, w, s, d, pads, groups):
    rows, (oh, ow) = np_im2col(x, w.shape[2:], s, d, pads)
    n, cout = x.shape[0], w.shape[0]
    cin_g = w.shape[1]
    out = np.zeros((rows.shape[0], cout))
    kk = w.shape[2] * w.shape[3]
    for g in range(groups):
        cols = rows[:, g * cin_g * kk:(g + 1) * cin_g * kk]
        og = slice(g * cout // groups, (g + 1) * cout // groups)
        out[:, og] = cols @ w[og].reshape(cout // groups, -1).T
    return out.reshape(n, oh, ow, cout).transpose(0, 3, 1, 2)


def np_block_diag_inverse(f, damping, block):
    """Dense block-diagonal matrix whose blocks are inv(F_block + sqrt(damping) I)."""
    d = f.shape[0]
    out = np.zeros_like(f, dtype=np.float64)
    step = d if d <= block else block
    for start in range(0, d, step):
        sl = slice(start, min(start + step, d))
        b = f[sl, sl].astype(np.float64)
        out[sl, sl] = np.linalg.inv(b + np.sqrt(damping) * np.eye(b.shape[0]))
    return out


def dense_from_blocks(blocks, dim):
    """(n_b, b, b) block inverses -> dense (dim, dim) block-diagonal (padding dropped)."""
    nb, b, _ = blocks.shape
    full = np.zeros((nb * b, nb * b))
    for i in range(nb):
        full[i * b:(i + 1) * b, i * b:(i + 1) * b] = blocks[i]
    return full[:dim, :dim]


# ----------------------------------------------------------------------------- tests
CONV_CASES = [
    # (hw, kernel, stride, dilation, pad_mode, padding)
    ((7, 6), (3, 2), (2, 1), (1, 2), "same", 0),
    ((6, 5), (3, 3), (1, 1), (1, 1), "pad", (1, 0, 2, 1)),
    ((8, 7), (2, 3), (3, 2), (2, 1), "valid", 0),
    ((5, 5), (1, 1), (2, 2), (1, 1), "same", 0),
]


@pytest.mark.parametrize("case", CONV_CASES)
def test_im2col_matches_loops_and_reproduces_convolution(case):
    hw, k, s, d, mode, padding = case
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 4) + hw).astype(np.float32)
    pads = tm.conv_pads(mode, padding, hw, k, s, d)
    assert pads == np_pads(mode, padding, hw, k, s, d)
    got = tm.im2col(Tensor(x), k, s, d, pads).asnumpy()
    ref, (oh, ow) = np_im2col(x, k, s, d, pads)
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)
    # invariant: patches times the flattened kernel give MindSpore's own convolution
    w = rng.standard_normal((6, 4) + k).astype(np.float32)
    conv = ops.Conv2D(6, k, pad_mode=mode, pad=padding, stride=s, dilation=d)
    ms_out = conv(Tensor(x), Tensor(w)).asnumpy()
    assert ms_out.shape == (2, 6, oh, ow)
    np.testing.assert_allclose(ms_out, np_conv(x, w, s, d, pads, 1), rtol=1e-4, atol=1e-4)
    assert ms.float32 == tm.im2col(Tensor(x), k, s, d, pads).dtype


def test_factor_formulas_against_numpy():
    rng = np.random.default_rng(2)
    rows = rng.standard_normal((3, 10, 4)).astype(np.float32)
    a = tm.input_factor(Tensor(rows)).asnumpy()
    np.testing.assert_allclose(a, np.einsum("grd,gre->gde", rows, rows) / 10, rtol=1e-5, atol=1e-6)
    aug = tm.append_ones(Tensor(rows)).asnumpy()
    assert aug.shape == (3, 10, 5) and np.all(aug[..., -1] == 1) and np.array_equal(aug[..., :4], rows)
    g = tm.output_factor(Tensor(rows * 8.0), 5, Tensor(8.0)).asnumpy()
    np.testing.assert_allclose(g, 5 * np.einsum("grd,gre->gde", rows, rows), rtol=1e-5, atol=1e-5)
    split = tm.split_groups(Tensor(rows[0].reshape(10, 4)), 2).asnumpy()
    np.testing.assert_array_equal(split, rows[0].reshape(10, 2, 2).transpose(1, 0, 2))
    ids = np.array([[1, 3, 3], [0, 3, 6]], np.int32)
    freq = tm.token_frequencies(Tensor(ids), 7).asnumpy()
    np.testing.assert_allclose(freq, np.bincount(ids.ravel(), minlength=7) / 6)


def np_diagonal_blocks(f, block):
    """Diagonal ``block``-sized blocks of a full ``(d, d)`` factor, the last completed with the identity."""
    d = f.shape[0]
    nb = -(-d // block)
    padded = np.eye(nb * block)
    padded[:d, :d] = f
    return np.stack([padded[i * block:(i + 1) * block, i * block:(i + 1) * block] for i in range(nb)])


@pytest.mark.parametrize("dim,block", [(11, 4), (12, 4), (9, 8), (5, 8), (8, 8)])
def test_block_factors_are_the_diagonal_blocks_of_the_full_factor(dim, block):
    """The capture computes only the diagonal blocks a block-diagonal inverse uses: they equal the blocks cut
    from the whole factor, both by numpy and by the full-factor path (input_factor / output_factor, then
    diagonal_blocks), which THOR ran before; up to the block size the factor is stored whole. Traces and
    pi-damping of the stored blocks equal those of the full factor."""
    rng = np.random.default_rng(dim * block)
    rows = rng.standard_normal((2, 13, dim)).astype(np.float32)
    full_a = np.einsum("grd,gre->gde", rows.astype(np.float64), rows) / 13
    full_g = 6 * np.einsum("grd,gre->gde", rows.astype(np.float64), rows)
    a = tm.block_input_factor(Tensor(rows), block).asnumpy()
    g = tm.block_output_factor(Tensor(rows * 4.0), 6, Tensor(4.0), block).asnumpy()
    if dim <= block:
        assert a.shape == (2, dim, dim)
        np.testing.assert_allclose(a, full_a, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(g, full_g, rtol=1e-5, atol=1e-5)
    else:
        nb = -(-dim // block)
        assert a.shape == g.shape == (2, nb, block, block)
        for i in range(2):
            np.testing.assert_allclose(a[i], np_diagonal_blocks(full_a[i], block), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(g[i], np_diagonal_blocks(full_g[i], block), rtol=1e-5, atol=1e-5)
        old = tm.diagonal_blocks(tm.input_factor(Tensor(rows)), block).asnumpy()
        np.testing.assert_allclose(a, old, rtol=1e-5, atol=1e-6)
        old_g = tm.diagonal_blocks(tm.output_factor(Tensor(rows * 4.0), 6, Tensor(4.0)), block).asnumpy()
        np.testing.assert_allclose(g, old_g, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(tm.factor_trace(Tensor(a), dim).asnumpy(), np.trace(full_a, axis1=1, axis2=2),
                               rtol=1e-5)
    g_small = tm.block_output_factor(Tensor(rows[:, :, :3]), 6, Tensor(1.0), block)
    pi = tm.pi_damping(Tensor(a), g_small, a_dim=dim).asnumpy()
    want = np.sqrt((np.trace(full_a, axis1=1, axis2=2) / dim)
                   / (np.trace(6 * np.einsum("grd,gre->gde", rows[:, :, :3], rows[:, :, :3]), axis1=1, axis2=2) / 3))
    np.testing.assert_allclose(pi, want, rtol=1e-5)
    if a.ndim == 4:  # a block-stored factor's width cannot be read from its shape
        with pytest.raises(ValueError, match="a_dim=0"):
            tm.pi_damping(Tensor(a), g_small)


def test_running_average():
    old, new = Tensor(np.full((2, 2), 4.0, np.float32)), Tensor(np.full((2, 2), 2.0, np.float32))
    np.testing.assert_allclose(tm.running_average(old, new, 0.75, Tensor(True)).asnumpy(), 0.75 * 4 + 0.25 * 2)
    np.testing.assert_allclose(tm.running_average(old, new, 0.75, Tensor(False)).asnumpy(), 2.0)
    np.testing.assert_allclose(tm.running_average(old, new, 0.0, Tensor(True)).asnumpy(), 2.0)


@pytest.mark.parametrize("dim,block", [(5, 8), (8, 4), (11, 4), (9, 3)])
def test_damped_block_inverse(dim, block):
    rng = np.random.default_rng(dim)
    m = rng.standard_normal((2, dim, dim + 3))
    f = (m @ m.transpose(0, 2, 1) / dim).astype(np.float32)
    damping = 0.05
    inv = tm.damped_block_inverse(Tensor(f), Tensor(np.float32(damping)), block).asnumpy()
    nb, b = tm.block_layout(dim, block)
    assert inv.shape == (2, nb, b, b)
    for g in range(2):
        ref = np_block_diag_inverse(f[g], damping, block)
        np.testing.assert_allclose(dense_from_blocks(inv[g], dim), ref, rtol=2e-3, atol=2e-4)
        # invariant: each block is symmetric
        np.testing.assert_allclose(inv[g], inv[g].transpose(0, 2, 1), atol=1e-4)


@pytest.mark.parametrize("d_out,d_in,block", [(3, 5, 8), (7, 10, 4), (6, 9, 3)])
def test_kronecker_precondition(d_out, d_in, block):
    rng = np.random.default_rng(d_out * d_in)

    def spd(d):
        m = rng.standard_normal((2, d, d + 2))
        return (m @ m.transpose(0, 2, 1) / d).astype(np.float32)

    fa, fg = spd(d_in), spd(d_out)
    grad = rng.standard_normal((2, d_out, d_in)).astype(np.float32)
    a_inv = tm.damped_block_inverse(Tensor(fa), Tensor(np.float32(0.1)), block)
    g_inv = tm.damped_block_inverse(Tensor(fg), Tensor(np.float32(0.1)), block)
    got = tm.kronecker_precondition(Tensor(grad), g_inv, a_inv).asnumpy()
    # the block-diagonal inverses written out (one product each instead of the blocks' tiling)
    a_dense = tm.dense_block_diagonal(a_inv, d_in)
    g_dense = tm.dense_block_diagonal(g_inv, d_out)
    got_dense = tm.kronecker_precondition(Tensor(grad), g_dense, a_dense).asnumpy()
    for g in range(2):
        ref_a, ref_g = np_block_diag_inverse(fa[g], 0.1, block), np_block_diag_inverse(fg[g], 0.1, block)
        ref = ref_g @ grad[g] @ ref_a
        np.testing.assert_allclose(got[g], ref, rtol=2e-3, atol=2e-4)
        np.testing.assert_allclose(got_dense[g], ref, rtol=2e-3, atol=2e-4)
        # exact: the blocks on the diagonal, zeros elsewhere, the identity padding cut off
        np.testing.assert_array_equal(a_dense.asnumpy()[g], dense_from_blocks(a_inv.asnumpy()[g], d_in))
        np.testing.assert_array_equal(g_dense.asnumpy()[g], dense_from_blocks(g_inv.asnumpy()[g], d_out))


def test_embedding_precondition_and_clip():
    rng = np.random.default_rng(5)
    grad = rng.standard_normal((6, 4)).astype(np.float32)
    freq = np.array([0.5, 0, 0.25, 0.25, 0, 0], np.float32)
    fg = rng.standard_normal((1, 4, 6))
    fg = (fg @ fg.transpose(0, 2, 1)).astype(np.float32)
    a_inv = tm.damped_diagonal_inverse(Tensor(freq), Tensor(np.float32(0.04)))
    g_inv = tm.damped_block_inverse(Tensor(fg), Tensor(np.float32(0.04)), 128)
    got = tm.embedding_precondition(Tensor(grad), a_inv, g_inv).asnumpy()
    ref = np.diag(1 / (freq + 0.2)) @ grad @ np.linalg.inv(fg[0] + 0.2 * np.eye(4))
    np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-4)
    x = Tensor(np.array([3.0, 4.0], np.float32))
    np.testing.assert_allclose(tm.clip_by_norm(x, 1.0).asnumpy(), [0.6, 0.8], rtol=1e-6)
    np.testing.assert_allclose(tm.clip_by_norm(x, 10.0).asnumpy(), [3.0, 4.0], rtol=1e-6)


def test_conv_pads_rejects_unknown_mode():
    with pytest.raises(ValueError, match="pad_mode"):
        tm.conv_pads("reflect", 0, (4, 4), (3, 3), (1, 1), (1, 1))


@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum_step(nesterov):
    w, v, g = np.array([1.0, 2.0], np.float32), np.array([0.5, -1.0], np.float32), np.array([1.0, 1.0], np.float32)
    new_w, new_v = tm.momentum_step(Tensor(w), Tensor(v), Tensor(g), Tensor(np.float32(0.1)), Tensor(np.float32(0.9)),
                                    nesterov)
    ref_v = 0.9 * v + g
    ref_w = w - 0.1 * (g + 0.9 * ref_v) if nesterov else w - 0.1 * ref_v
    np.testing.assert_allclose(new_v.asnumpy(), ref_v, rtol=1e-6)
    np.testing.assert_allclose(new_w.asnumpy(), ref_w, rtol=1e-6)


def test_blocks_finite_per_block(mode):
    """One flag per (b, b) block against numpy's all-finite over the last two axes (inf and NaN both count)."""
    blocks = np.random.default_rng(0).standard_normal((2, 3, 4, 4)).astype(np.float32)
    blocks[0, 1, 2, 3] = np.nan
    blocks[1, 2, 0, 0] = np.inf
    got = ms.jit(tm.blocks_finite)(Tensor(blocks)) if mode == "graph" else tm.blocks_finite(Tensor(blocks))
    np.testing.assert_array_equal(got.asnumpy(), np.isfinite(blocks).all(axis=(-2, -1)))


def test_stat_sample_count_and_leading_samples():
    """k = ceil(f N) in [1, N]; the whole batch at f = 1 (x itself, no copy); the first k samples otherwise."""
    from ms_boost.thor.math import leading_samples, stat_sample_count

    assert [stat_sample_count(32, f) for f in (1.0, 0.5, 0.25, 0.3, 1e-6)] == [32, 16, 8, 10, 1]
    assert stat_sample_count(7, 0.5) == 4 and stat_sample_count(1, 0.25) == 1 and stat_sample_count(100, 0.07) == 7
    x = Tensor(np.arange(24, dtype=np.float32).reshape(4, 3, 2))
    assert leading_samples(x, 4) is x
    np.testing.assert_array_equal(leading_samples(x, 2).asnumpy(), np.arange(12, dtype=np.float32).reshape(2, 3, 2))


def test_block_output_factor_on_a_sub_batch():
    """G of the first k of N samples: N^2/k sum_r delta_r delta_r^T (N delta: the per-sample gradient), whole and as
    blocks; k = 0 or N: N sum_r delta_r delta_r^T as before."""
    from ms_boost.thor.math import block_output_factor

    rng = np.random.default_rng(9)
    rows = rng.standard_normal((1, 10, 6)).astype(np.float32)
    scale = Tensor(np.float32(4.0))
    d = rows[0] / 4.0
    np.testing.assert_allclose(block_output_factor(Tensor(rows), 8, scale, 64, 5).asnumpy()[0], 64 / 5 * d.T @ d,
                               rtol=1e-5, atol=1e-6)
    for k in (0, 8):
        np.testing.assert_allclose(block_output_factor(Tensor(rows), 8, scale, 64, k).asnumpy()[0], 8 * d.T @ d,
                                   rtol=1e-5, atol=1e-6)
    blocks = block_output_factor(Tensor(rows), 8, scale, 4, 2).asnumpy()[0]
    full = 32 * d.T @ d
    np.testing.assert_allclose(blocks[0], full[:4, :4], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(blocks[1][:2, :2], full[4:, 4:], rtol=1e-5, atol=1e-6)

"""Numerical core of DimReduce (ms_boost/dim_reduce/math.py) against numpy formulas written here."""
from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

from ms_boost.dim_reduce.math import (
    armijo_accepts,
    back_project,
    bfgs_inverse_update,
    local_row_block,
    project,
    quasi_newton_direction,
    residual_momentum,
)


def np_bfgs(h, s, y):
    """H+ = (I - rho s y^T) H (I - rho y s^T) + rho s s^T, rho = 1 / y^T s."""
    rho = 1.0 / float(y @ s)
    eye = np.eye(len(s))
    return (eye - rho * np.outer(s, y)) @ h @ (eye - rho * np.outer(y, s)) + rho * np.outer(s, s)


class _BfgsCell(nn.Cell):
    def construct(self, h, s, y):
        return bfgs_inverse_update(h, s, y, 1e-20)


def _spd(rng, k):
    a = rng.standard_normal((k, k))
    return (a @ a.T / k + np.eye(k)).astype(np.float32)


def test_bfgs_secant_condition_symmetry_and_reference(mode):
    rng = np.random.default_rng(1)
    k = 6
    h = _spd(rng, k)
    s = rng.standard_normal(k).astype(np.float32)
    y = (s + 0.3 * rng.standard_normal(k)).astype(np.float32)
    assert y @ s > 0
    out = _BfgsCell()(Tensor(h), Tensor(s), Tensor(y)).asnumpy()
    np.testing.assert_allclose(out @ y, s, rtol=1e-4, atol=1e-5)  # secant condition H+ y = s
    np.testing.assert_allclose(out, out.T, atol=1e-5)
    assert np.linalg.eigvalsh(out.astype(np.float64)).min() > 0  # stays positive definite
    ref = np_bfgs(h.astype(np.float64), s.astype(np.float64), y.astype(np.float64))
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("scale", [-1.0, 0.0])
def test_bfgs_skipped_without_curvature(mode, scale):
    rng = np.random.default_rng(2)
    h = _spd(rng, 4)
    s = rng.standard_normal(4).astype(np.float32)
    y = (scale * s).astype(np.float32)  # y^T s <= 0: curvature condition fails
    out = _BfgsCell()(Tensor(h), Tensor(s), Tensor(y)).asnumpy()
    assert np.array_equal(out, h)
    assert np.all(np.isfinite(out))


def test_direction_and_armijo():
    h = np.diag([1.0, 2.0]).astype(np.float32)
    g = np.array([1.0, -1.0], np.float32)
    d = quasi_newton_direction(Tensor(h), Tensor(g)).asnumpy()
    np.testing.assert_allclose(d, [-1.0, 2.0])
    slope = float(g @ d)  # -3
    # bound = old + sigma * t * slope = 1 - 0.4 * 0.5 * 3 = 0.4
    for new, expected in [(0.39, True), (0.4, False), (0.41, False)]:
        got = armijo_accepts(Tensor(new, ms.float32), Tensor(1.0, ms.float32), Tensor(0.5, ms.float32),
                             Tensor(slope, ms.float32), 0.4)
        assert bool(got.asnumpy()) is expected


def test_projection_round_trip_and_residual():
    rng = np.random.default_rng(3)
    m, k = 40, 5
    p = np.linalg.qr(rng.standard_normal((m, k)))[0].T.astype(np.float32)  # orthonormal rows
    v = rng.standard_normal(m).astype(np.float32)
    g = project(Tensor(p), Tensor(v)).asnumpy()
    np.testing.assert_allclose(g, p @ v, rtol=1e-5, atol=1e-5)
    coeffs = np.stack([g, 2 * g])
    back = back_project(Tensor(p), Tensor(coeffs)).asnumpy()
    np.testing.assert_allclose(back, coeffs @ p, rtol=1e-5, atol=1e-5)
    mu = rng.standard_normal(m).astype(np.float32)
    res = residual_momentum(Tensor(mu), Tensor(v), Tensor(back[0]), 0.9).asnumpy()
    np.testing.assert_allclose(res, 0.9 * mu + v - p.T @ (p @ v), rtol=1e-5, atol=1e-5)
    # the residual gradient has no component in the subspace
    np.testing.assert_allclose(p @ (v - back[0]), 0.0, atol=1e-5)


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8, 32, 33])
@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 8])
def test_row_blocks_cover_components_in_order(k, ranks):
    blocks = [local_row_block(k, r, ranks) for r in range(ranks)]
    height = blocks[0][2]
    assert all(b[2] == height for b in blocks) and height * ranks >= k and height == -(-k // ranks)
    gathered = []
    for start, stop, h in blocks:
        assert 0 <= stop - start <= h
        gathered += list(range(start, stop)) + [-1] * (h - (stop - start))
    # gathering the padded blocks in rank order gives rows 0..k-1 first
    assert gathered[:k] == list(range(k))
    assert all(x == -1 for x in gathered[k:])


def test_row_block_rejects_bad_rank():
    with pytest.raises(ValueError, match="rank=2"):
        local_row_block(4, 2, 2)
    with pytest.raises(ValueError, match="n_components=0"):
        local_row_block(0, 0, 1)

"""THOR robustness (issue 13): trust region, inversion that cannot fail, non-finite guard, stop on divergence.

Numbers are checked against numpy references written here; the guards against invariants (nothing moves
on a skipped step, previous inverses kept, the error names the step and the layer).
"""
from __future__ import annotations

import json
from pathlib import Path

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
import pytest
from mindspore import Tensor, nn, ops

from ms_boost.thor import math as tm
from ms_boost.thor import thor
from ms_boost.thor.optimizer import ThorNonFiniteError


# ----------------------------------------------------------------------------- numpy references
def np_clamped_inverse(block, shift):
    """(B + s I)^-1 with B's eigenvalues clamped at 0 (float64)."""
    sym = (block.astype(np.float64) + block.astype(np.float64).T) / 2
    w, v = np.linalg.eigh(sym)
    return (v / (np.maximum(w, 0) + shift)) @ v.T


def np_step(w1, b1, w2, b2, x, y, lr, damping, kl_clip):
    """One THOR step (momentum 0, no decay) of x -> Dense -> tanh -> Dense -> CE with the trust region."""
    n = x.shape[0]
    h = np.tanh(x @ w1.T + b1)
    logits = h @ w2.T + b2
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    d2 = p.copy()
    d2[np.arange(n), y] -= 1
    d2 /= n
    d1 = (d2 @ w2) * (1 - h ** 2)
    directions, grads = [], []
    for a_in, dy in ((x, d1), (h, d2)):
        a_aug = np.concatenate([a_in, np.ones((n, 1))], 1)
        fa, fg = a_aug.T @ a_aug / n, n * dy.T @ dy
        grad = np.concatenate([dy.T @ a_in, dy.sum(0)[:, None]], 1)
        s = np.sqrt(damping)
        directions.append(np.linalg.inv(fg + s * np.eye(len(fg))) @ grad @ np.linalg.inv(fa + s * np.eye(len(fa))))
        grads.append(grad)
    vg = sum((d * g).sum() for d, g in zip(directions, grads))
    nu = min(1.0, np.sqrt(kl_clip / (lr ** 2 * abs(vg))))
    out = []
    for (w, b), d in zip(((w1, b1), (w2, b2)), directions):
        out += [w - lr * nu * d[:, :-1], b - lr * nu * d[:, -1]]
    return out, nu


class MLP(nn.Cell):
    def __init__(self, w1, b1, w2, b2):
        super().__init__()
        self.fc1 = nn.Dense(w1.shape[1], w1.shape[0], weight_init=Tensor(w1), bias_init=Tensor(b1))
        self.fc2 = nn.Dense(w2.shape[1], w2.shape[0], weight_init=Tensor(w2), bias_init=Tensor(b2))

    def construct(self, x):
        return self.fc2(ops.tanh(self.fc1(x)))


def mlp_data(seed=0, n=8):
    rng = np.random.default_rng(seed)
    w = [(rng.standard_normal(s) * k).astype(np.float32) for s, k in (((6, 5), 0.5), (6, 0.1), ((4, 6), 0.5), (4, 0.1))]
    x = rng.standard_normal((n, 5)).astype(np.float32)
    y = rng.integers(0, 4, n).astype(np.int32)
    return w, x, y


def train_cell(opt):
    cell = nn.TrainOneStepCell(nn.WithLossCell(opt.thor_network, nn.SoftmaxCrossEntropyWithLogits(
        sparse=True, reduction="mean")), opt)
    cell.set_train()
    return cell


# ----------------------------------------------------------------------------- trust region
@pytest.mark.parametrize("kl_clip", [1e-3, 10.0])
def test_trust_region_scales_the_step_as_numpy(mode, kl_clip):
    weights, x, y = mlp_data()
    net = MLP(*weights)
    opt = thor(net, 0.2, 0.05, 0.0, frequency=5, kl_clip=kl_clip)
    train_cell(opt)(Tensor(x), Tensor(y))
    expected, nu = np_step(*[w.astype(np.float64) for w in weights], x.astype(np.float64), y, 0.2, 0.05, kl_clip)
    assert (nu < 1.0) == (kl_clip < 1.0)  # the small bound clips, the large one does not
    np.testing.assert_allclose(opt.health()["last_nu"], nu, rtol=1e-4)
    got = [p.asnumpy() for p in (net.fc1.weight, net.fc1.bias, net.fc2.weight, net.fc2.bias)]
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=2e-4, atol=2e-5)


def test_trust_region_scale_function():
    for vg, lr, c in ((4.0, 0.1, 1e-3), (1e-8, 0.1, 1e-3), (0.0, 0.5, 1e-2), (-3.0, 0.01, 1e-3)):
        got = float(tm.trust_region_scale(Tensor(np.float32(vg)), Tensor(np.float32(lr)), c).asnumpy())
        want = 1.0 if vg == 0 else min(1.0, np.sqrt(c / (lr * lr * abs(vg))))
        assert got == pytest.approx(want, rel=1e-5)
    assert not np.isfinite(tm.trust_region_scale(Tensor(np.float32(np.nan)), Tensor(np.float32(0.1)), 1e-3).asnumpy())


# ----------------------------------------------------------------------------- inversion
def _gram(rng, dim, rank, scale, groups=1):
    x = rng.standard_normal((groups, rank, dim)).astype(np.float32)
    return np.matmul(x.transpose(0, 2, 1), x) * np.float32(scale / rank)


def test_inverse_of_rank_deficient_factor_cholesky_path_matches_numpy():
    rng = np.random.default_rng(0)
    f = _gram(rng, 24, 5, 1.0, groups=2)  # rank 5 of 24: singular, made invertible by the damping
    shift = np.array([0.3, 0.1], np.float32)
    inv, fallbacks = tm.guarded_block_inverse(Tensor(f), Tensor(shift), 10)
    assert float(fallbacks.asnumpy()) == 0.0
    inv = inv.asnumpy()
    for g in range(2):
        for b, start in enumerate(range(0, 24, 10)):
            block = f[g][start:start + 10, start:start + 10]
            ref = np.linalg.inv(block.astype(np.float64) + shift[g] * np.eye(len(block)))
            np.testing.assert_allclose(inv[g, b][:len(block), :len(block)], ref, rtol=1e-4, atol=1e-4)


def test_near_singular_indefinite_factor_falls_back_instead_of_raising(mode):
    """A factor made slightly indefinite (round-off on a near-singular K-FAC factor): raw Cholesky raises inside
    MindSpore, the guarded inverse clamps the eigenvalues and matches numpy."""
    rng = np.random.default_rng(1)
    q, _ = np.linalg.qr(rng.standard_normal((12, 12)))
    eig = np.concatenate([np.geomspace(1e3, 1.0, 9), [0.0, -2e-2, -5e-2]])
    f = ((q * eig) @ q.T).astype(np.float32)[None]
    shift = np.array([1e-2], np.float32)
    with pytest.raises(RuntimeError):
        ops.cholesky(Tensor(f[0] + shift[0] * np.eye(12, dtype=np.float32))).asnumpy()
    fn = ms.jit(tm.guarded_block_inverse, static_argnums=(2,)) if mode == "graph" else tm.guarded_block_inverse
    inv, fallbacks = fn(Tensor(f), Tensor(shift), 16)
    assert float(fallbacks.asnumpy()) == 1.0
    ref = np_clamped_inverse(f[0], shift[0])
    got = inv.asnumpy()[0, 0]
    np.testing.assert_allclose(got, ref, rtol=2e-3, atol=2e-3 * np.abs(ref).max())
    assert np.linalg.eigvalsh(got.astype(np.float64)).max() <= 1.0 / shift[0] * (1 + 1e-3)


def test_large_factor_with_small_damping_uses_fallback_and_matches_numpy():
    rng = np.random.default_rng(2)
    f = _gram(rng, 16, 3, 2e3)  # rank 3, entries ~1e3: shift 0.5 < 2^-10 * max |B|
    inv, fallbacks = tm.guarded_block_inverse(Tensor(f), Tensor(np.array([0.5], np.float32)), 16)
    assert float(fallbacks.asnumpy()) == 1.0
    ref = np_clamped_inverse(f[0], 0.5)
    # fp32 eigen-solvers resolve eigenvalues to ~10 u ||B|| ~ 1e-2 here, i.e. ~1 % of the shift
    np.testing.assert_allclose(inv.asnumpy()[0, 0], ref, rtol=1e-2, atol=1e-2 * np.abs(ref).max())


def test_pi_damping_matches_numpy():
    rng = np.random.default_rng(3)
    a, g = _gram(rng, 7, 10, 3.0, groups=2), _gram(rng, 4, 10, 0.02, groups=2)
    pi = tm.pi_damping(Tensor(a), Tensor(g)).asnumpy()
    want = [np.sqrt((np.trace(a[i]) / 7) / (np.trace(g[i]) / 4)) for i in range(2)]
    np.testing.assert_allclose(pi, want, rtol=1e-5)
    zero = tm.pi_damping(Tensor(a), Tensor(np.zeros_like(g))).asnumpy()
    np.testing.assert_array_equal(zero, [1.0, 1.0])  # a zero trace: no split


def test_pi_damping_step_uses_split_shifts(mode):
    weights, x, y = mlp_data(seed=4)
    net = MLP(*weights)
    opt = thor(net, 0.1, 0.05, 0.0, frequency=5, kl_clip=None, pi_damping=True)
    train_cell(opt)(Tensor(x), Tensor(y))
    # reference for fc2: its A and G from the forward/backward, pi from their traces
    w1, b1, w2, b2 = [w.astype(np.float64) for w in weights]
    n = x.shape[0]
    h = np.tanh(x @ w1.T + b1)
    logits = h @ w2.T + b2
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    d2 = p.copy()
    d2[np.arange(n), y] -= 1
    d2 /= n
    a_aug = np.concatenate([h, np.ones((n, 1))], 1)
    fa, fg = a_aug.T @ a_aug / n, n * d2.T @ d2
    pi = np.sqrt((np.trace(fa) / fa.shape[0]) / (np.trace(fg) / fg.shape[0]))
    s = np.sqrt(0.05)
    np.testing.assert_allclose(opt.a_inverses[1].asnumpy()[0, 0], np.linalg.inv(fa + pi * s * np.eye(len(fa))),
                               rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(opt.g_inverses[1].asnumpy()[0, 0], np.linalg.inv(fg + s / pi * np.eye(len(fg))),
                               rtol=1e-3, atol=1e-3)


# ----------------------------------------------------------------------------- non-finite guard
def test_nonfinite_factors_keep_previous_inverses(mode):
    """A refresh step whose inputs hold NaN: its factors are rejected (previous inverses kept, counted per layer),
    its update is skipped; the next finite step refreshes again."""
    weights, x, y = mlp_data(seed=5)
    net = MLP(*weights)
    opt = thor(net, 0.05, 0.05, 0.0, frequency=2)
    cell = train_cell(opt)
    cell(Tensor(x), Tensor(y))  # step 0: refresh
    cell(Tensor(x), Tensor(y))  # step 1
    before = [p.asnumpy().copy() for p in (*opt.a_inverses, *opt.g_inverses)]
    bad = x.copy()
    bad[0, 0] = np.nan
    cell(Tensor(bad), Tensor(y))  # step 2: a refresh with non-finite factors and gradients
    for b, a in zip(before, (p.asnumpy() for p in (*opt.a_inverses, *opt.g_inverses))):
        np.testing.assert_array_equal(a, b)
    health = opt.health()
    assert health["rejected_refreshes"] == {"fc1": 1, "fc2": 1}
    assert health["skipped_steps"] == 1 and int(opt.global_step.asnumpy()[0]) == 2
    cell(Tensor(x), Tensor(y))  # step 2 again, finite: refreshes
    assert not np.array_equal(opt.a_inverses[1].asnumpy(), before[1])  # fc2's input changed with the weights
    assert opt.health()["rejected_refreshes"] == {"fc1": 1, "fc2": 1}
    assert int(opt.global_step.asnumpy()[0]) == 3


def _state(opt, net):
    return ([p.asnumpy().copy() for p in net.trainable_params()] + [m.asnumpy().copy() for m in opt.moments]
            + [opt.global_step.asnumpy().copy()])


@pytest.mark.parametrize("loss_scale", [False, True])
def test_nonfinite_update_skips_the_whole_step(mode, loss_scale):
    """A step with NaN gradients moves nothing, with and without a loss scale (THOR skips it itself without one;
    the loss-scale cell skips it before THOR with one); training then continues."""
    from ms_boost import Model
    from ms_boost.thor import ConvertModelUtils

    weights, x, y = mlp_data(seed=6)
    net = MLP(*weights)
    opt = thor(net, 0.05, 0.05, 0.9, loss_scale=8.0 if loss_scale else 1.0, frequency=3)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    kwargs = {"loss_scale_manager": ms.FixedLossScaleManager(8.0, drop_overflow_update=False)} if loss_scale else {}
    model = ConvertModelUtils().convert_to_thor_model(Model(net, loss, opt, **kwargs), net, loss, opt, **kwargs)
    cell = model.train_network
    cell(Tensor(x), Tensor(y))  # step 0 (refresh)
    cell(Tensor(x), Tensor(y))  # step 1
    state = _state(opt, net)
    bad = x.copy()
    bad[1, 2] = np.nan
    cell(Tensor(bad), Tensor(y))  # step 2: NaN gradients -> skipped
    for s, a in zip(state, _state(opt, net)):
        np.testing.assert_array_equal(a, s)
    health = opt.health()
    if loss_scale:
        assert health["skipped_steps"] == 0  # the cell skipped the step: THOR was not called
    else:
        assert health["skipped_steps"] == 1 and health["last_bad_layer"] == "fc1"
        assert all(bool(f.asnumpy()) for f in opt.capture_flags)  # the next step captures statistics again
    for _ in range(2):
        cell(Tensor(x), Tensor(y))
    assert int(opt.global_step.asnumpy()[0]) == 4
    assert opt.health()["consecutive_skips"] == 0
    assert all(np.isfinite(p.asnumpy()).all() for p in net.trainable_params())


def test_nonfinite_preconditioned_update_with_finite_gradients_is_skipped():
    """PyNative: a corrupted inverse makes the preconditioned update NaN while the gradients are finite."""
    weights, x, y = mlp_data(seed=8)
    net = MLP(*weights)
    opt = thor(net, 0.05, 0.05, 0.9, frequency=3)
    cell = train_cell(opt)
    cell(Tensor(x), Tensor(y))
    corrupted = opt.g_inverses[1].asnumpy().copy()
    corrupted[0, 0, 0, 0] = np.inf
    opt.g_inverses[1].set_data(Tensor(corrupted))
    state = _state(opt, net)
    cell(Tensor(x), Tensor(y))
    for s, a in zip(state, _state(opt, net)):
        np.testing.assert_array_equal(a, s)
    assert opt.health()["last_bad_layer"] == "fc2"
    cell(Tensor(x), Tensor(y))  # refreshes (the skip requested it) and steps
    assert np.isfinite(opt.g_inverses[1].asnumpy()).all() and int(opt.global_step.asnumpy()[0]) == 2


def test_model_train_stops_on_persistent_nonfinite_loss_naming_step_and_layer(mode, caplog):
    from ms_boost import Model
    from ms_boost.thor import ConvertModelUtils

    weights, x, y = mlp_data(seed=7, n=40)
    x[16:] = np.nan  # batches 0, 1 are finite; from batch 2 on the inputs hold NaN
    net = MLP(*weights)
    opt = thor(net, 0.05, 0.05, 0.9, frequency=10, max_nonfinite_steps=2)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    model = ConvertModelUtils().convert_to_thor_model(Model(net, loss, opt), net, loss, opt)
    data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(8)
    with pytest.raises(ThorNonFiniteError) as err:
        model.train(1, data, dataset_sink_mode=False)
    message = str(err.value)
    assert "steps 3..4" in message and "stopped at step 4" in message
    assert "fc1 (input statistics" in message
    assert all(np.isfinite(p.asnumpy()).all() for p in net.trainable_params())  # weights never got NaN
    assert int(opt.global_step.asnumpy()[0]) == 2


# ----------------------------------------------------------------------------- several ranks
@pytest.mark.msrun
@pytest.mark.parametrize("exec_mode,loss_scale", [("graph", 0), ("pynative", 1)])
def test_two_workers_skip_the_same_nonfinite_step(exec_mode, loss_scale):
    """NaN inputs on rank 1 at step 1 only: both ranks skip that step (mean-reduced gradients are NaN), stay
    bit-identical, and equal one process on the concatenated batches."""
    from tests.helpers.msrun import run_msrun
    from tests.test_thor_distributed import build_thor_model
    from tests.workers.thor_nonfinite import BATCH, STEPS, poisoned_data

    worker = Path(__file__).parent / "workers" / "thor_nonfinite.py"
    ranks = run_msrun(worker, 2, args=[exec_mode, loss_scale])
    for key in ranks[0]:
        np.testing.assert_array_equal(ranks[0][key], ranks[1][key], err_msg=key)
    assert int(ranks[0]["step"][0]) == STEPS - 1
    assert int(ranks[0]["skipped"]) == (0 if loss_scale else 1)  # with a loss scale the cell skips first
    x, y = poisoned_data(2)
    net, opt, model = build_thor_model(None, loss_scale=bool(loss_scale))
    data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(BATCH * 2)
    model.train(1, data, dataset_sink_mode=False)
    for i, p in enumerate(net.trainable_params()):
        assert np.isfinite(p.asnumpy()).all()
        np.testing.assert_allclose(ranks[0][f"w{i}"], p.asnumpy(), rtol=1e-4, atol=2e-5)


# ----------------------------------------------------------------------------- configuration
def test_kl_clip_argument_and_config_checks():
    from ms_boost.config import AutoBoost

    weights, _, _ = mlp_data()
    for bad in (-1.0, float("nan"), "0.1", True):
        with pytest.raises((ValueError, TypeError), match="kl_clip"):
            thor(MLP(*weights), 0.1, 0.05, 0.9, kl_clip=bad)
    assert thor(MLP(*weights), 0.1, 0.05, 0.9, kl_clip=None).kl_clip == 0.0
    boost = AutoBoost("O0", {"boost": {"mode": "manual", "thor": True}, "thor": {"kl_clip": 0.01}})
    assert boost.thor.kl_clip == 0.01
    assert AutoBoost("O0", {"boost": {"mode": "manual", "thor": True}}).thor.kl_clip == 1e-3
    with pytest.raises(ValueError, match="thor.kl_clip"):
        AutoBoost("O0", {"boost": {"mode": "manual", "thor": True}, "thor": {"kl_clip": -0.5}})


def test_zoo_thor_recipe_sets_kl_clip():
    import yaml

    recipe = yaml.safe_load((Path(__file__).parents[1] / "model_zoo/resnet/configs/resnet50_imagenet_thor.yaml")
                            .read_text(encoding="utf-8"))
    assert recipe["thor"]["kl_clip"] == json.loads("0.001")

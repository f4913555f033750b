"""THOR robustness (issue 13): trust region, inversion that cannot fail, non-finite guard, stop on divergence.

Numbers are checked against numpy references written here; the guards against invariants (nothing moves
on a skipped step, previous inverses kept, the error names the step and the layer).
"""
from __future__ import annotations

import json
import types
from pathlib import Path

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
import pytest
from mindspore import Tensor, nn, ops

from ms_boost.thor import math as tm
from ms_boost.thor import thor
from ms_boost.thor.optimizer import ThorGuard, ThorNonFiniteError
from tests.helpers.nets import MLP


# ----------------------------------------------------------------------------- numpy references
def np_clamped_inverse(block, shift):
    """(B + s I)^-1 with B's eigenvalues clamped at 0 (float64)."""
    sym = (block.astype(np.float64) + block.astype(np.float64).T) / 2
    w, v = np.linalg.eigh(sym)
    return (v / (np.maximum(w, 0) + shift)) @ v.T


def np_step(w1, b1, w2, b2, x, y, lr, damping, kl_clip, pi_damping=False):
    """One THOR step from zero momentum (no decay) of x -> Dense -> tanh -> Dense -> CE with the trust region.

    Returns the new (w1, b1, w2, b2), the trust-region scale nu and each layer's inverses (A^-1, G^-1); with
    ``pi_damping`` the shift sqrt(damping) is split as pi*s on A and s/pi on G, pi = sqrt((tr A/dA)/(tr G/dG)).
    """
    n = x.shape[0]
    h = np.tanh(x @ w1.T + b1)
    logits = h @ w2.T + b2
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    d2 = p.copy()
    d2[np.arange(n), y] -= 1
    d2 /= n
    d1 = (d2 @ w2) * (1 - h ** 2)
    directions, grads, inverses = [], [], []
    for a_in, dy in ((x, d1), (h, d2)):
        a_aug = np.concatenate([a_in, np.ones((n, 1))], 1)
        fa, fg = a_aug.T @ a_aug / n, n * dy.T @ dy
        grad = np.concatenate([dy.T @ a_in, dy.sum(0)[:, None]], 1)
        s = np.sqrt(damping)
        pi = np.sqrt((np.trace(fa) / len(fa)) / (np.trace(fg) / len(fg))) if pi_damping else 1.0
        a_inv, g_inv = np.linalg.inv(fa + pi * s * np.eye(len(fa))), np.linalg.inv(fg + s / pi * np.eye(len(fg)))
        directions.append(g_inv @ grad @ a_inv)
        grads.append(grad)
        inverses.append((a_inv, g_inv))
    vg = sum((d * g).sum() for d, g in zip(directions, grads))
    nu = min(1.0, np.sqrt(kl_clip / (lr ** 2 * abs(vg))))
    out = []
    for (w, b), d in zip(((w1, b1), (w2, b2)), directions):
        out += [w - lr * nu * d[:, :-1], b - lr * nu * d[:, -1]]
    return out, nu, inverses


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


def _params(net):
    return [p.asnumpy().copy() for p in (net.fc1.weight, net.fc1.bias, net.fc2.weight, net.fc2.bias)]


def _state(opt, net):
    return ([p.asnumpy().copy() for p in net.trainable_params()] + [m.asnumpy().copy() for m in opt.moments]
            + [opt.global_step.asnumpy().copy()])


def _inverses(opt):
    return [p.asnumpy().copy() for p in (*opt.a_inverses, *opt.g_inverses)]


# ----------------------------------------------------------------------------- trust region
def test_trust_region_scale_function():
    """nu = min(1, sqrt(c / (lr^2 |vg|))) clips large steps and leaves small ones (1); in a THOR step against numpy,
    clipped and pi-damped, in both modes: test_step_matches_numpy."""
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
    MindSpore, the guarded inverse clamps the eigenvalues and matches numpy (Graph: the function alone under
    ms.jit, a sub-second compile)."""
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


# ----------------------------------------------------------------------------- non-finite guard
def test_nonfinite_update_with_loss_scale_skips_the_whole_step(mode):
    """With a loss scale (``Model`` + ``FixedLossScaleManager(8, drop_overflow_update=False)``: ms_boost's
    loss-scale cell) a step with NaN gradients is an overflow: the cell skips the optimizer, so no THOR state
    moves -- weights, moments, step, inverses, running-average factors, flags -- even on a refresh step whose
    flags are up; training then continues. Without a loss scale (THOR skips the step itself), both modes:
    test_nonfinite_step_is_skipped_and_refresh_rejected."""
    from ms_boost import Model
    from ms_boost.thor import ConvertModelUtils

    weights, x, y = mlp_data(seed=6)
    net = MLP(*weights)
    opt = thor(net, 0.05, 0.05, 0.9, loss_scale=8.0, frequency=2, factor_decay=0.5)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    kwargs = {"loss_scale_manager": ms.FixedLossScaleManager(8.0, drop_overflow_update=False)}
    model = ConvertModelUtils().convert_to_thor_model(Model(net, loss, opt, **kwargs), net, loss, opt, **kwargs)
    cell = model.train_network
    cell(Tensor(x), Tensor(y))  # step 0 (refresh)
    cell(Tensor(x), Tensor(y))  # step 1: now step 2 is a refresh step, the flags are up
    assert all(bool(f.asnumpy()) for f in opt.capture_flags)
    state = {p.name: p.asnumpy().copy() for p in opt.get_parameters() if "_batch" not in p.name}
    state.update({p.name: p.asnumpy().copy() for p in net.trainable_params()})
    bad = x.copy()
    bad[1, 2] = np.nan
    _, overflow, _ = cell(Tensor(bad), Tensor(y))  # step 2: NaN gradients -> skipped
    assert bool(overflow.asnumpy())
    params = {p.name: p for p in (*opt.get_parameters(), *net.trainable_params())}
    for name, value in state.items():
        np.testing.assert_array_equal(params[name].asnumpy(), value, err_msg=name)
    assert opt.health()["skipped_steps"] == 0  # the cell skipped the step: THOR was not called
    for _ in range(2):
        _, overflow, _ = cell(Tensor(x), Tensor(y))
        assert not bool(overflow.asnumpy())
    assert int(opt.global_step.asnumpy()[0]) == 4
    assert opt.health()["consecutive_skips"] == 0
    assert all(np.isfinite(p.asnumpy()).all() for p in (*net.trainable_params(), *opt.a_inverses))


def _stop_data(seed):
    """40 rows in batches of 8: batches 0, 1 finite, from batch 2 on the inputs hold NaN."""
    weights, x, y = mlp_data(seed=seed, n=40)
    x[16:] = np.nan
    return weights, ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(8)


def _check_stop_message(message):
    assert "steps 3..4" in message and "stopped at step 4" in message
    assert "fc1 (input statistics" in message


@pytest.mark.parametrize("nesterov", [False, True])
def test_skipped_step_with_weight_decay_moves_nothing(mode, nesterov):
    """THOR skips a NaN step itself (no loss scale) with weight decay on every parameter, the trust region and
    momentum or Nesterov, in the plain step (Graph: ms_boost's train cell, the plain variant): every weight and moment
    stays bit for bit -- each update is zeroed by its scaling product (``MulNoNan`` by 0) and the decay taken times 0,
    not by a ``where`` -- and the next finite steps move them again; a later skipped step with a weight already
    non-finite leaves every weight and moment bit for bit as well."""
    from ms_boost import BoostTrainOneStepCell

    weights, x, y = mlp_data(seed=3)
    net = MLP(*weights)
    opt = thor(net, 0.1, 0.05, 0.9, weight_decay=0.01, frequency=3, use_nesterov=nesterov)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    cell = BoostTrainOneStepCell(nn.WithLossCell(opt.thor_network, loss), opt).set_train()
    cell(Tensor(x), Tensor(y))  # step 0: refresh; the moments now hold values
    state = [p.asnumpy().copy() for p in (*opt.parameters, *opt.moments)]
    bad = x.copy()
    bad[2, 1] = np.nan
    cell(Tensor(bad), Tensor(y))  # step 1 (plain): NaN gradients
    after = [p.asnumpy() for p in (*opt.parameters, *opt.moments)]
    for before, now in zip(state, after):
        np.testing.assert_array_equal(now.view(np.int32), before.view(np.int32))
    assert opt.health()["skipped_steps"] == 1 and int(opt.global_step.asnumpy()[0]) == 1
    cell(Tensor(x), Tensor(y))  # step 1 again (a refresh: the skip asked for one), finite
    assert all(np.isfinite(p.asnumpy()).all() and not np.array_equal(p.asnumpy(), s)
               for p, s in zip(opt.parameters, state))
    # a skipped step where a weight is already non-finite (say, from a loaded checkpoint): its decay term is taken
    # times 0 by ``MulNoNan`` too, so no NaN reaches its moment (``inf * 0`` would): every weight and moment bit for
    # bit (this was test_skipped_step_with_a_non_finite_weight_leaves_every_moment, on a model of its own)
    first = opt.parameters[0]
    broken = first.asnumpy().copy()
    broken.flat[0] = np.inf
    ops.assign(first, Tensor(broken))  # in place (new data by set_data would compile the step again)
    state = [p.asnumpy().copy() for p in (*opt.parameters, *opt.moments)]
    cell(Tensor(bad), Tensor(y))  # step 2 (plain): NaN gradients, skipped, with the inf weight decayed
    assert opt.health()["skipped_steps"] == 2 and int(opt.global_step.asnumpy()[0]) == 2
    for before, now in zip(state, [p.asnumpy() for p in (*opt.parameters, *opt.moments)]):
        np.testing.assert_array_equal(now.view(np.int32), before.view(np.int32))


# ----------------------------------------------------------------------------- one THOR per mode, all scenarios
LR, DAMPING, KL = 0.2, 0.05, 1e-3


@pytest.fixture(scope="module", params=["pynative", "graph"])
def thor_run(request):
    """ONE THOR per mode (kl_clip 1e-3, pi-damping, momentum 0.9, refresh every 2 steps, stop after 2 non-finite
    steps) whose train cell is compiled once (Graph: the whole cell; PyNative: the compiled THOR step) and driven
    through every scenario: the step against numpy, a NaN refresh step (factors rejected, whole step skipped),
    recovery, a corrupted inverse (finite gradients, non-finite update: skipped, then refreshed), then
    Model.train stopping on persistent NaN. State is changed between steps in place (``ops.assign``), so the
    PyNative step is not compiled again. Records what the tests check; restores PyNative."""
    from ms_boost import Model
    from ms_boost.thor import ConvertModelUtils

    ms.set_context(mode=ms.GRAPH_MODE if request.param == "graph" else ms.PYNATIVE_MODE)
    rec = {}
    try:
        weights, x, y = mlp_data()
        stop_weights, stop_data = _stop_data(seed=7)
        net = MLP(*weights)
        opt = thor(net, LR, DAMPING, 0.9, frequency=2, kl_clip=KL, pi_damping=True, max_nonfinite_steps=2)
        loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        model = ConvertModelUtils().convert_to_thor_model(Model(net, loss, opt), net, loss, opt)
        cell = model.train_network
        rec.update(weights=weights, x=x, y=y)
        cell(Tensor(x), Tensor(y))  # step 0: refresh; from zero momentum the step is the numpy step
        rec.update(step0_params=_params(net), step0_nu=opt.health()["last_nu"],
                   step0_fc2_inverses=(opt.a_inverses[1].asnumpy()[0, 0].copy(),  # asnumpy() aliases: copy
                                       opt.g_inverses[1].asnumpy()[0, 0].copy()))
        cell(Tensor(x), Tensor(y))  # step 1
        rec.update(inverses_before=_inverses(opt), state_before=_state(opt, net))
        bad = x.copy()
        bad[0, 0] = np.nan
        cell(Tensor(bad), Tensor(y))  # step 2: a refresh whose factors and gradients hold NaN
        rec.update(inverses_bad=_inverses(opt), state_bad=_state(opt, net), health_bad=opt.health(),
                   capture_bad=[bool(f.asnumpy()) for f in opt.capture_flags])
        cell(Tensor(x), Tensor(y))  # step 2 again, finite: refreshes
        rec.update(inverses_again=_inverses(opt), health_again=opt.health(),
                   step_again=int(opt.global_step.asnumpy()[0]))
        cell(Tensor(x), Tensor(y))  # step 3
        rec.update(health_after=opt.health(), step_after=int(opt.global_step.asnumpy()[0]),
                   params_after=_params(net))
        cell(Tensor(x), Tensor(y))  # step 4: refresh
        # a corrupted inverse before step 5 (no refresh): the preconditioned update is non-finite, gradients are not
        corrupted = opt.g_inverses[1].asnumpy().copy()
        corrupted[0, 0, 0, 0] = np.inf
        ops.assign(opt.g_inverses[1], Tensor(corrupted))
        rec.update(state_corrupt_before=_state(opt, net))
        cell(Tensor(x), Tensor(y))  # step 5: skipped
        rec.update(state_corrupt_after=_state(opt, net), health_corrupt=opt.health())
        cell(Tensor(x), Tensor(y))  # step 5 again: refreshes (the skip requested it) and steps
        rec.update(corrupt_inverse_after=opt.g_inverses[1].asnumpy().copy(),
                   step_corrupt_after=int(opt.global_step.asnumpy()[0]))
        # the same net/optimizer/cell, now through Model.train with persistent NaN from its 3rd batch on
        for p, w in zip((net.fc1.weight, net.fc1.bias, net.fc2.weight, net.fc2.bias), stop_weights):
            ops.assign(p, Tensor(w))
        try:
            model.train(1, stop_data, dataset_sink_mode=False)
            rec["stop_error"] = None
        except ThorNonFiniteError as err:
            rec["stop_error"] = str(err)
        rec.update(stop_params=_params(net), stop_step=int(opt.global_step.asnumpy()[0]))
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    return rec


def test_step_matches_numpy(thor_run):
    """Trust region (clipping) and pi-damped inverses of the first step against numpy."""
    r = thor_run
    expected, nu, inverses = np_step(*[w.astype(np.float64) for w in r["weights"]], r["x"].astype(np.float64),
                                     r["y"], LR, DAMPING, KL, pi_damping=True)
    assert nu < 1.0  # the bound clips
    np.testing.assert_allclose(r["step0_nu"], nu, rtol=1e-4)
    for g, e in zip(r["step0_params"], expected):
        np.testing.assert_allclose(g, e, rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(r["step0_fc2_inverses"][0], inverses[1][0], rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(r["step0_fc2_inverses"][1], inverses[1][1], rtol=1e-3, atol=1e-3)


def test_nonfinite_step_is_skipped_and_refresh_rejected(thor_run):
    """The NaN refresh step keeps the previous inverses (rejection counted per layer) and moves nothing
    (weights, moments, step): THOR skips it itself (no loss scale); statistics are captured again; the next
    finite steps refresh and continue."""
    r = thor_run
    for b, a in zip(r["inverses_before"], r["inverses_bad"]):
        np.testing.assert_array_equal(a, b)
    for s, a in zip(r["state_before"], r["state_bad"]):
        np.testing.assert_array_equal(a, s)
    health = r["health_bad"]
    assert health["rejected_refreshes"] == {"fc1": 1, "fc2": 1}
    assert health["skipped_steps"] == 1 and health["last_bad_layer"] == "fc1"
    assert all(r["capture_bad"])
    assert not np.array_equal(r["inverses_again"][1], r["inverses_before"][1])  # refreshed
    assert r["health_again"]["rejected_refreshes"] == {"fc1": 1, "fc2": 1} and r["step_again"] == 3
    assert r["step_after"] == 4 and r["health_after"]["consecutive_skips"] == 0
    assert 0.0 < r["health_after"]["last_nu"] <= 1.0  # the skipped step's NaN nu is not kept
    assert all(np.isfinite(p).all() for p in r["params_after"])


def test_nonfinite_preconditioned_update_with_finite_gradients_is_skipped(thor_run):
    """A corrupted inverse makes the preconditioned update non-finite while the gradients are finite: nothing
    moves, the layer is named; the next step refreshes (the skip requested it, off the refresh schedule)."""
    r = thor_run
    for s, a in zip(r["state_corrupt_before"], r["state_corrupt_after"]):
        np.testing.assert_array_equal(a, s)
    assert r["health_corrupt"]["last_bad_layer"] == "fc2"
    assert r["health_corrupt"]["skipped_steps"] == r["health_after"]["skipped_steps"] + 1
    assert np.isfinite(r["corrupt_inverse_after"]).all() and r["step_corrupt_after"] == 6


def test_model_train_stops_on_persistent_nonfinite_loss_naming_step_and_layer(thor_run):
    r = thor_run
    assert r["stop_error"] is not None, "Model.train did not raise ThorNonFiniteError"
    _check_stop_message(r["stop_error"])
    assert all(np.isfinite(p).all() for p in r["stop_params"])  # weights never got NaN
    assert r["stop_step"] == r["step_corrupt_after"] + 2


# ----------------------------------------------------------------------------- several ranks
# Two msrun workers skipping the same non-finite step: tests/test_msrun_e2e.py (a scenario of its one msrun job).


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


class _CountingOptimizer:
    """Test double exposing the counters ThorGuard reads (``health``) and the stop limit."""

    max_nonfinite_steps = 2

    def __init__(self, skipped: int):
        self.skipped = skipped
        self.captures = 0

    def health(self):
        return {"eigen_fallback_blocks": 0, "rejected_inverses": 0, "skipped_steps": self.skipped,
                "rejected_refreshes": {"fc1": 0}, "last_bad_layer": "fc1"}

    def request_capture(self):
        self.captures += 1


class _RunContext:
    def __init__(self, step: int, loss: float):
        self.args = types.SimpleNamespace(cur_step_num=step, net_outputs=Tensor(np.float32(loss)))
        self.stopped = False

    def original_args(self):
        return self.args

    def request_stop(self):
        self.stopped = True


def test_guard_counts_only_skips_made_during_its_run():
    """Skips the optimizer made before Model.train (e.g. an earlier run) do not count as this run's first step."""
    opt = _CountingOptimizer(skipped=3)
    guard = ThorGuard(opt)
    guard.on_train_begin(_RunContext(0, 0.0))
    guard.on_train_step_end(_RunContext(1, 0.5))  # finite loss, no new skip
    assert guard.streak == 0 and opt.captures == 0
    opt.skipped = 4  # THOR skips step 2
    guard.on_train_step_end(_RunContext(2, 0.5))
    assert guard.streak == 1 and guard.first_step == 2 and opt.captures == 1


# ----------------------------------------------------------------------------- batched inversion
def test_batched_refresh_rejects_one_layer_and_inverts_the_others_as_numpy():
    """Factors of the same block size from three layers are inverted in one batch: the layer whose factor holds
    NaN keeps its previous (identity) inverses and is counted; the others' inverses equal numpy's (Cholesky, or
    with a tiny damping the clamped eigen-inverse for every block, counted as fallback blocks). One optimizer
    (one compiled step): the damping is rewritten in place between the two cases."""
    ms.set_seed(0)
    net = nn.SequentialCell([nn.Dense(5, 5), nn.Tanh(), nn.Dense(5, 5), nn.Tanh(), nn.Dense(5, 3)])
    opt = thor(net, 0.01, 0.04, 0.0, frequency=1)
    rng = np.random.default_rng(3)
    for case, (damping, eigen) in enumerate([(0.04, False), (1e-12, True)]):
        ops.assign(opt.damping.values, Tensor(np.array([damping], np.float32)))
        factors = []
        for i in range(3):
            pair = []
            for param in (opt.a_batches[i], opt.g_batches[i]):
                rows = rng.normal(size=(20, param.shape[-1]))
                value = (rows.T @ rows / 20)[None].astype(np.float32)
                if i == 1 and param is opt.a_batches[1]:
                    value[0, 2, 3] = np.nan
                ops.assign(param, Tensor(value))
                pair.append(value[0].astype(np.float64))
            factors.append(pair)
        opt(tuple(ops.zeros(p.shape, p.dtype) for p in opt.parameters))
        shift = np.sqrt(np.float32(damping))
        for i, (fa, fg) in enumerate(factors):
            for got, factor in ((opt.a_inverses[i], fa), (opt.g_inverses[i], fg)):
                got = got.asnumpy()[0, 0]
                if i == 1:
                    np.testing.assert_array_equal(got, np.eye(len(factor), dtype=np.float32))
                elif eigen:
                    np.testing.assert_allclose(got, np_clamped_inverse(factor, shift), rtol=2e-3, atol=1e-3)
                else:
                    np.testing.assert_allclose(got, np.linalg.inv(factor + shift * np.eye(len(factor))), rtol=1e-4,
                                               atol=1e-5)
        health = opt.health()
        assert list(health["rejected_refreshes"].values()) == [0, case + 1, 0]
        assert health["eigen_fallback_blocks"] == (6 if eigen else 0)
        assert health["rejected_inverses"] == 0


class _EmbeddingHead(nn.Cell):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(6, 4)
        self.fc = nn.Dense(4, 3)

    def construct(self, ids):
        return self.fc(self.emb(ids).mean(1))


def test_embedding_diagonal_inverse_rejected_when_not_finite(mode):
    """An embedding's input factor is diagonal and inverted elementwise, 1 / (a + sqrt(damping)): a finite refresh
    stores numpy's inverse and counts nothing; an entry equal to -sqrt(damping) makes the new inverse infinite, so
    the refresh keeps the previous inverse whole and counts one rejected inverse (not a rejected layer: the factor
    itself is finite)."""
    ms.set_seed(0)
    damping = 0.04
    opt = thor(_EmbeddingHead(), 0.01, damping, 0.0, frequency=1)
    assert opt.a_batches[0].shape == (6,)  # the embedding's diagonal factor
    rng = np.random.default_rng(5)
    shift = np.sqrt(np.float32(damping))
    expected = None
    for case in range(2):
        diagonal = np.abs(rng.normal(size=6)).astype(np.float32) + np.float32(0.5)
        if case == 1:
            diagonal[2] = -shift
        ops.assign(opt.a_batches[0], Tensor(diagonal))
        for param in (opt.g_batches[0], opt.a_batches[1], opt.g_batches[1]):
            rows = rng.normal(size=(20, param.shape[-1]))
            ops.assign(param, Tensor((rows.T @ rows / 20)[None].astype(np.float32)))
        opt(tuple(ops.zeros(p.shape, p.dtype) for p in opt.parameters))
        got = opt.a_inverses[0].asnumpy()
        health = opt.health()
        if case == 0:
            expected = 1.0 / (diagonal.astype(np.float64) + np.float64(shift))
            np.testing.assert_allclose(got, expected, rtol=1e-6)
            assert health["rejected_inverses"] == 0
        else:
            np.testing.assert_allclose(got, expected, rtol=1e-6)  # the previous inverse, kept whole
            assert health["rejected_inverses"] == 1
        assert health["rejected_refreshes"] == {"emb": 0, "fc": 0}

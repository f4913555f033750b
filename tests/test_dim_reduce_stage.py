"""DimReduce update stage (ms_boost/dim_reduce/stage.py) against a numpy re-implementation of the step."""
from __future__ import annotations

import os
import types

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops

from ms_boost.dim_reduce import DimReduce, DimReduceUpdate, build_dim_reduce_update, prepare_pca_matrix
from ms_boost.dim_reduce.pca import parameter_specs
from ms_boost.dim_reduce.spec import DimReduceConfig
from tests.helpers.nets import learnable_data, make_net

HP = {"rho": 0.55, "gamma": 0.9, "alpha": 0.01, "sigma": 0.4}


# ----------------------------------------------------------------------------------------------------------
# numpy reference: 2-layer tanh MLP + mean softmax cross-entropy, and the DimReduce step itself
def np_loss_grad(ws, x, y):
    w1, b1, w2, b2 = ws
    a = np.tanh(x @ w1.T + b1)
    z = a @ w2.T + b2
    z = z - z.max(axis=1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    n = len(y)
    loss = -np.mean(np.log(p[np.arange(n), y]))
    dz = p.copy()
    dz[np.arange(n), y] -= 1.0
    dz /= n
    da = dz @ w2 * (1.0 - a * a)
    return loss, [da.T @ x, da.sum(0), dz.T @ a, dz.sum(0)]


def np_dim_reduce_step(ws, state, x, y, p, rho, gamma, alpha, sigma, max_search_time=2, eps=1e-20):
    """One step: g = P grad; BFGS; d = -H g; Armijo over rho^m; w += t P^T d - alpha mu."""
    shapes = [w.shape for w in ws]

    def unflat(v):
        out, off = [], 0
        for s in shapes:
            out.append(v[off:off + int(np.prod(s))].reshape(s))
            off += int(np.prod(s))
        return out

    loss, grads = np_loss_grad(ws, x, y)
    flat_w = np.concatenate([w.ravel() for w in ws])
    flat_g = np.concatenate([g.ravel() for g in grads])
    g = p @ flat_g
    h = state["h"]
    if state["has_pair"]:
        s_, y_ = state["s"], g - state["g_last"]
        if y_ @ s_ > eps:
            r = 1.0 / (y_ @ s_)
            eye = np.eye(len(g))
            h = (eye - r * np.outer(s_, y_)) @ h @ (eye - r * np.outer(y_, s_)) + r * np.outer(s_, s_)
    d = -h @ g
    direction = p.T @ d
    step, accepted, trials = 0.0, False, []
    scale = state.get("scale", 1.0)  # carry_search: the scale carried between line searches
    for m in range(max_search_time):
        t = scale * rho ** m
        new_loss, _ = np_loss_grad(unflat(flat_w + t * direction), x, y)
        trials.append(new_loss)
        if new_loss < loss + sigma * t * (g @ d):
            step, accepted = t, True
            break
    mu = gamma * state["mu"] + flat_g - p.T @ g
    new_state = dict(state, mu=mu)
    if "scale" in state:
        new_state["scale"] = min(1.0, step / rho) if accepted else scale * rho ** max_search_time
    if accepted:
        new_state.update(h=h, g_last=g, s=step * d, has_pair=True)
    return unflat(flat_w + step * direction - alpha * mu), new_state, step, loss


def np_initial_state(k, m):
    return {"h": np.eye(k), "g_last": np.zeros(k), "s": np.zeros(k), "has_pair": False, "mu": np.zeros(m)}


# ----------------------------------------------------------------------------------------------------------
class TrainStep(nn.Cell):
    """Minimal train step for the stage: loss, gradients, update (what the lead's train cell does)."""

    def __init__(self, loss_net, weights, stage):
        super().__init__(auto_prefix=False)
        self.loss_net = loss_net
        self.weights = weights
        self.stage = stage
        self.grad = ops.GradOperation(get_by_list=True)

    def construct(self, *inputs):
        loss = self.loss_net(*inputs)
        grads = self.grad(self.loss_net, self.weights)(*inputs)
        return ops.depend(loss, self.stage(loss, grads, *inputs))


class SignedTrainStep(TrainStep):
    """TrainStep handing the stage ``sign * gradients`` (``sign`` a Parameter: -1 makes an ascent direction, so
    every trial fails; one compiled step for the failed and the normal searches)."""

    def __init__(self, loss_net, weights, stage):
        super().__init__(loss_net, weights, stage)
        self.sign = ms.Parameter(Tensor(1.0, ms.float32), name="sign", requires_grad=False)

    def construct(self, *inputs):
        loss = self.loss_net(*inputs)
        grads = self.grad(self.loss_net, self.weights)(*inputs)
        grads = tuple(g * self.sign for g in grads)
        return ops.depend(loss, self.stage(loss, grads, *inputs))


def mlp(seed=1):
    ms.set_seed(seed)
    net = nn.SequentialCell(nn.Dense(6, 5), nn.Tanh(), nn.Dense(5, 3))
    loss_net = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    return loss_net, ms.ParameterTuple(loss_net.trainable_params())


def mlp_data(seed=0, n=16):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 6)).astype(np.float32)
    y = rng.integers(0, 3, n).astype(np.int32)
    return x, y


def subspace(weights, k, seed=0):
    m = sum(int(np.prod(w.shape)) for w in weights)
    rng = np.random.default_rng(seed)
    return np.linalg.qr(rng.standard_normal((m, k)))[0].T.astype(np.float32)


def test_pynative_step_after_a_checkpoint_load_into_the_trained_network():
    """PyNative: weights loaded (``load_param_into_net``) into a network that already took a step are what the
    next step's line search evaluates and updates: equal to the numpy step from the loaded weights. (A trial
    forward pass compiled before the load read the old memory: other trial losses, another accepted step.)"""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    loss_net, weights = mlp()
    k = 3
    p = subspace(weights, k)
    stage = DimReduceUpdate(loss_net, weights, p, k, **HP)
    step = TrainStep(loss_net, weights, stage)
    x, y = mlp_data()
    step(Tensor(x), Tensor(y))
    rng = np.random.default_rng(5)
    loaded = [w.asnumpy() * 3.0 + rng.normal(0, 0.5, w.shape).astype(np.float32) for w in weights]
    ms.load_param_into_net(loss_net, {w.name: ms.Parameter(Tensor(v), name=w.name) for w, v in zip(weights, loaded)})
    state = {"h": stage.inv_hessian.asnumpy().astype(np.float64), "g_last": stage.grad_last.asnumpy(),
             "s": stage.step_last.asnumpy(), "has_pair": bool(stage.has_pair.asnumpy()),
             "mu": np.concatenate([m.asnumpy().ravel() for m in stage.momentum])}
    expect, _, t, _ = np_dim_reduce_step([v.astype(np.float64) for v in loaded], state, x.astype(np.float64), y,
                                         p.astype(np.float64), **HP)
    step(Tensor(x), Tensor(y))
    assert float(stage.step_size.asnumpy()) == pytest.approx(t, rel=1e-6)
    for w, e in zip(weights, expect):
        np.testing.assert_allclose(w.asnumpy(), e, rtol=1e-4, atol=1e-5, err_msg=w.name)


def test_line_search_rejection_restores_weights_and_batchnorm(mode):
    """A step that raises the loss is rejected at every trial; weights, BN statistics and BFGS state stay."""
    net = make_net()
    loss_net = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    loss_net.set_train(True)
    weights = ms.ParameterTuple(loss_net.trainable_params())
    k = 4
    stage = DimReduceUpdate(loss_net, weights, subspace(weights, k, seed=2), k, rho=0.55, gamma=0.9, alpha=0.0,
                            sigma=0.4, max_search_time=3)
    x, y = learnable_data(16)
    x, y = Tensor(x), Tensor(y)
    grads = ops.GradOperation(get_by_list=True)(loss_net, weights)(x, y)
    loss = loss_net(x, y)
    before = {p.name: p.asnumpy().copy() for p in loss_net.get_parameters()}
    # ascent direction: the stage is told the negated gradient, so every trial step raises the loss
    wrong = tuple(-g for g in grads)
    stage(loss, wrong, x, y)
    after = {p.name: p.asnumpy() for p in loss_net.get_parameters()}
    assert any("moving_mean" in n for n in before)
    for name, value in before.items():
        assert np.array_equal(after[name], value), name  # bitwise: weights and BatchNorm statistics
    assert not bool(stage.has_pair.asnumpy())
    assert np.array_equal(stage.inv_hessian.asnumpy(), np.eye(k, dtype=np.float32))
    # the residual momentum still accumulated (only alpha = 0 kept it out of the weights)
    assert any(np.abs(m.asnumpy()).max() > 0 for m in stage.momentum)
    # with the true gradient the same stage accepts a step and the loss decreases
    stage(loss_net(x, y), grads, x, y)
    assert bool(stage.has_pair.asnumpy())
    assert float(loss_net(x, y).asnumpy()) < float(loss.asnumpy())


def test_carry_search_continues_the_backtracking_in_the_next_step(mode):
    """carry_search: a search that accepts nothing shrinks the next search's steps by rho^max_search_time;
    an accepted step t starts the next search at min(1, t / rho) (numpy reference with the scale). Two runs:
    after a failed (ascent) search, and from a fresh stage, whose 4th search accepts at its second trial (the
    next scale stays there instead of growing past the accepted step)."""
    k = 3
    x, y = mlp_data()
    xt, yt = Tensor(x), Tensor(y)
    for after_failure in (True, False):
        loss_net, weights = mlp()
        p = subspace(weights, k)
        stage = DimReduceUpdate(loss_net, weights, p, k, **HP, carry_search=True)
        step = SignedTrainStep(loss_net, weights, stage)
        scale = 1.0
        if after_failure:
            step.sign.set_data(Tensor(-1.0, ms.float32))
            step(xt, yt)  # ascent direction: every trial fails
            step.sign.set_data(Tensor(1.0, ms.float32))
            assert float(stage.step_size.asnumpy()) == 0.0
            scale = HP["rho"] ** 2
            np.testing.assert_allclose(float(stage.search_scale.asnumpy()), scale, rtol=1e-6)
        ws = [w.asnumpy().astype(np.float64) for w in weights]
        state = dict(np_initial_state(k, p.shape[1]), scale=scale,
                     mu=np.concatenate([m.asnumpy().ravel() for m in stage.momentum]).astype(np.float64))
        steps, second_trial = [], []
        for _ in range(4):
            start = state["scale"]
            step(xt, yt)
            ws, state, t, _ = np_dim_reduce_step(ws, state, x.astype(np.float64), y, p.astype(np.float64), **HP)
            steps.append(t)
            second_trial.append(t == pytest.approx(start * HP["rho"]))
            np.testing.assert_allclose(float(stage.step_size.asnumpy()), t, rtol=1e-6)
            np.testing.assert_allclose(float(stage.search_scale.asnumpy()), state["scale"], rtol=1e-6)
            for got, ref in zip(weights, ws):
                np.testing.assert_allclose(got.asnumpy(), ref, rtol=1e-5, atol=1e-5)
        if after_failure:
            assert steps[0] == pytest.approx(HP["rho"] ** 2)  # the first search started where the failed one stopped
        else:
            assert second_trial[3] and state["scale"] == pytest.approx(steps[3] / HP["rho"])
            assert state["scale"] < 1.0  # the old rule (scale / rho) would have grown it back to 1


def test_state_lives_in_parameters_and_checkpoints(tmp_path):
    loss_net, weights = mlp()
    stage = DimReduceUpdate(loss_net, weights, subspace(weights, 3), 3, **HP)
    x, y = mlp_data()
    TrainStep(loss_net, weights, stage)(Tensor(x), Tensor(y))
    path = str(tmp_path / "s.ckpt")
    ms.save_checkpoint(stage, path)
    saved = ms.load_checkpoint(path)
    for name in ("dim_reduce.inv_hessian", "dim_reduce.grad_last", "dim_reduce.step_last", "dim_reduce.has_pair",
                 "dim_reduce.momentum.0.weight", "dim_reduce.momentum.2.bias"):
        assert name in saved, sorted(saved)
    np.testing.assert_array_equal(saved["dim_reduce.step_last"].asnumpy(), stage.step_last.asnumpy())
    assert all(not p.requires_grad for p in stage.get_parameters() if p.name.startswith("dim_reduce."))
    assert not any(n.startswith("dim_reduce.pca") for n in saved)  # the PCA matrix is not a checkpoint entry


def test_bad_arguments():
    loss_net, weights = mlp()
    p = subspace(weights, 3)
    with pytest.raises(ValueError, match=r"pca_mat of shape \(3, 53\) does not fit: expected .*\(4, 53\)"):
        DimReduceUpdate(loss_net, weights, p, 4)
    with pytest.raises(ValueError, match=r"pca_mat of shape \(3, 52\)"):
        DimReduceUpdate(loss_net, weights, p[:, :-1], 3)
    with pytest.raises(ValueError, match=r"dim_reduce\.rho=1\.5 is out of range; allowed: 0\.0 < value < 1\.0"):
        DimReduceUpdate(loss_net, weights, p, 3, rho=1.5)
    with pytest.raises(ValueError, match=r"dim_reduce\.sigma=0 is out of range; allowed: 0\.0 < value < 1\.0"):
        DimReduceUpdate(loss_net, weights, p, 3, sigma=0)
    with pytest.raises(ValueError, match=r"dim_reduce.alpha=-1"):
        DimReduceUpdate(loss_net, weights, p, 3, alpha=-1)
    with pytest.raises(ValueError, match=r"dim_reduce.max_search_time=0"):
        DimReduceUpdate(loss_net, weights, p, 3, max_search_time=0)
    bad = p.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        DimReduceUpdate(loss_net, weights, bad, 3)


def test_local_block_for_simulated_ranks():
    """Each rank keeps ceil(k/R) rows; padding rows are zero; the blocks stacked give P then zeros."""
    loss_net, weights = mlp()
    p = subspace(weights, 5)
    for ranks in (2, 3, 4):
        blocks = [DimReduceUpdate(loss_net, weights, p, 5, rank=r, rank_size=ranks).pca_rows.asnumpy()
                  for r in range(ranks)]
        stacked = np.concatenate(blocks)
        assert stacked.shape[0] == ranks * -(-5 // ranks)
        np.testing.assert_array_equal(stacked[:5], p)
        assert not stacked[5:].any()
        # a rank's own block is accepted as is
        DimReduceUpdate(loss_net, weights, blocks[-1], 5, rank=ranks - 1, rank_size=ranks)


def _save_trajectory(folder, weights, num, seed=0):
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    walk = [np.zeros(w.shape, np.float32) for w in weights]
    for i in range(num):
        walk = [v + rng.standard_normal(v.shape).astype(np.float32) * 0.1 for v in walk]
        items = [{"name": w.name, "data": Tensor(w.asnumpy() + v)} for w, v in zip(weights, walk)]
        ms.save_checkpoint(items, os.path.join(folder, f"net-{i}_1.ckpt"))


def test_prepare_computes_saves_and_reloads(tmp_path):
    loss_net, weights = mlp()
    folder = str(tmp_path / "ckpt")
    _save_trajectory(folder, weights, 6)
    specs = parameter_specs(weights)
    target = str(tmp_path / "pca_mat.npy")
    rows = prepare_pca_matrix(specs, 4, target, folder, timeout=60, device_number=8, progress=None)
    assert rows.shape == (4, 53) and os.path.isfile(target)
    np.testing.assert_array_equal(rows, np.load(target))
    # second time: the saved file is used (the folder is no longer needed)
    again = prepare_pca_matrix(specs, 3, target, None, timeout=60, progress=None)
    np.testing.assert_array_equal(again, rows[:3])
    # without pca_mat_path the matrix goes to weight_load_dir/pca_mat.npy
    prepare_pca_matrix(specs, 2, None, folder, timeout=60, progress=None)
    assert np.load(os.path.join(folder, "pca_mat.npy")).shape == (2, 53)
    with pytest.raises(ValueError, match="both are None"):
        prepare_pca_matrix(specs, 2, None, None)
    with pytest.raises(ValueError, match="does not exist and weight_load_dir is None"):
        prepare_pca_matrix(specs, 2, str(tmp_path / "missing.npy"), None)
    with pytest.raises(ValueError, match="does not fit the network"):
        prepare_pca_matrix(specs[:2], 2, target, None)
    with pytest.raises(ValueError, match=r"dim_reduce.n_components=6 needs at least 7 stage-1 checkpoints in "
                                         r"dim_reduce.weight_load_dir='.*ckpt' .* found 6"):
        prepare_pca_matrix(specs, 6, str(tmp_path / "other.npy"), folder)
    # a missing (or mistyped) folder is named as such, not as an unwritable pca_mat_path
    for missing in (str(tmp_path / "ckpt_typo"), os.path.join(folder, "net-0_1.ckpt")):
        with pytest.raises(ValueError, match=r"dim_reduce.weight_load_dir=.* is not an existing folder"):
            prepare_pca_matrix(specs, 2, None, missing)
        with pytest.raises(ValueError, match=r"is not an existing folder.*pca_mat_path='.*new.npy' does not exist"):
            prepare_pca_matrix(specs, 2, str(tmp_path / "new.npy"), missing)
    with pytest.raises(TimeoutError, match="time limit"):
        prepare_pca_matrix(specs, 2, str(tmp_path / "slow.npy"), folder, timeout=1e-9, progress=None)


def test_builder_from_config_sections(tmp_path):
    """The builder is host code (PyNative here); the stage it builds (carry_search, max_search_time 3) steps in
    both modes in test_carry_search_continues_the_backtracking_in_the_next_step and
    test_line_search_rejection_restores_weights_and_batchnorm."""
    loss_net, weights = mlp()
    folder = str(tmp_path / "ckpt")
    _save_trajectory(folder, weights, 5)
    cfg = DimReduceConfig(rho=0.5, gamma=0.8, alpha=0.002, sigma=0.3, n_components=3,
                          pca_mat_path=str(tmp_path / "p.npy"), weight_load_dir=folder, timeout=60,
                          max_search_time=3, carry_search=True)
    stage = build_dim_reduce_update(loss_net, weights, cfg, types.SimpleNamespace(device_number=8))
    assert stage.pca_rows.shape == (3, 53) and len(stage.trial_steps) == 3 and stage.carry_search
    x, y = mlp_data()
    before = float(loss_net(Tensor(x), Tensor(y)).asnumpy())
    step = TrainStep(loss_net, weights, stage)
    for _ in range(3):
        step(Tensor(x), Tensor(y))
    assert float(loss_net(Tensor(x), Tensor(y)).asnumpy()) < before


def test_tutorial_stage2_call_through_model(tmp_path):
    """The tutorial's stage-2 ``Model(...)`` call, as written (n_component 32, device_num 8, timeout 1200): it
    computes the PCA matrix from the weight folder, saves it and trains; a matrix precomputed with
    ``compute_pca_matrix`` is loaded by the same call instead (the same matrix)."""
    from mindspore.train import LossMonitor

    from ms_boost import Model
    from ms_boost.dim_reduce import compute_pca_matrix
    from tests.helpers.nets import dataset
    from tests.workers.dim_reduce_worker import dim_reduce_stage

    folder = str(tmp_path / "checkpoint_pca")
    _save_trajectory(folder, make_net().trainable_params(), 33)
    precomputed = str(tmp_path / "precomputed.npy")
    compute_pca_matrix(folder, 32, parameter_specs(make_net().trainable_params()), output=precomputed)

    def tutorial_model(net, pca_mat_path):
        boost_dict = {"boost": {"mode": "manual", "dim_reduce": True}, "common": {"device_num": 8},
                      "dim_reduce": {"rho": 0.55, "gamma": 0.9, "alpha": 0.001, "sigma": 0.4, "n_component": 32,
                                     "pca_mat_path": pca_mat_path, "weight_load_dir": folder, "timeout": 1200}}
        loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        opt = nn.SGD(net.trainable_params(), learning_rate=1)
        return Model(net, loss_fn=loss, optimizer=opt, metrics={"acc"}, boost_level="O1",
                     boost_config_dict=boost_dict)

    pca_mat_path = str(tmp_path / "pca_mat.npy")
    model = tutorial_model(make_net(), pca_mat_path)
    x, y = learnable_data(64)
    losses = []

    class Record(LossMonitor):
        def step_end(self, run_context):
            losses.append(float(run_context.original_args().net_outputs.asnumpy()))

    model.train(2, dataset(x, y), callbacks=[Record()], dataset_sink_mode=False)
    stage = dim_reduce_stage(model)
    assert stage.pca_rows.shape[0] == 32 and os.path.isfile(pca_mat_path)
    assert bool(stage.has_pair.asnumpy())
    assert np.mean(losses[-4:]) < np.mean(losses[:4])
    assert model.eval(dataset(x, y))["acc"] > 0.25
    # the precomputed matrix: loaded as is, equal to the one the call computed
    computed = np.load(pca_mat_path)
    np.testing.assert_array_equal(computed, np.load(precomputed))
    os.utime(precomputed, (1, 1))  # an old file: still used (no recomputation, which would rewrite it)
    loaded = dim_reduce_stage(tutorial_model(make_net(), precomputed))
    np.testing.assert_array_equal(loaded.pca_rows.asnumpy(), computed)
    assert os.stat(precomputed).st_mtime == 1


class UpstreamStep(nn.Cell):
    """Upstream's train-cell wiring of mindspore.boost.DimReduce (weights clone; gradients of ``scale * loss``,
    as under a loss scale, with the scale passed on)."""

    def __init__(self, loss_net, weights, dim_reduce, scale=1.0):
        super().__init__(auto_prefix=False)
        self.loss_net, self.weights, self.dim_reduce = loss_net, weights, dim_reduce
        self.weights_clone = weights.clone(prefix="weights_clone", init="same")
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)
        self.scale = Tensor(scale, ms.float32)

    def construct(self, *inputs):
        loss = self.loss_net(*inputs)
        grads = self.grad(self.loss_net, self.weights)(*inputs, self.scale)
        return ops.depend(loss, self.dim_reduce(loss, grads, self.scale, self.weights, self.weights_clone,
                                                *inputs))


def check_numpy_step(stage, weights, state, x, y, p, loss) -> tuple:
    """The numpy step from ``state`` (float64) against what ``stage`` just did: loss, weights, BFGS state,
    residual momentum. Returns the numpy weights, state and accepted step length."""
    ws = [w.astype(np.float64) for w in state.pop("weights")]
    ws, state, t, ref_loss = np_dim_reduce_step(ws, state, x.astype(np.float64), y, p.astype(np.float64), **HP)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    for got, ref in zip(weights, ws):
        np.testing.assert_allclose(got.asnumpy(), ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(stage.inv_hessian.asnumpy(), state["h"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(stage.step_last.asnumpy(), state["s"], rtol=1e-4, atol=1e-6)
    assert bool(stage.has_pair.asnumpy()) == state["has_pair"]
    mu = np.concatenate([m.asnumpy().ravel() for m in stage.momentum])
    np.testing.assert_allclose(mu, state["mu"], rtol=1e-5, atol=1e-5)
    return dict(state, weights=ws), t


def test_steps_equal_numpy_and_upstream_dim_reduce(mode):
    """Four steps of ms_boost's DimReduceUpdate equal the numpy step (loss, weights, BFGS state, momentum) and
    upstream mindspore.boost.DimReduce on one device (its SGD(lr=1) applies the step there); so do those of
    ms_boost's DimReduce in upstream's signature and wiring, given the gradients of 8 * loss and the loss scale 8
    (it divides them by the scale). (k = 5; k = 3 against numpy in the carry_search test: the code path does not
    depend on k.)"""
    from mindspore.boost.dim_reduce import DimReduce as UpstreamDimReduce

    x, y = mlp_data()
    k = 5
    results = []
    for impl in ("ms_boost", "ms_boost_upstream_signature", "upstream"):
        loss_net, weights = mlp()
        p = subspace(weights, k)
        if impl == "ms_boost":
            stage = DimReduceUpdate(loss_net, weights, p, k, **HP)
            step = TrainStep(loss_net, weights, stage)
            state = dict(np_initial_state(k, p.shape[1]), weights=[w.asnumpy().copy() for w in weights])
            accepted = []
        elif impl == "ms_boost_upstream_signature":
            stage = DimReduce(loss_net, None, weights, p, k, HP["rho"], HP["gamma"], HP["alpha"], HP["sigma"], 0, 1)
            step = UpstreamStep(loss_net, weights, stage, scale=8.0)
        else:
            opt = nn.SGD(weights, learning_rate=1.0)
            up = UpstreamDimReduce(loss_net, opt, weights, p, k, HP["rho"], HP["gamma"], HP["alpha"], HP["sigma"],
                                   0, 1)
            step = UpstreamStep(loss_net, weights, up)
        trace = []
        for _ in range(4):
            loss = step(Tensor(x), Tensor(y)).asnumpy()
            trace.append(np.concatenate([w.asnumpy().ravel() for w in weights]))
            if impl == "ms_boost":
                state, t = check_numpy_step(stage, weights, state, x, y, p, loss)
                accepted.append(t)
        results.append(trace)
        if impl == "ms_boost":
            assert state["has_pair"] and not np.allclose(state["h"], np.eye(k))  # the BFGS update really ran
            assert any(t > 0 for t in accepted)
    for other in results[1:]:
        for i, (a, b) in enumerate(zip(results[0], other)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=f"step {i}")
    assert not np.allclose(results[0][0], results[0][-1])

"""ms_boost.adasum: tree schedule, pair/tree math, the update stage, multi-rank runs (loopback ranks, msrun).

Every number is checked against the numpy reference below (float64), written independently of the
module: the tree is the recursive split of ``[0, n)`` at the largest power of two below ``n`` (the
module builds it level by level), and the training reference recomputes the whole step (per-rank
gradients of the linear model, per-server mean, optimizer deltas with per-server state, the tree).
"""
from __future__ import annotations

import functools
import warnings
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, ParameterTuple, Tensor, nn

from ms_boost import adasum
from ms_boost.adasum import (
    AdaSum,
    AdaSumReduce,
    AdaSumUpdate,
    adasum_pair,
    adasum_schedule,
    adasum_tree_reduce,
    plan_buckets,
    server_layout,
)
from ms_boost.stages import OptimizerUpdate
from tests.helpers.loopback import run_ranks
from tests.helpers.msrun import run_msrun
from tests.workers import adasum_steps as steps
from tests.workers.adasum_worker import (
    FP16_SHAPES,
    OPTIMIZER_STEPS,
    fp16_old_params,
    fp16_server_deltas,
    layout_results,
    mode_results,
)

WORKERS = Path(__file__).resolve().parent / "workers"


# --------------------------------------------------------------------------------------------------
# numpy reference
# --------------------------------------------------------------------------------------------------
def np_pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """AdaSum(a, b) in float64; a zero vector contributes nothing (its coefficient is irrelevant)."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    dot = float(np.sum(a * b))
    na, nb = float(np.sum(a * a)), float(np.sum(b * b))
    ca = 1.0 - dot / (2 * na) if na > 0 else 1.0
    cb = 1.0 - dot / (2 * nb) if nb > 0 else 1.0
    return ca * a + cb * b


def np_tree(vectors) -> np.ndarray:
    """Recursive AdaSum over contiguous halves: [0, n) splits at the largest power of two below n."""
    n = len(vectors)
    if n == 1:
        return np.asarray(vectors[0], np.float64)
    p = 1
    while p * 2 < n:
        p *= 2
    return np_pair(np_tree(vectors[:p]), np_tree(vectors[p:]))


def np_tree_blocks(n: int):
    """The merges of the recursive definition, as (left ranks, right ranks), any order."""
    if n == 1:
        return []

    def rec(lo, hi):
        if hi - lo == 1:
            return []
        p = 1
        while p * 2 < hi - lo:
            p *= 2
        return rec(lo, lo + p) + rec(lo + p, hi) + [(tuple(range(lo, lo + p)), tuple(range(lo + p, hi)))]
    return rec(0, n)


def np_grads(w: dict, x: np.ndarray, y: np.ndarray) -> dict:
    """Gradients of mean((W2 (W1 x + b1) + b2 - y)^2) for the TwoLayerLinear test model."""
    x, y = x.astype(np.float64), y.astype(np.float64)
    h = x @ w["w1"].T + w["b1"]
    pred = h @ w["w2"].T + w["b2"]
    e = 2.0 * (pred - y) / pred.size
    gh = e @ w["w2"]
    return {"w1": gh.T @ x, "b1": gh.sum(0), "w2": e.T @ h, "b2": e.sum(0), "frozen": np.zeros_like(w["frozen"])}


def np_optimizer_delta(name: str, g: dict, state: dict, t: int) -> dict:
    """One optimizer step's weight delta (and state update in place) as MindSpore's Momentum / Adam."""
    delta = {}
    for k, gk in g.items():
        if name == "momentum":
            v = state.setdefault(k, {"v": np.zeros_like(gk)})
            v["v"] = 0.9 * v["v"] + gk
            delta[k] = -0.1 * v["v"]
        elif name == "adam":
            s = state.setdefault(k, {"m": np.zeros_like(gk), "v": np.zeros_like(gk)})
            s["m"] = 0.9 * s["m"] + 0.1 * gk
            s["v"] = 0.999 * s["v"] + 0.001 * gk * gk
            lr_t = 0.05 * np.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t)
            delta[k] = -lr_t * s["m"] / (np.sqrt(s["v"]) + 1e-8)
        else:
            raise ValueError(name)
    return delta


def np_train(optimizer: str, steps_count: int, world: int, device_number: int) -> dict:
    """The whole data-parallel AdaSum training of TwoLayerLinear, float64."""
    w = {k: v.astype(np.float64) for k, v in steps.initial_weights().items()}
    servers = max(world // device_number, 1)
    states = [{} for _ in range(servers)]
    for t in range(steps_count):
        deltas = []
        for s in range(servers):
            ranks = range(s * device_number, min((s + 1) * device_number, world))
            per_rank = [np_grads(w, *steps.rank_data(r, t)) for r in ranks]
            g = {k: np.mean([pr[k] for pr in per_rank], axis=0) for k in w}
            deltas.append(np_optimizer_delta(optimizer, g, states[s], t + 1))
        w = {k: w[k] + np_tree([d[k] for d in deltas]) for k in w}
    return w


# --------------------------------------------------------------------------------------------------
# schedule and buckets (pure Python)
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", list(range(1, 18)))
def test_schedule_equals_recursive_split(n):
    levels = adasum_schedule(n)
    merges = [m for level in levels for m in level.merges]
    assert sorted(merges) == sorted(np_tree_blocks(n))
    assert len(merges) == n - 1
    assert len(levels) == (0 if n == 1 else int(np.ceil(np.log2(n))))
    blocks = [(r,) for r in range(n)]
    for level in levels:  # every level consumes exactly the blocks of the previous one, in order
        consumed = [b for m in level.merges for b in m] + ([level.carried] if level.carried else [])
        assert consumed == blocks
        assert level.num_nodes == len(blocks)
        blocks = [a + b for a, b in level.merges] + ([level.carried] if level.carried else [])
    assert blocks == [tuple(range(n))]


def test_schedule_powers_of_two_are_the_tutorial_halves_and_leftover_is_carried():
    four = adasum_schedule(4)
    assert four[0].merges == (((0,), (1,)), ((2,), (3,))) and four[0].carried is None
    assert four[1].merges == (((0, 1), (2, 3)),)
    three = adasum_schedule(3)
    assert three[0].merges == (((0,), (1,)),) and three[0].carried == (2,)
    assert three[1].merges == (((0, 1), (2,)),) and three[1].carried is None
    six = adasum_schedule(6)
    assert six[1].carried == (4, 5) and six[2].merges == (((0, 1, 2, 3), (4, 5)),)
    assert adasum_schedule(1) == ()


@pytest.mark.parametrize("bad, exc", [(0, ValueError), (-2, ValueError), (2.0, TypeError), (True, TypeError)])
def test_schedule_rejects_bad_counts(bad, exc):
    with pytest.raises(exc, match="num_servers"):
        adasum_schedule(bad)


def test_plan_buckets_groups_consecutive_tensors_and_pads_to_chunks_and_shards():
    sizes = [3, 5, 10, 2, 1]
    buckets = plan_buckets(sizes, 8, 3, chunk=4)
    assert [(b.first, b.stop) for b in buckets] == [(0, 2), (2, 3), (3, 5)]
    for b in buckets:
        own = sizes[b.first:b.stop]
        assert all(p % 4 == 0 and s <= p < s + 4 for p, s in zip(b.padded, own))
        assert list(b.starts) == list(np.cumsum((0,) + b.padded[:-1]))
        assert b.length % (3 * 4) == 0 and b.shard * 3 == b.length and 0 <= b.tail < 3 * 4
        e = b.indicator()
        assert e.shape == (b.length // 4, b.stop - b.first)
        np.testing.assert_array_equal(e.sum(0) * 4, b.padded)  # chunks of each tensor
        assert e.sum(1).max() == 1 and e.sum() * 4 == sum(b.padded)
    one = plan_buckets(sizes, 10 ** 9, 1, chunk=1)
    assert len(one) == 1 and one[0].padded == tuple(sizes) and one[0].tail == 0 and one[0].shard == 21


# --------------------------------------------------------------------------------------------------
# math, single process, both modes
# --------------------------------------------------------------------------------------------------
class _Pair(nn.Cell):
    def construct(self, a, b):
        return adasum_pair(a, b)


class _Tree(nn.Cell):
    def __init__(self, n):
        super().__init__()
        self.plan = tuple(level.plan for level in adasum_schedule(n))

    def construct(self, nodes):
        return adasum_tree_reduce(nodes, self.plan)


def test_pair_matches_numpy_and_invariants(mode):
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(2, 3, 5)).astype(np.float32)
    pair = _Pair()
    np.testing.assert_allclose(pair(Tensor(a), Tensor(b)).asnumpy(), np_pair(a, b), atol=1e-6, rtol=1e-5)
    # orthogonal deltas add, identical deltas give that delta, a zero delta is neutral, 0+0 = 0 (no NaN)
    u = np.zeros((3, 5), np.float32)
    v = np.zeros((3, 5), np.float32)
    u[0] = a[0]
    v[1:] = b[1:]
    np.testing.assert_allclose(pair(Tensor(u), Tensor(v)).asnumpy(), u + v, atol=1e-7)
    np.testing.assert_array_equal(pair(Tensor(a), Tensor(a)).asnumpy(), a)
    zero = np.zeros_like(a)
    np.testing.assert_array_equal(pair(Tensor(zero), Tensor(b)).asnumpy(), b)
    np.testing.assert_array_equal(pair(Tensor(a), Tensor(zero)).asnumpy(), a)
    np.testing.assert_array_equal(pair(Tensor(zero), Tensor(zero)).asnumpy(), zero)
    # anti-parallel: a and -a cancel to 0
    np.testing.assert_allclose(pair(Tensor(a), Tensor(-a)).asnumpy(), 0, atol=1e-7)
    # squares that underflow float32 (||u||^2 ~ 1e-43): finite, and u is negligible next to b
    u = np.full((3, 5), 1e-22, np.float32)
    out = pair(Tensor(u), Tensor(b)).asnumpy()
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, b, atol=1e-6)


def test_pair_combines_float16_in_float32(mode):
    rng = np.random.default_rng(2)
    a, b = (rng.normal(0, 1e-3, size=(2, 64))).astype(np.float16)
    out = _Pair()(Tensor(a), Tensor(b))
    assert out.dtype == ms.float32
    # in float16 the squared norms (~6e-5) lose most digits and tiny deltas underflow; in float32 they don't
    np.testing.assert_allclose(out.asnumpy(), np_pair(a.astype(np.float64), b), rtol=1e-5, atol=1e-9)
    tiny = np.full((8,), 1e-4, np.float16)  # ||tiny||^2 = 8e-8 underflows to 0 in float16
    np.testing.assert_allclose(_Pair()(Tensor(tiny), Tensor(tiny)).asnumpy(), tiny.astype(np.float32), rtol=1e-6)


@functools.cache
def _tree(n: int) -> _Tree:
    """One compiled tree cell per server count (Graph mode compiles once per cell and input shape)."""
    return _Tree(n)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7])
def test_tree_matches_numpy_reference_and_invariants(mode, n):
    rng = np.random.default_rng(10 + n)
    nodes = rng.normal(size=(n, 12)).astype(np.float32)
    if n > 2:
        nodes[1] = 0  # a zero-norm delta (frozen layer on that server)
    out = _tree(n)(Tensor(nodes)).asnumpy()
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, np_tree(list(nodes)), rtol=1e-5, atol=1e-6)
    # the leftover rule is the power-of-two tree padded with zero deltas
    pow2 = 1 << (n - 1).bit_length()
    padded = np.concatenate([nodes, np.zeros((pow2 - n, 12), np.float32)])
    np.testing.assert_allclose(out, _tree(pow2)(Tensor(padded)).asnumpy(), rtol=1e-6, atol=1e-7)
    # invariants: identical deltas give that delta, mutually orthogonal deltas add
    base = rng.normal(size=(12,)).astype(np.float32)
    np.testing.assert_allclose(_tree(n)(Tensor(np.tile(base, (n, 1)))).asnumpy(), base, rtol=1e-6)
    ortho = np.zeros((n, 12), np.float32)
    for s, cols in enumerate(np.array_split(np.arange(12), n)):  # disjoint supports
        ortho[s, cols] = rng.normal(size=cols.size)
    np.testing.assert_allclose(_tree(n)(Tensor(ortho)).asnumpy(), ortho.sum(0), rtol=1e-6, atol=1e-7)


class _SegTree(nn.Cell):
    def __init__(self, n, indicator, chunk):
        super().__init__()
        self.plan = tuple(level.plan for level in adasum_schedule(n))
        self.indicator, self.chunk = Tensor(indicator), chunk

    def construct(self, nodes):
        return adasum_tree_reduce(nodes, self.plan, self.indicator, self.chunk)


@pytest.mark.parametrize("n", [2, 3, 5])
def test_fused_segmented_tree_equals_per_tensor_numpy(mode, n):
    """The fused layout (chunks, padding, shards) gives each tensor its own AdaSum tree."""
    sizes = [5, 1, 130, 7, 12]
    (bucket,) = plan_buckets(sizes, 10 ** 6, 3, chunk=8)
    rng = np.random.default_rng(30 + n)
    per_server = [[rng.normal(size=k).astype(np.float32) for k in sizes] for _ in range(n)]
    per_server[0][3][:] = 0  # a frozen tensor on server 0 only
    for s in range(n):
        per_server[s][1][:] = 0  # frozen everywhere
    nodes = np.zeros((n, bucket.length), np.float32)
    for s in range(n):
        for k, start in enumerate(bucket.starts):
            nodes[s, start:start + sizes[k]] = per_server[s][k]
    out = _SegTree(n, bucket.indicator(), 8)(Tensor(nodes)).asnumpy()
    assert np.isfinite(out).all()
    for k, start in enumerate(bucket.starts):
        expect = np_tree([per_server[s][k] for s in range(n)])
        np.testing.assert_allclose(out[start:start + sizes[k]], expect, rtol=1e-5, atol=1e-6)
    mask = np.ones(bucket.length, bool)
    for k, start in enumerate(bucket.starts):
        mask[start:start + sizes[k]] = False
    np.testing.assert_array_equal(out[mask], 0)  # padding stays zero
    np.testing.assert_array_equal(out[bucket.starts[1]], 0)


# --------------------------------------------------------------------------------------------------
# cells on one process
# --------------------------------------------------------------------------------------------------
def test_update_on_one_rank_is_the_plain_step_with_one_warning(mode):
    net_a = steps.TwoLayerLinear()
    opt_a = steps.make_optimizer("momentum", net_a.trainable_params())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step_a = steps.TinyTrainStep(nn.WithLossCell(net_a, nn.MSELoss()), opt_a, device_number=8)
    ada_warnings = [w for w in caught if "AdaSum is a no-op" in str(w.message)]
    assert len(ada_warnings) == 1
    net_b = steps.TwoLayerLinear()
    opt_b = steps.make_optimizer("momentum", net_b.trainable_params())
    step_b = steps.TinyTrainStep(nn.WithLossCell(net_b, nn.MSELoss()), opt_b, adasum=False)
    for t in range(2):
        x, y = steps.rank_data(0, t)
        step_a(Tensor(x), Tensor(y))
        step_b(Tensor(x), Tensor(y))
    for pa, pb in zip(net_a.trainable_params(), net_b.trainable_params()):
        np.testing.assert_array_equal(pa.asnumpy(), pb.asnumpy())
    ref = np_train("momentum", 2, 1, 1)
    for p in net_a.trainable_params():
        np.testing.assert_allclose(p.asnumpy(), ref[p.name], atol=1e-5)


def test_upstream_adasum_cell_on_one_server_applies_old_minus_delta(mode):
    old = fp16_old_params()
    params = ParameterTuple(Parameter(Tensor(a), name=f"p{i}") for i, a in enumerate(old))
    olds = ParameterTuple(Parameter(Tensor(a), name=f"o{i}") for i, a in enumerate(old))
    cell = AdaSum(0, 1, 1, params)

    class Apply(nn.Cell):
        def __init__(self):
            super().__init__()
            self.cell, self.params, self.olds = cell, params, olds

        def construct(self, deltas):
            return self.cell(deltas, self.params, self.olds)

    deltas = fp16_server_deltas(1)
    Apply()(steps.to_float16_tuple(deltas))
    for p, o, d in zip(params, old, deltas):
        expect = (o.astype(np.float32) - d.astype(np.float32)).astype(np.float16)
        np.testing.assert_array_equal(p.asnumpy(), expect)


def test_bad_arguments_raise_with_the_name_and_value():
    with pytest.raises(TypeError, match="device_number"):
        server_layout(2.0)
    with pytest.raises(ValueError, match="device_number=0"):
        server_layout(0)
    with pytest.raises(ValueError, match="bucket_size"):
        AdaSumReduce([(2,)], 1, bucket_size=0)
    with pytest.raises(ValueError, match="chunk"):
        AdaSumReduce([(2,)], 1, chunk=True)
    net = steps.TwoLayerLinear()
    with pytest.raises(TypeError, match="inner"):
        AdaSumUpdate(lambda *a: None, net.trainable_params(), 1)
    with pytest.raises(TypeError, match="weights"):
        AdaSumUpdate(OptimizerUpdate(nn.SGD(net.trainable_params())), [Tensor(np.ones(2))], 1)
    with pytest.raises(ValueError, match="rank=3"):
        AdaSum(3, 1, 1, net.trainable_params())
    with pytest.raises(ValueError, match="group_number=4"):
        AdaSum(0, 1, 4, net.trainable_params())
    assert adasum.server_layout(8) == (1, 0)


# --------------------------------------------------------------------------------------------------
# multi-rank: every rank equals the numpy reference of the whole training
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("workers, device_numbers, optimizers, fp16, with_model", [
    (3, (1,), ("momentum", "adam"), False, False),
    (4, (2,), (), True, True)],
    ids=["3ranks", "2servers_x_2devices"])
def test_loopback_training_matches_numpy_reference(workers, device_numbers, optimizers, fp16, with_model):
    """PyNative, on simulated ranks (tests/helpers/loopback.py): weights on every rank after the whole training
    equal the numpy reference to 1e-5: the tree over 3 servers (a carried leaf, two levels) with Momentum and Adam,
    and 2 servers of 2 devices (server-group mean, sharded AllGather) with the float16 cells and ``Model`` (the
    linear training through the library's train cell, plain and with an overflow step; the tutorial's conv net
    runs under msrun in tests/test_tutorials.py and on one process). The msrun job below runs the same 2 x 2 cases
    in Graph mode. Each new AdaSum cell compiles its fused steps once per rank (they take Parameters), so the
    cases are spread over the layouts rather than repeated."""
    def rank_fn(rank):
        return {**layout_results(),
                **mode_results("pynative", device_numbers, with_model, optimizers, fp16, tutorial=False)}

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # AdaSum must be active on every rank (no "no-op" warning)
        results = run_ranks(workers, rank_fn)
    check_results(results, workers, device_numbers, "pynative", "pynative" if with_model else None, optimizers, fp16,
                  tutorial=False)


@pytest.mark.msrun
def test_msrun_graph_training_matches_numpy_reference():
    """Graph mode under a real 4-worker msrun job (MCCL): the float16 cells as 4 servers x 1 device (the
    two-level tree with real communication) and as 2 servers x 2 devices, and the linear training through Model
    (2 x 2, plain and an overflow step) against numpy. The tutorial's conv net runs in Graph mode under msrun in
    tests/test_tutorials.py."""
    results = run_msrun(WORKERS / "adasum_worker.py", workers=4, args=["1,2", "graph", "graph", "2", "no_tutorial"])
    check_results(results, 4, (1, 2), "graph", "graph", (), tutorial=False, model_device_number=2)


def check_results(results, workers: int, device_numbers, mode: str, model_mode, optimizers, fp16=True,
                  tutorial=True, model_device_number: int = 0) -> None:
    """Every AdaSum case saved by ``adasum_worker.mode_results`` against the numpy reference."""
    init = steps.initial_weights()
    assert int(results[0]["layout/servers_when_device_number_is_world"]) == 1
    if workers > 2:  # a device_number that does not divide the ranks is refused, naming the key
        msg = str(results[0]["layout/non_divisor_error"])
        assert f"common.device_number={workers - 1}" in msg and f"({workers})" in msg
    for dn in device_numbers:
        prefix = f"d{dn}/{mode}"
        for opt in optimizers:
            steps_count = OPTIMIZER_STEPS[opt]
            ref = np_train(opt, steps_count, workers, dn)
            _check_ranks(results, f"{prefix}/{opt}", ref)
            np.testing.assert_array_equal(results[0][f"{prefix}/{opt}/frozen"], init["frozen"])
            # AdaSum is not the mean: with more than one server the result differs from averaging deltas
            assert np.abs(ref["w1"] - np_train(opt, steps_count, workers, workers)["w1"]).max() > 1e-4
        if fp16:
            _check_fp16_upstream_cell(results, prefix, workers // dn)
    if model_mode:
        dn = model_device_number or device_numbers[-1]
        _check_model_cases(results, f"d{dn}/{model_mode}", workers, dn, tutorial)


def _check_ranks(results, prefix: str, ref: dict) -> None:
    for name in ref:
        for rank, res in enumerate(results):
            got = res[f"{prefix}/{name}"]
            np.testing.assert_allclose(got, ref[name], atol=1e-5, rtol=0, err_msg=f"{prefix}/{name} rank {rank}")
            np.testing.assert_array_equal(got, results[0][f"{prefix}/{name}"])


def _check_fp16_upstream_cell(results, prefix: str, servers: int) -> None:
    server_deltas = [fp16_server_deltas(s) for s in range(servers)]
    for i, old in enumerate(fp16_old_params()):
        combined = np_tree([d[i].astype(np.float64) for d in server_deltas])
        expect = (old.astype(np.float64) - combined).astype(np.float16)
        for res in results:  # float16 weights: equal to the reference up to one float16 rounding
            got = res[f"{prefix}/fp16/p{i}"]
            assert got.dtype == np.float16 and got.shape == FP16_SHAPES[i] and np.isfinite(got).all()
            err = np.abs(got.astype(np.float64) - expect.astype(np.float64))
            assert (err <= np.spacing(np.abs(expect))).all(), (prefix, i, err.max())
        if i == 1:  # zero delta on every server: unchanged
            np.testing.assert_array_equal(results[0][f"{prefix}/fp16/p1"], old)
        # AdaSumUpdate on float16 weights: the delta is (w_old + d) rounded to float16, minus w_old
        stepped = [(old + d[i]).astype(np.float16) for d in server_deltas]  # float16 addition, rounded
        combined = np_tree([st.astype(np.float64) - old.astype(np.float64) for st in stepped])
        expect = (old.astype(np.float64) + combined).astype(np.float16)
        for res in results:
            got = res[f"{prefix}/fp16_update/w{i}"]
            assert got.dtype == np.float16 and np.isfinite(got).all()
            err = np.abs(got.astype(np.float64) - expect.astype(np.float64))
            assert (err <= np.spacing(np.abs(expect))).all(), (prefix, i, err.max())
            np.testing.assert_array_equal(got, results[0][f"{prefix}/fp16_update/w{i}"])


def _check_model_cases(results, prefix: str, workers: int, device_number: int, tutorial: bool) -> None:
    """ms_boost.Model with boost O2 + the tutorial's adasum dict (+ common.device_number)."""
    ref = np_train("momentum", 2, workers, device_number)
    _check_ranks(results, f"{prefix}/model/plain", ref)
    if workers > device_number:  # AdaSum across servers is not the mean over every rank
        assert np.abs(ref["w1"] - np_train("momentum", 2, workers, workers)["w1"]).max() > 1e-4
    np.testing.assert_array_equal(results[0][f"{prefix}/model/plain/frozen"], steps.initial_weights()["frozen"])
    # an overflow (inf input on the last rank only) between the two steps changes nothing on any rank
    _check_ranks(results, f"{prefix}/model/overflow", ref)
    if not tutorial:
        return
    tutorial = sorted(k for k in results[0] if k.startswith(f"{prefix}/model/tutorial/"))
    assert tutorial
    for key in tutorial:
        for res in results:
            assert np.isfinite(res[key]).all()
            np.testing.assert_array_equal(res[key], results[0][key])
    changed = [np.abs(results[0][k] - results[0][k.replace("/tutorial/", "/tutorial_init/")]).max() for k in tutorial]
    assert max(changed) > 1e-4


def test_tutorial_usage_on_one_process_runs_with_one_warning(mode):
    """The tutorial's call as written (device_number left at its default) on one process."""
    from mindspore.train import FixedLossScaleManager

    from ms_boost import Model
    from tests.helpers.nets import dataset, learnable_data, make_net
    from tests.workers.adasum_worker import TUTORIAL_BOOST

    net = make_net()
    before = [p.asnumpy().copy() for p in net.trainable_params()]
    opt = nn.Momentum(net.trainable_params(), 0.01, 0.9, loss_scale=1024)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), optimizer=opt,
                      loss_scale_manager=FixedLossScaleManager(1024, drop_overflow_update=False), amp_level="O2",
                      boost_level="O2", boost_config_dict=TUTORIAL_BOOST)
        x, y = learnable_data(32)
        model.train(1, dataset(x, y, batch_size=16), dataset_sink_mode=False)
    assert len([w for w in caught if "AdaSum is a no-op" in str(w.message)]) == 1
    after = [p.asnumpy() for p in net.trainable_params()]
    assert all(np.isfinite(a).all() for a in after)
    assert max(np.abs(a - b).max() for a, b in zip(after, before)) > 1e-4

"""THOR checkpoints of another factor layout: whole factors (written before the block capture), another block size.

The old checkpoints are built in numpy; the steps after loading are checked against numpy references written here
(block-diagonal damped inverses, running average, momentum)."""
from __future__ import annotations

import logging
import re

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn

from ms_boost import BoostTrainOneStepCell
from ms_boost.thor import load_thor_checkpoint, thor
from ms_boost.thor.checkpoint import convert_thor_checkpoint, factor_to_layout, layout_holds, stored_factor_layout
from tests.helpers.nets import MLP
from tests.test_thor_math import np_diagonal_blocks
from tests.test_thor_optimizer import _mlp_data, _train_cell, np_damped_inverse, np_softmax_ce_grad

LR, DAMPING, MOMENTUM, DECAY = 0.1, 0.1, 0.9, 0.5


def _spd(rng, dim):
    x = rng.standard_normal((dim + 3, dim))
    return x.T @ x / (dim + 3)


def _np_pass(weights, x, y):
    """numpy forward/backward of MLP (fc1's bias frozen): per layer (A, G, gradient) as THOR captures them."""
    w1, b1, w2, b2 = weights
    n = x.shape[0]
    h = np.tanh(x @ w1.T + b1)
    _, d2 = np_softmax_ce_grad(h @ w2.T + b2, y)
    d1 = (d2 @ w2) * (1 - h ** 2)
    h_aug = np.concatenate([h, np.ones((n, 1))], 1)
    return [(x.T @ x / n, n * d1.T @ d1, d1.T @ x),  # fc1: its frozen bias is neither in A nor trained
            (h_aug.T @ h_aug / n, n * d2.T @ d2, np.concatenate([d2.T @ h, d2.sum(0)[:, None]], 1))]


def _np_momentum_step(weights, moments, directions):
    """v <- m v + d; w <- w - lr v for fc1.weight, fc2.weight and fc2.bias (fc1.bias frozen)."""
    w1, b1, w2, b2 = weights
    v1, vw2, vb2 = moments
    d1, d2 = directions
    v1, vw2, vb2 = MOMENTUM * v1 + d1, MOMENTUM * vw2 + d2[:, :-1], MOMENTUM * vb2 + d2[:, -1]
    return (w1 - LR * v1, b1, w2 - LR * vw2, b2 - LR * vb2), (v1, vw2, vb2)


class _Run:
    """A THOR run on MLP (fc1's bias frozen, block size ``block``) and the numpy state of an old checkpoint."""

    def __init__(self, block, factor_decay=DECAY):
        weights, self.x, self.y = _mlp_data()
        net = MLP(*_mlp_data(seed=1)[0])  # other weights: the checkpoint's must be loaded
        net.fc1.bias.requires_grad = False
        self.opt = thor(net, LR, DAMPING, MOMENTUM, frequency=2, block_size=block, kl_clip=None,
                        factor_decay=factor_decay)
        self.cell = _train_cell(self.opt.thor_network, self.opt)
        self.net = net
        rng = np.random.default_rng(7)
        self.weights = [w.astype(np.float64) for w in weights]
        self.moments = [rng.standard_normal(s) * 0.1 for s in ((6, 5), (4, 6), (4,))]
        # the old layout's dims: fc1's A with its (frozen) bias column, 6 wide; fc2's A 7, G 6 and 4
        self.run_avg = {("fc1", "a"): _spd(rng, 6), ("fc1", "g"): _spd(rng, 6), ("fc2", "a"): _spd(rng, 7),
                        ("fc2", "g"): _spd(rng, 4)}
        self.scratch = {key: _spd(rng, f.shape[0]) for key, f in self.run_avg.items()}

    def checkpoint(self, inverse_block, global_step=3, factor_layout=None):
        """``{name: Parameter}`` after ``global_step`` steps: whole factors (or cut at ``factor_layout``), inverses
        of the trimmed running averages as blocks of ``inverse_block`` (the only inverse layout there was)."""
        opt, net = self.opt, self.net
        fc = dict(zip(("fc1", "fc2"), opt.thor_layers))
        entries = {}

        def put(param, value):
            entries[param.name] = Parameter(Tensor(np.asarray(value).astype(param.asnumpy().dtype)), name=param.name)

        for param, value in zip((net.fc1.weight, net.fc1.bias, net.fc2.weight, net.fc2.bias), self.weights):
            put(param, value)
        for param, value in zip(opt.moments, self.moments):
            put(param, value)
        put(opt.global_step, np.array([global_step]))
        put(opt.thor_initialised, np.array(True))
        put(opt.refresh_next, np.array(False))
        self.inverses = {}
        for slot, (name, layer) in enumerate(fc.items()):
            put(layer.thor_capture, np.array((global_step % 2) == 0))
            for which in ("a", "g"):
                factor = self.trimmed(self.run_avg[(name, which)], name, which)
                self.inverses[(name, which)] = inverse = np_damped_inverse(factor, DAMPING, inverse_block)
                put((opt.a_inverses if which == "a" else opt.g_inverses)[slot],
                    np_diagonal_blocks(inverse, inverse_block)[None])
                for attr, source in ((f"matrix_{which}", self.run_avg), (f"matrix_{which}_batch", self.scratch)):
                    if getattr(layer, attr, None) is None:  # no running average (factor_decay 0)
                        continue
                    value = source[(name, which)]
                    if factor_layout is not None:  # a block checkpoint (written without fc1's bias column)
                        value = self.trimmed(value, name, which)
                        if value.shape[0] > factor_layout:  # one block: stored whole
                            value = np_diagonal_blocks(value, factor_layout)
                    put(getattr(layer, attr), value[None])
        return entries

    @staticmethod
    def trimmed(factor, name, which):
        return factor[:5, :5] if (name, which) == ("fc1", "a") else factor

    def step(self):
        self.cell(Tensor(self.x), Tensor(self.y))

    def params(self):
        return [p.asnumpy().astype(np.float64)
                for p in (self.net.fc1.weight, self.net.fc1.bias, self.net.fc2.weight, self.net.fc2.bias)]


def _assert_weights(got, want):
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5)


def _np_refresh_step(run, weights, moments, block, running=None):
    """numpy: a refresh step (capture, fold into ``running`` when given, invert with ``block``, precondition)."""
    stats = _np_pass(weights, run.x.astype(np.float64), run.y)
    directions = []
    for name, (a, g, grad) in zip(("fc1", "fc2"), stats):
        if running is not None:
            a = DECAY * run.trimmed(running[(name, "a")], name, "a") + (1 - DECAY) * a
            g = DECAY * running[(name, "g")] + (1 - DECAY) * g
        directions.append(np_damped_inverse(g, DAMPING, block) @ grad @ np_damped_inverse(a, DAMPING, block))
    return _np_momentum_step(weights, moments, directions)


def test_whole_factor_checkpoint_is_converted_and_the_next_steps_match_numpy(mode, caplog):
    """A checkpoint written before the block capture (whole factors, fc1's A with its frozen bias column) loads into
    a block-size-4 run: every factor becomes numpy's diagonal blocks with the identity completing the last, one
    log line each; its inverses (always block-diagonal) load as they are. The next step (no refresh) preconditions
    with them, the one after refreshes from the converted running average: both equal numpy."""
    run = _Run(block=4)
    entries = run.checkpoint(inverse_block=4)
    with caplog.at_level(logging.INFO, logger="ms_boost"):
        converted = convert_thor_checkpoint(entries, run.cell)
    messages = [r.getMessage() for r in caplog.records if r.getMessage().startswith("THOR checkpoint:")]
    lines = [m for m in messages if "filled from" not in m]
    assert len(lines) == 6, lines  # 4 factors x 2 layers but fc2's G and its average (4 wide): whole in both layouts
    assert any("fc1.matrix_a (1, 6, 6) -> (1, 2, 4, 4)" in line for line in lines), lines
    # the checkpoint predates the written-out inverses of the 2-block factors (fc1's A and G, fc2's A): filled from
    # its blocks, and the next step preconditions with them
    filled = sorted(m.split()[2] for m in messages if "filled from" in m)
    assert filled == ["thor_a_dense.fc1", "thor_a_dense.fc2", "thor_g_dense.fc1"], messages
    _, ckpt_not_loaded = ms.load_param_into_net(run.cell, converted, strict_load=True)
    assert not ckpt_not_loaded
    fc1, fc2 = run.opt.thor_layers
    for layer, name in ((fc1, "fc1"), (fc2, "fc2")):
        for which in ("a", "g"):
            for attr, source in ((f"matrix_{which}", run.run_avg), (f"matrix_{which}_batch", run.scratch)):
                want = run.trimmed(source[(name, which)], name, which)
                want = np_diagonal_blocks(want, 4) if want.shape[0] > 4 else want
                np.testing.assert_allclose(getattr(layer, attr).asnumpy()[0], want, rtol=1e-6, atol=1e-6,
                                           err_msg=f"{name}.{attr}")
    assert not bool(run.opt.refresh_next.asnumpy())
    # step 3: no refresh, the checkpoint's inverses
    directions = [run.inverses[(name, "g")] @ grad @ run.inverses[(name, "a")]
                  for name, (_, _, grad) in zip(("fc1", "fc2"), _np_pass(run.weights, run.x.astype(np.float64), run.y))]
    weights, moments = _np_momentum_step(run.weights, run.moments, directions)
    run.step()
    _assert_weights(run.params(), weights)
    # step 4: refresh, folding this capture into the converted running averages
    weights, _ = _np_refresh_step(run, weights, moments, 4, running=run.run_avg)
    run.step()
    _assert_weights(run.params(), weights)
    assert int(run.opt.global_step.asnumpy()[0]) == 5


# (mode, history, cell kind). MindSpore's train cell in Graph mode only: in PyNative mode both cells reach THOR the
# same way (``optimizer(grads)``: ``THOR.__call__`` checks the written-out inverses, then the compiled step), so
# the PyNative case of MindSpore's cell repeated the boost cell's (~4-6 CPU-s: a THOR step compiled before and
# again after the load); in Graph mode they compile different graphs (step variants / the device-switch graph).
WITHOUT_WRITTEN_OUT = [("graph", "fresh", "boost"), ("graph", "trained", "boost"), ("graph", "trained", "mindspore"),
                       ("pynative", "fresh", "boost"), ("pynative", "trained", "boost")]


@pytest.mark.parametrize("mode,history,cell_kind", WITHOUT_WRITTEN_OUT)
def test_checkpoint_without_written_out_inverses_loaded_by_mindspore_alone(mode, history, cell_kind):
    """A same-layout checkpoint written before the written-out inverses (no ``thor_a_dense.*`` / ``thor_g_dense.*``
    entries) loaded by ``mindspore.load_param_into_net`` alone, not :func:`load_thor_checkpoint`: MindSpore lists the
    copies as not loaded and the network keeps its own -- identities in a fresh network; in a trained one (3 steps of
    another run, refreshed at step 2) its own run's, so the checkpoint of step 3 lands one step after the network's
    last refresh. The next step (no refresh; Graph mode: the plain variant with ms_boost's train cell, the
    device-switch graph with MindSpore's, which multiplies by the blocks) preconditions with the checkpoint's inverses:
    numpy's step; afterwards every written-out copy is the checkpoint's block inverse written out, exactly."""
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    try:
        _without_written_out_inverses(mode, history, cell_kind)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)


def _without_written_out_inverses(mode, history, cell_kind):
    run = _Run(block=4)
    if cell_kind == "boost":
        loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        run.cell = BoostTrainOneStepCell(nn.WithLossCell(run.opt.thor_network, loss), run.opt).set_train()
    if history == "trained":
        for _ in range(3):
            run.step()
        assert int(run.opt.global_step.asnumpy()[0]) == 3
    entries = run.checkpoint(inverse_block=4, factor_layout=4)  # the network's layout: nothing to convert
    opt = run.opt
    written = {p.name: p for p in opt.dense_inverses}
    assert sorted(written) == ["thor_a_dense.fc1", "thor_a_dense.fc2", "thor_g_dense.fc1"]
    assert not set(written) & set(entries)
    not_loaded, ckpt_not_loaded = ms.load_param_into_net(run.cell, entries)
    assert set(written) <= set(not_loaded) and not ckpt_not_loaded
    directions = [run.inverses[(name, "g")] @ grad @ run.inverses[(name, "a")]
                  for name, (_, _, grad) in zip(("fc1", "fc2"), _np_pass(run.weights, run.x.astype(np.float64), run.y))]
    run.step()
    _assert_weights(run.params(), _np_momentum_step(run.weights, run.moments, directions)[0])
    if mode == "graph" and cell_kind == "mindspore":  # that graph multiplied by the blocks; the next host check
        assert opt.sync_dense_inverses()  # (a step variant, PyNative) finds them replaced and writes the copies
    assert not opt.sync_dense_inverses()  # nothing replaced since
    for name, which in (("fc1", "a"), ("fc1", "g"), ("fc2", "a")):
        np.testing.assert_array_equal(written[f"thor_{which}_dense.{name}"].asnumpy()[0],
                                      run.inverses[(name, which)].astype(np.float32), err_msg=f"{name} {which}")


def test_another_block_size_refreshes_at_the_first_step(tmp_path):
    """A whole-factor checkpoint file with block-4 inverses loaded (``load_thor_checkpoint``) into a block-size-2
    run: the factors are cut into 2-blocks exactly, the 4-block inverses are left out and the optimizer refreshes
    at its first step (off schedule): the step equals numpy's refresh step at block size 2 from the converted
    running averages. Graph mode, where the host chooses the refresh variant from the loaded flags (PyNative runs
    the same compiled step; the first test covers both modes)."""
    ms.set_context(mode=ms.GRAPH_MODE)
    run = _Run(block=2)
    entries = run.checkpoint(inverse_block=4)
    converted = convert_thor_checkpoint(entries, run.cell)
    assert run.opt.a_inverses[0].name not in converted and run.opt.g_inverses[1].name not in converted
    path = str(tmp_path / "old.ckpt")
    ms.save_checkpoint([{"name": k, "data": v.data} for k, v in entries.items()], path)
    not_loaded, ckpt_not_loaded = load_thor_checkpoint(path, run.cell, strict_load=True)
    assert not ckpt_not_loaded and {p.name for p in (*run.opt.a_inverses, *run.opt.g_inverses)} <= set(not_loaded)
    np.testing.assert_allclose(run.opt.thor_layers[1].matrix_a.asnumpy()[0],
                               np_diagonal_blocks(run.run_avg[("fc2", "a")], 2), rtol=1e-6, atol=1e-6)
    assert bool(run.opt.refresh_next.asnumpy())
    weights, _ = _np_refresh_step(run, run.weights, run.moments, 2, running=run.run_avg)
    try:
        run.step()
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    _assert_weights(run.params(), weights)
    assert not bool(run.opt.refresh_next.asnumpy())


def test_smaller_blocks_into_larger_blocks():
    """The reverse: a checkpoint of 2-blocks loaded into a block-size-4 run lacks the entries of the 4-blocks. Its
    running averages are refused (they would enter the next fold), naming what to do; without running averages
    (factor_decay 0) the scratch factors and inverses are left out and the first step refreshes from its own
    capture: numpy's refresh step at block size 4."""
    run = _Run(block=4)
    with pytest.raises(ValueError, match=r"fc1\.matrix_a has shape \(1, 3, 2, 2\) in the checkpoint and "
                                         r"\(1, 2, 4, 4\) in the network; allowed: .*block_size=2"):
        convert_thor_checkpoint(run.checkpoint(inverse_block=2, factor_layout=2), run.cell)
    run = _Run(block=4, factor_decay=0.0)
    converted = convert_thor_checkpoint(run.checkpoint(inverse_block=2, factor_layout=2), run.cell)
    assert run.opt.thor_layers[0].matrix_a_batch.name not in converted
    ms.load_param_into_net(run.cell, converted, strict_load=True)
    weights, _ = _np_refresh_step(run, run.weights, run.moments, 4)
    run.step()
    _assert_weights(run.params(), weights)


def test_malformed_shapes_are_refused_with_the_parameter_both_shapes_and_what_is_allowed():
    run = _Run(block=4)
    fc1, fc2 = run.opt.thor_layers
    for param, shape, allowed in ((fc2.matrix_a_batch, (1, 5, 5), r"\(1, 2, 4, 4\) \(block size 4\), the whole factor "
                                   r"\(1, 7, 7\), or its diagonal blocks"),
                                  (fc1.matrix_a, (1, 7, 7), r"\(1, 5, 5\) or \(1, 6, 6\) with the bias column"),
                                  (fc1.matrix_g, (2, 6, 6), r"\(1, 6, 6\)"),
                                  (run.opt.a_inverses[1], (1, 7, 7), r"the block inverse \(1, 2, 4, 4\)")):
        entries = run.checkpoint(inverse_block=4)
        entries[param.name] = Parameter(Tensor(np.zeros(shape, np.float32)), name=param.name)
        said = re.escape(f"{param.name} has shape {shape} in the checkpoint and {tuple(param.shape)} in the network; "
                         "allowed: ")
        with pytest.raises(ValueError, match=said + ".*" + allowed):
            convert_thor_checkpoint(entries, run.cell)


def test_layout_helpers():
    """Layouts recognised from shapes, which layouts hold which blocks, and the conversion of a never-captured
    (all-zero) factor, which stays all zeros like a fresh buffer, against a captured one (identity completion)."""
    assert stored_factor_layout((1, 11, 11), 1, [11]) == (11, 11)
    assert stored_factor_layout((1, 3, 4, 4), 1, [11]) == (11, 4)
    assert stored_factor_layout((1, 3, 4, 4), 1, [13]) is None  # 13 needs 4 blocks of 4
    assert stored_factor_layout((2, 11, 11), 1, [11]) is None
    assert layout_holds((11, 11), 11, 4) and layout_holds((11, 8), 11, 4) and layout_holds((11, 8), 11, 8)
    assert not layout_holds((11, 4), 11, 8) and not layout_holds((11, 4), 11, 11) and not layout_holds((12, 6), 12, 4)
    assert not factor_to_layout(np.zeros((1, 5, 5)), (5, 5), 5, 4).any()
    f = _spd(np.random.default_rng(0), 6)
    np.testing.assert_array_equal(factor_to_layout(f[None], (6, 6), 5, 4)[0], np_diagonal_blocks(f[:5, :5], 4))
    np.testing.assert_array_equal(factor_to_layout(np_diagonal_blocks(f, 4)[None], (6, 4), 6, 2)[0],
                                  np_diagonal_blocks(f, 2))


def test_zoo_resume_converts_a_whole_factor_checkpoint(tmp_path):
    """The zoo's ``--resume`` (``restore_train_network``) loads the old-layout checkpoint into the THOR train network:
    converted factors, and the next step equals numpy's (the checkpoint's inverses, no refresh); a malformed factor
    is refused naming the file and the parameter."""
    import json

    from model_zoo.resnet.src.run_state import MANIFEST_KEY, restore_train_network

    class Cfg(dict):
        __getattr__ = dict.__getitem__

    run = _Run(block=4)
    entries = {p.name: p for p in run.cell.get_parameters()}
    entries.update(run.checkpoint(inverse_block=4))
    manifest = json.dumps({"global_step": 3, "steps_per_epoch": 4})
    path = tmp_path / "resnet-1_3.ckpt"
    ms.save_checkpoint([{"name": k, "data": v.data} for k, v in entries.items()], str(path),
                       append_dict={MANIFEST_KEY: manifest})
    cfg = Cfg(resume=str(path), checkpoint_dir="checkpoint", checkpoint_prefix="resnet", epoch_size=2)
    assert restore_train_network(cfg, run.cell, 4, lambda p, m: None)[0] == 3
    np.testing.assert_allclose(run.opt.thor_layers[0].matrix_a.asnumpy()[0],
                               np_diagonal_blocks(run.run_avg[("fc1", "a")][:5, :5], 4), rtol=1e-6, atol=1e-6)
    directions = [run.inverses[(name, "g")] @ grad @ run.inverses[(name, "a")]
                  for name, (_, _, grad) in zip(("fc1", "fc2"), _np_pass(run.weights, run.x.astype(np.float64), run.y))]
    run.step()
    _assert_weights(run.params(), _np_momentum_step(run.weights, run.moments, directions)[0])
    bad = dict(entries, **{"fc2.matrix_g": Parameter(Tensor(np.zeros((1, 5, 5), np.float32)), name="fc2.matrix_g")})
    ms.save_checkpoint([{"name": k, "data": v.data} for k, v in bad.items()], str(path),
                       append_dict={MANIFEST_KEY: manifest})
    with pytest.raises(ValueError, match=re.escape(f"resume: checkpoint {str(path)!r}: THOR checkpoint: fc2.matrix_g "
                                                   "has shape (1, 5, 5) in the checkpoint and (1, 4, 4)")):
        restore_train_network(cfg, _Run(block=4).cell, 4, lambda p, m: None)


def test_block_128_checkpoint_into_block_64_run(tmp_path, caplog):
    """A checkpoint a block-128 run wrote (a Dense layer whose A is 201 wide: two 128-blocks, the second padded)
    loaded into a block-64 run (the default): every 64-block lies inside one 128-block, so the
    factors and running averages load as numpy's diagonal 64-blocks of the stored 128-blocks (the last one, 9 wide,
    completed with the identity); the 128-block inverses are left out and the first step refreshes, off schedule:
    its running averages are the converted ones folded with this step's capture, its inverses numpy's damped
    inverses of those folds' 64-blocks (G, 10 wide, is whole in both layouts: its inverse loads, and is refreshed
    as well)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((16, 200)).astype(np.float32)
    y = rng.integers(0, 10, 16).astype(np.int32)

    def run(block, seed):
        w = np.random.default_rng(seed).standard_normal((10, 200)).astype(np.float32) * 0.05
        net = ms.nn.Dense(200, 10, weight_init=Tensor(w), bias_init="zeros")
        opt = thor(net, LR, DAMPING, MOMENTUM, frequency=2, block_size=block, kl_clip=None, factor_decay=DECAY)
        return opt, _train_cell(opt.thor_network, opt)

    old_opt, old_cell = run(128, 0)
    for _ in range(3):  # refreshes at steps 0 and 2: factors, running averages and inverses all hold values
        old_cell(Tensor(x), Tensor(y))
    path = str(tmp_path / "block128.ckpt")
    ms.save_checkpoint(old_cell, path)
    old = old_opt.thor_layers[0]
    assert old.a_dim == 201 and old.matrix_a.shape == (1, 2, 128, 128) and old_opt.a_inverses[0].shape[-1] == 128

    opt, cell = run(64, 1)
    layer = opt.thor_layers[0]
    with caplog.at_level(logging.INFO, logger="ms_boost"):
        not_loaded, ckpt_not_loaded = load_thor_checkpoint(path, cell, strict_load=True)
    assert not ckpt_not_loaded and list(not_loaded) == [opt.a_inverses[0].name]  # G's (10 wide) fits both
    assert any("matrix_a (1, 2, 128, 128) -> (1, 4, 64, 64) (blocks of size 128" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    for attr in ("matrix_a", "matrix_a_batch"):
        stored = getattr(old, attr).asnumpy()[0]
        full = np.zeros((201, 201))
        full[:128, :128], full[128:, 128:] = stored[0], stored[1, :73, :73]
        np.testing.assert_array_equal(getattr(layer, attr).asnumpy()[0], np_diagonal_blocks(full, 64), err_msg=attr)
    for attr in ("matrix_g", "matrix_g_batch"):  # 10 wide: whole in both layouts, loaded as it was
        np.testing.assert_array_equal(getattr(layer, attr).asnumpy(), getattr(old, attr).asnumpy(), err_msg=attr)
    np.testing.assert_array_equal(layer.weight.asnumpy(), old.weight.asnumpy())
    assert bool(opt.refresh_next.asnumpy()) and int(opt.global_step.asnumpy()[0]) == 3  # 3: not a refresh step

    converted = layer.matrix_a.asnumpy()[0].astype(np.float64)
    g_average = layer.matrix_g.asnumpy()[0].astype(np.float64)
    cell(Tensor(x), Tensor(y))
    assert not bool(opt.refresh_next.asnumpy())
    g_folded = DECAY * g_average + (1 - DECAY) * layer.matrix_g_batch.asnumpy()[0].astype(np.float64)
    np.testing.assert_allclose(opt.g_inverses[0].asnumpy()[0, 0], np_damped_inverse(g_folded, DAMPING, 64),
                               rtol=2e-4, atol=2e-5, err_msg="G")
    captured = layer.matrix_a_batch.asnumpy()[0].astype(np.float64)
    folded = DECAY * converted + (1 - DECAY) * captured
    np.testing.assert_allclose(layer.matrix_a.asnumpy()[0], folded, rtol=1e-5, atol=1e-6)
    inverses = opt.a_inverses[0].asnumpy()[0]
    assert inverses.shape == (4, 64, 64)
    for k in range(4):  # each block inverted alone; the last one's identity rows (past column 201) aside
        size = min(64, 201 - 64 * k)
        want = np.linalg.inv(folded[k, :size, :size] + np.sqrt(DAMPING) * np.eye(size))
        np.testing.assert_allclose(inverses[k, :size, :size], want, rtol=2e-4, atol=2e-5, err_msg=f"A block {k}")


def test_load_into_a_trained_network_keeps_its_compiled_step(mode, tmp_path):
    """``load_thor_checkpoint`` into a network that has trained (its step compiled) writes in place: the next steps,
    a refresh folding the loaded running averages among them, equal bit for bit those of a network the checkpoint
    was loaded into before its first step, and PyNative keeps its compiled THOR step (nothing compiled again).

    Before (``load_param_into_net``'s ``set_data``): PyNative compiled the step again (~1.4 CPU-s on this net);
    Graph mode's refresh two steps after the load folded the running averages the network had before it (the graph
    kept the memory it was compiled with where only a refresh reads it), 0.49 off in ``fc1.matrix_a``."""
    weights, x, y = _mlp_data()
    data = (Tensor(x), Tensor(y))

    def build():
        opt = thor(MLP(*weights), LR, DAMPING, MOMENTUM, frequency=3, block_size=4, kl_clip=None,
                   factor_decay=DECAY)
        return opt, _train_cell(opt.thor_network, opt)

    trained_opt, trained = build()
    trained(*data)  # step 0: compiled, refreshed
    rng = np.random.default_rng(5)
    entries = []
    for p in trained.get_parameters():  # other weights, factors and running averages; the inverses as they are
        value = p.asnumpy()
        if value.dtype == np.float32 and not p.name.startswith("thor_"):
            value = value + (0.5 * np.abs(rng.standard_normal(value.shape))).astype(np.float32)
        entries.append({"name": p.name, "data": Tensor(value)})
    path = str(tmp_path / "resume.ckpt")
    ms.save_checkpoint(entries, path)
    compiled = trained_opt._compiled if mode == "pynative" else None  # the compiled PyNative THOR step
    fresh_opt, fresh = build()
    for cell in (fresh, trained):
        assert load_thor_checkpoint(path, cell, strict_load=True) == ([], [])
    for step in range(1, 5):  # global steps 1-4: step 3 refreshes
        for cell in (trained, fresh):
            cell(*data)
        want = {p.name: p.asnumpy() for p in fresh.get_parameters()}
        for p in trained.get_parameters():
            np.testing.assert_array_equal(p.asnumpy(), want[p.name], err_msg=f"step {step} {p.name}")
    if mode == "pynative":
        assert trained_opt._compiled is compiled
    assert int(trained_opt.global_step.asnumpy().reshape(-1)[0]) == 5

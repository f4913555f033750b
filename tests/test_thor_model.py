"""THOR through Model: dataset sink, eval, the boost configuration, dynamic loss scale, a deep chain in Graph mode.

The tutorial's usage pattern (ResNet, ``thor(..., split_indices=[26, 53], ...)``, ``convert_to_thor_model`` of a
Model with amp O2 and a fixed loss scale, sink training; the step count, the 13 THOR layers, every weight moved
and finite, non-zero inverses) is checked on the tutorial script's own run:
tests/test_tutorials_thor.py::test_thor_tutorial_train.
"""
from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn
from mindspore.train import Model as MsModel

from ms_boost import Model
from ms_boost.thor import THOR, ConvertModelUtils, thor
from ms_boost.thor.optimizer import DEFAULT_KL_CLIP
from tests.helpers.nets import MLP, dataset, learnable_data, make_net
from tests.test_thor_optimizer import _mlp_data, np_damped_inverse


def ce():
    return nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def np_chain_thor_steps(params, batches, lr, damping, momentum, weight_decay, kl_clip, frequency, threshold=None,
                        stable=None, block=None):
    r"""THOR steps (float64, moments from 0) of x -> Dense -> tanh -> ... -> Dense -> mean softmax CE.

    ``params``: ``[W1, b1, W2, b2, ...]``; ``batches``: ``[(x, y), ...]``, one step each. Factors
    :math:`A = [h;1]^T[h;1]/n`, :math:`G = n\,\delta^T\delta` and their inverses with :math:`\sqrt\lambda` are
    refreshed on steps ``t % frequency == 0``; the direction :math:`G^{-1}[\nabla W|\nabla b]A^{-1}` is scaled by
    the trust region :math:`\nu = \min(1, \sqrt{c / (\eta^2 |\sum \langle d, g\rangle|)})`, weight decay is
    added (every parameter), then heavy-ball momentum. Returns the final parameters.

    ``threshold`` (adaptive refresh, the THOR paper's trace rule): at a refresh a layer is inverted again only when
    :math:`|\operatorname{tr}F/\operatorname{tr}F_{last} - 1|` exceeds it for its A or its G (``F_last``: the
    factor at its last inversion); the other layers keep their inverses, counted in the list ``stable``.
    ``block``: factors wider than this are inverted block by block (their diagonal blocks; the traces stay those
    of the whole factors). ``lr`` may be a per-step sequence, its last value kept after its end.
    """
    params = [np.asarray(p, np.float64) for p in params]
    moments = [np.zeros_like(p) for p in params]
    inverses, last_traces = None, None
    rates = np.atleast_1d(np.asarray(lr, np.float64))
    for step, (x, y) in enumerate(batches):
        lr = rates[min(step, len(rates) - 1)]
        ws, bs = params[0::2], params[1::2]
        n = x.shape[0]
        hs = [x.astype(np.float64)]
        for i, (w, b) in enumerate(zip(ws, bs)):
            z = hs[-1] @ w.T + b
            hs.append(np.tanh(z) if i < len(ws) - 1 else z)
        p = np.exp(hs[-1] - hs[-1].max(1, keepdims=True))
        d = p / p.sum(1, keepdims=True)
        d[np.arange(n), y] -= 1
        d /= n
        grads, deltas = [None] * len(ws), [None] * len(ws)
        for i in reversed(range(len(ws))):
            deltas[i] = d
            grads[i] = np.concatenate([d.T @ hs[i], d.sum(0)[:, None]], 1)
            d = (d @ ws[i]) * (1 - hs[i] ** 2)
        if step % frequency == 0:
            inverses = inverses or [None] * len(ws)
            last_traces = last_traces or [None] * len(ws)
            for i in range(len(ws)):
                a_aug = np.concatenate([hs[i], np.ones((n, 1))], 1)
                fa, fg = a_aug.T @ a_aug / n, n * deltas[i].T @ deltas[i]
                traces = np.array([np.trace(fa), np.trace(fg)])
                if threshold and last_traces[i] is not None and np.all(
                        np.abs(traces / last_traces[i] - 1) <= threshold):
                    stable.append((step, i))
                    continue
                last_traces[i] = traces
                inverses[i] = (np_damped_inverse(fa, damping, block or len(fa)),
                               np_damped_inverse(fg, damping, block or len(fg)))
        directions = [g_inv @ g @ a_inv for g, (a_inv, g_inv) in zip(grads, inverses)]
        vg = sum((v * g).sum() for v, g in zip(directions, grads))
        nu = min(1.0, np.sqrt(kl_clip / (lr ** 2 * abs(vg)))) if kl_clip else 1.0
        for i, v in enumerate(directions):
            for k, part in ((2 * i, v[:, :-1]), (2 * i + 1, v[:, -1])):
                moments[k] = momentum * moments[k] + nu * part + weight_decay * params[k]
                params[k] = params[k] - lr * moments[k]
    return params


def _graph(fn):
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        return fn()
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)


def test_boost_config_turns_thor_on():
    """Model(..., boost_config_dict={"boost": {"thor": True}, "thor": {...}}) trains with THOR and the user's lr."""
    net = make_net()
    before = [p.asnumpy().copy() for p in net.trainable_params()]
    lr = Tensor(np.full(8, 0.02, np.float32))
    user_opt = nn.Momentum(net.trainable_params(), lr, 0.8, weight_decay=1e-4)
    model = Model(net, ce(), user_opt, boost_config_dict={"boost": {"mode": "manual", "thor": True},
                                                          "thor": {"damping": 0.05, "frequency": 2,
                                                                   "block_size": 8, "stat_fraction": 0.5}})
    opt = model.train_network.optimizer
    assert isinstance(opt, THOR) and opt.get_frequency() == 2 and opt.block_size == 8
    assert all(layer.block_size == 8 for layer in opt.thor_layers)
    # thor.stat_fraction reaches the optimizer and its layers (the statistics on half of each batch)
    assert opt.stat_fraction == 0.5 and all(layer.stat_fraction == 0.5 for layer in opt.thor_layers)
    assert abs(float(opt.momentum.asnumpy()) - 0.8) < 1e-6 and abs(opt.weight_decay - 1e-4) < 1e-9
    assert opt.learning_rate is user_opt.learning_rate
    assert [p.name for p in opt.parameters] == [p.name for p in user_opt.parameters]
    opt.compile_pynative_step = False  # op by op: the configuration is the point here, not the compiled step
    x, y = learnable_data(64)
    model.train(1, dataset(x, y), dataset_sink_mode=False)
    assert int(opt.global_step.asnumpy()[0]) == 4
    assert all(not np.array_equal(p.asnumpy(), b) for p, b in zip(net.trainable_params(), before))
    assert type(net.conv1) is nn.Conv2d  # the user's network keeps its layers


def test_dynamic_loss_scale_is_unscaled_in_the_factors():
    """With a DynamicLossScaleManager (2^12, doubled after 2 good steps: step 2 runs with 2^13) the gradients and
    the captured G are divided by the scale the backward used: three steps (refreshes at steps 0 and 2) of the
    compiled PyNative step equal numpy's unscaled THOR steps."""
    weights, x, y = _mlp_data(seed=2, n=24)
    net = MLP(*weights)
    opt = thor(net, 0.05, 0.05, 0.9, frequency=2)
    assert opt.compile_pynative_step
    manager = ms.DynamicLossScaleManager(2.0 ** 12, scale_factor=2, scale_window=2)
    model = ConvertModelUtils().convert_to_thor_model(Model(net, ce(), opt, loss_scale_manager=manager), net, ce(),
                                                      opt, loss_scale_manager=manager)
    model.train(1, dataset(x, y, batch_size=8), dataset_sink_mode=False)
    assert opt.thor_layers[-1].g_capture.loss_scale.name == "scale_sense"
    assert float(model.train_network.scale_sense.asnumpy()) == 2.0 ** 13
    batches = [(x[i:i + 8], y[i:i + 8]) for i in range(0, 24, 8)]
    expected = np_chain_thor_steps(weights, batches, 0.05, 0.05, 0.9, 0.0, DEFAULT_KL_CLIP, 2)
    for got, want in zip([p.asnumpy() for p in net.trainable_params()], expected):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_deep_network_compiles_in_graph_mode_and_matches_numpy(monkeypatch):
    """A 13-layer THOR net (26 parameters; the smallest chain above the 12-layer threshold in
    ``ms_boost.thor.optimizer._ensure_call_depth``, so the raise is exercised) with a fixed loss scale: Graph mode
    compiles (per-parameter work is mapped, not unrolled, and the call-depth limit is raised with the layer count;
    ResNet-50's 54 layers exceeded the default limit of 1000 before) and makes numpy's two THOR steps (trust
    region, weight decay, momentum). PyNative is checked against the same reference on a 2-layer chain in
    test_dynamic_loss_scale_is_unscaled_in_the_factors."""
    from mindspore.train import FixedLossScaleManager

    from ms_boost.thor import optimizer as thor_optimizer

    before = thor_optimizer._CALL_DEPTH["raised_to"]  # pylint: disable=protected-access

    def run():
        # count only what this chain raises (monkeypatch puts the record back after the test)
        monkeypatch.setitem(thor_optimizer._CALL_DEPTH, "raised_to", 0)  # pylint: disable=protected-access
        ms.set_seed(0)
        cells = []
        for _ in range(12):
            cells += [nn.Dense(6, 6), nn.Tanh()]
        net = nn.SequentialCell(cells + [nn.Dense(6, 3)])
        initial = [p.asnumpy().copy() for p in net.trainable_params()]
        opt = thor(net, 0.05, 0.05, 0.9, 1e-4, 16.0, 8, frequency=1)
        model = Model(opt.thor_network, ce(), opt,
                      loss_scale_manager=FixedLossScaleManager(16.0, drop_overflow_update=False))
        rng = np.random.default_rng(0)
        x = rng.normal(size=(16, 6)).astype(np.float32)
        y = (np.arange(16) % 3).astype(np.int32)
        model.train(1, dataset(x, y, batch_size=8), dataset_sink_mode=False)
        assert len(opt.thor_layers) == 13 and int(opt.global_step.asnumpy()[0]) == 2
        # this chain raised the graph call-depth limit (ms_boost records it; MindSpore has no getter)
        assert thor_optimizer._CALL_DEPTH["raised_to"] > 1000  # pylint: disable=protected-access
        return initial, (x, y), [p.asnumpy().copy() for p in net.trainable_params()]

    try:
        initial, (x, y), graph = _graph(run)
    finally:
        if before > thor_optimizer._CALL_DEPTH["raised_to"]:  # pylint: disable=protected-access
            ms.set_recursion_limit(before)  # a bigger net in this process had raised it further
    expected = np_chain_thor_steps(initial, [(x[:8], y[:8]), (x[8:], y[8:])], 0.05, 0.05, 0.9, 1e-4,
                                   DEFAULT_KL_CLIP, 1)
    for i, (g, e) in enumerate(zip(graph, expected)):
        np.testing.assert_allclose(g, e, rtol=1e-3, atol=1e-5, err_msg=f"parameter {i}")
    assert any(not np.allclose(g, w) for g, w in zip(graph, initial))


def test_tutorial_model_call_trains_thor_without_convert_and_takes_frequency(mode):
    """The THOR tutorial's ``Model(net, loss_fn, optimizer=opt, ..., frequency=N)`` on the net given to ``thor()``
    (no ``convert_to_thor_model``): Model trains ``opt.thor_network`` (whose layers capture the statistics) and
    ``frequency`` becomes the refresh interval (thor() had its default 100): three steps (both modes) equal
    numpy's THOR with refreshes at steps 0 and 2. Before, the plain layers captured nothing and THOR
    preconditioned with the damping alone."""
    weights, x, y = _mlp_data(seed=3, n=24)
    net = MLP(*weights)
    opt = thor(net, 0.05, 0.05, 0.9)
    assert opt.get_frequency() == 100
    model = Model(net, ce(), opt, metrics={"acc"}, frequency=2)
    assert opt.get_frequency() == 2
    # the plan logged when training starts names THOR (the boost plan alone reads as a plain step)
    assert "optimizer: THOR from thor() over 2 THOR layers, factors and inverses refreshed every 2 steps" in (
        model._plan_text())  # pylint: disable=protected-access
    model.train(1, dataset(x, y, batch_size=8), dataset_sink_mode=False)
    batches = [(x[i:i + 8], y[i:i + 8]) for i in range(0, 24, 8)]
    expected = np_chain_thor_steps(weights, batches, 0.05, 0.05, 0.9, 0.0, DEFAULT_KL_CLIP, 2)
    for got, want in zip([p.asnumpy() for p in net.trainable_params()], expected):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert set(model.eval(dataset(x, y, batch_size=8), dataset_sink_mode=False)) == {"acc"}


def test_model_refuses_a_thor_optimizer_on_a_network_without_its_layers_and_frequency_without_thor():
    """Misuse named, not trained wrongly: ``frequency`` with another optimizer or out of range; a THOR optimizer
    with a network that shares no parameter, or a loss cell around the unconverted net (it holds no THOR layer).
    A loss cell around ``opt.thor_network`` is fine."""
    import pytest

    weights, _, _ = _mlp_data(seed=3, n=8)
    net = MLP(*weights)
    with pytest.raises(ValueError, match=r"frequency=5 .*Momentum, not THOR"):
        Model(net, ce(), nn.Momentum(net.trainable_params(), 0.1, 0.9), frequency=5)
    opt = thor(net, 0.05, 0.05, 0.9)
    with pytest.raises(ValueError, match=r"frequency=0 must be an int >= 1"):
        Model(net, ce(), opt, frequency=0)
    with pytest.raises(ValueError, match="share no parameter"):
        Model(MLP(*weights), ce(), opt)
    with pytest.raises(ValueError, match="does not contain its THOR layers"):
        Model(nn.WithLossCell(net, ce()), optimizer=opt)
    Model(nn.WithLossCell(opt.thor_network, ce()), optimizer=opt)


def record_phases(cell):
    """The list of ``cell.phase`` at each of its ``compile`` calls (MindSpore asks at every Graph-mode call, then finds
    the phase's graph or compiles it): one entry per step, one graph per distinct entry."""
    phases = []
    original = cell.compile

    def compile_spy(*args, **kwargs):
        phases.append(cell.phase)
        return original(*args, **kwargs)

    cell.compile = compile_spy
    return phases


def assert_equals_numpy_thor(net, weights, x, y, steps):
    """``net``'s weights equal numpy's THOR (lr 0.05, damping 0.05, momentum 0.9, frequency 2) after ``steps`` steps
    on the batches of 8 of ``x``, ``y`` in order (repeated)."""
    batches = [(x[i:i + 8], y[i:i + 8]) for i in range(0, len(x), 8)]
    batches = (batches * steps)[:steps]
    expected = np_chain_thor_steps(weights, batches, 0.05, 0.05, 0.9, 0.0, DEFAULT_KL_CLIP, 2)
    for got, want in zip([p.asnumpy() for p in net.trainable_params()], expected):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ["boost_cell", "mindspore_cell_wrapped"])
def test_step_variants_chosen_on_the_host_match_numpy(kind):
    """Graph mode, a loop calling the train cell itself: ms_boost's ``BoostTrainOneStepCell`` directly (its update
    chain's THOR stage hook chooses the variant), or MindSpore's ``nn.TrainOneStepCell`` through the compatibility
    wrapper ``ThorTrainStep`` (the same hook). The host picks the capturing/refresh variant at steps 0 and 2 and the
    plain one at step 1 (frequency 2), each its own compiled graph (phase, two compiles in all), and the three steps
    equal numpy's THOR; a plain step writes no statistics; the train cell and the layers are left in the default
    (device-switch) mode afterwards."""
    from ms_boost import BoostTrainOneStepCell
    from ms_boost.thor.variants import ThorTrainStep

    def run():
        weights, x, y = _mlp_data(seed=4, n=24)
        net = MLP(*weights)
        opt = thor(net, 0.05, 0.05, 0.9, frequency=2)
        loss_net = nn.WithLossCell(opt.thor_network, ce())
        if kind == "boost_cell":
            cell = BoostTrainOneStepCell(loss_net, opt).set_train()
            step = cell
        else:
            cell = nn.TrainOneStepCell(loss_net, opt).set_train()
            step = ThorTrainStep(cell, opt)
        chosen, scratch = [], []
        phases = record_phases(cell)
        for i in range(3):
            chosen.append(opt.next_step_variant())
            step(Tensor(x[8 * i:8 * i + 8]), Tensor(y[8 * i:8 * i + 8]))
            scratch.append(opt.thor_layers[0].matrix_a_batch.asnumpy().copy())
        assert chosen == [(True, True), (False, False), (True, True)]
        # compile is asked at every call (MindSpore then finds the phase's graph): one phase per step, two graphs
        assert phases == ["train_thor_capture_refresh", "train_thor_plain", "train_thor_capture_refresh"], phases
        np.testing.assert_array_equal(scratch[0], scratch[1])  # the plain step captured nothing
        assert not np.array_equal(scratch[1], scratch[2])
        assert cell.phase == "train" and opt.static_refresh is None
        assert all(layer.a_capture.static is None and layer.g_capture.static is None for layer in opt.thor_layers)
        assert_equals_numpy_thor(net, weights, x, y, steps=3)

    _graph(run)


def test_thor_train_step_leaves_the_choice_to_an_ms_boost_train_cell():
    """Graph mode: ``ThorTrainStep`` around ms_boost's train cell is a pass-through (the cell chooses the variant
    itself, once: the phase is not suffixed twice), and in PyNative mode no variant is chosen (no suffix, no static
    mode; the capture flags are read on the host there)."""
    from ms_boost import BoostTrainOneStepCell
    from ms_boost.thor.variants import ThorTrainStep

    weights, x, y = _mlp_data(seed=4, n=8)
    net = MLP(*weights)
    opt = thor(net, 0.05, 0.05, 0.9, frequency=2)
    cell = BoostTrainOneStepCell(nn.WithLossCell(opt.thor_network, ce()), opt).set_train()
    seen = []

    def spy(*args, **kwargs):  # records the phase and the modes the step runs under, runs nothing
        seen.append((cell.phase, opt.static_refresh, opt.thor_layers[0].a_capture.static))
        return Tensor(0.0)

    cell.compile_and_run = spy
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        ThorTrainStep(cell, opt)(Tensor(x), Tensor(y))
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    assert seen == [("train_thor_capture_refresh", None, True)]
    assert cell.phase == "train" and opt.static_refresh is None and opt.thor_layers[0].a_capture.static is None
    assert opt.plan_graph_step(True) is None  # PyNative: nothing to choose


def test_step_variants_survive_an_evaluation_between_epochs_with_and_without_sink():
    """Graph mode, ``Model.train`` over two epochs with an evaluation after each (as a time-to-accuracy loop does),
    then two more epochs with ``dataset_sink_mode=True`` on the same model.

    MindSpore switches the network back to training (``set_train`` resets the train cell's phase) after the
    step-begin callbacks at the first step after an evaluation; a variant chosen by a callback was overruled there
    (the default device-switch graph compiled: a third full compile inside a steady epoch). The train cell chooses
    the variant itself when it is called, after that reset: only the two variants are compiled, and the twelve
    steps (refreshes at the even steps; frequency 2 does not divide the 3 steps an epoch) equal numpy's THOR. With
    ``dataset_sink_mode=True`` too: on CPU MindSpore trains such a run step by step, calling the train cell, so the
    variants run there as well (the sunk epochs reuse the two graphs). The model is converted from a MindSpore
    ``Model`` (as the tutorial's ``convert_to_thor_model`` call may get it) and evaluates.
    (Before, the sunk and the step-by-step runs were two tests each with their own model, and a third test compared
    a sunk run with a step-by-step one on a small conv net: numpy's reference checks both ways of running here.)
    """
    from mindspore.train import Callback

    def run():
        weights, x, y = _mlp_data(seed=5, n=24)
        net = MLP(*weights)
        opt = thor(net, 0.05, 0.05, 0.9, frequency=2)
        model = ConvertModelUtils().convert_to_thor_model(MsModel(net, ce(), opt, metrics={"acc"}), net, ce(), opt,
                                                          metrics={"acc"})
        assert isinstance(model, Model)
        cell = model.train_network
        phases = record_phases(cell)
        evaluated = []

        class EvaluateEachEpoch(Callback):
            def on_train_epoch_end(self, run_context):
                evaluated.append(model.eval(dataset(x, y, batch_size=8), dataset_sink_mode=False))

        for sink in (False, True):
            model.train(2, dataset(x, y, batch_size=8), callbacks=[EvaluateEachEpoch()], dataset_sink_mode=sink)
            assert cell.phase == "train"
        assert phases == ["train_thor_capture_refresh", "train_thor_plain"] * 6, phases  # one per step, two graphs
        assert int(opt.global_step.asnumpy()[0]) == 12
        assert len(evaluated) == 4 and all(set(r) == {"acc"} and 0.0 <= r["acc"] <= 1.0 for r in evaluated)
        assert_equals_numpy_thor(net, weights, x, y, steps=12)

    _graph(run)


def _adaptive_run(block=None):
    """Six THOR steps (frequency 1) with the adaptive refresh (threshold 0.25) through Model, checked against numpy:
    the parameters and which layers kept their inverses (four of the ten refreshes after the first; every trace
    ratio of the reference run is at least 0.02 away from the threshold, so float32 decides as float64 does).
    ``block``: THOR's block size (factors wider than it are stored as their diagonal blocks, whose traces add up to
    the whole factor's)."""
    weights, x, y = _mlp_data(seed=5, n=48)
    net = MLP(*weights)
    opt = thor(net, 0.05, 0.05, 0.9, frequency=1, refresh_threshold=0.25, **({"block_size": block} if block else {}))
    Model(net, ce(), opt).train(1, dataset(x, y, batch_size=8), dataset_sink_mode=False)
    batches = [(x[i:i + 8], y[i:i + 8]) for i in range(0, 48, 8)]
    stable = []
    expected = np_chain_thor_steps(weights, batches, 0.05, 0.05, 0.9, 0.0, DEFAULT_KL_CLIP, 1, threshold=0.25,
                                   stable=stable, block=block)
    assert stable == [(1, 0), (1, 1), (2, 1), (3, 0)]
    counts = opt.health()["stable_refreshes"]
    assert list(counts.values()) == [sum(1 for _, i in stable if i == layer) for layer in range(2)]
    for got, want in zip([p.asnumpy() for p in net.trainable_params()], expected):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_adaptive_refresh_matches_numpy_pynative():
    _adaptive_run()


def test_adaptive_refresh_matches_numpy_graph():
    _graph(_adaptive_run)


def test_adaptive_refresh_on_factors_stored_as_blocks_matches_numpy_graph():
    """Block size 4: three of the four factors are captured as two diagonal blocks each."""
    _graph(lambda: _adaptive_run(block=4))


def test_adaptive_refresh_threshold_config():
    import pytest

    from ms_boost.config import AutoBoost

    boost = AutoBoost("O0", {"boost": {"mode": "manual", "thor": True}, "thor": {"refresh_threshold": 0.1}})
    assert boost.thor.refresh_threshold == 0.1
    assert AutoBoost("O0", {"boost": {"mode": "manual", "thor": True}}).thor.refresh_threshold is None
    with pytest.raises(ValueError, match="thor.refresh_threshold"):
        AutoBoost("O0", {"boost": {"mode": "manual", "thor": True}, "thor": {"refresh_threshold": -0.5}})
    weights, _, _ = _mlp_data()
    with pytest.raises(TypeError, match="thor.refresh_threshold"):
        thor(MLP(*weights), 0.1, 0.05, 0.9, refresh_threshold="0.1")
    net = make_net()
    model = Model(net, ce(), nn.Momentum(net.trainable_params(), 0.01, 0.9),
                  boost_config_dict={"boost": {"mode": "manual", "thor": True}, "thor": {"refresh_threshold": 0.3}})
    assert model.train_network.optimizer.refresh_threshold == 0.3

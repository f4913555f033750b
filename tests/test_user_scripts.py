"""Scripts as users write them from MindSpore's tutorials and API docs, with ``from ms_boost import Model``.

Each test is a bug found by running such a script (docs/compatibility.md, "User scripts checked"), reduced to
its smallest form: the call that broke, checked against plain MindSpore (O0 must be bit for bit the same) or an
invariant (Graph mode gives what PyNative gives, whose path runs MindSpore's own optimizer).
"""
from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn
from mindspore.train import Callback
from mindspore.train import Model as MsModel

from ms_boost import Model
from tests.helpers.nets import dataset, learnable_data, make_net, weights


def ce():
    return nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


class _StepLosses(Callback):
    """The loss of every training step (``fit`` accepts only ``on_train_*``/``on_eval_*`` methods)."""

    def __init__(self):
        super().__init__()
        self.losses = []

    def on_train_step_end(self, run_context):
        out = run_context.original_args().net_outputs
        self.losses.append(float(np.asarray((out[0] if isinstance(out, (tuple, list)) else out).asnumpy())))


class _DenseBN(nn.Cell):
    """Dense-BN-ReLU-Dense on 16 features: four weight tensors in two layers (two freezing atoms at least)."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(16, 32)
        self.bn = nn.BatchNorm1d(32)
        self.relu = nn.ReLU()
        self.fc2 = nn.Dense(32, 4)

    def construct(self, x):
        return self.fc2(self.relu(self.bn(self.fc1(x))))


def _dense_net(seed: int = 0) -> _DenseBN:
    net = _DenseBN()
    rng = np.random.RandomState(seed)
    for p in net.trainable_params():
        p.set_data(ms.Tensor(rng.normal(0, 0.1, p.shape).astype(np.float32)))
    return net


def _dense_data(n: int = 64, seed: int = 0, features: int = 16, classes: int = 4):
    """``(x, y)``: ``n`` normal rows of ``features`` floats, labelled by the argmax of a random linear map to
    ``classes`` (the users' scripts' learnable data; the same arrays for the same arguments)."""
    rng = np.random.RandomState(seed)
    x = rng.normal(size=(n, features)).astype(np.float32)
    y = np.argmax(x @ rng.normal(size=(features, classes)), axis=1).astype(np.int32)
    return x, y


def test_fit_at_o0_matches_mindspore(mode):
    """``model.fit`` (train + evaluation per epoch) at O0 trains and evaluates exactly as MindSpore's."""
    x, y = learnable_data(64)
    results = []
    for model_cls in (MsModel, Model):
        net = make_net()
        model = model_cls(net, ce(), nn.Momentum(net.trainable_params(), 0.05, 0.9), metrics={"acc", "loss"})
        losses = _StepLosses()
        model.fit(2, dataset(x, y), dataset(x[:32], y[:32]), callbacks=[losses])
        results.append((losses.losses, weights(net), model.eval(dataset(x[:32], y[:32]))))
    (ms_losses, ms_weights, ms_eval), (our_losses, our_weights, our_eval) = results
    assert our_losses == ms_losses and len(our_losses) == 8
    for a, b in zip(ms_weights, our_weights):
        np.testing.assert_array_equal(a, b)
    assert our_eval == ms_eval


def test_fit_with_boost_level_auto_runs_the_trial(mode):
    """``Model(boost_level="auto").fit`` runs the trial first, as ``train`` does.

    MindSpore's ``fit`` has its own loop and never calls ``train``: it ran the pending network, which raised
    "the plan is chosen when train() starts".
    """
    x, y = _dense_data()
    net = _dense_net()
    before = weights(net)
    model = Model(net, ce(), nn.Momentum(net.trainable_params(), 0.05, 0.9), metrics={"acc"}, boost_level="auto")
    losses = _StepLosses()
    model.fit(2, dataset(x, y), dataset(x[:32], y[:32]), callbacks=[losses])
    assert model.autotune_report is not None
    assert len(losses.losses) == 8 and np.all(np.isfinite(losses.losses))
    assert any(np.abs(a - b).max() > 0 for a, b in zip(before, weights(net)))  # the user's net was trained


@pytest.mark.parametrize("group_lr", [0.02, "dynamic"])
def test_freezing_with_a_per_group_learning_rate_graph_matches_pynative(group_lr):
    """Momentum with parameter groups where one group sets its own ``lr`` (MindSpore's docs example), at O1.

    Gradient freezing rebuilds one Momentum per layer group; a group without ``lr`` becomes an optimizer with one
    learning rate while the user's had per-group ones. Graph mode read the first group's rates for it and crashed
    ("'int' object is not callable"). PyNative runs each rebuilt MindSpore Momentum as it is: Graph must match it.
    """
    x, y = _dense_data()
    cfg = {"boost": {"mode": "manual", "less_bn": False, "grad_freeze": True},
           "grad_freeze": {"param_groups": 2, "freeze_p": 0.5, "total_steps": 8}}
    results = []
    for mode in (ms.PYNATIVE_MODE, ms.GRAPH_MODE):
        ms.set_context(mode=mode)
        net = _dense_net()
        fc1 = [p for p in net.trainable_params() if p.name.startswith("fc1")]
        rest = [p for p in net.trainable_params() if not p.name.startswith("fc1")]
        lr = nn.piecewise_constant_lr([2, 100], [0.05, 0.02]) if group_lr == "dynamic" else group_lr
        groups = [{"params": fc1, "lr": lr, "weight_decay": 0.01}, {"params": rest},
                  {"order_params": net.trainable_params()}]
        model = Model(net, ce(), nn.Momentum(groups, 0.1, 0.9), boost_level="O1", boost_config_dict=cfg)
        losses = _StepLosses()
        model.train(2, dataset(x, y), callbacks=[losses])
        results.append((losses.losses, weights(net)))
    ms.set_context(mode=ms.PYNATIVE_MODE)
    (py_losses, py_weights), (graph_losses, graph_weights) = results
    np.testing.assert_allclose(graph_losses, py_losses, rtol=1e-6)
    for a, b in zip(py_weights, graph_weights):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)


def test_a_train_step_cell_given_as_network_trains_as_in_mindspore(mode):
    """``Model(nn.TrainOneStepCell(...), boost_level="O1")``: no optimizer given to Model, the network trains itself.

    ms_boost took it for an evaluation network and converted it in place (LessBN's FN head replaced the last Dense),
    so the script trained another network than the one it built. MindSpore's Model (and upstream boost) train it
    as it is; now so does ms_boost, with a warning that boost is not applied.
    """
    x, y = _dense_data()
    results = []
    for model_cls, kwargs in ((MsModel, {}), (Model, {"boost_level": "O1"})):
        net = _dense_net()
        train_cell = nn.TrainOneStepCell(nn.WithLossCell(net, ce()), nn.Momentum(net.trainable_params(), 0.1, 0.9))
        model = model_cls(train_cell, **kwargs)
        losses = _StepLosses()
        model.train(2, dataset(x, y), callbacks=[losses])
        results.append((losses.losses, [p.name for p in net.get_parameters()], weights(net)))
    (ms_losses, ms_names, ms_weights), (our_losses, our_names, our_weights) = results
    assert our_names == ms_names  # no FN head's multiplier: the network was not converted
    assert our_losses == ms_losses
    for a, b in zip(ms_weights, our_weights):
        np.testing.assert_array_equal(a, b)


def test_less_bn_says_why_it_added_no_fn_head():
    """O1 on a net whose last Dense has an activation: LessBN leaves it (no FN head) and now logs why.

    The plan says ``fn_flag: True``; before, nothing told the user that no head was added.
    """
    import logging

    class ActivationHead(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc = nn.Dense(16, 8)
            self.head = nn.Dense(8, 4, activation="relu")

        def construct(self, x):
            return self.head(self.fc(x))

    records = []

    class _Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    handler = _Keep()
    logger = logging.getLogger("ms_boost")
    logger.addHandler(handler)
    try:
        net = ActivationHead()
        Model(net, ce(), nn.Momentum(net.trainable_params(), 0.1, 0.9), boost_level="O1")
    finally:
        logger.removeHandler(handler)
    assert isinstance(net.head, nn.Dense)  # left unchanged
    assert any("LessBN" in m and "'head' has an activation" in m for m in records), records


def test_a_misspelt_boost_level_names_every_allowed_value():
    """``boost_level="Auto"`` (or ``"o1"``): the error lists what Model takes, ``"auto"`` included."""
    net = _dense_net()
    with pytest.raises(ValueError, match=r"boost_level='Auto'.*'O0', 'O1', 'O2'.*'auto'"):
        Model(net, ce(), nn.Momentum(net.trainable_params(), 0.1, 0.9), boost_level="Auto")


def test_loss_scale_cell_with_the_docs_float32_max_scale_trains_as_unscaled(mode):
    """MindSpore's docs build the loss-scale cell with ``scale_sense = Tensor(np.full((1), np.finfo(np.float32).max))``.

    ms_boost unscaled the gradients by multiplying with ``1 / scale``, a float32 subnormal there: Graph mode flushed
    it to zero (every gradient 0, no overflow reported: training silently stopped) and PyNative rounded it coarsely.
    Dividing by the scale gives the unscaled step (this small net's gradients stay below 1, so ``g * scale`` is finite).
    """
    from ms_boost import BoostTrainOneStepCell, BoostTrainOneStepWithLossScaleCell

    x, y = _dense_data(32)
    runs = []
    for scale in (None, ms.Tensor(np.full((1), np.finfo(np.float32).max), dtype=ms.float32)):
        net = _dense_net()
        opt = nn.Momentum(net.trainable_params(), 0.1, 0.9)
        if scale is None:
            cell = BoostTrainOneStepCell(nn.WithLossCell(net, ce()), opt)
        else:
            cell = BoostTrainOneStepWithLossScaleCell(nn.WithLossCell(net, ce()), opt, scale_sense=scale)
        cell.set_train()
        losses, overflows = [], []
        for i in range(3):
            out = cell(ms.Tensor(x[8 * i:8 * i + 8]), ms.Tensor(y[8 * i:8 * i + 8]))
            losses.append(float((out[0] if isinstance(out, tuple) else out).asnumpy()))
            if isinstance(out, tuple):
                overflows.append(bool(out[1].asnumpy()))
        runs.append((losses, weights(net), overflows))
    (plain_losses, plain_weights, _), (scaled_losses, scaled_weights, overflows) = runs
    assert overflows == [False, False, False]
    np.testing.assert_allclose(scaled_losses, plain_losses, rtol=1e-6)
    for a, b in zip(plain_weights, scaled_weights):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)


def test_group_loss_scale_above_2_to_126_trains_as_unscaled(mode):
    """A GroupLossScaleManager group at a scale above :math:`2^{126}` unscales by division too (as the loss-scale cell).

    ``grad * (1 / scale)`` flushed the subnormal reciprocal to zero in Graph mode (that group stopped training
    with no overflow) and rounded it coarsely in PyNative.
    """
    from tests.test_loss_scale import assert_trains_as_unscaled, build

    manager, net = build(init_scale=[2.0 ** 127, 16.0], max_loss_scale=2.0 ** 127)
    assert_trains_as_unscaled(manager, net, 3)


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_a_callback_setting_the_scripts_optimizer_learning_rate_changes_the_trained_rate(level, mode):
    """A callback written as the docs write one, holding the script's own optimizer: ``ops.assign(opt.learning_rate,
    0)`` after step 2. At O1/O2 boost rebuilds the optimizer (LessBN's groups, one optimizer per freezing group); the
    rebuilt ones trained with a copy of the rate, so the assignment did nothing and training went on at 0.1. They
    now train with the script's Parameter itself: from step 3 on no weight moves, and the script reads the rate
    that trains."""
    x, y = _dense_data()
    net = _dense_net()
    opt = nn.Momentum(net.trainable_params(), 0.1, 0.9)

    class ZeroRateAfterTwo(Callback):
        def __init__(self):
            super().__init__()
            self.after = []

        def step_end(self, run_context):
            step = run_context.original_args().cur_step_num
            if step == 2:
                ms.ops.assign(opt.learning_rate, ms.Tensor(0.0, ms.float32))
            if step >= 2:
                self.after.append(weights(net))

    model = Model(net, ce(), opt, boost_level=level)
    seen = ZeroRateAfterTwo()
    model.train(1, dataset(x, y), callbacks=[seen])
    assert len(seen.after) == 3  # steps 2, 3, 4
    for later in seen.after[1:]:
        for a, b in zip(seen.after[0], later):
            np.testing.assert_array_equal(a, b)
    trained = model.train_network.optimizer
    assert float(trained.learning_rate.asnumpy()) == 0.0 == float(opt.learning_rate.asnumpy())


def _seq_dense_bn(seed: int = 0) -> nn.SequentialCell:
    """``_DenseBN`` written as users often do, as a SequentialCell (the same layers, weights and order)."""
    net = nn.SequentialCell([nn.Dense(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dense(32, 4)])
    rng = np.random.RandomState(seed)
    for p in net.trainable_params():
        p.set_data(ms.Tensor(rng.normal(0, 0.1, p.shape).astype(np.float32)))
    return net


def test_amp_o1_with_boost_o1_on_a_sequential_cell(mode, tmp_path, monkeypatch):
    """``Model(SequentialCell(...), amp_level="O1", boost_level="O1")``: trains as MindSpore's Model on the LessBN net.

    MindSpore's amp "O1" rewrites the network's source; it failed ("Please handle custom-object first") on LessBN's
    wrapper, whose ``construct`` forwards ``*inputs`` to a SequentialCell, although plain MindSpore casts the
    SequentialCell alone fine (upstream boost fails the same way). The cast now goes to the network the wrapper calls:
    with LessBN alone (no freezing, no gradient centralization) the run is bit for bit MindSpore's ``Model`` with
    ``amp_level="O1"`` on the same net converted by ``LessBN`` (FN head included).
    """
    from ms_boost import LessBN

    monkeypatch.chdir(tmp_path)  # MindSpore's rewrite writes the rewritten source to ./rewritten_network
    x, y = _dense_data()
    cfg = {"boost": {"mode": "manual", "less_bn": True, "grad_freeze": False}, "less_bn": {"gc_flag": False}}
    results = []
    for model_cls in (Model, MsModel):
        net = _seq_dense_bn()
        kwargs = {"boost_level": "O1", "boost_config_dict": cfg} if model_cls is Model else {}
        if model_cls is MsModel:
            LessBN(net, fn_flag=True)  # converts net in place: the structure ms_boost trains
        model = model_cls(net, ce(), nn.Momentum(net.trainable_params(), 0.05, 0.9), metrics={"acc"},
                          amp_level="O1", **kwargs)
        losses = _StepLosses()
        model.train(2, dataset(x, y), callbacks=[losses])
        results.append((losses.losses, weights(net), [p.name for p in net.trainable_params()]))
    (our_losses, our_weights, our_names), (ms_losses, ms_weights, ms_names) = results
    assert len(our_losses) == 8 and "3.multiplier" in our_names and our_names == ms_names
    assert our_losses == ms_losses
    for a, b in zip(ms_weights, our_weights):
        np.testing.assert_array_equal(b, a)


def test_amp_o1_with_boost_o1_on_a_conv_net(mode, tmp_path, monkeypatch):
    """``Model(conv_net, amp_level="O1", boost_level="O1")`` on CPU: the im2col + GEMM convolutions run as they are.

    MindSpore's amp "O1" rewrite regenerated the source of ``cpu_gemm_conv``'s convolution in a new module, without
    the helpers its module defines: NameError ('_conv_pads', 'output_size') when the Model was built. The rewrite now
    calls that cell as it is (float32). This net's other white-list layer is the last Dense, which LessBN turns into
    the FN head, so amp O1 changes little here: the run stays within 1e-4 of amp O0's at the same boost level.
    """
    from ms_boost.cpu_gemm_conv import GemmConv2dSwap
    from tests.helpers.nets import learnable_data, make_net

    monkeypatch.chdir(tmp_path)  # MindSpore's rewrite writes the rewritten source to ./rewritten_network
    x, y = learnable_data(48)
    results = []
    for amp_level in ("O0", "O1"):
        net = make_net()
        model = Model(net, ce(), nn.Momentum(net.trainable_params(), 0.05, 0.9), amp_level=amp_level,
                      boost_level="O1")
        losses = _StepLosses()
        model.train(1, dataset(x, y), callbacks=[losses])
        assert isinstance(net.conv1, GemmConv2dSwap) and isinstance(net.conv2, GemmConv2dSwap)
        results.append((losses.losses, weights(net)))
    (o0_losses, o0_weights), (o1_losses, o1_weights) = results
    assert len(o1_losses) == 3 and np.all(np.isfinite(o1_losses)) and o1_losses[-1] != o1_losses[0]
    np.testing.assert_allclose(o1_losses, o0_losses, rtol=1e-4)
    for a, b in zip(o0_weights, o1_weights):
        np.testing.assert_allclose(b, a, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("sens", ["a", True, float("inf"), [1.0, 2.0]])
def test_boost_train_cell_names_a_bad_sens(sens):
    """``BoostTrainOneStepCell(net, opt, sens=...)`` with something not a finite number: the error names ``sens``.

    ``sens="a"`` raised Python's bare "could not convert string to float: 'a'"; ``True`` and ``inf`` were taken.
    """
    from ms_boost import BoostTrainOneStepCell

    net = _dense_net()
    with pytest.raises(TypeError, match=r"sens must be a finite number.*got"):
        BoostTrainOneStepCell(nn.WithLossCell(net, ce()), nn.Momentum(net.trainable_params(), 0.1, 0.9), sens=sens)


def test_boost_train_cell_takes_the_sens_users_pass():
    """Numbers, numpy scalars and one-element Tensors stay accepted as ``sens`` (MindSpore's TrainOneStepCell's)."""
    from ms_boost import BoostTrainOneStepCell

    net = _dense_net()
    for sens, expected in ((2, 2.0), (1024.0, 1024.0), (np.float32(0.5), 0.5), (ms.Tensor(4.0, ms.float32), 4.0)):
        cell = BoostTrainOneStepCell(nn.WithLossCell(net, ce()), nn.Momentum(net.trainable_params(), 0.1, 0.9),
                                     sens=sens)
        assert cell.sens == expected


class _ConvDense(nn.Cell):
    """Conv-ReLU-Dense without BatchNorm (module level: MindSpore's amp rewrite subclasses it by name)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, pad_mode="same", has_bias=False)
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(4 * 8 * 8, 4)

    def construct(self, x):
        return self.fc(self.flatten(self.relu(self.conv(x))))


def _thor_amp_run(amp_level: str) -> tuple:
    """``thor(net, ...)`` + ``Model(..., amp_level=amp_level, frequency=2)`` on a conv net, one epoch of 3 steps:
    (losses, weights, the classes of the THOR network's cells)."""
    from ms_boost import thor
    from tests.helpers.nets import learnable_data

    x, y = learnable_data(48)
    ms.set_seed(0)
    net = _ConvDense()
    opt = thor(net, 0.05, 0.03, 0.9, 1e-4, 1.0, 16, frequency=2)
    model = Model(net, ce(), opt, amp_level=amp_level, frequency=2)
    losses = _StepLosses()
    model.train(1, dataset(x, y), callbacks=[losses])
    return losses.losses, weights(net), [type(cell) for _, cell in opt.thor_network.cells_and_names()]


@pytest.fixture(scope="module")
def thor_amp_o0_run():
    """The amp O0 run of the test below, in PyNative mode, once for both modes' O1 runs: on this net the Graph-mode
    O0 run gives the same losses and weights bit for bit (checked when this was shared)."""
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        return _thor_amp_run("O0")
    finally:
        ms.set_context(mode=previous)


def test_thor_with_amp_o1_runs_its_layers_as_they_are(mode, tmp_path, monkeypatch, thor_amp_o0_run):
    """``thor(net, ...)`` + ``Model(..., amp_level="O1", frequency=2)`` on a conv net.

    MindSpore's amp "O1" rewrite regenerated the THOR layers' source in a new module without this package's helpers
    (NameError '_write_input_statistic'). THOR layers are now called as they are, in float32; every other white-list
    layer of this net is a THOR layer, so the run stays within 1e-4 of amp O0's (the PyNative O0 run: the same
    numbers as Graph mode's).
    """
    from ms_boost.thor import Conv2dThor, DenseThor

    monkeypatch.chdir(tmp_path)  # MindSpore's rewrite writes the rewritten source to ./rewritten_network
    o1_losses, o1_weights, o1_layers = _thor_amp_run("O1")
    o0_losses, o0_weights, o0_layers = thor_amp_o0_run
    for layers in (o0_layers, o1_layers):
        assert Conv2dThor in layers and DenseThor in layers  # the THOR layers themselves trained
    assert len(o1_losses) == 3 and np.all(np.isfinite(o1_losses)) and o1_losses[-1] != o1_losses[0]
    np.testing.assert_allclose(o1_losses, o0_losses, rtol=1e-4)
    for a, b in zip(o0_weights, o1_weights):
        np.testing.assert_allclose(b, a, rtol=1e-3, atol=1e-5)

"""Users' scripts, eleventh round (docs/compatibility.md): the data side as the tutorials write it, the functional loop
next to Model, a train cell of the script's own, MindSpore's graceful exit, mode switches, bad input.

Each test is a finding of such a script, reduced to its smallest form, against plain MindSpore.
"""
from __future__ import annotations

import json
import signal

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
import pytest
from mindspore import Tensor, nn, ops
from mindspore.train import Callback, OnRequestExit
from mindspore.train import Model as MsModel

from ms_boost import BoostTrainOneStepCell, Model
from tests.helpers.loopback import run_ranks
from tests.test_user_scripts import _dense_data, _StepLosses, ce

# LessBN without FN head and gradient centralization: on this net (no residual addition) it only rebuilds the
# optimizer, so every number is MindSpore's (the fourth round's plan)
REBUILD_ONLY = {"boost": {"mode": "manual", "less_bn": True, "grad_freeze": False},
                "less_bn": {"fn_flag": False, "gc_flag": False}}
ACCUMULATION = {"boost": {"mode": "manual", "less_bn": False, "grad_freeze": False, "grad_accumulation": True},
                "grad_accumulation": {"grad_accumulation_step": 2}}


def _net(seed: int = 0) -> nn.Cell:
    net = nn.SequentialCell(nn.Dense(16, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dense(16, 4))
    rng = np.random.RandomState(seed)
    for p in net.trainable_params():
        if "gamma" not in p.name and "beta" not in p.name:
            p.set_data(Tensor(rng.normal(0, 0.3, p.shape).astype(np.float32)))
    return net


def _data(n: int = 64):
    x, y = _dense_data(n)
    return ds.NumpySlicesDataset({"data": x, "label": y}, shuffle=False).batch(16)


def _weights(net: nn.Cell) -> dict:
    return {p.name: p.asnumpy().copy() for p in net.trainable_params()}


class _ExitRequestAt(Callback):
    """Writes OnRequestExit's config file (``{"GracefulExit": 1}``) after step ``at``: the exit request of MindSpore's
    graceful-exit tutorial, without sending the process a signal."""

    def __init__(self, path, at: int):
        super().__init__()
        self.path, self.at = path, at

    def on_train_step_end(self, run_context):
        if run_context.original_args().cur_step_num == self.at:
            self.path.write_text(json.dumps({"GracefulExit": 1}))


def _train_until_exit_request(make_model, tmp_path, name):
    """Train 2 epochs of 4 steps with OnRequestExit, the exit asked after step 2; the steps run and the checkpoint."""
    request = tmp_path / f"{name}.json"
    net = _net()
    model = make_model(net)
    losses = _StepLosses()
    previous = signal.getsignal(signal.SIGUSR1)  # OnRequestExit installs a handler for its signal: put it back
    try:
        model.train(2, _data(), callbacks=[
            OnRequestExit(save_ckpt=True, save_mindir=False, file_name="exit", directory=str(tmp_path / name),
                          config_file=str(request), sig=signal.SIGUSR1),
            _ExitRequestAt(request, 2), losses], dataset_sink_mode=False)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    saved = list((tmp_path / name).rglob("exit_train.ckpt"))
    return losses.losses, _weights(net), (ms.load_checkpoint(str(saved[0])) if saved else None)


def test_graceful_exit_stops_training_at_the_step_mindspore_stops(mode, tmp_path, monkeypatch):
    """MindSpore's graceful exit: ``MS_ENABLE_GRACEFUL_EXIT=1`` + ``OnRequestExit`` (here through its config file).

    Before: ms_boost's train cells had no ``graceful_exit`` flag, which OnRequestExit looks for in the train network:
    plain MindSpore stopped after the request (3 steps, a checkpoint with the step), ms_boost trained all 8 steps and
    saved nothing until the end, without a word. Now every plan stops where MindSpore stops; O0 bit for bit.
    """
    monkeypatch.setenv("MS_ENABLE_GRACEFUL_EXIT", "1")
    ref_losses, ref_w, ref_ckpt = _train_until_exit_request(
        lambda net: MsModel(net, ce(), nn.Momentum(net.trainable_params(), 0.05, 0.9)), tmp_path, "ms")
    assert len(ref_losses) == 3 and ref_ckpt is not None and bool(ref_ckpt["graceful_exit"].asnumpy())
    losses, w, ckpt = _train_until_exit_request(
        lambda net: Model(net, ce(), nn.Momentum(net.trainable_params(), 0.05, 0.9)), tmp_path, "o0")
    assert losses == ref_losses
    for name in ref_w:
        np.testing.assert_array_equal(w[name], ref_w[name])
    assert ckpt is not None and bool(ckpt["graceful_exit"].asnumpy())
    assert int(ckpt["global_step"].asnumpy().reshape(-1)[0]) == 3
    np.testing.assert_array_equal(ckpt["0.weight"].asnumpy(), ref_ckpt["0.weight"].asnumpy())
    # a plan with a device-side branch, through the loss-scale cell
    losses, _, ckpt = _train_until_exit_request(
        lambda net: Model(net, ce(), nn.Momentum(net.trainable_params(), 0.05, 0.9), boost_level="O1",
                          boost_config_dict=ACCUMULATION,
                          loss_scale_manager=ms.amp.FixedLossScaleManager(128.0, drop_overflow_update=True)),
        tmp_path, "acc")
    assert len(losses) == 3 and ckpt is not None


def test_graceful_exit_is_agreed_by_every_data_parallel_rank(monkeypatch):
    """Over data-parallel ranks the step sets ``graceful_exit`` only once every rank asked (``graceful_init`` 1),
    as ``nn.TrainOneStepCell``: the ranks stop at the same step (loopback world of 2 ranks, PyNative)."""
    monkeypatch.setenv("MS_ENABLE_GRACEFUL_EXIT", "1")
    x, y = _dense_data(8)

    def rank_fn(rank):
        net = _net()
        cell = BoostTrainOneStepCell(nn.WithLossCell(net, ce()), nn.Momentum(net.trainable_params(), 0.05, 0.9))
        cell.set_train()
        names = {p.name for p in cell.get_parameters()}
        seen = []
        for asked in ((0, 0), (1, 0), (1, 1)):
            cell.init_param.set_data(Tensor([asked[rank]], ms.int32))
            cell(Tensor(x[rank * 4:rank * 4 + 4]), Tensor(y[rank * 4:rank * 4 + 4]))
            seen.append(bool(cell.exit_param.asnumpy()))
        return names, seen

    for names, seen in run_ranks(2, rank_fn):
        assert {"graceful_exit", "graceful_init"} <= names
        assert seen == [False, False, True]


class _ClipStep(nn.TrainOneStepCell):
    """A train cell of the script's own: ``nn.TrainOneStepCell`` with the gradients clipped by global norm."""

    def construct(self, *inputs):
        loss = self.network(*inputs)
        sens = ops.fill(loss.dtype, loss.shape, self.sens)
        grads = self.grad(self.network, self.weights)(*inputs, sens)
        grads = ops.clip_by_global_norm(grads, 1.0)
        self.optimizer(self.grad_reducer(grads))
        return loss


def test_auto_level_on_a_train_cell_of_the_scripts_own_trains_it_as_it_is(mode):
    """``Model(MyTrainStep(loss_net, opt), boost_level="auto")``.

    Before: "needs the run's first-order optimizer (Momentum, SGD, ...); got NoneType. THOR is one of the
    candidates", where O1/O2 warn and train the cell as it is (as MindSpore's Model). Now "auto" does the same:
    bit for bit MindSpore's Model.
    """
    def train(model_class, **kw):
        net = _net()
        cell = _ClipStep(nn.WithLossCell(net, ce()), nn.Momentum(net.trainable_params(), 0.1, 0.9))
        losses = _StepLosses()
        model_class(cell, **kw).train(1, _data(32), callbacks=[losses])
        return losses.losses, _weights(net)

    ref_losses, ref_w = train(MsModel)
    losses, w = train(Model, boost_level="auto")
    assert losses == ref_losses
    for name in ref_w:
        np.testing.assert_array_equal(w[name], ref_w[name])


def _functional_steps(net, opt, steps: int) -> None:
    """MindSpore 2.x quick start's loop: ``value_and_grad(forward_fn, None, opt.parameters, has_aux=True)``."""
    loss_fn = ce()

    def forward_fn(data, label):
        logits = net(data)
        return loss_fn(logits, label), logits

    grad_fn = ms.value_and_grad(forward_fn, None, opt.parameters, has_aux=True)

    def train_step(data, label):
        (loss, _), grads = grad_fn(data, label)
        opt(grads)
        return loss

    if ms.get_context("mode") == ms.GRAPH_MODE:
        train_step = ms.jit(train_step)
    net.set_train()
    for i, (data, label) in enumerate(_data(32).create_tuple_iterator()):
        if i < steps:
            train_step(data, label)


def test_warns_when_the_scripts_optimizer_moved_after_model_rebuilt_it(mode):
    """``model = Model(net, loss, opt, boost_level="O1")``, then the quick start's functional loop steps ``opt``, then
    ``model.train``.

    At O1 Model trains optimizers rebuilt from ``opt`` when it was built; the loop's momenta and step reach ``opt``
    only, so the run goes on from other numbers than MindSpore's (here the rebuild-only plan, whose numbers equal
    MindSpore's when the Model is built after the loop), without a word before. Now ``train`` says so, naming both
    steps; built after the loop, nothing is said and the numbers are MindSpore's.
    """
    net = _net()
    opt = nn.Momentum(net.trainable_params(), 0.1, 0.9)
    model = Model(net, ce(), opt, boost_level="O1", boost_config_dict=REBUILD_ONLY)
    _functional_steps(net, opt, 2)
    with pytest.warns(UserWarning, match=r"at global_step 2, but boost_level 'O1' rebuilt it .* at global_step 0"):
        model.train(1, _data(32))

    def loop_then_model(model_class, **kw):
        net = _net()
        opt = nn.Momentum(net.trainable_params(), 0.1, 0.9)
        _functional_steps(net, opt, 2)
        losses = _StepLosses()
        model_class(net, ce(), opt, **kw).train(1, _data(32), callbacks=[losses])
        return losses.losses, _weights(net)

    ref_losses, ref_w = loop_then_model(MsModel)
    import warnings
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="ms_boost: the optimizer given to Model")
        losses, w = loop_then_model(Model, boost_level="O1", boost_config_dict=REBUILD_ONLY)
    assert losses == ref_losses
    for name in ref_w:
        np.testing.assert_array_equal(w[name], ref_w[name])


@pytest.mark.parametrize("learning_rate", [[], np.zeros(0, np.float32), Tensor(np.zeros(0, np.float32)), [[0.05]]])
def test_thor_refuses_an_empty_or_nested_per_step_learning_rate_by_name(learning_rate):
    """``thor(net, [], ...)`` (a schedule list left empty) failed at the first step with MindSpore's "For 'Gather',
    the 'input_indices' should be in the range [0, 0)", a nested list with "The object is not callable"; both are
    now refused when ``thor`` is called, naming the value and what is allowed."""
    from ms_boost import thor

    with pytest.raises(TypeError, match=r"thor: learning_rate=.* is not allowed; allowed: .*\(a non-empty list"):
        thor(_net(), learning_rate, 0.03, 0.9, 1e-4, 1.0, 16, frequency=2)


def test_a_numpy_bool_switch_is_a_bool():
    """``{"boost": {"mode": "manual", "less_bn": np.bool_(False)}}`` (a switch computed with numpy) was refused with
    "must be a bool (True/False), got False (bool_)", where numpy ints pass as ints; it now counts as the bool it is."""
    from ms_boost import AutoBoost

    plan = AutoBoost("O1", {"boost": {"mode": "manual", "less_bn": np.bool_(False), "grad_accumulation": np.True_}})
    assert plan.boost_config["less_bn"] is False and plan.boost_config["grad_accumulation"] is True
    with pytest.raises(TypeError, match=r"boost\.less_bn must be a bool \(True/False\), got 1 \(int\)"):
        AutoBoost("O1", {"boost": {"mode": "manual", "less_bn": 1}})

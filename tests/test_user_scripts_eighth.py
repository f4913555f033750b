"""Users' scripts, eighth round (docs/compatibility.md): callbacks and schedules that change training state, the
functional training style.

Each test is a finding of such a script, reduced to its smallest form, against plain MindSpore.
"""
from __future__ import annotations

import warnings

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import Tensor, nn, ops
from mindspore.train import Model as MsModel

from ms_boost import Model, thor
from tests.test_user_scripts import _dense_data, _dense_net, _StepLosses, ce

#: gradient accumulation alone (O0 plus the section): two micro-steps per update
ACCUMULATE_2 = {"boost": {"mode": "manual", "grad_accumulation": True},
                "grad_accumulation": {"grad_accumulation_step": 2}}
#: gradient freezing that trains every group at every step (one rebuilt optimizer per layer group, nothing frozen)
FREEZE_NOTHING = {"boost": {"mode": "manual", "less_bn": False, "grad_freeze": True},
                  "grad_freeze": {"freeze_p": 1.0, "param_groups": 2, "total_steps": 100}}
#: LessBN without FN head and GC: on a net without residual additions only the optimizer is rebuilt
LESS_BN_ONLY = {"boost": {"mode": "manual", "less_bn": True, "grad_freeze": False},
                "less_bn": {"fn_flag": False, "gc_flag": False}}


def _batches(x, y, repeat_each: int = 1):
    """Batches of 16 rows, each ``repeat_each`` times in a row."""
    xs = np.concatenate([x[i:i + 16] for i in range(0, len(x), 16) for _ in range(repeat_each)])
    ys = np.concatenate([y[i:i + 16] for i in range(0, len(y), 16) for _ in range(repeat_each)])
    return ds.NumpySlicesDataset({"data": xs, "label": ys}, shuffle=False).batch(16)


def _trained(net) -> dict:
    return {p.name: p.asnumpy() for p in net.trainable_params()}


class _WeightDecaySchedule(nn.Cell):
    """A weight decay that grows with the step (MindSpore takes a Cell of ``global_step`` as ``weight_decay``)."""

    def construct(self, global_step):
        return ops.cast(global_step, ms.float32) * 1e-3 + 1e-3


def _thor(net):
    return thor(net, Tensor(0.05, ms.float32), Tensor(0.03, ms.float32), 0.9, 1e-4, 1.0, 16, frequency=2)


def test_a_weight_decay_schedule_survives_o1s_rebuilt_optimizers(mode):
    """``nn.AdamWeightDecay(params, lr, weight_decay=<Cell of the step>)`` at O1 failed when the Model was built.

    AdamWeightDecay records no constructor arguments, so O1 reads them back from the instance, where MindSpore keeps
    the schedule wrapped (``_WrappedWeightDecay``): "keeps no readable attribute for ['weight_decay']". The rebuilt
    optimizers now get the schedule itself: with the two plans that change nothing MindSpore computes, bit for bit
    MindSpore's Model, for a plain parameter list and for groups where one group has its own schedule.
    """
    x, y = _dense_data(32)
    for form in ("plain", "groups"):
        results = []
        for config in (None, FREEZE_NOTHING, LESS_BN_ONLY):
            net = _dense_net()
            params = net.trainable_params()
            if form == "groups":
                params = [{"params": [p for p in params if "fc1" in p.name], "weight_decay": _WeightDecaySchedule()},
                          {"params": [p for p in params if "fc1" not in p.name], "weight_decay": 0.01}]
            opt = nn.AdamWeightDecay(params, 0.01, weight_decay=_WeightDecaySchedule())
            if config is None:
                model = MsModel(net, ce(), opt)
            else:
                model = Model(net, ce(), opt, boost_level="O1", boost_config_dict=config)
            losses = _StepLosses()
            model.train(2, _batches(x, y), callbacks=[losses])
            results.append((losses.losses, _trained(net)))
        (want_losses, want), *ours = results
        for losses, got in ours:
            assert losses == want_losses, form
            for name in want:
                np.testing.assert_array_equal(got[name], want[name], err_msg=f"{form}: {name}")


def test_a_rate_schedule_advances_once_per_accumulated_update(mode):
    """With ``grad_accumulation_step: 2`` a ``LearningRateSchedule`` (and a per-step list) is read once per update.

    The optimizer's ``global_step`` counts updates, not micro-steps: over batches fed twice in a row (two equal
    micro-steps average to that batch's gradient), accumulation trains bit for bit as MindSpore's Model on each
    batch once, with the same schedule.
    """
    x, y = _dense_data(32)
    results = []
    for config, repeat_each in ((None, 1), (ACCUMULATE_2, 2)):
        for rate in (lambda: nn.CosineDecayLR(0.001, 0.1, 4), lambda: [0.1, 0.05, 0.02, 0.01]):
            net = _dense_net()
            opt = nn.Momentum(net.trainable_params(), rate(), 0.9)
            model = MsModel(net, ce(), opt) if config is None else Model(net, ce(), opt, boost_config_dict=config)
            losses = _StepLosses()
            model.train(2, _batches(x, y, repeat_each), callbacks=[losses])
            results.append((losses.losses[repeat_each - 1::repeat_each], _trained(net)))
    for (want_losses, want), (losses, got) in zip(results[:2], results[2:]):
        assert losses == want_losses and len(losses) == 4
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def _functional_thor_run(net, opt, forward_net, x, y) -> list:
    """MindSpore 2.x's tutorial loop: ``value_and_grad`` over a forward function, ``optimizer(grads)``."""
    loss_fn = ce()

    def forward_fn(data, label):
        logits = forward_net(data)
        return loss_fn(logits, label), logits

    grad_fn = ms.value_and_grad(forward_fn, None, opt.parameters, has_aux=True)

    def train_step(data, label):
        (loss, _), grads = grad_fn(data, label)
        return ops.depend(loss, opt(grads))

    if ms.get_context("mode") == ms.GRAPH_MODE:
        train_step = ms.jit(train_step)
    forward_net.set_train()
    return [float(train_step(Tensor(x[i:i + 16]), Tensor(y[i:i + 16])).asnumpy()) for i in range(0, len(x), 16)]


def test_thor_in_the_functional_loop_trains_thor_network_and_warns_over_the_users_net(mode):
    """THOR in the tutorials' functional loop.

    Over ``opt.thor_network`` (the converted copy ``thor(net)`` trains, sharing ``net``'s Parameters) the loop
    trains bit for bit as ``Model`` does. Over the user's ``net`` no THOR layer runs, so no statistic is captured
    and THOR preconditions with factors that never change: it trained on silently; in PyNative mode the first step
    now warns, naming ``thor_network`` (Graph mode never asks the host, nothing can be told there).
    """
    x, y = _dense_data(48)
    net = _dense_net()
    losses = _StepLosses()
    Model(net, ce(), _thor(net)).train(1, _batches(x, y), callbacks=[losses])
    want = _trained(net)

    net = _dense_net()
    opt = _thor(net)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        got_losses = _functional_thor_run(net, opt, opt.thor_network, x, y)
    assert got_losses == losses.losses
    for name in want:
        np.testing.assert_array_equal(_trained(net)[name], want[name], err_msg=name)
    assert not [w for w in record if "THOR step without" in str(w.message)]

    if ms.get_context("mode") == ms.PYNATIVE_MODE:
        net = _dense_net()
        opt = _thor(net)
        opt.compile_pynative_step = False  # two steps op by op: the warning comes before the step (a compile saved)
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            _functional_thor_run(net, opt, net, x[:32], y[:32])
        said = [str(w.message) for w in record if "THOR step without" in str(w.message)]
        assert len(said) == 1 and "thor_network" in said[0]  # once, not at every step


class _RateBySetData(ms.train.Callback):
    """``optimizer.learning_rate.set_data(...)`` after step ``at`` (new memory, not ``ops.assign``)."""

    def __init__(self, at: int, value: float):
        super().__init__()
        self.at, self.value = at, value

    def on_train_step_end(self, run_context):
        cb_params = run_context.original_args()
        if cb_params.cur_step_num == self.at:
            cb_params.optimizer.learning_rate.set_data(Tensor(self.value, ms.float32))


def test_a_rate_set_with_set_data_between_steps_reaches_steps_with_device_branches(mode):
    """A callback setting the rate with ``set_data`` within one ``train``: ms_boost as MindSpore's Model.

    ``set_data`` gives the rate new memory. MindSpore's Graph-mode step takes it; the loss-scale cell (the tutorials'
    ``FixedLossScaleManager``) and gradient accumulation read it inside a device-side branch, which MindSpore 2.10
    keeps on the memory it was compiled with: they trained on at the old rate (rate 0 from step 2: the weights kept
    moving). Model now compiles such a step again when a Parameter got new memory. In PyNative mode MindSpore's own
    optimizer keeps the old rate too (measured, MindSpore 2.10); ms_boost's O0 steps equal it there as well.
    """
    x, y = _dense_data(48)
    results = []
    for config, repeat_each, manager in ((None, 1, True), ("O0", 1, True), (ACCUMULATE_2, 2, False)):
        net = _dense_net()
        opt = nn.Momentum(net.trainable_params(), 0.05, 0.9, loss_scale=128.0 if manager else 1.0)
        kwargs = {"loss_scale_manager": ms.train.FixedLossScaleManager(128.0, False)} if manager else {}
        if config is None:
            model = MsModel(net, ce(), opt, **kwargs)
        else:
            model = Model(net, ce(), opt, boost_config_dict=None if config == "O0" else config, **kwargs)
        losses = _StepLosses()
        model.train(1, _batches(x, y, repeat_each), callbacks=[losses, _RateBySetData(2 * repeat_each, 0.0)])
        results.append((losses.losses[repeat_each - 1::repeat_each], _trained(net)))
    (want_losses, want), *ours = results
    for losses, got in ours:
        assert losses == want_losses and len(losses) == 3
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)


class _LossAsTensor(ms.train.Callback):
    """A script's loss log written against MindSpore: ``cb_params.net_outputs`` is the loss Tensor."""

    def __init__(self):
        super().__init__()
        self.losses = []

    def on_train_step_end(self, run_context):
        self.losses.append(float(run_context.original_args().net_outputs.asnumpy()))


def test_callbacks_get_the_loss_alone_with_a_fixed_scale_as_with_mindspore(mode):
    """``FixedLossScaleManager(S, drop_overflow_update=False)``: the tutorials' manager (AdaSum, THOR).

    MindSpore's Model trains it through ``nn.TrainOneStepCell(..., sens=S)``, whose output -- ``net_outputs`` in
    the callbacks -- is the loss Tensor; ms_boost trains through its loss-scale cell (it skips overflowing steps),
    whose output is ``(loss, overflow, scale)``, so a callback calling ``net_outputs.asnumpy()`` failed ("'tuple'
    object has no attribute 'asnumpy'") and ``History`` recorded tuples. The callbacks now get the loss alone, as with
    MindSpore: the same losses and history. Managers MindSpore trains through its loss-scale cell keep the tuple.
    """
    x, y = _dense_data(48)
    results = []
    for model_cls in (MsModel, Model):
        net = _dense_net()
        opt = nn.Momentum(net.trainable_params(), 0.05, 0.9, loss_scale=128.0)
        model = model_cls(net, ce(), opt, loss_scale_manager=ms.train.FixedLossScaleManager(128.0, False))
        losses, history = _LossAsTensor(), ms.train.History()
        model.train(2, _batches(x, y), callbacks=[losses, history])
        results.append((losses.losses, history.history))
    assert results[1] == results[0] and len(results[0][0]) == 6

    net = _dense_net()
    manager = ms.train.FixedLossScaleManager(128.0, True)
    outputs = []
    model = Model(net, ce(), nn.Momentum(net.trainable_params(), 0.05, 0.9), loss_scale_manager=manager)
    model.train(1, _batches(x, y), callbacks=[ms.train.LambdaCallback(
        on_train_step_end=lambda run_context: outputs.append(run_context.original_args().net_outputs))])
    assert all(isinstance(out, tuple) and len(out) == 3 for out in outputs)

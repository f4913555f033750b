"""MindSpore's optimizer-reading callbacks with gradient freezing (docs/compatibility.md, finding 45).

With freezing on, the optimizer that trains is ms_boost's ``FreezeOpt``, a Cell and no ``nn.Optimizer``: MindSpore's
``SummaryCollector`` found "no optimizer" and recorded neither the learning rate nor the weights' histograms.
Callbacks now get an ``nn.Optimizer`` view of it as ``cb_params.optimizer`` (the same weights, the same learning-rate
Parameter); the rate callbacks keep changing the rate that trains.
"""
from __future__ import annotations

import struct

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn
from mindspore.train import (
    LambdaCallback,
    LearningRateScheduler,
    ReduceLROnPlateau,
    SummaryCollector,
    lineage_pb2,
    summary_pb2,
)

from ms_boost import Model
from tests.test_user_scripts import ce
from tests.test_user_scripts_fourteenth import _data, _Net

#: freezing alone keeps the network as the script wrote it, so the tags are MindSpore's at O0; O2 adds LessBN
FREEZE_ONLY = {"boost": {"mode": "manual", "less_bn": False, "grad_freeze": True}}


def _records(path):
    data = path.read_bytes()
    at = 0
    while at < len(data):
        (size,) = struct.unpack("<Q", data[at:at + 8])
        at += 12  # length, its crc
        yield data[at:at + size]
        at += size + 4  # data, its crc


def _read_summary(folder):
    """``(step -> {tag: value}, train lineage's hyper-parameters)`` of the summary files in ``folder``."""
    steps, hyper = {}, None
    (events,) = [p for p in folder.iterdir() if p.name.endswith("_MS")]
    (lineage,) = [p for p in folder.iterdir() if p.name.endswith("_lineage")]
    for raw in _records(events):
        event = summary_pb2.Event()
        event.ParseFromString(raw)
        if event.HasField("summary"):
            steps.setdefault(event.step, {}).update({v.tag: v for v in event.summary.value})
    for raw in _records(lineage):
        event = lineage_pb2.LineageEvent()
        event.ParseFromString(raw)
        if event.HasField("train_lineage"):
            hyper = event.train_lineage.hyper_parameters
    return steps, hyper


def _train_with_summary(tmp_path, name, level, config=None):
    ms.set_seed(3)
    net = _Net()
    opt = nn.Momentum(net.trainable_params(), 0.05, 0.9)
    if level == "mindspore":
        model = ms.train.Model(net, ce(), opt)
    else:
        model = Model(net, ce(), opt, boost_level=level, boost_config_dict=config or {})
    folder = tmp_path / name
    model.train(1, _data(24), callbacks=[SummaryCollector(str(folder), collect_freq=1)])
    trained = model.train_network.optimizer.parameters
    return _read_summary(folder), {p.name: p.asnumpy() for p in trained}, [p.name for p in trained]


def _check_histograms_are_the_weights(last, weights):
    for name, values in weights.items():
        tag = f"{name}/auto"
        if tag in last:
            hist = last[tag].histogram
            assert hist.count == values.size
            np.testing.assert_allclose([hist.min, hist.max, hist.sum],
                                       [values.min(), values.max(), values.astype(np.float64).sum()], rtol=1e-5,
                                       atol=1e-6)


def test_summary_collector_records_rate_and_histograms_with_freezing(mode, tmp_path):
    """At O1 with freezing (network unchanged) the summary has MindSpore's O0 tags at every step, the histograms of
    the trained weights, and the lineage's learning rate and optimizer name; at O2 (LessBN's FN head too) the first
    five weights the rebuilt optimizer trains."""
    (ms_steps, ms_hyper), _, _ = _train_with_summary(tmp_path, "mindspore", "mindspore")
    assert ms_hyper.learning_rate == pytest.approx(0.05) and ms_hyper.optimizer == "Momentum"
    for level, config in (("O1", FREEZE_ONLY), ("O2", None)):
        (steps, hyper), weights, names = _train_with_summary(tmp_path, level, level, config)
        assert sorted(steps) == sorted(ms_steps)
        expected = ["loss/auto"] + [f"{n}/auto" for n in names[:5]]
        for step in steps:
            assert sorted(steps[step]) == sorted(expected), (level, step)
        if level == "O1":
            assert all(sorted(steps[s]) == sorted(ms_steps[s]) for s in steps)  # MindSpore's own tags
        _check_histograms_are_the_weights(steps[max(steps)], weights)
        assert hyper.optimizer == ms_hyper.optimizer
        assert hyper.learning_rate == pytest.approx(ms_hyper.learning_rate)


def test_rate_callbacks_still_change_the_rate_that_trains(mode):
    """``LearningRateScheduler`` and ``ReduceLROnPlateau`` assign ``cb_params.optimizer.learning_rate``: the view's is
    the Parameter the freezing optimizer's steps read, so rate 0 from the fourth step stops every weight, and the
    plateau's reduction reaches the trained rate."""
    ms.set_seed(3)
    net = _Net()
    model = Model(net, ce(), nn.Momentum(net.trainable_params(), 0.05, 0.9), boost_level="O1",
                  boost_config_dict=FREEZE_ONLY)
    freeze_opt = model.train_network.optimizer
    seen, after = [], []

    def step_end(run_context):
        args = run_context.original_args()
        seen.append(args.optimizer)
        after.append({p.name: p.asnumpy().copy() for p in freeze_opt.parameters})

    zero_from_4 = LearningRateScheduler(lambda lr, step: 0.0 if step >= 3 else lr)
    model.train(1, _data(48), callbacks=[zero_from_4, LambdaCallback(on_train_step_end=step_end)])
    shown = seen[0]
    assert isinstance(shown, nn.Optimizer)
    assert shown.learning_rate is freeze_opt.learning_rate and list(shown.parameters) == list(freeze_opt.parameters)
    assert float(freeze_opt.learning_rate.asnumpy()) == 0.0
    assert any(not np.array_equal(after[0][k], after[2][k]) for k in after[0])  # steps 2 and 3 trained
    for later in after[3:]:  # rate 0 from the fourth step: nothing moves
        for name, value in later.items():
            np.testing.assert_array_equal(value, after[3][name])

    ms.set_seed(3)
    net = _Net()
    model = Model(net, ce(), nn.Momentum(net.trainable_params(), 0.05, 0.9), boost_level="O1",
                  boost_config_dict=FREEZE_ONLY)
    plateau = ReduceLROnPlateau(monitor="loss", factor=0.5, patience=0, min_delta=1e3, verbose=False)
    # the first epoch's loss sets the best; the second's is not better by 1e3: halved once (MindSpore's Model alike)
    model.train(2, _data(24), callbacks=[plateau])
    assert float(model.train_network.optimizer.learning_rate.asnumpy()) == pytest.approx(0.05 / 2)

"""Users' scripts, fourteenth round (docs/compatibility.md): ``Model.fit`` with validation and MindSpore's callbacks,
sink sizes, amp and loss-scale forms.

Each test is a finding of such a script, reduced to its smallest form, against plain MindSpore.
"""
from __future__ import annotations

import mindspore.dataset as ds
import numpy as np
from mindspore import nn
from mindspore.train import LambdaCallback

from ms_boost import Model
from tests.test_user_scripts import ce


class _Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(8, 8)
        self.relu = nn.ReLU()
        self.fc2 = nn.Dense(8, 3)

    def construct(self, x):
        return self.fc2(self.relu(self.fc1(x)))


def _data(n: int = 48, seed: int = 0):
    rng = np.random.RandomState(seed)
    x = rng.normal(size=(n, 8)).astype(np.float32)
    y = np.argmax(x @ np.random.RandomState(9).normal(size=(8, 3)), axis=1).astype(np.int32)
    return ds.NumpySlicesDataset({"data": x, "label": y}, shuffle=False).batch(8)


def test_auto_plans_the_steps_mindspore_trains_when_sink_size_is_given_on_cpu(mode):
    """``train(epochs, data, dataset_sink_mode=True, sink_size=k)``: MindSpore 2.10's Model does not sink on CPU and
    trains the whole data set each epoch whatever ``sink_size`` says. ``boost_level="auto"`` planned its run as
    ``epochs * sink_size`` steps (here 4 where 12 are trained), so it weighed compile time against a run 3x shorter
    than the one that followed. It now plans the steps MindSpore trains."""
    steps = []
    net = _Net()
    model = Model(net, ce(), nn.Momentum(net.trainable_params(), 0.05, 0.9), boost_level="auto",
                  boost_config_dict={"autotune": {"candidates": ["O0"], "time_budget": False}})
    model.train(2, _data(), callbacks=[LambdaCallback(on_train_step_end=lambda rc: steps.append(1))],
                dataset_sink_mode=True, sink_size=2)
    assert len(steps) == 12  # MindSpore's doing: 6 batches an epoch, sink_size not applied on CPU
    assert model.autotune_report.planned_steps == len(steps)


def test_gradient_freezing_is_told_the_steps_mindspore_trains_when_sink_size_is_given_on_cpu(mode):
    """The same for gradient freezing, which reads the run's length when training begins (to choose one graph per
    train set only for long runs): it took ``epoch_num * batch_num`` from MindSpore's callback parameters, and on CPU
    ``batch_num`` says ``sink_size`` while each epoch trains the whole data set."""
    steps = []
    net = _Net()
    model = Model(net, ce(), nn.Momentum(net.trainable_params(), 0.05, 0.9), boost_level="O1",
                  boost_config_dict={"boost": {"mode": "manual", "grad_freeze": True}})
    model.train(2, _data(), callbacks=[LambdaCallback(on_train_step_end=lambda rc: steps.append(1))],
                dataset_sink_mode=True, sink_size=2)
    assert len(steps) == 12
    assert model.train_network.optimizer.planned_steps == len(steps)


def _resume_with_backup(model, tmp_path):
    """MindSpore's ``BackupAndRestore`` in one process: train with it, train on without it, then train again with it,
    which loads the backup into the train network in ``on_train_begin`` (after the Model has trained)."""
    from mindspore.train import BackupAndRestore

    model.train(2, _data(), callbacks=[BackupAndRestore(str(tmp_path), delete_checkpoint=False)])
    model.train(1, _data())  # the weights move past the backup
    model.train(1, _data(), callbacks=[BackupAndRestore(str(tmp_path), delete_checkpoint=False)])


def _params(net):
    return {p.name: p.asnumpy().copy() for p in net.get_parameters()}


def test_a_backup_restored_when_training_begins_is_trained_from_with_a_loss_scale_manager(mode, tmp_path):
    """``BackupAndRestore`` loads its checkpoint into the train network when ``train`` begins. With a loss-scale
    manager (the step skips an overflowing update under a device-side branch) the Graph-mode step compiled by the
    earlier ``train`` kept the memory it was compiled with, so the restored optimizer state was mixed with the old one
    (weights off MindSpore's by up to 0.02 after one epoch): ms_boost recompiled for memory replaced before ``train``
    began or between two steps, not in between. Compared with MindSpore's Model on the same calls (the fixed scale
    with the optimizer's ``loss_scale``, which MindSpore runs on CPU), in each mode."""
    import mindspore as ms
    from mindspore.train import Model as MsModel

    results = []
    for make in (MsModel, Model):
        ms.set_seed(1)
        net = _Net()
        model = make(net, ce(), nn.Momentum(net.trainable_params(), 0.05, 0.9, loss_scale=128.0),
                     loss_scale_manager=ms.FixedLossScaleManager(128, drop_overflow_update=False))
        _resume_with_backup(model, tmp_path / make.__module__)
        results.append(_params(net))
    assert results[0].keys() == results[1].keys()
    for name, value in results[0].items():
        np.testing.assert_array_equal(results[1][name], value, err_msg=name)


def test_a_backup_restored_when_training_begins_is_trained_from_with_gradient_accumulation(mode, tmp_path):
    """The same with gradient accumulation (its update runs under a device-side branch): resumed from the backup of
    epoch 2, one more epoch equals three epochs straight (the accumulators are in the backup)."""
    import mindspore as ms

    acc = {"boost": {"mode": "manual", "grad_accumulation": True}, "grad_accumulation": {"grad_accumulation_step": 2}}
    results = []
    for resumed in (False, True):
        ms.set_seed(1)
        net = _Net()
        model = Model(net, ce(), nn.Momentum(net.trainable_params(), 0.05, 0.9), boost_level="O1",
                      boost_config_dict=acc)
        if resumed:
            _resume_with_backup(model, tmp_path)
        else:
            model.train(3, _data())
        results.append(_params(net))
    for name, value in results[0].items():
        np.testing.assert_array_equal(results[1][name], value, err_msg=name)


def test_training_on_after_early_stopping_restored_the_best_weights_starts_from_them(mode):
    """``fit`` with ``EarlyStopping(restore_best_weights=True)`` loads the best epoch's values into the train network
    when it stops, after the last step; then ``model.train`` goes on. With a loss-scale manager in Graph mode the next
    step still ran on the memory it was compiled with, partly from the values before the restore (weights off
    MindSpore's by up to 0.06 after one more epoch): Model recorded the memory when training ended, restore
    included, as the memory the step was compiled on. Compared with MindSpore's Model on the same calls."""
    import mindspore as ms
    from mindspore.train import EarlyStopping
    from mindspore.train import Model as MsModel
    from mindspore.train.metrics import Loss

    results = []
    for make in (MsModel, Model):
        ms.set_seed(1)
        net = _Net()
        model = make(net, ce(), nn.Momentum(net.trainable_params(), 0.2, 0.9, loss_scale=128.0),
                     metrics={"loss": Loss()}, loss_scale_manager=ms.FixedLossScaleManager(128, False))
        stop = EarlyStopping(monitor="eval_loss", patience=1, restore_best_weights=True, min_delta=1.0)
        model.fit(3, _data(), _data(16, seed=1), callbacks=[stop])  # stops after epoch 2, restores epoch 1
        model.train(1, _data())
        results.append(_params(net))
    for name, value in results[0].items():
        np.testing.assert_array_equal(results[1][name], value, err_msg=name)

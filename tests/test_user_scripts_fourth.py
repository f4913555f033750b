"""Users' scripts, fourth round (docs/compatibility.md): callbacks, learning rates, optimizers, resuming, data sets.

Each test is a bug found by such a script, reduced to its smallest form. Where a boost plan changes nothing that
MindSpore computes (gradient freezing with ``freeze_p: 1.0``, every group trained at every step; LessBN without its
FN head and gradient centralization on a net without residual additions), ms_boost's Model must train bit for bit
as ``mindspore.train.Model``: that isolates what the rebuilt optimizers do.
"""
from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import nn
from mindspore.train import Model as MsModel

from ms_boost import Model
from tests.helpers.nets import dataset, weights
from tests.test_user_scripts import _dense_data, _dense_net, _StepLosses, ce

#: gradient freezing that trains every group at every step: one rebuilt optimizer per layer group, nothing frozen
FREEZE_NOTHING = {"boost": {"mode": "manual", "less_bn": False, "grad_freeze": True},
                  "grad_freeze": {"freeze_p": 1.0, "param_groups": 2, "total_steps": 100}}
#: LessBN alone without FN head and GC: on a net without residual additions only the optimizer is rebuilt
LESS_BN_ONLY = {"boost": {"mode": "manual", "less_bn": True, "grad_freeze": False},
                "less_bn": {"fn_flag": False, "gc_flag": False}}


def _against_mindspore(make_optimizer, config, epochs: int = 2):
    """Train ``_dense_net`` with MindSpore's Model and with ms_boost's at ``config``; both results."""
    x, y = _dense_data()
    results = []
    for model_cls, kwargs in ((MsModel, {}), (Model, {"boost_level": "O1", "boost_config_dict": config})):
        net = _dense_net()
        model = model_cls(net, ce(), make_optimizer(net), metrics={"acc"}, **kwargs)
        losses = _StepLosses()
        model.train(epochs, dataset(x, y), callbacks=[losses])
        results.append((losses.losses, weights(net), model.eval(dataset(x[:32], y[:32]))))
    return results


def _assert_identical(results, steps: int = 8):
    (ms_losses, ms_weights, ms_eval), (our_losses, our_weights, our_eval) = results
    assert len(our_losses) == steps and our_losses == ms_losses
    for a, b in zip(ms_weights, our_weights):
        np.testing.assert_array_equal(b, a)
    assert our_eval == ms_eval


def test_adam_weight_decay_with_a_per_step_list_rebuilt_by_freezing(mode):
    """``nn.AdamWeightDecay(params, nn.exponential_decay_lr(...), weight_decay=0.01)`` at O1.

    AdamWeightDecay records no constructor arguments, so its rate is read back from the instance: MindSpore's wrapper
    of the per-step list. That read named ``nn.LearningRateSchedule``, which MindSpore 2.10 does not export
    (AttributeError when the Model was built); the wrapper is now recognised and its rates passed on.
    """
    lr = nn.exponential_decay_lr(0.1, 0.5, 12, 4, 2)
    _assert_identical(_against_mindspore(
        lambda net: nn.AdamWeightDecay(net.trainable_params(), lr, weight_decay=0.01), FREEZE_NOTHING))


def test_group_rates_with_a_schedule_as_the_default_rate(mode):
    """Momentum whose default rate is a ``CosineDecayLR`` and whose groups set ``lr`` (a per-step list, a float).

    MindSpore records no schedule argument (``init_learning_rate`` None), and the rebuild fell back to
    ``opt.learning_rate``, a per-parameter ``CellList`` with group rates: TypeError in Momentum's constructor
    ("float() argument must be ... not '_IteratorLearningRate'"). The default rate is now the entry of a parameter
    whose group set none.
    """
    def momentum(net):
        decay = [p for p in net.trainable_params() if "weight" in p.name]
        rest = [p for p in net.trainable_params() if "weight" not in p.name]
        groups = [{"params": decay, "weight_decay": 0.01, "lr": nn.exponential_decay_lr(0.1, 0.5, 12, 4, 2)},
                  {"params": rest, "lr": 0.02}, {"order_params": net.trainable_params()}]
        return nn.Momentum(groups, nn.CosineDecayLR(0.001, 0.1, 10), 0.9)

    _assert_identical(_against_mindspore(momentum, FREEZE_NOTHING))


def test_group_rates_with_a_schedule_default_used_by_a_group(mode):
    """As above, with one group taking the default ``CosineDecayLR`` (no ``lr`` of its own)."""
    def momentum(net):
        decay = [p for p in net.trainable_params() if "weight" in p.name]
        rest = [p for p in net.trainable_params() if "weight" not in p.name]
        groups = [{"params": decay, "lr": nn.exponential_decay_lr(0.1, 0.5, 12, 4, 2)}, {"params": rest},
                  {"order_params": net.trainable_params()}]
        return nn.Momentum(groups, nn.CosineDecayLR(0.001, 0.1, 10), 0.9)

    _assert_identical(_against_mindspore(momentum, FREEZE_NOTHING))


def test_less_bn_keeps_mindspores_weight_decay_filter(mode):
    """``nn.Momentum(net.trainable_params(), lr, 0.9, weight_decay=0.01)`` (a plain list) at O1.

    MindSpore decays, in an optimizer built on a plain list, only the parameters whose name holds neither ``beta``
    nor ``gamma`` (BatchNorm's are not decayed). LessBN rebuilds the optimizer on parameter groups, where every
    parameter of a group is decayed: BatchNorm's gamma and beta were decayed at O1, silently (upstream does the
    same). They are now a group of their own with ``weight_decay`` 0: bit for bit MindSpore's run.
    """
    _assert_identical(_against_mindspore(
        lambda net: nn.Momentum(net.trainable_params(), 0.1, 0.9, weight_decay=0.01), LESS_BN_ONLY))


def _tutorial_resume(model_cls, kwargs, tmp_path, epochs_before: int = 1, epochs: int = 3):
    """Train, save a checkpoint, load it the tutorials' way into a fresh net and optimizer, build a Model, go on."""
    from mindspore.train import CheckpointConfig, ModelCheckpoint

    x, y = _dense_data()
    lr = nn.cosine_decay_lr(0.001, 0.1, 4 * epochs, 4, epochs)

    def momentum(net):
        return nn.Momentum(net.trainable_params(), lr, 0.9)

    net = _dense_net()
    first = _StepLosses()
    saver = ModelCheckpoint(prefix="net", directory=str(tmp_path),
                            config=CheckpointConfig(save_checkpoint_steps=4 * epochs_before))
    MsModel(net, ce(), momentum(net)).train(epochs_before, dataset(x, y), callbacks=[first, saver])
    params = ms.load_checkpoint(str(tmp_path / f"net-{epochs_before}_4.ckpt"))
    net = _dense_net(seed=1)
    opt = momentum(net)
    ms.load_param_into_net(net, params)
    ms.load_param_into_net(opt, params)
    model = model_cls(net, ce(), opt, **kwargs)
    losses = _StepLosses()
    model.train(epochs, dataset(x, y), callbacks=[losses], initial_epoch=epochs_before)
    return first.losses + losses.losses, weights(net)


def test_resuming_into_net_and_optimizer_continues_the_schedule_at_o1(mode, tmp_path):
    """A checkpoint of plain MindSpore loaded into a fresh net and optimizer (the tutorials' way), then ``Model(...,
    boost_level="O1")``: the rebuilt optimizers must start from the loaded optimizer's state.

    They started from zero: the learning-rate schedule restarted at step 0 (the loaded ``global_step`` was left in
    the script's optimizer) and the momenta were lost. With plans that change nothing MindSpore computes, the resumed
    run is now bit for bit MindSpore's resumed run.
    """
    reference = _tutorial_resume(MsModel, {}, tmp_path / "ms")
    for name, config in (("freeze", FREEZE_NOTHING), ("less_bn", LESS_BN_ONLY)):
        ours = _tutorial_resume(Model, {"boost_level": "O1", "boost_config_dict": config}, tmp_path / name)
        assert ours[0] == reference[0], name
        for a, b in zip(reference[1], ours[1]):
            np.testing.assert_array_equal(b, a, err_msg=name)

"""Users' scripts, sixth round (docs/compatibility.md): data pipelines, network and loss forms, after training.

Each test is a finding of such a script, reduced to its smallest form.
"""
from __future__ import annotations

import warnings

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
import pytest
from mindspore import Tensor, nn

from ms_boost import BoostTrainOneStepCell, Model
from ms_boost.training_data import describe_training_data
from tests.test_user_scripts import _dense_data, _dense_net, ce

#: gradient accumulation alone (O0 plus the section): two micro-steps per update
ACCUMULATE_2 = {"boost": {"mode": "manual", "grad_accumulation": True},
                "grad_accumulation": {"grad_accumulation_step": 2}}


def _batched(x, y, batch: int, drop_remainder: bool):
    return ds.NumpySlicesDataset({"data": x, "label": y}, shuffle=False).batch(batch, drop_remainder=drop_remainder)


def _ms_boost_warnings(record) -> list:
    return [str(w.message) for w in record if str(w.message).startswith("ms_boost: grad_accumulation: the training")]


def test_the_training_data_description_finds_a_short_last_batch():
    """The outermost ``batch`` below ``repeat``/``map``/``project``; a short last batch only without drop_remainder."""
    x, y = _dense_data(60)
    data = describe_training_data(_batched(x, y, 16, False).repeat(2))
    assert (data.batch_size, data.last_batch) == (16, 12)
    data = describe_training_data(_batched(x, y, 16, False).project(["data", "label"]))
    assert (data.batch_size, data.last_batch) == (16, 12)
    assert describe_training_data(_batched(x, y, 16, True)).last_batch is None
    assert describe_training_data(_batched(x, y, 15, False)).last_batch is None  # 60 rows: 4 full batches
    assert describe_training_data(ds.NumpySlicesDataset({"data": x}, shuffle=False)).batch_size is None
    # a generator function (no length) or a filter: MindSpore would read the data to count the rows; left unknown
    rows = [(x[i], y[i]) for i in range(60)]
    sized = ds.GeneratorDataset(rows, ["data", "label"], shuffle=False).batch(16)
    assert describe_training_data(sized).last_batch == 12
    data = describe_training_data(ds.GeneratorDataset(lambda: iter(rows), ["data", "label"]).batch(16))
    assert (data.batch_size, data.last_batch) == (16, None)
    unknown = ds.NumpySlicesDataset({"data": x, "label": y}, shuffle=False).filter(lambda d, label: True).batch(16)
    assert describe_training_data(unknown).last_batch is None


def test_accumulation_over_a_short_last_batch_warns_and_averages_the_micro_steps(mode):
    """``batch(16, drop_remainder=False)`` over 60 rows (a last batch of 12) with ``grad_accumulation_step: 2``.

    The update is the mean of the two micro-steps' gradients, as upstream's ``GradientAccumulation``: the 12 rows
    weigh as much as the 16 before them, so that update is not the gradient of the 28 rows (it is for equal
    batches). The script was told nothing; Model now warns, and not for full batches or without accumulation.
    The weights after the epoch against a numpy SGD step on MindSpore's gradients of each batch.
    """
    x, y = _dense_data(60)
    lr = 0.1
    reference = _dense_net()
    loss_net = nn.WithLossCell(reference, ce())
    params = reference.trainable_params()
    for lo, hi in ((0, 32), (32, 60)):  # two updates: batches [16, 16] and [16, 12]
        grads = []
        for a, b in ((lo, lo + 16), (lo + 16, hi)):
            grad_fn = ms.grad(loss_net, grad_position=None, weights=params)
            loss_net.set_train(True)
            grads.append([g.asnumpy() for g in grad_fn(Tensor(x[a:b]), Tensor(y[a:b]))])
        for p, g1, g2 in zip(params, *grads):
            p.set_data(Tensor(p.asnumpy() - lr * (g1 + g2) / 2))
    expected = [p.asnumpy() for p in params]

    net = _dense_net()
    model = Model(net, ce(), nn.SGD(net.trainable_params(), lr), boost_level="O0", boost_config_dict=ACCUMULATE_2)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        model.train(1, _batched(x, y, 16, False))
    said = _ms_boost_warnings(record)
    assert len(said) == 1 and "last batch holds 12 of 16 rows" in said[0] and "drop_remainder=True" in said[0]
    for p, e in zip(net.trainable_params(), expected):
        np.testing.assert_allclose(p.asnumpy(), e, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("drop, config", [(True, ACCUMULATE_2), (False, None)])
def test_no_data_warning_for_full_batches_or_without_accumulation(drop, config):
    x, y = _dense_data(60)
    net = _dense_net()
    model = Model(net, ce(), nn.SGD(net.trainable_params(), 0.1), boost_level="O0", boost_config_dict=config)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        model.train(1, _batched(x, y, 16, drop))
    assert _ms_boost_warnings(record) == []


# ---------------------------------------------------------------------------------------------------------------
# THOR in the network and loss forms of the tutorials
# ---------------------------------------------------------------------------------------------------------------
def _thor(network):
    from ms_boost import thor

    return thor(network, 0.05, 0.03, 0.9, 1e-4, 1.0, 16, frequency=2)


def _thor_losses(model, x, y) -> list:
    from tests.test_user_scripts import _StepLosses

    losses = _StepLosses()
    model.train(1, _batched(x, y, 16, True), callbacks=[losses])
    return losses.losses


def test_thor_with_amp_o2_leaves_the_trained_net_callable_and_exportable(mode, tmp_path):
    """The THOR tutorial's ``Model(..., amp_level="O2", loss_scale_manager=FixedLossScaleManager(128, False),
    keep_batchnorm_fp32=False)`` + ``convert_to_thor_model``, then ``net(x)`` and ``ms.export(net, ...)``.

    ``thor(net)`` converts a copy of ``net`` that reused every unconverted cell (BatchNorm, ReLU) of ``net``; amp's
    in-place ``to_float`` casts of the THOR copy reached those shared cells, so the trained ``net`` was half float16:
    ``net(x)`` and the export failed ("For 'MatMul', the type of 'x2' should be same as 'x1'"). The copy's cells
    are now its own: ``net`` stays float32 and computes what the trained model predicts (to float16 rounding).
    """
    from mindspore import FixedLossScaleManager

    from ms_boost.thor import ConvertModelUtils

    x, y = _dense_data(32)
    net = _dense_net()
    opt = _thor(net)
    scale = FixedLossScaleManager(1.0, drop_overflow_update=False)
    model = Model(net, ce(), opt, metrics={"acc"}, amp_level="O2", loss_scale_manager=scale, keep_batchnorm_fp32=False)
    model = ConvertModelUtils.convert_to_thor_model(model=model, network=net, loss_fn=ce(), optimizer=opt,
                                                    metrics={"acc"}, amp_level="O2", loss_scale_manager=scale,
                                                    keep_batchnorm_fp32=False)
    assert np.all(np.isfinite(_thor_losses(model, x, y)))
    predicted = model.predict(Tensor(x[:4])).asnumpy().astype(np.float32)
    out = net(Tensor(x[:4])).asnumpy()
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, predicted, atol=2e-3)
    ms.export(net, Tensor(x[:4]), file_name=str(tmp_path / "net"), file_format="MINDIR")
    exported = nn.GraphCell(ms.load(str(tmp_path / "net.mindir")))(Tensor(x[:4])).asnumpy()
    np.testing.assert_allclose(exported, out, rtol=1e-6, atol=1e-6)


def test_thor_on_a_loss_network_and_in_a_train_cell_as_the_tutorial_form():
    """THOR given to Model in the other forms of the tutorials, against the THOR tutorial's form (``thor(net)`` +
    ``Model(net, loss_fn, opt)``), bit for bit.

    * ``thor(loss_net, ...)`` then ``Model(loss_net, optimizer=opt)`` (loss_fn None), as the error for a loss network
      around a plain net advises: it was refused ("does not contain its THOR layers"), since Model took the THOR copy
      of the net ``thor()`` got only when a ``loss_fn`` was given.
    * ``Model(nn.TrainOneStepCell(nn.WithLossCell(net, loss), thor(net, ...)))``, upstream's pattern (its ``thor``
      converts ``net`` in place): ms_boost's ``thor`` leaves ``net`` as it is, so that cell trained with THOR
      capturing nothing (preconditioning with factors that never change), silently. Model (and ms_boost's own
      ``BoostTrainOneStepCell`` built by hand) now refuses it naming the way out; the cell built on
      ``opt.thor_network`` trains as the tutorial form.

    PyNative mode only (both modes until 2026-11-28): both findings are which cells and network Model takes, decided
    in Python before anything is compiled, the same in either mode. The Graph-mode half compiled three THOR steps
    (~9 CPU-s) of cells whose Graph-mode THOR training is checked against numpy elsewhere: ms_boost's train cell
    through ``Model`` in both modes (tests/test_thor_model.py
    ``test_tutorial_model_call_trains_thor_without_convert_and_takes_frequency``) and MindSpore's
    ``TrainOneStepCell`` around THOR (tests/test_thor_model.py
    ``test_step_variants_chosen_on_the_host_match_numpy[mindspore_cell_wrapped]``).
    """
    x, y = _dense_data(32)
    net = _dense_net()
    opt = _thor(net)
    with pytest.raises(ValueError, match=r"holds a THOR optimizer but does not call its THOR layers.*thor_network"):
        Model(nn.TrainOneStepCell(nn.WithLossCell(net, ce()), opt))
    with pytest.raises(ValueError, match=r"BoostTrainOneStepCell holds a THOR optimizer but does not call its THOR"):
        BoostTrainOneStepCell(nn.WithLossCell(net, ce()), opt)  # ms_boost's own cell, built by hand for a loop
    tutorial = _thor_losses(Model(net, ce(), opt), x, y)
    loss_net = nn.WithLossCell(_dense_net(), ce())
    assert _thor_losses(Model(loss_net, optimizer=_thor(loss_net)), x, y) == tutorial
    other = _dense_net()
    opt = _thor(other)
    assert _thor_losses(Model(nn.TrainOneStepCell(nn.WithLossCell(opt.thor_network, ce()), opt)), x, y) == tutorial


def test_boost_levels_that_rebuild_the_optimizer_name_thor():
    """``Model(net, loss, thor(net, ...), boost_level="O1")``: LessBN and freezing rebuild the optimizer, which THOR
    cannot be; the error said to use nn.Adam or nn.Momentum instead. It now says THOR is second-order and to train
    it at O0 (or switch those algorithms off)."""
    net = _dense_net()
    with pytest.raises(TypeError, match=r"THOR is a second-order optimizer.*boost_level='O0'"):
        Model(net, ce(), _thor(net), boost_level="O1")

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

from ms_boost import Model
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

"""ms_boost.Model with boost algorithms switched on: the plan is applied and logged."""
from __future__ import annotations

import logging

from mindspore import nn

from ms_boost import Model
from tests.helpers.nets import dataset, learnable_data, make_net


def ce():
    return nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def test_boost_applies_without_metrics_and_logs_plan(caplog):
    """Upstream skipped boost unless metrics/eval_network were given; ms_boost applies it and logs the plan."""
    net = make_net()
    model = Model(net, ce(), nn.SGD(net.trainable_params(), 0.1),
                  boost_config_dict={"boost": {"mode": "manual", "grad_accumulation": True},
                                     "grad_accumulation": {"grad_accumulation_step": 2}})
    assert model.boost.enabled("grad_accumulation")
    names = {type(c).__name__ for _, c in model.train_network.cells_and_names()}
    assert "AccumulateUpdate" in names
    logger = logging.getLogger("ms_boost")
    logger.addHandler(caplog.handler)
    try:
        x, y = learnable_data(32)
        model.train(1, dataset(x, y), dataset_sink_mode=False)
    finally:
        logger.removeHandler(caplog.handler)
    assert "accumulate x2" in caplog.text and "grad_accumulation" in caplog.text

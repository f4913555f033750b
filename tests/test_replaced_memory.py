"""A checkpoint loaded with ``load_param_into_net`` into a model that has trained: training on uses the loaded values.

``set_data`` gives each Parameter new memory, and MindSpore 2.10's compiled step keeps the old memory wherever a
device-side branch reads or writes it (gradient accumulation's update): without ``Model`` compiling the step again,
the moments and the step counter stayed at the loaded values and the weights moved from the old moments.
"""
import gc

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn

from ms_boost import Model
from ms_boost.replaced_memory import memory_key, replaced_parameters

gc.collect()
gc.freeze()

CONFIG = {"boost": {"mode": "manual", "grad_accumulation": True}, "grad_accumulation": {"grad_accumulation_step": 2}}


def _data(seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(32, 6)).astype(np.float32)
    y = rng.integers(0, 3, 32).astype(np.int32)
    return ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(8)


def _model():
    ms.set_seed(0)
    net = nn.SequentialCell(nn.Dense(6, 8), nn.ReLU(), nn.Dense(8, 3))
    opt = nn.Momentum(net.trainable_params(), 0.1, 0.9)
    return Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), opt, boost_config_dict=CONFIG)


def _state(model):
    return {p.name: p.asnumpy().copy() for p in model.train_network.get_parameters()}


def _load(model, values):
    return ms.load_param_into_net(model.train_network, {k: Parameter(Tensor(v), name=k) for k, v in values.items()})


@pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE], ids=["graph", "pynative"])
def test_training_on_after_loading_into_a_trained_model_equals_loading_first(mode):
    ms.set_context(mode=mode)
    source = _model()
    source.train(1, _data(5), dataset_sink_mode=False)
    checkpoint = _state(source)
    assert checkpoint["global_step"] != 0 and np.abs(checkpoint["moments.2.weight"]).max() > 0

    trained = _model()
    trained.train(1, _data(1), dataset_sink_mode=False)
    assert _load(trained, checkpoint) == ([], [])
    assert replaced_parameters(trained._memory_key, memory_key(trained.train_network))  # set_data: new memory
    trained.train(1, _data(2), dataset_sink_mode=False)

    fresh = _model()
    assert _load(fresh, checkpoint) == ([], [])
    fresh.train(1, _data(2), dataset_sink_mode=False)

    got, want = _state(trained), _state(fresh)
    assert got.keys() == want.keys()
    for name in want:  # bit for bit: the same loaded state and the same data
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    # and the run did train on from the loaded values (two updates of 2 micro-steps of the 4 batches)
    assert want["global_step"] == checkpoint["global_step"] + 2
    assert not np.array_equal(want["moments.2.weight"], checkpoint["moments.2.weight"])


def test_replaced_parameters_names_what_changed():
    before = (("a", 1), ("b", 2))
    assert replaced_parameters(before, (("a", 1), ("b", 3))) == ["b"]
    assert replaced_parameters(before, before) == []
    assert replaced_parameters(None, before) == []
    assert replaced_parameters(before, (("a", 1),)) == ["a"]

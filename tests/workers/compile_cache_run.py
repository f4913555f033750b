"""Worker for tests/test_compile_cache.py: one short training of a small MLP through ``ms_boost.Model``.

Usage: ``compile_cache_run.py CACHE_DIR ACCUMULATION_STEPS [ACCUMULATION_STEPS ...]`` -- Graph mode with MindSpore's
compile cache on in CACHE_DIR, one model per step count, in order; prints ``WEIGHTS <json list>`` per model (the last
layer's weights after one epoch) and ``CACHE <path>`` (the cache path at the end).
The test calls :func:`train` in its own process (PyNative, no cache) for the reference.
"""
import json
import sys

import mindspore as ms
import numpy as np
from mindspore import nn

from ms_boost import Model
from tests.helpers.nets import dataset


def train(accumulation_steps: int) -> np.ndarray:
    """One epoch of 4 batches of 8 with gradient accumulation over ``accumulation_steps`` steps."""
    ms.set_seed(0)
    net = nn.SequentialCell(nn.Dense(4, 8), nn.ReLU(), nn.Dense(8, 3))
    rng = np.random.default_rng(0)
    x, y = rng.random((32, 4)).astype(np.float32), rng.integers(0, 3, 32).astype(np.int32)
    model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                  nn.Momentum(net.trainable_params(), 0.1, 0.9),
                  boost_config_dict={"boost": {"mode": "manual", "grad_accumulation": True},
                                     "grad_accumulation": {"grad_accumulation_step": accumulation_steps}})
    model.train(1, dataset(x, y, batch_size=8), dataset_sink_mode=False)
    return net[2].weight.asnumpy()


if __name__ == "__main__":
    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE, enable_compile_cache=True, compile_cache_path=sys.argv[1])
    for steps in sys.argv[2:]:
        weights = train(int(steps))
        print("WEIGHTS " + json.dumps(weights.tolist()), flush=True)
    print("CACHE " + ms.get_context("compile_cache_path"))

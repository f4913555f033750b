"""Data-parallel training under msrun equals one process on the concatenated batch."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from mindspore import nn

from ms_boost import Model
from tests.helpers.msrun import run_msrun
from tests.helpers.nets import dataset, learnable_data, weights
from tests.workers.common import make_plain_net

WORKER = Path(__file__).parent / "workers" / "data_parallel.py"
STEPS, BATCH, WORKERS = 3, 4, 2


def single_process_reference():
    x, y = learnable_data(STEPS * BATCH * WORKERS, seed=1)
    net = make_plain_net()
    model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                  nn.Momentum(net.trainable_params(), 0.1, 0.9))
    model.train(1, dataset(x, y, batch_size=BATCH * WORKERS), dataset_sink_mode=False)
    return weights(net)


@pytest.mark.msrun
@pytest.mark.parametrize("exec_mode", ["pynative", "graph"])
def test_two_workers_mean_reducer_equals_concatenated_batch(exec_mode):
    ranks = run_msrun(WORKER, WORKERS, args=[exec_mode, STEPS, BATCH])
    ref = single_process_reference()
    for r in range(1, WORKERS):
        for i in range(len(ref)):
            np.testing.assert_array_equal(ranks[0][f"w{i}"], ranks[r][f"w{i}"])
    for i, w in enumerate(ref):
        np.testing.assert_allclose(ranks[0][f"w{i}"], w, rtol=0, atol=1e-5)


@pytest.mark.msrun
def test_overflow_on_one_rank_skips_the_step_on_every_rank():
    ranks = run_msrun(Path(__file__).parent / "workers" / "overflow_one_rank.py", 2, args=["graph"])
    for out in ranks:
        assert not bool(out["of1"]) and bool(out["of2"])
        assert float(out["changed"]) == 0.0
    np.testing.assert_array_equal(ranks[0]["w"], ranks[1]["w"])

"""THOR under msrun with 2 CPU workers: identical weights on both ranks, equal to one process on the
concatenated batch (factors are mean-all-reduced before inversion; inverses split across ranks and
broadcast)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from mindspore import nn

from tests.helpers.msrun import run_msrun
from tests.helpers.nets import dataset, learnable_data
from tests.workers.common import make_plain_net

WORKER = Path(__file__).parent / "workers" / "thor_data_parallel.py"
STEPS, BATCH, WORKERS = 4, 4, 2


def build_thor_model(split_indices, distribute_inverses: bool = True, loss_scale: bool = False):
    """The plain conv net (no BatchNorm) trained by THOR through ConvertModelUtils and ms_boost.Model
    (with ``loss_scale``: a fixed loss scale of 8 divided out by the optimizer)."""
    from ms_boost.thor import THOR, ConvertModelUtils, ConvertNetUtils

    net = make_plain_net()
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    thor_net = ConvertNetUtils().convert_to_thor_net(net)
    opt = THOR(thor_net, 0.1, 0.05, 0.9, weight_decay=1e-3, loss_scale=8.0 if loss_scale else 1.0, frequency=2,
               split_indices=split_indices, distribute_inverses=distribute_inverses, block_size=16)
    import mindspore as ms

    from ms_boost import Model

    kwargs = {"loss_scale_manager": ms.FixedLossScaleManager(8.0, drop_overflow_update=False)} if loss_scale else {}
    model = ConvertModelUtils().convert_to_thor_model(Model(net, loss, opt, **kwargs), net, loss, opt, **kwargs)
    return net, opt, model


def single_process_reference():
    x, y = learnable_data(STEPS * BATCH * WORKERS, seed=1)
    net, opt, model = build_thor_model(None)
    model.train(1, dataset(x, y, batch_size=BATCH * WORKERS), dataset_sink_mode=False)
    return [p.asnumpy().copy() for p in net.trainable_params()], opt


@pytest.mark.msrun
@pytest.mark.parametrize("exec_mode,split,distribute", [("graph", [0], True), ("pynative", None, True),
                                                         ("graph", None, False)])
def test_two_workers_equal_one_process_on_the_concatenated_batch(exec_mode, split, distribute):
    ranks = run_msrun(WORKER, WORKERS, args=[exec_mode, STEPS, BATCH, json.dumps(split), int(distribute)])
    ref, ref_opt = single_process_reference()
    assert [int(r["step"][0]) for r in ranks] == [STEPS] * WORKERS
    if distribute:  # the inversion work is split: every rank owned some factors
        assert all(int(r["owned"]) > 0 for r in ranks)
        assert sum(int(r["owned"]) for r in ranks) == 2 * len(ref_opt.thor_layers)
    else:
        assert all(int(r["owned"]) == 2 * len(ref_opt.thor_layers) for r in ranks)
    for key in ranks[0]:
        if key != "owned":
            np.testing.assert_array_equal(ranks[0][key], ranks[1][key], err_msg=key)
    for i, w in enumerate(ref):
        np.testing.assert_allclose(ranks[0][f"w{i}"], w, rtol=1e-4, atol=2e-5, err_msg=f"w{i}")
    for i, p in enumerate(ref_opt.a_inverses):
        np.testing.assert_allclose(ranks[0][f"a_inv{i}"], p.asnumpy(), rtol=1e-3, atol=1e-4)

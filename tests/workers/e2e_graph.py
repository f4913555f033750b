"""msrun worker: the Graph-mode end-to-end scenarios of tests/test_msrun_e2e.py in one job (one msrun start).

Usage: e2e_graph.py WORK_DIR
Each scenario saves its arrays under ``<scenario>/``; every rank runs every scenario in the same order:

* ``comm``: every ms_boost.comm collective cell (world and a server group of 2) on this rank's vector.
* ``dp``: data-parallel training through ms_boost.Model (mean reducer), rank shards of a fixed data set.
* ``overflow``: the loss-scale cell, rank 1's loss is inf on step 2 (every rank must skip the step).
* ``group_overflow``: the group loss-scale step, rank 1's batch overflows the conv group (tests/test_loss_scale.py).
* ``light_o1``: data-parallel Model with LessBN, gradient centralization, freezing and split groups
  (tests/test_o1_o2.py).
* ``dim_reduce``: stage 2 of DimReduce through Model; rank 0 computes the PCA matrix from WORK_DIR/stage1.
* ``thor``: THOR through ConvertModelUtils and Model, factors fused in two groups, inverses split.
* ``thor_nonfinite``: THOR with NaN inputs on rank 1 at one step (tests/workers/thor_nonfinite.py): in Graph
  mode the ``thor`` model goes on over the poisoned steps (one THOR compilation for both), in PyNative a fresh one.
* ``autotune``: ``Model(boost_level="auto")`` on rank shards (tests/workers/autotune_scenario.py): one pick on
  every rank.
* ``divergence``: DivergenceRollback where only rank 1's learning rate spikes (tests/workers/divergence_rollback.py):
  both ranks roll back together.
* ``handshake_stuck``: the PCA handshake with rank 1 alive but stuck before it (tests/workers/handshake_stuck.py);
  last, since it ends in an error on every rank.
"""
import os
import sys

import numpy as np
from mindspore import Tensor, nn

from ms_boost import BoostTrainOneStepWithLossScaleCell, Model, comm
from tests.helpers.msrun import save_result
from tests.helpers.nets import dataset, learnable_data, weights
from tests.workers.common import (
    InfOnNegativeLabel,
    data_parallel_shard,
    freeze_startup_objects,
    make_plain_net,
    rank_rows,
)

DP_STEPS, DP_BATCH = 3, 4
DIM_STEPS, DIM_BATCH, DIM_K = 3, 8, 3
THOR_STEPS, THOR_BATCH, THOR_SPLIT = 4, 4, [0]


def comm_vector(rank: int) -> np.ndarray:
    return np.array([rank + 1.0, 10.0 * (rank + 1), -2.0 * rank], np.float32)


def comm_scenario(rank: int, size: int) -> dict:
    from tests.test_comm import Ops

    group, servers = comm.server_groups(2)
    outs = Ops(group, size)(Tensor(comm_vector(rank)))
    comm.barrier()
    names = ("sum", "mean", "max", "min", "prod", "gather", "bcast", "server_mean", "server_gather")
    return {**{n: o.asnumpy() for n, o in zip(names, outs)}, "servers": np.array(servers)}


def dp_scenario(rank: int, size: int) -> dict:
    x, y = rank_rows(rank, size, DP_STEPS, DP_BATCH)
    net = make_plain_net()
    model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                  nn.Momentum(net.trainable_params(), 0.1, 0.9))
    model.train(1, dataset(x, y, batch_size=DP_BATCH), dataset_sink_mode=False)
    return {f"w{i}": w for i, w in enumerate(weights(net))}


def overflow_scenario(rank: int) -> dict:
    x, y = learnable_data(8, seed=rank)
    net = make_plain_net()
    cell = BoostTrainOneStepWithLossScaleCell(InfOnNegativeLabel(net), nn.Momentum(net.trainable_params(), 0.1, 0.9),
                                              scale_sense=Tensor(64.0))
    cell.set_train()
    _, of1, _ = cell(Tensor(x), Tensor(y))
    before = [p.asnumpy().copy() for p in cell.get_parameters()]
    y_bad = y.copy()
    if rank == 1:
        y_bad[0] = -1 - y[0]
    _, of2, _ = cell(Tensor(x), Tensor(y_bad))
    after = [p.asnumpy().copy() for p in cell.get_parameters()]
    changed = max(float(np.abs(a - b).max()) for a, b in zip(before, after) if a.dtype.kind == "f")
    return {"of1": of1.asnumpy(), "of2": of2.asnumpy(), "changed": np.array(changed), "w": net.fc.weight.asnumpy()}


def light_o1_scenario(rank: int, size: int) -> dict:
    from tests.test_data_parallel import train_rank
    from tests.test_o1_o2 import LIGHT_O1

    return {f"w{i}": w for i, w in enumerate(train_rank(rank, size, LIGHT_O1))}


def dim_reduce_scenario(rank: int, size: int, work_dir: str) -> dict:
    from tests.workers.dim_reduce_worker import dim_reduce_stage, stage2_model

    x, y = rank_rows(rank, size, DIM_STEPS, DIM_BATCH)
    net = make_plain_net()
    model = stage2_model(net, os.path.join(work_dir, "stage1"), os.path.join(work_dir, "pca_mat.npy"), DIM_K)
    model.train(1, dataset(x, y, batch_size=DIM_BATCH), dataset_sink_mode=False)
    stage = dim_reduce_stage(model)
    return {**{f"w{i}": w for i, w in enumerate(weights(net))}, "pca_rows": stage.pca_rows.asnumpy(),
            "inv_hessian": stage.inv_hessian.asnumpy(), "step_last": stage.step_last.asnumpy()}


def thor_scenario(rank: int, size: int) -> tuple:
    """THOR_STEPS clean steps (``thor``), then the same model goes on over the NaN-poisoned steps (``graph0_`` of
    ``thor_nonfinite``, tests/workers/thor_nonfinite.py): one THOR compilation for both."""
    from tests.test_thor_distributed import build_thor_model
    from tests.workers.thor_nonfinite import train_poisoned

    x, y = rank_rows(rank, size, THOR_STEPS, THOR_BATCH)
    net, opt, model = build_thor_model(THOR_SPLIT, True)
    model.train(1, dataset(x, y, batch_size=THOR_BATCH), dataset_sink_mode=False)
    # copies: asnumpy() may share the Parameter's memory, and the training goes on
    clean = {"owned": np.array(sum(1 for owner in opt.inverse_owner if owner == rank)),
             "step": opt.global_step.asnumpy().copy(),
             **{f"w{i}": p.asnumpy().copy() for i, p in enumerate(net.trainable_params())},
             **{f"a_inv{i}": p.asnumpy().copy() for i, p in enumerate(opt.a_inverses)},
             **{f"g_inv{i}": p.asnumpy().copy() for i, p in enumerate(opt.g_inverses)}}
    return clean, train_poisoned(net, opt, model, rank, size, "graph0_")


def main() -> None:
    from tests.test_loss_scale import overflow_on_rank_1
    from tests.workers.autotune_scenario import autotune_scenario
    from tests.workers.divergence_rollback import divergence_scenario
    from tests.workers.handshake_stuck import stuck_scenario
    from tests.workers.thor_nonfinite import nonfinite_scenario

    work_dir = sys.argv[1]
    rank, size, _, _ = data_parallel_shard("graph", 1, 1)  # Graph mode, communication, DATA_PARALLEL + mean
    freeze_startup_objects()
    results = {}

    def thor_both() -> dict:
        clean, poisoned = thor_scenario(rank, size)
        return {**{f"thor/{k}": v for k, v in clean.items()}, **{f"thor_nonfinite/{k}": v for k, v in poisoned.items()}}

    for name, run in (("comm", lambda: comm_scenario(rank, size)), ("dp", lambda: dp_scenario(rank, size)),
                      ("overflow", lambda: overflow_scenario(rank)),
                      ("group_overflow", lambda: overflow_on_rank_1(rank)),
                      ("light_o1", lambda: light_o1_scenario(rank, size)),
                      ("dim_reduce", lambda: dim_reduce_scenario(rank, size, work_dir)),
                      ("", thor_both),
                      ("thor_nonfinite", lambda: nonfinite_scenario(rank, size)),
                      ("autotune", lambda: autotune_scenario(rank, size)),
                      ("divergence", lambda: divergence_scenario(rank)),
                      ("handshake_stuck", lambda: stuck_scenario(os.path.join(work_dir, "stage1_stuck"),
                                                                 os.path.join(work_dir, "p_stuck.npy")))):
        results.update({f"{name}/{k}" if name else k: v for k, v in run().items()})
    save_result(**results)


if __name__ == "__main__":
    main()

"""msrun scenario: DivergenceRollback on data-parallel ranks where only rank 1's learning rate spikes.

Run as the ``divergence`` scenario of tests/workers/e2e_graph.py (one msrun job for every Graph-mode scenario;
tests/test_msrun_e2e.py::test_msrun_graph_ranks_roll_back_together checks it), or alone:
``divergence_rollback.py MODE`` under msrun. Each rank returns its rollbacks as rows (step, restored step),
whether the guard gave up and whether its final weights are finite.
"""
import sys

import numpy as np
from mindspore import Tensor, nn

STEPS, SPIKE = 12, 5


def divergence_scenario(rank: int) -> dict:
    """Train the plain net with the rollback callback; rank 1's learning rate of step SPIKE is multiplied by 1e4."""
    from ms_boost import Model
    from ms_boost.divergence import DivergencePolicy, DivergenceRollback
    from tests.helpers.nets import dataset, learnable_data, weights
    from tests.workers.common import make_plain_net

    x, y = learnable_data(STEPS * 8, seed=rank)
    lr = np.full(STEPS, 0.05, np.float32)
    if rank == 1:
        lr[SPIKE - 1] *= 1e4
    net = make_plain_net()
    model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                  nn.Momentum(net.trainable_params(), Tensor(lr), 0.9))
    healer = DivergenceRollback(DivergencePolicy(spike_factor=5.0, window=3, max_rollbacks=2, snapshot_steps=2),
                                log=None)
    model.train(1, dataset(x, y, batch_size=8), callbacks=[healer], dataset_sink_mode=False)
    rows = [[r["step"], r["restored_step"]] for r in healer.rollbacks]
    return {"rollbacks": np.array(rows, np.int64).reshape(-1, 2), "failed": np.array(healer.failure is not None),
            "finite": np.array(all(np.isfinite(w).all() for w in weights(net)))}


if __name__ == "__main__":
    from tests.helpers.msrun import save_result
    from tests.workers.common import data_parallel_shard

    save_result(**divergence_scenario(data_parallel_shard(sys.argv[1], STEPS, 8)[0]))

"""msrun scenario ``autotune`` of the Graph-mode job (tests/workers/e2e_graph.py): ``Model(boost_level="auto")`` on
2 data-parallel ranks, each on its own shard, so each rank measures its own figures; they must agree on the pick.

Saved per rank: the pick's index among the candidates, every candidate's agreed figures (kept flag, progress,
step and compile seconds, held-out loss at the start and the end, gain, measured flag), and the trained weights.
Both candidates are probed (2 steps each) and their progress measured (3 steps each): 10 of the budget's 10 steps.
"""
import numpy as np
from mindspore import nn

from ms_boost import Model
from tests.helpers.nets import dataset, weights
from tests.workers.common import make_plain_net, rank_rows

CANDIDATES = ["O0", "grad_accumulation_2"]
STEPS, BATCH = 12, 4


def autotune_scenario(rank: int, size: int) -> dict:
    x, y = rank_rows(rank, size, STEPS, BATCH, seed=3)
    net = make_plain_net()
    model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                  nn.Momentum(net.trainable_params(), 0.1, 0.9), boost_level="auto",
                  boost_config_dict={"autotune": {"candidates": CANDIDATES, "budget": 0.9, "holdout_batches": 1,
                                                  "probe_steps": 2, "min_trial_steps": 2, "max_trial_steps": 3,
                                                  "time_budget": False}})
    model.train(1, dataset(x, y, batch_size=BATCH), dataset_sink_mode=False)
    report = model.autotune_report
    figures = np.array([[c.figures.ok, c.figures.progress, c.figures.step_s, c.figures.compile_s,
                         c.figures.loss_start, c.figures.loss_end, c.figures.gain, c.figures.measured]
                        for c in report.candidates], np.float64)
    return {"pick": np.array(CANDIDATES.index(report.pick)), "ranks": np.array(report.ranks),
            "trial_steps": np.array(report.trial_steps), "figures": figures,
            **{f"w{i}": w for i, w in enumerate(weights(net))}}

"""msrun worker: data-parallel training with ms_boost.Model; saves this rank's final weights.

Usage: data_parallel.py MODE STEPS PER_RANK_BATCH [BOOST_JSON]
Each step, rank r trains on rows [s*B*n + r*B, s*B*n + (r+1)*B) of a fixed global data set, so one
process on the concatenated batch of B*n rows is the reference.
"""
import json
import sys

import mindspore as ms
from mindspore import nn
from mindspore.communication import init

from ms_boost import Model, comm
from tests.helpers.msrun import save_result
from tests.helpers.nets import dataset, learnable_data, weights
from tests.workers.common import make_plain_net

mode, steps, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
boost = json.loads(sys.argv[4]) if len(sys.argv) > 4 else None
ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
ms.set_device("CPU")
init()
ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
rank, size = comm.get_rank(), comm.get_size()
x, y = learnable_data(steps * batch * size, seed=1)
rows = [s * batch * size + rank * batch + i for s in range(steps) for i in range(batch)]
net = make_plain_net()
model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
              nn.Momentum(net.trainable_params(), 0.1, 0.9), boost_config_dict=boost)
model.train(1, dataset(x[rows], y[rows], batch_size=batch), dataset_sink_mode=False)
save_result(**{f"w{i}": w for i, w in enumerate(weights(net))})

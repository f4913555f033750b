"""msrun worker: data-parallel THOR with ms_boost.Model; saves this rank's weights and THOR state.

Usage: thor_data_parallel.py MODE STEPS PER_RANK_BATCH SPLIT_INDICES_JSON DISTRIBUTE_INVERSES(0|1)
Step s of rank r trains on rows [s*B*n + r*B, s*B*n + (r+1)*B) of a fixed data set, so one process on
the concatenated batch of B*n rows (tests/test_thor_distributed.py) is the reference.
"""
import json
import sys

import mindspore as ms
import numpy as np
from mindspore.communication import init

from ms_boost import comm
from tests.helpers.msrun import save_result
from tests.helpers.nets import dataset, learnable_data
from tests.test_thor_distributed import build_thor_model

mode, steps, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
split, distribute = json.loads(sys.argv[4]), bool(int(sys.argv[5]))
ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
ms.set_device("CPU")
init()
ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
rank, size = comm.get_rank(), comm.get_size()
x, y = learnable_data(steps * batch * size, seed=1)
rows = [s * batch * size + rank * batch + i for s in range(steps) for i in range(batch)]
net, opt, model = build_thor_model(split, distribute)
model.train(1, dataset(x[rows], y[rows], batch_size=batch), dataset_sink_mode=False)
owned = sum(1 for owner in opt.inverse_owner if owner == rank)
save_result(owned=np.array(owned), step=opt.global_step.asnumpy(),
            **{f"w{i}": p.asnumpy() for i, p in enumerate(net.trainable_params())},
            **{f"a_inv{i}": p.asnumpy() for i, p in enumerate(opt.a_inverses)},
            **{f"g_inv{i}": p.asnumpy() for i, p in enumerate(opt.g_inverses)})

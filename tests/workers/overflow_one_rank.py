"""msrun worker: rank 1 overflows on step 2; every rank must skip that step (weights unchanged)."""
import sys

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn
from mindspore.communication import init

from ms_boost import BoostTrainOneStepWithLossScaleCell, comm
from tests.helpers.msrun import save_result
from tests.helpers.nets import learnable_data
from tests.workers.common import InfOnNegativeLabel, make_plain_net

ms.set_context(mode=ms.GRAPH_MODE if sys.argv[1] == "graph" else ms.PYNATIVE_MODE)
ms.set_device("CPU")
init()
ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
rank = comm.get_rank()
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
save_result(of1=of1.asnumpy(), of2=of2.asnumpy(), changed=changed, w=net.fc.weight.asnumpy())

"""msrun worker: every ms_boost.comm primitive in the execution mode given as argv[1]."""
import sys

import mindspore as ms
import numpy as np
from mindspore import nn
from mindspore.communication import init

from ms_boost import comm
from tests.helpers.msrun import save_result

ms.set_context(mode=ms.GRAPH_MODE if sys.argv[1] == "graph" else ms.PYNATIVE_MODE)
ms.set_device("CPU")
init()
rank, size = comm.get_rank(), comm.get_size()
x = ms.Tensor(np.array([rank + 1.0, 10.0 * (rank + 1)], np.float32))


class Ops(nn.Cell):
    def __init__(self, server_group):
        super().__init__()
        self.sum = comm.AllReduce("sum")
        self.mean = comm.AllReduce("mean")
        self.max = comm.AllReduce("max")
        self.gather = comm.AllGather()
        self.bcast = comm.Broadcast(size - 1)
        self.server_mean = comm.AllReduce("mean", server_group)

    def construct(self, t):
        return self.sum(t), self.mean(t), self.max(t), self.gather(t), self.bcast(t), self.server_mean(t)


group, servers = comm.server_groups(2)
outs = Ops(group)(x)
comm.barrier()
save_result(sum=outs[0].asnumpy(), mean=outs[1].asnumpy(), max=outs[2].asnumpy(), gather=outs[3].asnumpy(),
            bcast=outs[4].asnumpy(), server_mean=outs[5].asnumpy(), size=size, rank=rank,
            servers=np.array(servers))

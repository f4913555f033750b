"""A data-parallel worker with one rank alive but stuck: every rank runs a Graph-mode step holding an AllReduce
(the mean-gradient reduction of data parallelism); after ``STUCK_AFTER`` good steps rank ``STUCK_RANK`` sleeps
``STUCK_SECONDS`` instead of its next step, so the others wait in the collective until MindSpore's CPU collective
timeout (``MS_CPU_COMM_OP_TIMEOUT``) ends their wait. Used by tests/test_scripts.py in place of train.py, under the
CPU launcher's real msrun job (its command-line arguments are ignored).
"""
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402
from mindspore import nn  # noqa: E402
from mindspore.communication import init  # noqa: E402

from ms_boost import comm  # noqa: E402


class ReduceStep(nn.Cell):
    def __init__(self):
        super().__init__()
        self.reduce = comm.AllReduce()

    def construct(self, x):
        return self.reduce(x * 2)


def main() -> None:
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    init()
    rank = comm.get_rank()
    stuck, after = int(os.environ.get("STUCK_RANK", "1")), int(os.environ.get("STUCK_AFTER", "2"))
    step = ReduceStep()
    x = ms.Tensor(np.ones(8, np.float32))
    for i in range(after + 1):
        if i == after and rank == stuck:
            print(f"rank {rank}: stuck before step {i}", flush=True)
            time.sleep(float(os.environ.get("STUCK_SECONDS", "300")))
        out = step(x)
        print(f"rank {rank}: step {i} {float(out.asnumpy()[0])}", flush=True)


if __name__ == "__main__":
    main()

"""Pieces shared by worker scripts and the tests that check them."""
import gc

import mindspore as ms
from mindspore import nn


def freeze_startup_objects() -> None:
    """Collect once, then freeze what is alive (MindSpore's modules and its cluster, the worker's imports): MindSpore
    runs a full ``gc.collect()`` before every Cell graph compile, which then walks only the objects made since (as
    tests/conftest.py does for the test processes)."""
    gc.collect()
    gc.freeze()


class PlainConvNet(nn.Cell):
    """Conv + ReLU + Dense without BatchNorm: data-parallel training equals one big batch exactly."""

    def __init__(self, num_classes: int = 4):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, stride=2, pad_mode="same", has_bias=True)
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(6 * 4 * 4, num_classes)

    def construct(self, x):
        return self.fc(self.flatten(self.relu(self.conv(x))))


def data_parallel_shard(mode: str, steps: int, batch: int, seed: int = 1) -> tuple:
    """Start a data-parallel msrun worker and return ``(rank, size, x, y)``: this rank's rows of a fixed data set.

    Sets ``mode`` (``"graph"`` or ``"pynative"``) on CPU, initialises communication in DATA_PARALLEL mode with
    the gradient mean. Step ``s`` of rank ``r`` gets rows ``[s*B*n + r*B, s*B*n + (r+1)*B)``, so one process on
    the concatenated batch of ``B*n`` rows is the reference.
    """
    from mindspore.communication import init

    from ms_boost import comm

    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    init()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    rank, size = comm.get_rank(), comm.get_size()
    return (rank, size) + rank_rows(rank, size, steps, batch, seed)


def rank_rows(rank: int, size: int, steps: int, batch: int, seed: int = 1) -> tuple:
    """``(x, y)`` of rank ``rank`` of ``size``: step ``s`` gets rows ``[s*B*n + r*B, s*B*n + (r+1)*B)``."""
    from tests.helpers.nets import learnable_data

    x, y = learnable_data(steps * batch * size, seed=seed)
    rows = [s * batch * size + rank * batch + i for s in range(steps) for i in range(batch)]
    return x[rows], y[rows]


def make_plain_net(seed: int = 5) -> PlainConvNet:
    ms.set_seed(seed)
    return PlainConvNet()


class InfOnNegativeLabel(nn.Cell):
    """Loss network whose loss is inf when the batch's first label is negative (an injected overflow)."""

    def __init__(self, net):
        super().__init__()
        self.net = net
        self.ce = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def construct(self, x, y):
        factor = ms.ops.select(y[0] < 0, ms.Tensor(float("inf"), ms.float32), ms.Tensor(1.0, ms.float32))
        return self.ce(self.net(x), ms.ops.abs(y)) * factor

"""Tiny AdaSum training pieces shared by the AdaSum tests, workers and benchmark.

* :class:`TwoLayerLinear` -- ``y = W2 (W1 x + b1) + b2`` plus a trainable parameter the loss never
  uses (its gradient, hence its optimizer delta, is exactly zero: a "frozen layer").
* :class:`TinyTrainStep` -- loss, gradients, mean within a server, then the update stage; with
  ``adasum=False`` it is plain data parallelism (mean over every rank), the benchmark's baseline.
* :func:`rank_data` -- the known per-rank batch.
"""
from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

from ms_boost import comm
from ms_boost.adasum import AdaSumUpdate
from ms_boost.stages import OptimizerUpdate

IN, HID, OUT, BATCH = 6, 4, 3, 4


def initial_weights() -> dict:
    """The initial weights every rank starts from (float32, fixed seed)."""
    rng = np.random.default_rng(7)
    return {"w1": rng.normal(0, 0.5, (HID, IN)).astype(np.float32),
            "b1": rng.normal(0, 0.1, (HID,)).astype(np.float32),
            "w2": rng.normal(0, 0.5, (OUT, HID)).astype(np.float32),
            "b2": rng.normal(0, 0.1, (OUT,)).astype(np.float32),
            "frozen": rng.normal(0, 1.0, (5,)).astype(np.float32)}


def rank_data(rank: int, step: int = 0):
    """The batch ``(x, y)`` rank ``rank`` trains on at step ``step`` (float32)."""
    rng = np.random.default_rng(1000 + 17 * rank + step)
    return (rng.normal(0, 1, (BATCH, IN)).astype(np.float32),
            rng.normal(0, 1, (BATCH, OUT)).astype(np.float32))


class TwoLayerLinear(nn.Cell):
    """``W2 (W1 x + b1) + b2``; parameter ``frozen`` is trainable but unused (zero gradient)."""

    def __init__(self):
        super().__init__()
        init = initial_weights()
        self.w1 = Parameter(Tensor(init["w1"]), name="w1")
        self.b1 = Parameter(Tensor(init["b1"]), name="b1")
        self.w2 = Parameter(Tensor(init["w2"]), name="w2")
        self.b2 = Parameter(Tensor(init["b2"]), name="b2")
        self.frozen = Parameter(Tensor(init["frozen"]), name="frozen")

    def construct(self, x):
        h = ops.matmul(x, self.w1.T) + self.b1
        return ops.matmul(h, self.w2.T) + self.b2


class TinyTrainStep(nn.Cell):
    """One step: loss, gradients, mean within the server, update stage (AdaSum across servers or not).

    Args:
        loss_net: Cell returning the loss.
        optimizer: the optimizer.
        device_number: devices per server.
        adasum: wrap the optimizer stage in :class:`~ms_boost.adasum.AdaSumUpdate`; False gives plain
            data parallelism (mean over all ranks).
    """

    def __init__(self, loss_net, optimizer, device_number: int = 1, adasum: bool = True):
        super().__init__(auto_prefix=False)
        self.loss_net = loss_net
        self.loss_net.set_grad()
        self.weights = ParameterTuple(optimizer.parameters)
        self.grad = ops.GradOperation(get_by_list=True)
        data_parallel = comm.data_parallel_reduce_config()[0]
        if adasum:
            group = comm.server_groups(device_number)[0] if data_parallel else None
            self.reducer = comm.GradReducer(self.weights, True, device_number, group, enabled=group is not None)
            self.update = AdaSumUpdate(OptimizerUpdate(optimizer), self.weights, device_number)
        else:
            self.reducer = comm.GradReducer(self.weights, True, enabled=data_parallel)
            self.update = OptimizerUpdate(optimizer)

    def construct(self, *inputs):
        loss = self.loss_net(*inputs)
        grads = self.grad(self.loss_net, self.weights)(*inputs)
        grads = self.reducer(grads)
        return ops.depend(loss, self.update(loss, grads, *inputs))


def make_optimizer(name: str, params):
    """The optimizers the tests use, with the hyper-parameters the numpy reference assumes."""
    if name == "momentum":
        return nn.Momentum(params, learning_rate=0.1, momentum=0.9)
    if name == "adam":
        return nn.Adam(params, learning_rate=0.05, beta1=0.9, beta2=0.999, eps=1e-8)
    if name == "sgd":
        return nn.SGD(params, learning_rate=0.1)
    raise ValueError(f"make_optimizer: name={name!r} is not one of ['momentum', 'adam', 'sgd'].")


def train_linear(optimizer: str, steps: int, device_number: int) -> dict:
    """Train :class:`TwoLayerLinear` on this rank's batches for ``steps`` steps; return its weights."""
    net = TwoLayerLinear()
    loss_net = nn.WithLossCell(net, nn.MSELoss())
    step = TinyTrainStep(loss_net, make_optimizer(optimizer, net.trainable_params()), device_number)
    for s in range(steps):
        x, y = rank_data(comm.get_rank(), s)
        step(Tensor(x), Tensor(y))
    return {p.name: p.asnumpy().copy() for p in net.trainable_params()}


def to_float16_tuple(arrays) -> tuple:
    return tuple(Tensor(np.asarray(a, np.float16), ms.float16) for a in arrays)

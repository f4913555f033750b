"""msrun worker for tests/test_adasum.py: one process = one rank (the loopback tests call
:func:`layout_results` and :func:`mode_results` on simulated ranks).

Usage: ``adasum_worker.py DEVICE_NUMBERS MODES [MODEL_MODE [MODEL_DEVICE_NUMBER [tutorial|no_tutorial]]]``.
In each of the comma-separated MODES
(``pynative``, ``graph``), for each device number D of the comma-separated DEVICE_NUMBERS, it trains
``TwoLayerLinear`` with AdaSum across servers of D ranks (Momentum 2 steps; Adam 1 step in PyNative; in Graph
mode only when MODEL_MODE is not Graph too: Model trains the same linear model),
runs the upstream-named ``AdaSum`` cell on float16 deltas (one all-zero tensor, one zero on server 0 only), and
``AdaSumUpdate`` on float16 weights whose inner stage adds those deltas. With MODEL_MODE (``pynative``
or ``graph``) it also trains, in that mode and with MODEL_DEVICE_NUMBER (default: the last D), through
``ms_boost.Model``: the same
linear model (plain, and with a loss scale and an overflow step injected on the last rank), and the
tutorial's usage (amp O2, fixed loss scale 1024, boost O2 with the tutorial's manual dict) on a small
conv net (unless ``no_tutorial``). Everything is saved for the numpy reference in the test.
"""
from __future__ import annotations

import sys

import mindspore as ms
import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops
from mindspore.communication import init
from mindspore.train import FixedLossScaleManager

from ms_boost import Model, comm
from ms_boost.adasum import AdaSum, AdaSumUpdate, server_layout
from tests.helpers.msrun import save_result
from tests.helpers.nets import dataset, learnable_data, make_net
from tests.workers.adasum_steps import TwoLayerLinear, rank_data, to_float16_tuple, train_linear
from tests.workers.common import freeze_startup_objects

TUTORIAL_BOOST = {"boost": {"mode": "manual", "less_bn": False, "grad_freeze": False, "adasum": True,
                            "grad_accumulation": False, "dim_reduce": False}}

FP16_SHAPES = ((3, 4), (5,), (2, 2))


def fp16_server_deltas(server: int) -> list:
    """float16 deltas of server ``server``: tensor 1 is zero everywhere, tensor 2 zero on server 0."""
    rng = np.random.default_rng(500 + server)
    out = [rng.normal(0, 1e-2, s).astype(np.float16) for s in FP16_SHAPES]
    out[1][...] = 0
    if server == 0:
        out[2][...] = 0
    return out


def fp16_old_params() -> list:
    rng = np.random.default_rng(77)
    return [rng.normal(0, 1, s).astype(np.float16) for s in FP16_SHAPES]


class UpstreamApiStep(nn.Cell):
    """Holds float16 parameters and their old values; applies ``AdaSum(delta, params, old)``."""

    def __init__(self, device_number: int):
        super().__init__()
        old = fp16_old_params()
        self.params = ParameterTuple(Parameter(Tensor(a), name=f"p{i}") for i, a in enumerate(old))
        self.old = ParameterTuple(Parameter(Tensor(a), name=f"old{i}") for i, a in enumerate(old))
        servers = max(comm.get_size() // device_number, 1)
        self.adasum = AdaSum(comm.get_rank(), device_number, servers, self.params)

    def construct(self, deltas):
        return self.adasum(deltas, self.params, self.old)


def linear_batches(with_overflow: bool):
    """This rank's batches 0 and 1 (known data); with_overflow puts an inf batch between them on the last rank."""
    rank = comm.get_rank()
    batches = [rank_data(rank, 0), rank_data(rank, 1)]
    if with_overflow:
        x, y = rank_data(rank, 0)
        if rank == comm.get_size() - 1:
            x = np.full_like(x, np.inf)
        batches.insert(1, (x, y))
    return np.concatenate([b[0] for b in batches]), np.concatenate([b[1] for b in batches])


def model_cases(device_number: int, tutorial: bool = True) -> dict:
    """Train through ms_boost.Model; return the weights of each case."""
    boost = {**TUTORIAL_BOOST, "common": {"device_number": device_number}}
    out = {}
    for case in ("plain", "overflow"):
        net = TwoLayerLinear()
        opt = nn.Momentum(net.trainable_params(), 0.1, 0.9)
        kwargs = {"loss_scale_manager": FixedLossScaleManager(1024, drop_overflow_update=False)} \
            if case == "overflow" else {}
        model = Model(net, nn.MSELoss(), opt, boost_level="O2", boost_config_dict=boost, **kwargs)
        x, y = linear_batches(case == "overflow")
        model.train(1, dataset(x, y, batch_size=x.shape[0] // (3 if case == "overflow" else 2)),
                    dataset_sink_mode=False)
        out.update({f"{case}/{p.name}": p.asnumpy().copy() for p in net.trainable_params()})
    if not tutorial:
        return out
    # the tutorial's call, as written (the only addition: common.device_number for this CPU layout)
    net = make_net()
    init_weights = {p.name: p.asnumpy().copy() for p in net.trainable_params()}
    opt = nn.Momentum(net.trainable_params(), 0.01, 0.9, loss_scale=1024)
    model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), optimizer=opt,
                  loss_scale_manager=FixedLossScaleManager(1024, drop_overflow_update=False), amp_level="O2",
                  boost_level="O2", boost_config_dict=boost)
    x, y = learnable_data(32, seed=comm.get_rank())
    model.train(1, dataset(x, y, batch_size=16), dataset_sink_mode=False)
    for p in net.trainable_params():
        out[f"tutorial/{p.name}"] = p.asnumpy().copy()
        out[f"tutorial_init/{p.name}"] = init_weights[p.name]
    return out


class AddDeltaStage(nn.Cell):
    """Update stage that adds fixed float16 deltas to the weights (an optimizer with a known step)."""

    def __init__(self, weights, deltas):
        super().__init__()
        self.weights = weights
        self.deltas = ParameterTuple(Parameter(Tensor(d), name=f"delta{i}", requires_grad=False)
                                     for i, d in enumerate(deltas))

    def construct(self, loss, grads, *inputs):
        out = ()
        for i in range(len(self.weights)):
            out = out + (ops.assign(self.weights[i], self.weights[i] + self.deltas[i]),)
        return out


class Fp16UpdateStep(nn.Cell):
    """AdaSumUpdate over float16 weights whose inner stage adds this server's float16 deltas."""

    def __init__(self, device_number: int):
        super().__init__()
        self.weights = ParameterTuple(Parameter(Tensor(a), name=f"w{i}") for i, a in enumerate(fp16_old_params()))
        deltas = fp16_server_deltas(comm.get_rank() // device_number)
        self.update = AdaSumUpdate(AddDeltaStage(self.weights, deltas), self.weights, device_number)

    def construct(self, loss):
        return self.update(loss, ())


def layout_results() -> dict:
    """server_layout on this world: one server when device_number is the world size; a non-divisor refused."""
    results = {"layout/servers_when_device_number_is_world": np.array(server_layout(comm.get_size())[0])}
    if comm.get_size() > 2:
        try:
            server_layout(comm.get_size() - 1)
            results["layout/non_divisor_error"] = np.array("")
        except ValueError as exc:
            results["layout/non_divisor_error"] = np.array(str(exc))
    return results


OPTIMIZER_STEPS = {"momentum": 2, "adam": 1}


def mode_results(mode_name: str, device_numbers, with_model: bool, optimizers=("momentum", "adam"),
                 fp16: bool = True, tutorial: bool = True, model_device_number: int = 0) -> dict:
    """The AdaSum cases of this rank in the current execution mode, keyed ``d<D>/<mode_name>/...``:
    the linear training with each of ``optimizers``, the float16 cells (``fp16``), ``Model`` (``with_model``,
    with ``model_device_number``, default the last device number; the tutorial's conv net too with
    ``tutorial``)."""
    results = {}
    for dn in device_numbers:
        prefix = f"d{dn}/{mode_name}"
        for opt in optimizers:
            for name, value in train_linear(opt, OPTIMIZER_STEPS[opt], dn).items():
                results[f"{prefix}/{opt}/{name}"] = value
        if not fp16:
            continue
        cell = UpstreamApiStep(dn)
        cell(to_float16_tuple(fp16_server_deltas(comm.get_rank() // dn)))
        for i, p in enumerate(cell.params):
            results[f"{prefix}/fp16/p{i}"] = p.asnumpy()
        step = Fp16UpdateStep(dn)
        step(Tensor(0.0, ms.float32))
        for i, w in enumerate(step.weights):
            results[f"{prefix}/fp16_update/w{i}"] = w.asnumpy()
    if with_model:
        dn = model_device_number or device_numbers[-1]
        for name, value in model_cases(dn, tutorial).items():
            results[f"d{dn}/{mode_name}/model/{name}"] = value
    return results


def main() -> None:
    device_numbers = [int(d) for d in sys.argv[1].split(",")]
    modes = sys.argv[2].split(",")  # the modes to run, e.g. "graph" or "pynative,graph"
    model_mode = sys.argv[3] if len(sys.argv) > 3 else None
    model_device_number = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    tutorial = (sys.argv[5] if len(sys.argv) > 5 else "tutorial") == "tutorial"
    ms.set_device("CPU")
    ms.device_context.cpu.op_tuning.threads_num(1)  # tiny ops: one kernel thread per rank is fastest
    init()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    freeze_startup_objects()
    results = layout_results()
    for mode_name in modes:
        ms.set_context(mode=ms.GRAPH_MODE if mode_name == "graph" else ms.PYNATIVE_MODE)
        # the optimizer only changes the deltas; Adam's graph is MindSpore's own: momentum alone in Graph mode,
        # and not at all with Model in the same mode (Model's plain case is the same linear training, through the
        # library's own train cell)
        if mode_name == "graph":
            optimizers = () if mode_name == model_mode else ("momentum",)
        else:
            optimizers = ("momentum", "adam")
        results.update(mode_results(mode_name, device_numbers, mode_name == model_mode, optimizers,
                                    tutorial=tutorial, model_device_number=model_device_number))
    save_result(**results)


if __name__ == "__main__":
    main()

"""ms_boost.comm: identity on one process; every collective on 2-4 simulated ranks of the loopback world
(tests/helpers/loopback.py), checked against numpy; the loopback world's own failure modes. Real MCCL
collectives in Graph mode run in the end-to-end msrun jobs (tests/test_msrun_e2e.py)."""
from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from ms_boost import comm
from tests.helpers.loopback import LoopbackError, LoopbackWorld, run_ranks


def test_single_process_is_identity(mode):
    x = ms.Tensor(np.arange(4, dtype=np.float32))
    assert comm.get_size() == 1 and comm.get_rank() == 0 and not comm.is_initialized()
    for cell in (comm.AllReduce("sum"), comm.AllReduce("mean"), comm.AllGather(), comm.Broadcast(0)):
        np.testing.assert_array_equal(cell(x).asnumpy(), x.asnumpy())
    grads = (x, x * 2)
    out = comm.GradReducer([ms.Parameter(x, name="p0"), ms.Parameter(x, name="p1")])(grads)
    np.testing.assert_array_equal(out[1].asnumpy(), grads[1].asnumpy())
    comm.barrier()  # returns at once
    assert comm.data_parallel_reduce_config()[0] is False


@pytest.mark.parametrize("device_number, ranks, expected", [(8, None, 1), (8, 2, 2), (2, 8, 2), (4, 4, 4), (1, 3, 1)])
def test_server_size_caps_device_number_at_the_ranks(device_number, ranks, expected):
    """Fewer ranks than common.device_number sit on one server (None: the world size, 1 in this process)."""
    assert comm.server_size(device_number, ranks) == expected


def test_bad_arguments():
    with pytest.raises(ValueError, match="op='avg'"):
        comm.AllReduce("avg")
    with pytest.raises(ValueError, match=r"common.device_number=3 must be a positive divisor"):
        comm.server_groups(3)
    with pytest.raises(ValueError, match="must be distinct ranks"):
        comm.create_group([0, 0])


class Ops(nn.Cell):
    """Every collective cell of ms_boost.comm, world and server group."""

    def __init__(self, server_group, size):
        super().__init__()
        self.sum = comm.AllReduce("sum")
        self.mean = comm.AllReduce("mean")
        self.max = comm.AllReduce("max")
        self.min = comm.AllReduce("min")
        self.prod = comm.AllReduce("prod")
        self.gather = comm.AllGather()
        self.bcast = comm.Broadcast(size - 1)
        self.server_mean = comm.AllReduce("mean", server_group)
        self.server_gather = comm.AllGather(server_group)

    def construct(self, t):
        return (self.sum(t), self.mean(t), self.max(t), self.min(t), self.prod(t), self.gather(t), self.bcast(t),
                self.server_mean(t), self.server_gather(t))


def rank_vector(rank: int) -> np.ndarray:
    return np.array([rank + 1.0, 10.0 * (rank + 1), -2.0 * rank], np.float32)


@pytest.mark.parametrize("size", [2, 4])
def test_collectives_on_loopback_ranks_match_numpy(size):
    def rank_fn(rank):
        group, servers = comm.server_groups(2)
        outs = Ops(group, size)(ms.Tensor(rank_vector(rank)))
        comm.barrier()
        return {"outs": [o.asnumpy() for o in outs], "servers": servers, "rank": comm.get_rank(),
                "size": comm.get_size(), "server_rank": comm.get_rank(group), "server_size": comm.get_size(group),
                "inited": comm.is_initialized(), "reduce": comm.data_parallel_reduce_config()}

    results = run_ranks(size, rank_fn)
    xs = np.stack([rank_vector(r) for r in range(size)])
    names = ("sum", "mean", "max", "min", "prod", "gather", "bcast", "server_mean", "server_gather")
    for r, res in enumerate(results):
        assert (res["rank"], res["size"], res["inited"]) == (r, size, True)
        assert res["reduce"] == (True, True, size)
        assert res["servers"] == [[s, s + 1] for s in range(0, size, 2)]
        assert (res["server_rank"], res["server_size"]) == ((r % 2, 2) if size > 2 else (r, 2))
        server = xs[r - r % 2:r - r % 2 + 2]
        expect = (xs.sum(0), xs.mean(0), xs.max(0), xs.min(0), xs.prod(0), xs.reshape(-1), xs[size - 1],
                  server.mean(0), server.reshape(-1))
        for name, got, want in zip(names, res["outs"], expect):
            np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=f"{name} rank {r}")


def test_uses_stand_in_backend_only_while_one_is_installed():
    assert not comm.uses_stand_in_backend()
    seen = run_ranks(2, lambda rank: comm.uses_stand_in_backend())
    assert seen == [True, True]
    assert not comm.uses_stand_in_backend()


def test_loopback_world_failures_are_clear_errors():
    """A failing rank fails the world; mismatched collectives and ranks that never meet are named."""
    def one_rank_raises(rank):
        if rank == 1:
            raise ValueError("boom on rank 1")
        return comm.AllReduce("sum")(ms.Tensor(np.ones(2, np.float32))).asnumpy()

    with pytest.raises(ValueError, match="boom on rank 1"):
        run_ranks(3, one_rank_raises)

    def shapes_differ(rank):
        return comm.AllReduce("sum")(ms.Tensor(np.ones(rank + 1, np.float32))).asnumpy()

    with pytest.raises(LoopbackError, match="collective #0 of group 'loopback_world'.*shapes"):
        run_ranks(2, shapes_differ)

    def rank_0_skips(rank):
        if rank:
            comm.barrier()

    with pytest.raises(LoopbackError, match="deadlock"):
        run_ranks(3, rank_0_skips)
    with pytest.raises(LoopbackError, match="PYNATIVE_MODE only"):
        ms.set_context(mode=ms.GRAPH_MODE)
        try:
            run_ranks(2, lambda rank: rank)
        finally:
            ms.set_context(mode=ms.PYNATIVE_MODE)
    world = LoopbackWorld(2)
    assert world.run(lambda rank: comm.get_rank() * 10) == [0, 10]
    assert not comm.is_initialized() and comm.get_size() == 1  # MindSpore's communication is back

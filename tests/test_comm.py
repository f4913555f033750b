"""ms_boost.comm: identity on one process, real collectives under msrun (checked against numpy)."""
from __future__ import annotations

from pathlib import Path

import mindspore as ms
import numpy as np
import pytest

from ms_boost import comm
from tests.helpers.msrun import run_msrun

WORKER = Path(__file__).parent / "workers" / "comm_ops.py"


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


@pytest.mark.msrun
@pytest.mark.parametrize("exec_mode", ["pynative", "graph"])
def test_collectives_under_msrun_four_ranks(exec_mode):
    size = 4
    res = run_msrun(WORKER, size, args=[exec_mode])
    xs = np.array([[r + 1.0, 10.0 * (r + 1)] for r in range(size)], np.float32)
    for r, out in enumerate(res):
        assert int(out["rank"]) == r and int(out["size"]) == size
        np.testing.assert_allclose(out["sum"], xs.sum(0))
        np.testing.assert_allclose(out["mean"], xs.mean(0))
        np.testing.assert_allclose(out["max"], xs.max(0))
        np.testing.assert_allclose(out["gather"], xs.reshape(-1))
        np.testing.assert_allclose(out["bcast"], xs[size - 1])
        server = r // 2
        np.testing.assert_allclose(out["server_mean"], xs[2 * server:2 * server + 2].mean(0))
        np.testing.assert_array_equal(out["servers"], [[0, 1], [2, 3]])

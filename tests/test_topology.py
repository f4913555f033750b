"""Topology: one rule and one message for common.device_number; the loss-scaler adapter against numpy."""
from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn

from ms_boost import AutoBoost
from ms_boost.loss_scale_group import GroupLossScaleManager
from ms_boost.loss_scaler import DynamicLossScaler, FixedLossScaler, GroupLossScaler, make_loss_scaler
from ms_boost.topology import Topology


@pytest.mark.parametrize("size,device_number,servers,server_size", [
    (8, 4, 2, 4), (8, 8, 1, 8), (8, 16, 1, 8), (6, 3, 2, 3), (2, 8, 1, 2), (1, 8, 1, 1), (4, 1, 4, 1)])
def test_servers_of_consecutive_ranks(size, device_number, servers, server_size):
    for rank in range(size):
        t = Topology(rank, size, device_number)
        assert (t.num_servers, t.server_size) == (servers, server_size)
        assert t.server == rank // server_size and t.local_rank == rank % server_size
        assert t.servers[t.server] == tuple(range(t.server * server_size, (t.server + 1) * server_size))
    assert Topology(0, size, device_number).server_roots == tuple(range(0, size, server_size))
    assert bool(Topology(0, size, device_number).note) == (device_number > size)


def test_one_rule_one_message():
    message = r"common.device_number=3 must divide the number of ranks \(8\) or be at least it"
    t = Topology(0, 8, 3)  # built fine: the layout is needed only where servers are used
    for query in ("num_servers", "servers", "local_rank", "server", "server_roots"):
        with pytest.raises(ValueError, match=message):
            getattr(t, query)
    with pytest.raises(ValueError, match=message):
        AutoBoost("O2", {"common": {"device_number": 3}}).summary(ranks=8)
    with pytest.raises(ValueError, match=r"common.device_number=0 is out of range"):
        Topology(0, 8, 0)
    with pytest.raises(TypeError, match=r"common.device_number must be an int"):
        Topology(0, 8, 2.0)
    with pytest.raises(ValueError, match=r"topology rank=8 is out of range"):
        Topology(8, 8, 4)
    # this process (no communication): one rank, not data parallel
    here = Topology.current(8)
    assert (here.rank, here.size, here.data_parallel, here.num_servers) == (0, 1, False, 1)
    text = AutoBoost("O2").summary(ranks=2)
    assert "note: common.device_number=8 is more than the 2 rank(s): they form one server" in text


def test_fixed_and_dynamic_scalers_unscale_and_flag_overflow(mode):
    g = (Tensor(np.array([2.0, -4.0], np.float32)), Tensor(np.array([[8.0]], np.float32)))
    scale = Parameter(Tensor(4.0, ms.float32), name="scale")
    fixed = make_loss_scaler(4.0, [])
    assert isinstance(fixed, FixedLossScaler)
    out, overflow = fixed(scale, g)
    np.testing.assert_allclose(out[0].asnumpy(), [0.5, -1.0])  # g / 4 (an optimizer's share is put back by its
    np.testing.assert_allclose(out[1].asnumpy(), [[2.0]])      # apply stage: test_model's loss-scale convention)
    assert not bool(overflow.asnumpy())
    bad = (g[0], Tensor(np.array([[np.inf]], np.float32)))
    assert bool(fixed(scale, bad)[1].asnumpy())
    dynamic = make_loss_scaler(nn.DynamicLossScaleUpdateCell(4.0, 2.0, 1000), [])
    assert isinstance(dynamic, DynamicLossScaler) and dynamic.initial_scale == 4.0
    _, overflow = dynamic(scale, bad)
    assert bool(overflow.asnumpy()) and float(scale.asnumpy()) == 2.0  # backed off by the update cell
    p = Parameter(Tensor(np.ones(2, np.float32)), name="p")
    group = make_loss_scaler(GroupLossScaleManager(8.0, [[p]]), [p])
    assert isinstance(group, GroupLossScaler) and len(group.state_parameters()) == 1
    with pytest.raises(ValueError, match="positive finite"):
        make_loss_scaler(0.0, [])
    with pytest.raises(TypeError, match="scale_sense must be"):
        make_loss_scaler("8", [])

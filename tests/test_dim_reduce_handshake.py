"""The msrun PCA handshake's store protocol (ms_boost/dim_reduce/handshake.py), two ranks in one process."""
from __future__ import annotations

import socket
import time

import pytest

from ms_boost import comm
from ms_boost.dim_reduce import handshake


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_rank_that_never_arrives_is_named_and_a_late_rank_is_told(monkeypatch):
    address = ("127.0.0.1", _free_port())
    root = handshake._StoreStatus(address, 0, 2, [0], timeout=0.5)
    late = handshake._StoreStatus(address, 1, 2, [0], timeout=0.5)
    late.ns = root.ns  # one handshake seen from two ranks (in two processes they count alike)
    root.done("arrived")
    root.done("prepared")
    root.done("read")
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"rank 0: rank\(s\) \[1\] never reached the PCA handshake \(dead, or "
                                           r"alive but stuck\) within dim_reduce.timeout=0.5 s"):
        root.wait("read", [0, 1], time.monotonic() + 0.5, "reading")
    assert 0.5 <= time.monotonic() - start < 3
    # rank 1 wakes up later: rank 0 prepared the matrix but failed, and rank 1 learns it at once
    late.done("arrived")
    assert late.wait("prepared", [0], time.monotonic() + 5, "preparing") == {0: 1}
    assert late.failed_ranks() == [0]
    with pytest.raises(handshake._PeerFailed):
        late.tick()


def test_a_rank_that_arrived_but_is_slow_is_named_as_such():
    address = ("127.0.0.1", _free_port())
    first = handshake._StoreStatus(address, 0, 2, [0], timeout=0.3)
    second = handshake._StoreStatus(address, 1, 2, [0], timeout=0.3)
    second.ns = first.ns
    first.done("arrived")
    second.done("arrived")
    with pytest.raises(TimeoutError, match=r"rank 1: rank\(s\) \[0\] reached it but did not finish preparing"):
        second.wait("prepared", [0], time.monotonic() + 0.3, "preparing")
    assert first.failed_ranks() == [1] and first.status("prepared", [0, 1]) == {0: 0, 1: 0}


def test_store_address_from_the_msrun_environment(monkeypatch):
    for name in ("MS_SCHED_HOST", "MS_SCHED_PORT", "MS_BOOST_STORE_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert comm.status_store_address() is None  # no msrun: the collective exchange is used
    monkeypatch.setenv("MS_SCHED_HOST", "10.0.0.1")
    monkeypatch.setenv("MS_SCHED_PORT", "8118")
    assert comm.status_store_address() == ("10.0.0.1", 8119)
    monkeypatch.setenv("MS_BOOST_STORE_PORT", "9000")
    assert comm.status_store_address() == ("10.0.0.1", 9000)
    monkeypatch.setenv("MS_BOOST_STORE_PORT", "\u0669000")
    with pytest.raises(ValueError, match=r"MS_BOOST_STORE_PORT='\u0669000' is not a port number"):
        comm.status_store_address()

"""The status boards of ms_boost/comm/status_board.py (DimReduce's PCA handshake runs on them): the TCP-store board
with two ranks in one process, the collective board on the loopback world, and the one place a transport is picked.
"""
from __future__ import annotations

import socket
import time

import pytest

from ms_boost import comm
from tests.helpers.loopback import run_ranks

PCA = comm.Handshake(key="pca_handshake", name="the PCA handshake", timeout=0.5, timeout_name="dim_reduce.timeout",
                     outcome="dim_reduce cannot start")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _handshake(timeout: float) -> comm.Handshake:
    return comm.Handshake(PCA.key, PCA.name, timeout, PCA.timeout_name, PCA.outcome)


def test_a_rank_that_never_arrives_is_named_and_a_late_rank_is_told(monkeypatch):
    address = ("127.0.0.1", _free_port())
    root = comm.StoreStatusBoard(address, 0, 2, _handshake(0.5))  # opening the board marks the rank arrived
    late = comm.StoreStatusBoard(address, 1, 2, _handshake(0.5))
    late.namespace = root.namespace  # one handshake seen from two ranks (in two processes they count alike)
    root.post("prepared", True)
    root.post("read", True)
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"rank 0: rank\(s\) \[1\] never reached the PCA handshake \(dead, or "
                                           r"alive but stuck\) within dim_reduce.timeout=0.5 s"):
        root.wait("read", [0, 1], time.monotonic() + 0.5, "reading")
    assert 0.5 <= time.monotonic() - start < 3
    # rank 1 wakes up later: rank 0 prepared the matrix but failed, and rank 1 learns it at once
    late.post("arrived", True)
    assert late.wait("prepared", [0], time.monotonic() + 5, "preparing") == comm.Settled(failed=[0], unfinished=[])
    assert late.status("prepared", [0]) == {0: 1}
    assert late.failed_ranks() == [0]
    with pytest.raises(comm.PeerFailed):
        late.check()


def test_a_rank_that_arrived_but_is_slow_is_named_as_such():
    address = ("127.0.0.1", _free_port())
    first = comm.StoreStatusBoard(address, 0, 2, _handshake(0.3))
    second = comm.StoreStatusBoard(address, 1, 2, _handshake(0.3))
    second.namespace = first.namespace
    second.post("arrived", True)
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


def test_the_transport_is_picked_in_one_place(monkeypatch):
    """Collectives on one process and without a scheduler address; the store with one (several ranks)."""
    for name in ("MS_SCHED_HOST", "MS_SCHED_PORT", "MS_BOOST_STORE_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert isinstance(comm.open_status_board(PCA), comm.CollectiveStatusBoard)
    assert run_ranks(2, lambda rank: type(comm.open_status_board(PCA)).__name__) == ["CollectiveStatusBoard"] * 2
    monkeypatch.setenv("MS_SCHED_HOST", "127.0.0.1")
    monkeypatch.setenv("MS_BOOST_STORE_PORT", str(_free_port()))
    assert isinstance(comm.open_status_board(PCA), comm.CollectiveStatusBoard)  # one process: nobody to wait for
    boards = run_ranks(2, lambda rank: comm.open_status_board(PCA))
    assert [type(b).__name__ for b in boards] == ["StoreStatusBoard"] * 2
    assert [b.status("arrived", [b.rank]) for b in boards] == [{0: 1}, {1: 1}]  # opening marks the arrival


def test_collective_board_waits_for_the_workers_and_spreads_a_failure():
    """Ranks 0 and 2 work (three and one units), ranks 1 and 3 wait; everyone leaves on the same exchange."""
    def work(rank, fail_at):
        board = comm.CollectiveStatusBoard(rank, 4)
        workers, error = [0, 2], None
        if rank in workers:
            try:
                for unit in range(3 if rank == 0 else 1):
                    if rank == 0 and unit == fail_at:
                        raise ValueError("bad checkpoint")
                    board.check()
            except comm.PeerFailed as exc:
                return ("peer", exc.ranks)
            except ValueError:
                error = "own"
            board.post("prepared", error is None)
        prepared = board.wait("prepared", workers, time.monotonic(), "preparing")
        board.post("read", True)
        return (error, tuple(prepared), tuple(board.wait("read", range(4), time.monotonic(), "reading")))

    fine = (None, ([], []), ([], []))
    assert run_ranks(4, lambda rank: work(rank, fail_at=None)) == [fine] * 4
    outcome = run_ranks(4, lambda rank: work(rank, fail_at=1))
    # rank 0 failed at its second unit, while rank 2 (one unit) had already posted: rank 0 is failed and unfinished
    assert outcome[0] == ("own", ([0], [0]), ([], []))
    assert outcome[1] == outcome[2] == outcome[3] == (None, ([0], [0]), ([], []))

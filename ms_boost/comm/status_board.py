"""Status boards: per-rank phase flags that every rank posts and waits on, outside any long collective.

A handshake (DimReduce's PCA matrix) has a few ranks do a long piece of work while the others wait for it. A
single collective around that work would block every rank for as long as it takes, past the backends'
collective timeouts, and would say nothing about who is missing. A *status board* instead lets each rank post
that it finished a phase, or failed, and wait -- bounded -- until given ranks have finished it or some rank failed.

:class:`StatusBoard` is the protocol the algorithm calls; two transports implement it and
:func:`open_status_board` is the one place that picks one:

* :class:`StoreStatusBoard` -- MindSpore's TCP key-value store, served by rank 0, when the scheduler's address
  is known (``msrun``, :func:`status_store_address`). Every wait is polled against a deadline, without any
  blocking collective; a rank that never arrived (dead, or alive but stuck) is named in the ``TimeoutError``.
* :class:`CollectiveStatusBoard` -- one tiny AllGather of every rank's flag per call (identity on one process),
  for launches without a scheduler (HCCL rank tables, mpirun). Each collective waits for at most one unit of
  the workers' work; a rank that never arrives is bounded by the backend's own collective timeout.

How a handshake uses a board, whatever the transport (every rank makes the same calls, so the collective one
stays in lockstep):

1. ``board = open_status_board(Handshake(...))`` on every rank (the store marks the rank's arrival);
2. a rank doing a long piece of work calls ``board.check()`` between two units of it (:class:`PeerFailed` when
   some rank failed), then ``board.post(phase, ok)``;
3. every rank calls ``board.wait(phase, ranks, deadline, what)`` with the same ``ranks`` (those that post
   ``phase``), which returns the ranks that failed and those of ``ranks`` that did not finish ``phase``
   (:class:`Settled`; both empty: all of ``ranks`` finished it).
"""
from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Protocol, Sequence, Tuple

import numpy as np
from mindspore import Tensor

from ms_boost.comm.collectives import AllGather, get_rank, get_size

try:  # MindSpore's TCP key-value store; without it every board runs over collectives
    from mindspore.mint.distributed import TCPStore
except ImportError:  # pragma: no cover - a MindSpore release without mint.distributed.TCPStore
    TCPStore = None

__all__ = [
    "Handshake", "PeerFailed", "Settled", "StatusBoard", "StoreStatusBoard", "CollectiveStatusBoard",
    "open_status_board",
    "status_store_address", "status_store", "poll",
]

_STORES: Dict[tuple, Any] = {}  # kept open for the life of the process (rank 0 serves it)
_POLL_SECONDS = 0.05
_MIN_CONNECT_SECONDS = 10.0  # starting / reaching the store under load: never less than this
_BOARDS = itertools.count()  # boards opened in this process: a key namespace each, the same on every rank


@dataclass(frozen=True)
class Handshake:
    """What a status board serves, as its keys and errors name it.

    Attributes:
        key: prefix of the board's keys in the store (a fresh numbered namespace per board).
        name: the handshake in messages, e.g. ``"the PCA handshake"``.
        timeout: seconds a wait may take; also bounds reaching the store (at least 10 s).
        timeout_name: the setting ``timeout`` comes from, e.g. ``"dim_reduce.timeout"``.
        outcome: what a failure means, e.g. ``"dim_reduce cannot start"``.
    """

    key: str
    name: str
    timeout: float
    timeout_name: str
    outcome: str


class Settled(NamedTuple):
    """How a :meth:`StatusBoard.wait` ended.

    Attributes:
        failed: the ranks that posted a failure, in rank order.
        unfinished: the waited-for ranks that did not finish the phase (empty unless some rank failed).
    """

    failed: List[int]
    unfinished: List[int]


class PeerFailed(RuntimeError):
    """Raised by :meth:`StatusBoard.check` when the board shows that other ranks failed.

    Attributes:
        ranks: the failed ranks.
    """

    def __init__(self, ranks: Sequence[int]):
        self.ranks = list(ranks)
        super().__init__(f"rank(s) {self.ranks} failed")


class StatusBoard(Protocol):
    """Per-rank phase flags of one handshake (see the module docstring for the calling pattern).

    Attributes:
        rank: this rank.
        world: number of ranks.
    """

    rank: int
    world: int

    def check(self) -> None:
        """Between two units of a long piece of work: raise :class:`PeerFailed` when some rank failed."""

    def post(self, phase: str, ok: bool) -> None:
        """This rank finished ``phase`` (``ok``) or failed (``not ok``; the other ranks stop waiting)."""

    def wait(self, phase: str, ranks: Sequence[int], deadline: float, what: str) -> Settled:
        """Wait until every rank of ``ranks`` posted ``phase`` or some rank failed.

        Args:
            phase: the phase waited for.
            ranks: the ranks that post it (the same list on every rank).
            deadline: ``time.monotonic()`` value past which the wait gives up (the store; the collective
                transport is bounded by the backend's collective timeout instead).
            what: the phase's work in the timeout message, e.g. ``"preparing the PCA matrix 'p.npy'"``.

        Returns:
            The ranks that failed and those of ``ranks`` that did not finish ``phase`` (both empty: all did).

        Raises:
            TimeoutError: ``deadline`` passed; names the ranks that never arrived and those still working.
        """
        ...


class CollectiveStatusBoard:
    """A status board over one tiny AllGather per call (identity on one process).

    Every rank makes the same calls: while some ranks work (calling :meth:`check` once per unit of work), the
    others loop in :meth:`wait`, each loop one AllGather; all ranks see the same flags, so they leave on the same
    call. Each collective therefore waits for at most one unit of work, far below any backend timeout.

    Args:
        rank: this rank.
        world: number of ranks.
    """

    BUSY, DONE, FAILED = 0.0, 1.0, 2.0

    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world
        self.gather = AllGather()
        self.posted: Dict[str, float] = {}

    def exchange(self, status: float) -> np.ndarray:
        """Every rank's ``status`` of this call, in rank order (one AllGather)."""
        return self.gather(Tensor(np.array([status], np.float32))).asnumpy().reshape(-1)

    def failed(self, flags: np.ndarray) -> List[int]:
        """The ranks whose flag in ``flags`` says failed."""
        return [r for r, f in enumerate(flags) if f == self.FAILED]

    def check(self) -> None:
        """Report busy; raise :class:`PeerFailed` when some rank failed (the last exchange for every rank)."""
        failed = self.failed(self.exchange(self.BUSY))
        if failed:
            raise PeerFailed(failed)

    def post(self, phase: str, ok: bool) -> None:
        """Remember this rank's result of ``phase``; the next :meth:`wait` on it sends it."""
        self.posted[phase] = self.DONE if ok else self.FAILED

    def wait(self, phase: str, ranks: Sequence[int], deadline: float, what: str) -> Settled:
        """Exchange this rank's status of ``phase`` until every rank of ``ranks`` is done or one failed.

        ``deadline`` and ``what`` are not used: a rank that never arrives is bounded by the backend's collective
        timeout.
        """
        del deadline, what
        status = self.posted.get(phase, self.BUSY)
        while True:
            flags = self.exchange(status)
            failed = self.failed(flags)
            unfinished = [r for r in ranks if flags[r] != self.DONE]
            if failed or not unfinished:
                return Settled(failed, unfinished)


class StoreStatusBoard:
    """A status board in MindSpore's TCP key-value store; every wait bounded, missing ranks named.

    Keys (a fresh namespace per board): ``<ns>/<phase>/<rank>`` is 1 once the rank finished that phase
    (``arrived`` once the board is open); ``<ns>/fail/<rank>`` is 1 once it failed and ``<ns>/failed`` counts the
    failed ranks (store values are counters, so success and failure never share a key). Reads use
    ``add(key, 0)``, which never blocks.

    Args:
        address: ``(host, port)`` of the store (:func:`status_store_address`); rank 0 serves it.
        rank: this rank.
        world: number of ranks.
        handshake: what the board serves (keys, timeout, the words of its errors).

    Raises:
        RuntimeError: rank 0 cannot serve the store.
        TimeoutError: another rank cannot reach it within the handshake's timeout (rank 0 dead or stuck).
    """

    DONE = 1

    def __init__(self, address: Tuple[str, int], rank: int, world: int, handshake: Handshake):
        self.rank, self.world, self.handshake = rank, world, handshake
        self.namespace = f"ms_boost/{handshake.key}/{next(_BOARDS)}"
        timeout, name = float(handshake.timeout), handshake.name
        try:
            self.store = status_store(address, rank, world, max(_MIN_CONNECT_SECONDS, timeout))
        except Exception as exc:  # noqa: BLE001 -- name the rank that serves the store
            if rank == 0:
                raise RuntimeError(f"rank 0 cannot serve {name} store on {address[0]}:{address[1]} ({exc}); set "
                                   f"MS_BOOST_STORE_PORT to a free port.") from None
            raise TimeoutError(f"rank {rank}: rank 0 did not reach {name} within {handshake.timeout_name}="
                               f"{timeout:g} s (its store {address[0]}:{address[1]} is unreachable: {exc}); rank 0 "
                               f"is dead or stuck before {name}.") from None
        self.post("arrived", True)

    def _add(self, key: str, amount: int) -> int:
        try:
            return int(self.store.add(f"{self.namespace}/{key}", amount))
        except Exception as exc:  # noqa: BLE001
            raise RuntimeError(f"rank {self.rank}: {self.handshake.name} store (served by rank 0) failed: {exc}; "
                               f"rank 0 has probably stopped (see its error).") from None

    def post(self, phase: str, ok: bool) -> None:
        """Mark ``phase`` finished, or this rank failed (if the store still answers: the caller raises anyway)."""
        if ok:
            self._add(f"{phase}/{self.rank}", self.DONE)
            return
        try:
            self._add(f"fail/{self.rank}", 1)
            self._add("failed", 1)
        except RuntimeError:
            pass

    def status(self, phase: str, ranks: Sequence[int]) -> Dict[int, int]:
        """``{rank: 1 if it finished phase else 0}`` for ``ranks``."""
        return {r: self._add(f"{phase}/{r}", 0) for r in ranks}

    def failed_ranks(self) -> List[int]:
        """The ranks that posted a failure, in rank order."""
        if self._add("failed", 0) == 0:
            return []
        return [r for r in range(self.world) if self._add(f"fail/{r}", 0)]

    def check(self) -> None:
        """Raise :class:`PeerFailed` when some rank failed."""
        failed = self.failed_ranks()
        if failed:
            raise PeerFailed(failed)

    def wait(self, phase: str, ranks: Sequence[int], deadline: float, what: str) -> Settled:
        """Poll until every rank of ``ranks`` finished ``phase`` or some rank failed; see :meth:`StatusBoard.wait`.

        On timeout this rank posts its own failure first, so the others stop at their next poll.
        """
        flags: Dict[int, int] = {}

        def settled() -> bool:
            nonlocal flags
            flags = self.status(phase, ranks)
            return all(flags.values()) or bool(self._add("failed", 0))

        if not poll(settled, deadline):  # the deadline passed: name who is missing
            pending = [r for r, v in flags.items() if not v]
            arrived = self.status("arrived", pending)
            absent = [r for r in pending if not arrived[r]]
            slow = [r for r in pending if arrived[r]]
            self.post(phase, False)  # release the others at once
            parts = []
            if absent:
                parts.append(f"rank(s) {absent} never reached {self.handshake.name} (dead, or alive but stuck)")
            if slow:
                parts.append(f"rank(s) {slow} reached it but did not finish {what}")
            raise TimeoutError(f"rank {self.rank}: {'; '.join(parts)} within {self.handshake.timeout_name}="
                               f"{float(self.handshake.timeout):g} s; {self.handshake.outcome}.")
        return Settled(self.failed_ranks(), [r for r, v in flags.items() if not v])


def open_status_board(handshake: Handshake) -> StatusBoard:
    """This rank's board for ``handshake``: the one place a transport is chosen.

    The store (:class:`StoreStatusBoard`) when there are several ranks, the scheduler's address is known
    (:func:`status_store_address`) and MindSpore has a TCP store; else collectives
    (:class:`CollectiveStatusBoard`, also on one process).

    Raises:
        ValueError: the scheduler's port variable is not a port number.
        RuntimeError, TimeoutError: the store cannot be served or reached (see :class:`StoreStatusBoard`).
    """
    rank, world = get_rank(), get_size()
    address = status_store_address() if world > 1 and TCPStore is not None else None
    if address is None:
        return CollectiveStatusBoard(rank, world)
    return StoreStatusBoard(address, rank, world, handshake)


def status_store_address() -> Optional[Tuple[str, int]]:
    """``(host, port)`` of the status store under ``msrun``, else None (use collectives instead).

    The store is served by rank 0 on the scheduler's port + 1 (``MS_SCHED_HOST`` / ``MS_SCHED_PORT``), or on
    ``MS_BOOST_STORE_PORT``. This is the one place ms_boost reads the scheduler's environment.

    Raises:
        ValueError: the port variable is not a port number.
    """
    host, port = os.environ.get("MS_SCHED_HOST"), os.environ.get("MS_SCHED_PORT")
    override = os.environ.get("MS_BOOST_STORE_PORT")
    if not host or not (port or override):
        return None
    text = override or port or ""
    if not text.isascii() or not text.isdigit() or not 0 < int(text) + (0 if override else 1) < 65536:
        name = "MS_BOOST_STORE_PORT" if override else "MS_SCHED_PORT"
        raise ValueError(f"{name}={text!r} is not a port number (ASCII digits, 1..65535).")
    return host, int(text) + (0 if override else 1)


def status_store(address: Tuple[str, int], rank: int, world: int, timeout: float) -> Any:
    """MindSpore's TCP key-value store at ``address`` (rank 0 serves it), opened once per process.

    Values are counters: ``store.add(key, n)`` adds and returns the new value, ``add(key, 0)`` reads without
    blocking.

    Args:
        address: ``(host, port)``, e.g. :func:`status_store_address`.
        rank: this rank (rank 0 serves the store).
        world: number of ranks.
        timeout: seconds to wait for the store (connecting, serving).

    Raises:
        RuntimeError: this MindSpore has no TCP store.
        Exception: MindSpore's error when the store cannot be served or reached (the caller names the rank).
    """
    if TCPStore is None:
        raise RuntimeError("this MindSpore has no mindspore.mint.distributed.TCPStore; use the collective board.")
    key = (tuple(address), rank == 0)
    if key not in _STORES:
        _STORES[key] = TCPStore(address[0], address[1], world_size=world, is_master=rank == 0,
                                timeout=timedelta(seconds=float(timeout)), wait_for_workers=False)
    return _STORES[key]


def poll(ready: Callable[[], bool], deadline: float) -> bool:
    """Call ``ready()`` until it returns True (then True) or ``time.monotonic()`` passes ``deadline`` (then False).

    Sleeps a few milliseconds between calls; the store board's waits are built on it.
    """
    while True:
        if ready():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(_POLL_SECONDS)

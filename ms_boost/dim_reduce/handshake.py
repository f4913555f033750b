"""The PCA-matrix handshake of dimension-reduce training: every rank gets its block of PCA rows.

Before stage 2 starts, the first rank of every server (its *root*) loads or computes the PCA matrix
(:func:`ms_boost.dim_reduce.pca.compute_pca_matrix`) while all ranks exchange a status flag through tiny
collectives, so every rank leaves together -- with the rows, or with an error naming the rank that failed.

Under ``msrun`` (:func:`ms_boost.comm.status_store_address` finds the scheduler) the flags go through MindSpore's
TCP key-value store (:func:`ms_boost.comm.status_store`, served by rank 0 on ``MS_SCHED_PORT + 1``, or on
``MS_BOOST_STORE_PORT``), polled (:func:`ms_boost.comm.poll`) without any blocking collective: every wait is bounded by
``dim_reduce.timeout`` and a rank that never arrives -- dead, or alive but stuck -- is named in the error.
Without those variables (e.g. an HCCL rank-table launch) the flags go through tiny AllGathers instead,
whose wait is bounded by the backend's own collective timeout (see ``docs/dim_reduce.md``).
"""
from __future__ import annotations

import itertools
import os
import sys
import time
from typing import Dict, List, Optional, Sequence

import numpy as np
from mindspore import Tensor

from ms_boost import comm
from ms_boost.dim_reduce.math import local_row_block
from ms_boost.dim_reduce.pca import ParamSpec, check_finite_rows, compute_pca_matrix, list_checkpoints, open_pca_matrix
from ms_boost.topology import Topology

__all__ = ["prepare_pca_matrix", "local_pca_rows", "DEFAULT_PCA_FILE_NAME"]

DEFAULT_PCA_FILE_NAME = "pca_mat.npy"


def local_pca_rows(pca_mat, n_components: int, rank: int, rank_size: int) -> np.ndarray:
    """This rank's zero-padded block of PCA rows, ``(ceil(k/R), M)`` float32.

    Args:
        pca_mat: the full ``(>= k, M)`` matrix (array or memory map; only the needed rows are read).
        n_components: ``k``.
        rank: this rank.
        rank_size: ``R``.
    """
    start, stop, height = local_row_block(n_components, rank, rank_size)
    rows = np.zeros((height, pca_mat.shape[1]), dtype=np.float32)
    rows[:stop - start] = np.asarray(pca_mat[start:stop], dtype=np.float32)
    return rows


def _stderr_progress(message: str) -> None:
    print(f"[ms_boost.dim_reduce] {message}", file=sys.stderr, flush=True)


def _devices_per_server(device_number: Optional[int], world: int) -> int:
    """Ranks per server by :class:`~ms_boost.topology.Topology`'s rule.

    ``device_number`` is capped at the number of ranks, which it must then divide; ``None`` is one server of
    every rank.
    """
    topology = Topology(0, world, world if device_number is None else device_number)
    topology.check_servers()
    return topology.server_size


class _PeerFailed(Exception):
    """Raised inside a root's computation when the status exchange shows another rank failed."""


class _StatusExchange:
    """Status of every rank by one tiny AllGather per call (identity on one process).

    While the server roots prepare the PCA matrix, every rank calls :meth:`exchange` the same number of
    times: a root once per unit of work (one checkpoint read, one chunk), the others in a loop. Each
    collective therefore waits for at most one unit of work -- far below any backend timeout -- and all
    ranks see the same status vector, so they leave the loop on the same call.
    """

    BUSY, DONE, FAILED = 0.0, 1.0, 2.0

    def __init__(self, roots: Sequence[int]):
        self.gather = comm.AllGather()
        self.roots = list(roots)

    def exchange(self, status: float) -> np.ndarray:
        return self.gather(Tensor(np.array([status], np.float32))).asnumpy().reshape(-1)

    def failed(self, flags: np.ndarray) -> list:
        return [r for r, f in enumerate(flags) if f == self.FAILED]

    def tick(self) -> None:
        """A root between two units of work: report busy; stop if a peer failed."""
        flags = self.exchange(self.BUSY)
        if self.failed(flags):
            raise _PeerFailed(self.failed(flags))

    def wait(self, status: float) -> np.ndarray:
        """Report ``status`` until every root is done or some rank failed; returns the last status vector."""
        while True:
            flags = self.exchange(status)
            if self.failed(flags) or all(flags[r] == self.DONE for r in self.roots):
                return flags


def _root_prepare(target: str, specs, n_components: int, num_weights: int, pca_mat_path, weight_load_dir,
                  timeout: float, progress, heartbeat) -> None:
    """Server root: check an existing matrix, or compute it from the checkpoints into ``target``."""
    rank = comm.get_rank()
    if pca_mat_path and os.path.isfile(pca_mat_path):
        open_pca_matrix(target, n_components, num_weights)
        if progress:
            progress(f"rank {rank}: using PCA matrix {target}")
        return
    if not weight_load_dir:
        raise ValueError(f"dim_reduce.pca_mat_path={pca_mat_path!r} does not exist and weight_load_dir is None: "
                         f"nothing to compute the PCA matrix from.")
    if not os.path.isdir(weight_load_dir):
        raise ValueError(f"dim_reduce.weight_load_dir={str(weight_load_dir)!r} is not an existing folder; it must "
                         f"hold the stage-1 checkpoints the PCA matrix is computed from (pca_mat_path="
                         f"{pca_mat_path!r} {'does not exist' if pca_mat_path else 'is not given'}).")
    found = len(list_checkpoints(str(weight_load_dir)))
    if found < n_components + 1:
        raise ValueError(f"dim_reduce.n_components={n_components} needs at least {n_components + 1} stage-1 "
                         f"checkpoints in dim_reduce.weight_load_dir={str(weight_load_dir)!r} (centring removes one "
                         f"dimension), found {found}: save more in stage 1, or lower n_components.")
    folder = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(folder):
        raise ValueError(f"dim_reduce.pca_mat_path={target!r}: folder {folder!r} does not exist, so the computed "
                         f"PCA matrix cannot be saved there.")
    if progress:
        progress(f"rank {rank}: computing the PCA of {weight_load_dir} into {target}")
    compute_pca_matrix(str(weight_load_dir), n_components, specs, output=target, progress=progress,
                       deadline=time.monotonic() + float(timeout), heartbeat=heartbeat)


_MIN_CONNECT_SECONDS = 10.0  # starting / reaching the store under load: never less than this
_CALLS = itertools.count()  # handshakes in this process: a key namespace each, the same on every rank


class _StoreStatus:
    """Per-rank status flags in MindSpore's TCP key-value store; every wait bounded, missing ranks named.

    Keys (a fresh namespace per handshake): ``<ns>/<phase>/<rank>`` is 1 once the rank finished that phase;
    ``<ns>/fail/<rank>`` is 1 once it failed and ``<ns>/failed`` counts failed ranks (store values are
    counters, so success and failure never share a key). Reads use ``add(key, 0)``, which never blocks.
    """

    DONE = 1

    def __init__(self, address: tuple, rank: int, world: int, roots: Sequence[int], timeout: float):
        self.rank, self.world, self.roots = rank, world, list(roots)
        self.timeout = float(timeout)
        self.ns = f"ms_boost/pca_handshake/{next(_CALLS)}"
        try:
            self.store = comm.status_store(address, rank, world, max(_MIN_CONNECT_SECONDS, self.timeout))
        except Exception as exc:  # noqa: BLE001 -- name the rank that serves the store
            if rank == 0:
                raise RuntimeError(f"rank 0 cannot serve the PCA handshake store on {address[0]}:{address[1]} "
                                   f"({exc}); set MS_BOOST_STORE_PORT to a free port.") from None
            raise TimeoutError(f"rank {rank}: rank 0 did not reach the PCA handshake within dim_reduce.timeout="
                               f"{self.timeout:g} s (its store {address[0]}:{address[1]} is unreachable: {exc}); "
                               f"rank 0 is dead or stuck before the handshake.") from None

    def _add(self, key: str, amount: int) -> int:
        try:
            return int(self.store.add(f"{self.ns}/{key}", amount))
        except Exception as exc:  # noqa: BLE001
            raise RuntimeError(f"rank {self.rank}: the PCA handshake store (served by rank 0) failed: {exc}; "
                               f"rank 0 has probably stopped (see its error).") from None

    def done(self, phase: str) -> None:
        self._add(f"{phase}/{self.rank}", self.DONE)

    def report_failure(self) -> None:
        """Mark this rank failed, if the store still answers (the caller is already raising)."""
        try:
            self._add(f"fail/{self.rank}", 1)
            self._add("failed", 1)
        except RuntimeError:
            pass

    def status(self, phase: str, ranks: Sequence[int]) -> Dict[int, int]:
        return {r: self._add(f"{phase}/{r}", 0) for r in ranks}

    def failed_ranks(self) -> List[int]:
        if self._add("failed", 0) == 0:
            return []
        return [r for r in range(self.world) if self._add(f"fail/{r}", 0)]

    def tick(self) -> None:
        """A root between two units of work: stop if a peer failed."""
        failed = self.failed_ranks()
        if failed:
            raise _PeerFailed(failed)

    def wait(self, phase: str, ranks: Sequence[int], deadline: float, what: str) -> Dict[int, int]:
        """Poll until every rank of ``ranks`` has a status in ``phase`` or some rank failed.

        Raises:
            TimeoutError: ``deadline`` passed; names the ranks that never reached the handshake and those
                that reached it but have not finished ``what``.
        """
        flags: Dict[int, int] = {}

        def settled() -> bool:
            nonlocal flags
            flags = self.status(phase, ranks)
            return all(flags.values()) or bool(self._add("failed", 0))

        if not comm.poll(settled, deadline):  # the deadline passed: name who is missing
            pending = [r for r, v in flags.items() if not v]
            arrived = self.status("arrived", pending)
            absent = [r for r in pending if not arrived[r]]
            slow = [r for r in pending if arrived[r]]
            self.report_failure()  # release the others at once
            parts = []
            if absent:
                parts.append(f"rank(s) {absent} never reached the PCA handshake (dead, or alive but stuck)")
            if slow:
                parts.append(f"rank(s) {slow} reached it but did not finish {what}")
            raise TimeoutError(f"rank {self.rank}: {'; '.join(parts)} within dim_reduce.timeout="
                               f"{self.timeout:g} s; dim_reduce cannot start.")
        return flags


def _read_rows(target: str, n_components: int, num_weights: int, rank: int, world: int) -> np.ndarray:
    rows = local_pca_rows(open_pca_matrix(target, n_components, num_weights), n_components, rank, world)
    start = local_row_block(n_components, rank, world)[0]
    check_finite_rows(rows, target, first_row=start)
    return rows


def _prepare_with_store(address, target, specs, n_components, num_weights, pca_mat_path, weight_load_dir,
                        timeout, progress, rank, world, per_server) -> np.ndarray:
    start = time.monotonic()
    roots = list(range(0, world, per_server))
    status = _StoreStatus(address, rank, world, roots, timeout)
    status.done("arrived")
    if rank in roots:
        try:
            _root_prepare(target, specs, n_components, num_weights, pca_mat_path, weight_load_dir, timeout,
                          progress, status.tick)
        except _PeerFailed as exc:
            raise RuntimeError(f"rank {rank}: rank(s) {exc.args[0]} failed during the PCA handshake "
                               f"(see their error); dim_reduce cannot start.") from None
        except BaseException:
            status.report_failure()
            raise
        status.done("prepared")
    else:
        root = rank - rank % per_server
        # the root stops at its own deadline (timeout after it arrived); allow a little for its report
        flags = status.wait("prepared", [root], start + float(timeout) + 2.0,
                            f"preparing the PCA matrix {target!r}")
        failed = status.failed_ranks()
        if flags[root] != status.DONE:
            raise RuntimeError(f"rank {rank}: the PCA matrix could not be prepared by server root rank(s) "
                               f"{[root]} (see their error); dim_reduce cannot start.")
        if failed:
            raise RuntimeError(f"rank {rank}: rank(s) {failed} failed during the PCA handshake (see their error); "
                               f"dim_reduce cannot start.")
    try:
        rows = _read_rows(target, n_components, num_weights, rank, world)
    except BaseException as exc:
        status.report_failure()
        raise ValueError(f"rank {rank} cannot read the PCA matrix {target!r} prepared by its server's root "
                         f"rank {rank - rank % per_server}: {exc}") from exc
    status.done("read")
    deadline = max(start + float(timeout), time.monotonic() + min(float(timeout), 30.0))
    flags = status.wait("read", range(world), deadline, f"reading the PCA matrix {target!r}")
    failed = status.failed_ranks()
    if failed:
        raise RuntimeError(f"rank {rank}: rank(s) {failed} failed during the PCA handshake (see their error); "
                           f"dim_reduce cannot start.")
    return rows


def prepare_pca_matrix(specs: Sequence[ParamSpec], n_components: int, pca_mat_path: Optional[str] = None,
                       weight_load_dir: Optional[str] = None, timeout: float = 1800,
                       device_number: Optional[int] = None, progress=_stderr_progress) -> np.ndarray:
    """Get this rank's block of PCA rows: load ``pca_mat_path`` or compute it from ``weight_load_dir``.

    Protocol (no file polling, no long blocking collective):

    1. On each server (``device_number`` consecutive ranks) only the first rank -- the *root* -- touches
       the source: it checks ``pca_mat_path`` when that file exists, otherwise it computes the PCA of the
       checkpoints in ``weight_load_dir`` (streaming, :func:`compute_pca_matrix`) into ``pca_mat_path``
       (or ``weight_load_dir/pca_mat.npy``), written under a temporary name and renamed. The root stops
       with ``TimeoutError`` once ``timeout`` seconds have passed.
    2. Meanwhile every rank exchanges a status flag with one tiny AllGather per unit of the roots' work
       (:class:`_StatusExchange`) until every root is done or one failed. On failure every rank raises --
       the root its own error, the others a ``RuntimeError`` naming it -- so no rank is left waiting in a
       later collective, and the wait is bounded by the roots' ``timeout``.
    3. Every rank reads only its own block of rows from the finished file (memory map); one more flag
       exchange turns any read failure into an error on all ranks.
    4. Under msrun the flags live in MindSpore's TCP key-value store instead (module docstring): every
       rank first marks its arrival; each wait is bounded by ``timeout`` (reading: by ``timeout`` from the
       start, at least ``min(timeout, 30)`` s after this rank's own read), and a ``TimeoutError`` names the
       ranks that never reached the handshake (dead, or alive but stuck) and those still working. A rank
       that fails marks itself failed, so the others stop at their next poll.

    Args:
        specs: ``(name, shape)`` of the trainable parameters in network order.
        n_components: ``k``.
        pca_mat_path: an existing ``.npy`` to load, or where to save the computed matrix.
        weight_load_dir: folder of stage-1 checkpoints (needed when ``pca_mat_path`` does not exist).
        timeout: seconds the root may spend preparing the matrix.
        device_number: ranks per server (``common.device_number``); capped at the world size.
        progress: message sink for the root's progress (None: silent).

    Returns:
        ``(ceil(k / R), M)`` float32 block of rows for this rank (zero-padded).

    Raises:
        ValueError: neither source given, bad shapes, too few checkpoints (see :func:`compute_pca_matrix`).
        TimeoutError: the root ran out of ``timeout``.
        RuntimeError: another rank failed to prepare or read the matrix.
    """
    rank, world = comm.get_rank(), comm.get_size()
    per_server = _devices_per_server(device_number, world)
    num_weights = int(sum(int(np.prod(s, dtype=np.int64)) for _, s in specs))
    if not pca_mat_path and not weight_load_dir:
        raise ValueError("dim_reduce needs pca_mat_path (an existing PCA matrix .npy) or weight_load_dir "
                         "(a folder of stage-1 checkpoints to compute it from); both are None.")
    if pca_mat_path and not str(pca_mat_path).endswith(".npy"):
        raise ValueError(f"dim_reduce.pca_mat_path={pca_mat_path!r} must name a .npy file.")
    target = str(pca_mat_path) if pca_mat_path else os.path.join(str(weight_load_dir), DEFAULT_PCA_FILE_NAME)
    address = comm.status_store_address() if world > 1 else None
    if address is not None:
        return _prepare_with_store(address, target, specs, n_components, num_weights, pca_mat_path,
                                   weight_load_dir, timeout, progress, rank, world, per_server)
    status = _StatusExchange(range(0, world, per_server))
    error = None
    if rank % per_server == 0:
        try:
            _root_prepare(target, specs, n_components, num_weights, pca_mat_path, weight_load_dir, timeout,
                          progress, status.tick)
        except _PeerFailed as exc:  # the exchange that showed it was the last one for every rank
            raise RuntimeError(f"rank {rank}: rank(s) {exc.args[0]} failed to prepare the PCA matrix "
                               f"(see their error); dim_reduce cannot start.") from None
        except Exception as exc:  # noqa: BLE001 -- any failure must reach the other ranks, then re-raise
            error = exc
        flags = status.wait(status.FAILED if error is not None else status.DONE)
    else:
        flags = status.wait(status.BUSY)
    if error is not None:
        raise error
    if status.failed(flags):
        raise RuntimeError(f"rank {rank}: the PCA matrix could not be prepared by server root rank(s) "
                           f"{status.failed(flags)} (see their error); dim_reduce cannot start.")
    try:
        rows = _read_rows(target, n_components, num_weights, rank, world)
    except Exception as exc:  # noqa: BLE001 -- reported to every rank first
        error = exc
    failed = status.failed(status.exchange(status.FAILED if error is not None else status.DONE))
    if error is not None:
        raise ValueError(f"rank {rank} cannot read the PCA matrix {target!r} prepared by its server's root "
                         f"rank {rank - rank % per_server}: {error}") from error
    if failed:
        raise RuntimeError(f"rank(s) {failed} could not read the PCA matrix {target!r}; dim_reduce cannot start.")
    return rows

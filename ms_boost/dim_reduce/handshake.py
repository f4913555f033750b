"""The PCA-matrix handshake of dimension-reduce training: every rank gets its block of PCA rows.

Before stage 2 starts, the first rank of every server (its *root*) loads or computes the PCA matrix
(:func:`ms_boost.dim_reduce.pca.compute_pca_matrix`) while every rank waits on a status board
(:func:`ms_boost.comm.open_status_board`), so every rank leaves together -- with the rows, or with an error
naming the rank that failed. The board's transport (a TCP store under ``msrun``: bounded by ``dim_reduce.timeout``,
a rank that never arrives named; else tiny collectives) is chosen by :mod:`ms_boost.comm`; this module makes the
same calls on either (see ``docs/dim_reduce.md``).
"""
from __future__ import annotations

import os
import sys
import time
from typing import Callable, Optional, Sequence

import numpy as np

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


def _root_prepare(target: str, specs: Sequence[ParamSpec], n_components: int, num_weights: int,
                  pca_mat_path: Optional[str], weight_load_dir: Optional[str], timeout: float,
                  progress: Optional[Callable[[str], None]], heartbeat: Callable[[], None]) -> None:
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


def _post(board: comm.StatusBoard, phase: str, error: Optional[BaseException]) -> None:
    """Post this rank's result of ``phase``; an interrupt (not an ``Exception``) is raised at once, unwaited."""
    board.post(phase, error is None)
    if error is not None and not isinstance(error, Exception):
        raise error


def _read_rows(target: str, n_components: int, num_weights: int, rank: int, world: int) -> np.ndarray:
    rows = local_pca_rows(open_pca_matrix(target, n_components, num_weights), n_components, rank, world)
    start = local_row_block(n_components, rank, world)[0]
    check_finite_rows(rows, target, first_row=start)
    return rows


def _missing_on_member(rank: int, root: int, target: str, pca_mat_path: Optional[str],
                       weight_load_dir: Optional[str]) -> str:
    """The error of a rank whose matrix path does not exist after its root prepared the root's own path.

    The usual cause: a data-parallel script that saved its stage-1 checkpoints per rank and gives each rank its
    own ``weight_load_dir`` (or ``pca_mat_path``); only the root computes, into the path it was given.
    """
    given = (f"dim_reduce.pca_mat_path={pca_mat_path!r}" if pca_mat_path
             else f"dim_reduce.weight_load_dir={weight_load_dir!r} (the matrix goes to weight_load_dir/"
                  f"{DEFAULT_PCA_FILE_NAME})")
    return (f"rank {rank} cannot read the PCA matrix {target!r}: the file does not exist, although its server's "
            f"root rank {root} has prepared the matrix at the path that rank was given. Only the root computes it "
            f"(or loads it), so every rank of a server must name the same dim_reduce.pca_mat_path and "
            f"weight_load_dir, in a folder the ranks share; this rank has {given}. With stage-1 checkpoints saved "
            f"per rank, give every rank the root's folder (e.g. rank {root}'s), or the same pca_mat_path.")


def prepare_pca_matrix(specs: Sequence[ParamSpec], n_components: int, pca_mat_path: Optional[str] = None,
                       weight_load_dir: Optional[str] = None, timeout: float = 1800,
                       device_number: Optional[int] = None,
                       progress: Optional[Callable[[str], None]] = _stderr_progress) -> np.ndarray:
    """Get this rank's block of PCA rows: load ``pca_mat_path`` or compute it from ``weight_load_dir``.

    Protocol (no file polling, no long blocking collective), over a status board (:mod:`ms_boost.comm`):

    1. On each server (``device_number`` consecutive ranks) only the first rank -- the *root* -- touches
       the source: it checks ``pca_mat_path`` when that file exists, otherwise it computes the PCA of the
       checkpoints in ``weight_load_dir`` (streaming, :func:`compute_pca_matrix`) into ``pca_mat_path``
       (or ``weight_load_dir/pca_mat.npy``), written under a temporary name and renamed. The root stops
       with ``TimeoutError`` once ``timeout`` seconds have passed, and checks the board between two units of
       its work (one checkpoint read, one chunk), stopping when another rank failed.
    2. Every root posts ``prepared`` (done or failed) and every rank waits until all roots are done or one
       failed. On failure every rank raises -- the root its own error, the others a ``RuntimeError`` naming
       it -- so no rank is left waiting in a later collective.
    3. Every rank reads only its own block of rows from the finished file (memory map) and posts ``read``;
       the wait on every rank turns any read failure into an error on all ranks.

    The board's transport decides how a wait is bounded. Under msrun (MindSpore's TCP store) every rank
    first marks its arrival; each wait is bounded by ``timeout`` (reading: by ``timeout`` from the start, at
    least ``min(timeout, 30)`` s after this rank's own read), and a ``TimeoutError`` names the ranks that never
    reached the handshake (dead, or alive but stuck) and those still working; a rank that fails marks itself
    failed, so the others stop at their next poll. Over collectives (no scheduler address) every wait is a
    loop of tiny AllGathers, one per unit of the roots' work, bounded by the backend's collective timeout.

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
        TimeoutError: the root ran out of ``timeout``; under msrun also a rank that did not arrive or finish in
            time (named).
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
    start = time.monotonic()
    board = comm.open_status_board(comm.Handshake(key="pca_handshake", name="the PCA handshake",
                                                  timeout=float(timeout), timeout_name="dim_reduce.timeout",
                                                  outcome="dim_reduce cannot start"))
    roots = list(range(0, world, per_server))
    root = rank - rank % per_server
    error: Optional[BaseException] = None
    if rank == root:
        try:
            _root_prepare(target, specs, n_components, num_weights, pca_mat_path, weight_load_dir, timeout,
                          progress, board.check)
        except comm.PeerFailed as exc:  # the board's last word for every rank: nobody waits for this one
            raise RuntimeError(f"rank {rank}: rank(s) {exc.ranks} failed during the PCA handshake (see their "
                               f"error); dim_reduce cannot start.") from None
        except BaseException as exc:  # noqa: BLE001 -- any failure must reach the other ranks, then re-raise
            error = exc
        _post(board, "prepared", error)
    # a root stops at its own deadline (timeout after it arrived); allow a little for its report
    settled = board.wait("prepared", roots, start + float(timeout) + 2.0, f"preparing the PCA matrix {target!r}")
    if error is not None:
        raise error
    if settled.unfinished:
        raise RuntimeError(f"rank {rank}: the PCA matrix could not be prepared by server root rank(s) "
                           f"{settled.unfinished} (see their error); dim_reduce cannot start.")
    if settled.failed:
        raise RuntimeError(f"rank {rank}: rank(s) {settled.failed} failed during the PCA handshake (see their "
                           f"error); dim_reduce cannot start.")
    try:
        rows = _read_rows(target, n_components, num_weights, rank, world)
    except BaseException as exc:  # noqa: BLE001 -- reported to every rank first
        error = exc
    _post(board, "read", error)
    deadline = max(start + float(timeout), time.monotonic() + min(float(timeout), 30.0))
    settled = board.wait("read", range(world), deadline, f"reading the PCA matrix {target!r}")
    if error is not None:
        if rank != root and not os.path.exists(target):
            raise ValueError(_missing_on_member(rank, root, target, pca_mat_path, weight_load_dir)) from error
        raise ValueError(f"rank {rank} cannot read the PCA matrix {target!r} prepared by its server's root "
                         f"rank {root}: {error}") from error
    if settled.failed:
        raise RuntimeError(f"rank {rank}: rank(s) {settled.failed} could not read the PCA matrix {target!r} (see "
                           f"their error); dim_reduce cannot start.")
    return rows

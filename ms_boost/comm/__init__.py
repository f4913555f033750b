"""Communication layer of ms_boost: the only package that talks to :mod:`mindspore.communication`.

Algorithms reach other ranks through the names here, never through MindSpore's communication modules, a
scheduler's environment variables or a backend test:

* :mod:`ms_boost.comm.collectives` -- ranks, groups and the collective cells (``AllReduce``, ``AllGather``,
  ``Broadcast``, ``GradReducer``, ``barrier``); the identity on one process; :func:`use_backend`, the seam through
  which tests serve them from an in-process loopback world.
* :mod:`ms_boost.comm.status_board` -- the :class:`StatusBoard` protocol of per-rank phase flags (handshakes that
  wait on long work, bounded, naming missing ranks) and its two transports, a TCP store and collectives, picked
  in one place by :func:`open_status_board`.
"""
from __future__ import annotations

from ms_boost.comm.collectives import (
    AllGather,
    AllReduce,
    Broadcast,
    GradReducer,
    barrier,
    collectives_compile,
    create_group,
    data_parallel_reduce_config,
    get_rank,
    get_size,
    is_initialized,
    server_groups,
    server_ranks,
    server_size,
    uninitialised_parallel_mode,
    use_backend,
    uses_stand_in_backend,
    world_group,
)
from ms_boost.comm.status_board import (
    CollectiveStatusBoard,
    Handshake,
    PeerFailed,
    Settled,
    StatusBoard,
    StoreStatusBoard,
    open_status_board,
    poll,
    status_store,
    status_store_address,
)

__all__ = [
    "is_initialized", "get_rank", "get_size", "world_group", "create_group", "server_size", "server_ranks",
    "server_groups", "barrier", "data_parallel_reduce_config", "use_backend", "uses_stand_in_backend",
    "collectives_compile", "uninitialised_parallel_mode", "AllReduce", "AllGather", "Broadcast", "GradReducer",
    "StatusBoard", "Handshake", "PeerFailed", "Settled", "open_status_board", "CollectiveStatusBoard",
    "StoreStatusBoard",
    "status_store_address", "status_store", "poll",
]

"""Ranks, groups and collectives: the part of :mod:`ms_boost.comm` that talks to :mod:`mindspore.communication`.

It works the same over HCCL (Ascend), NCCL (GPU) and MCCL (CPU under ``msrun``): nothing here names a backend, a
group literal or a device count. When communication has not been initialised (a plain single-process run) every
collective is the identity, :func:`get_size` is 1 and :func:`get_rank` is 0, so algorithm code never
branches on "distributed or not".

Cells (usable inside ``construct`` in PyNative and Graph mode):

* :class:`AllReduce` -- sum / max / min / prod over a group (``"mean"`` divides the sum by the group size).
* :class:`AllGather` -- concatenation along axis 0 in rank order.
* :class:`Broadcast` -- the root's tensor on every rank.
* :class:`GradReducer` -- data-parallel reduction of a tuple of gradients.

Functions (Python side, at build time): :func:`is_initialized`, :func:`get_rank`, :func:`get_size`,
:func:`world_group`, :func:`create_group`, :func:`server_size`, :func:`server_ranks`, :func:`server_groups`,
:func:`barrier`,
:func:`data_parallel_reduce_config`, and :func:`use_backend`, through which tests serve all of the above from
an in-process loopback world of N simulated ranks (``tests/helpers/loopback.py``).
"""
from __future__ import annotations

import hashlib
from typing import Optional, Sequence, Tuple

import mindspore as ms
from mindspore import Tensor, nn, ops
from mindspore.communication import management as _mgmt

__all__ = [
    "is_initialized", "get_rank", "get_size", "world_group", "create_group", "server_size", "server_ranks",
    "server_groups", "barrier", "data_parallel_reduce_config", "use_backend", "uses_stand_in_backend", "AllReduce",
    "AllGather", "Broadcast", "GradReducer", "collectives_compile", "uninitialised_parallel_mode",
]

_CREATED_GROUPS: dict = {}

# Where ranks, groups, collective primitives and the parallel context come from. None: MindSpore itself
# (mindspore.communication, ops.AllReduce/AllGather/Broadcast, nn.DistributedGradReducer). Tests install an
# in-process loopback world of N simulated ranks (tests/helpers/loopback.py) that serves the same names.
_BACKEND = None


def use_backend(backend) -> object:
    """Serve every rank query and collective of this module from ``backend`` (None: MindSpore's).

    ``backend`` provides ``GlobalComm`` (``INITED``, ``WORLD_COMM_GROUP``), ``get_rank``, ``get_group_size``,
    ``create_group``, ``AllReduce``, ``AllGather``, ``Broadcast``, ``DistributedGradReducer`` and
    ``get_auto_parallel_context`` with MindSpore's signatures. Returns the previous backend; groups created
    under it are forgotten.
    """
    global _BACKEND
    previous, _BACKEND = _BACKEND, backend
    _CREATED_GROUPS.clear()
    return previous


def uses_stand_in_backend() -> bool:
    """True while :func:`use_backend` serves a stand-in (e.g. a test's loopback world) instead of MindSpore."""
    return _BACKEND is not None


def collectives_compile() -> bool:
    """Whether this process's collectives can run inside a compiled graph.

    MindSpore's own collectives compile (one device or several ranks); a stand-in backend installed with
    :func:`use_backend` serves Python collectives (the tests' loopback world), which run only op by op.
    """
    return _BACKEND is None or bool(getattr(_BACKEND, "COLLECTIVES_COMPILE", False))


def _api(module):
    """``module`` (mindspore, ops, nn or the management module), or the installed backend that stands in for it."""
    return module if _BACKEND is None else _BACKEND


def is_initialized() -> bool:
    """Whether ``mindspore.communication.init()`` has run in this process."""
    return bool(getattr(_api(_mgmt).GlobalComm, "INITED", False))


def world_group() -> str:
    """Name of the group holding every rank (backend specific, read from MindSpore)."""
    return _api(_mgmt).GlobalComm.WORLD_COMM_GROUP


def get_rank(group: Optional[str] = None) -> int:
    """Rank of this process in ``group`` (world by default); 0 without communication."""
    if not is_initialized():
        return 0
    return int(_api(_mgmt).get_rank(group or world_group()))


def get_size(group: Optional[str] = None) -> int:
    """Number of ranks in ``group`` (world by default); 1 without communication."""
    if not is_initialized():
        return 1
    return int(_api(_mgmt).get_group_size(group or world_group()))


def create_group(rank_ids: Sequence[int], prefix: str = "ms_boost") -> str:
    """Create (once) a communication group over ``rank_ids`` and return its name.

    The name is derived from the rank list, so every rank that asks for the same ranks gets the
    same group, and asking twice does not create it twice. A group equal to the whole world is
    answered with the world group itself.

    Args:
        rank_ids: world ranks of the group, any order (sorted internally); must hold this rank.
        prefix: readable prefix of the generated name.

    Raises:
        ValueError: empty or duplicated ``rank_ids``, or ranks outside ``[0, world size)``.
    """
    ranks = sorted(int(r) for r in rank_ids)
    size = get_size()
    if not ranks or len(set(ranks)) != len(ranks) or ranks[0] < 0 or ranks[-1] >= size:
        raise ValueError(f"create_group: rank_ids={list(rank_ids)} must be distinct ranks in [0, {size}).")
    if not is_initialized() or len(ranks) == size:
        return world_group()
    digest = hashlib.sha1(",".join(map(str, ranks)).encode()).hexdigest()[:10]
    name = f"{prefix}_{len(ranks)}_{digest}"
    if name not in _CREATED_GROUPS:
        _api(_mgmt).create_group(name, ranks)
        _CREATED_GROUPS[name] = tuple(ranks)
    return name


def server_size(device_number: int, ranks: Optional[int] = None) -> int:
    """Ranks per server: ``device_number`` capped at ``ranks`` (the world size when None).

    Fewer ranks than ``common.device_number`` (8 by default) all sit on one server.
    """
    return min(device_number, get_size() if ranks is None else ranks)


def server_ranks(server_size: int, size: int) -> Tuple[Tuple[int, ...], ...]:
    """The rank lists of the servers.

    server ``s`` holds ranks ``[s*server_size, (s+1)*server_size)`` (the layout of HCCL rank tables and of ``msrun``
    node ranks; ``server_size`` divides ``size``). The one place the layout is computed (:func:`server_groups` and
    :class:`~ms_boost.topology.Topology` read it).
    """
    return tuple(tuple(range(s, s + server_size)) for s in range(0, size, server_size))


def server_groups(device_number: int) -> tuple:
    """Split the world into servers of ``device_number`` consecutive ranks.

    Ranks ``[s*device_number, (s+1)*device_number)`` form server ``s`` (the layout of HCCL rank
    tables and of ``msrun`` node ranks). Only the group of this rank's own server is created.

    Args:
        device_number: devices per server (``common.device_number``); must divide the world size.

    Returns:
        ``(my_group_name, servers)`` where ``servers`` is the list of rank lists of every server.

    Raises:
        ValueError: ``device_number`` < 1 or not a divisor of the world size.
    """
    size = get_size()
    if not isinstance(device_number, int) or device_number < 1 or size % device_number:
        raise ValueError(
            f"common.device_number={device_number!r} must be a positive divisor of the number of ranks ({size}).")
    servers = [list(ranks) for ranks in server_ranks(device_number, size)]
    mine = servers[get_rank() // device_number]
    if device_number == 1:
        return None, servers
    return create_group(mine, prefix="ms_boost_server"), servers


def data_parallel_reduce_config() -> tuple:
    """Whether gradients must be reduced across ranks, and how, from MindSpore's parallel context.

    Returns:
        ``(reduce, mean, degree)``: ``reduce`` is True in data/hybrid parallel mode with more than one
        rank; ``mean`` is the context's ``gradients_mean``; ``degree`` the context's device number
        (the world size when unset).
    """
    mode = _api(ms).get_auto_parallel_context("parallel_mode")
    reduce = is_initialized() and get_size() > 1 and mode in ("data_parallel", "hybrid_parallel")
    mean = bool(_api(ms).get_auto_parallel_context("gradients_mean"))
    degree = int(_api(ms).get_auto_parallel_context("device_num") or 0) if reduce else 0
    # device_num defaults to 1 when the user did not set it: the world size is the degree then
    return reduce, mean, degree if degree > 1 else get_size()


def uninitialised_parallel_mode() -> Optional[str]:
    """The context's data/hybrid ``parallel_mode`` when communication is not initialised, else None.

    (The script never called ``mindspore.communication.init()``, or was started without msrun.) Such a process
    trains alone: there are no other ranks to reduce with.
    """
    mode = _api(ms).get_auto_parallel_context("parallel_mode")
    if mode in ("data_parallel", "hybrid_parallel") and not is_initialized():
        return str(mode)
    return None


_REDUCE_OPS = ("sum", "mean", "max", "min", "prod")


class AllReduce(nn.Cell):
    """All-reduce one tensor over ``group``; identity on a single rank.

    ``"sum"`` and ``"mean"`` use the backend's AllReduce. ``"max"``, ``"min"`` and ``"prod"`` gather every
    rank's tensor and reduce locally: MindSpore's CPU backend (MCCL) sums whatever reduce op it is given,
    so this is the form that is right on every backend (meant for small tensors such as flags).

    Args:
        op: ``"sum"``, ``"mean"``, ``"max"``, ``"min"`` or ``"prod"``.
        group: group name from :func:`create_group`/:func:`server_groups`; ``None`` is the world.
        enabled: False makes the cell the identity (e.g. ranks that train independently, not data parallel).
    """

    def __init__(self, op: str = "sum", group: Optional[str] = None, enabled: bool = True):
        super().__init__()
        if op not in _REDUCE_OPS:
            raise ValueError(f"AllReduce: op={op!r} is not one of {sorted(_REDUCE_OPS)}.")
        self.size = get_size(group)
        self.active = bool(enabled) and self.size > 1
        self.mean = op == "mean"
        self.gathered = op in ("max", "min", "prod")
        self.op = op
        if self.active:
            if self.gathered:
                self.gather = _api(ops).AllGather(group or world_group())
            else:
                self.reduce = _api(ops).AllReduce(ops.ReduceOp.SUM, group or world_group())

    def construct(self, x):
        """The reduction of ``x`` over the group (``x`` itself on one process)."""
        if not self.active:
            return x
        if self.gathered:
            stacked = self.gather(ops.expand_dims(x, 0))
            if self.op == "max":
                return stacked.max(axis=0)
            if self.op == "min":
                return stacked.min(axis=0)
            return ops.prod(stacked, 0)
        y = self.reduce(x)
        if self.mean:
            y = y / self.size
        return y


class AllGather(nn.Cell):
    """Concatenate each rank's tensor along axis 0, in rank order; identity on a single rank."""

    def __init__(self, group: Optional[str] = None):
        super().__init__()
        self.active = get_size(group) > 1
        if self.active:
            self.gather = _api(ops).AllGather(group or world_group())

    def construct(self, x):
        """``x`` of every rank of the group, concatenated along axis 0 (``x`` on one process)."""
        if self.active:
            return self.gather(x)
        return x


class Broadcast(nn.Cell):
    """Send the tensor of global rank ``root`` to every rank of ``group``; identity on a single rank."""

    def __init__(self, root: int = 0, group: Optional[str] = None):
        super().__init__()
        self.active = get_size(group) > 1
        if self.active:
            self.bcast = _api(ops).Broadcast(int(root), group or world_group())

    def construct(self, x):
        """The root's ``x`` on every rank of the group (``x`` on one process)."""
        if self.active:
            return self.bcast((x,))[0]
        return x


class GradReducer(nn.Cell):
    """Data-parallel reduction of a gradient tuple: sum over ``group``, divided by ``degree`` if ``mean``.

    Args:
        parameters: the parameters the gradients belong to (their count sizes the fused reduction).
        mean: divide by ``degree`` after summing.
        degree: number of ranks summed (defaults to the group size).
        group: ``None`` for the world.
        enabled: False makes the cell the identity (e.g. stand-alone mode with communication initialised).
    """

    def __init__(self, parameters, mean: bool = True, degree: Optional[int] = None, group: Optional[str] = None,
                 enabled: bool = True):
        super().__init__()
        size = get_size(group)
        self.active = bool(enabled) and size > 1
        if self.active:
            self.reducer = _api(nn).DistributedGradReducer(parameters, mean, degree or size,
                                                           group=group or world_group())

    def construct(self, grads):
        """The gradients reduced across the group (summed, divided by ``degree`` when ``mean``), or unchanged."""
        if self.active:
            return self.reducer(grads)
        return grads


def barrier(group: Optional[str] = None) -> None:
    """Block until every rank of ``group`` reaches this point (no-op on one rank).

    Implemented with a tiny all-reduce, which every backend supports and which, unlike polling a
    file, cannot miss a rank: a rank that never arrives makes the collective time out with the
    backend's error instead of hanging silently forever.
    """
    if get_size(group) <= 1:
        return
    token = Tensor([1.0], ms.float32)
    out = _api(ops).AllReduce(ops.ReduceOp.SUM, group or world_group())(token)
    out.asnumpy()

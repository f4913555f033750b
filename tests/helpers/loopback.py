"""An in-process loopback world: N simulated ranks in one process, for multi-rank unit tests.

:func:`run_ranks` runs ``fn(rank)`` for every rank of a world of ``size`` ranks, each in its own Python
thread, and returns the per-rank results in rank order. While it runs, :mod:`ms_boost.comm` is served by
the world (:func:`ms_boost.comm.use_backend`): ``comm.get_rank()`` is the calling thread's rank,
``comm.get_size()`` the world size, ``create_group``/``server_groups`` make real sub-groups, and the
collective primitives behind ``comm.AllReduce``, ``AllGather``, ``Broadcast``, ``GradReducer`` and
``barrier`` exchange the ranks' tensors. The library's own multi-rank code paths (server groups, the
reducer's mean, AdaSum's tree over the gathered shards, DimReduce's row blocks, THOR's factor owners and
broadcasts) run unchanged; only the transport is simulated.

Scheduling is deterministic and one rank runs at a time: rank threads take turns (the lowest-numbered
rank that is not blocked runs) and switch only at collectives, so MindSpore never sees two Python
threads at once and global state (random seeds, the execution mode) behaves as in a single process.
A collective completes when every rank of its group has called it; the k-th call of a group on one rank
meets the k-th call on the others, which must be the same kind of collective on the same shape (else
every rank fails with a message naming both). A rank that raises fails the whole world (the others
raise too, as an msrun job would); ranks that wait for each other forever fail with a deadlock error.

The world reports ``parallel_mode="data_parallel"`` (or the ``parallel_mode`` given, e.g. ``"stand_alone"``: ranks
that train on their own) with ``gradients_mean`` (default True) to
``comm.data_parallel_reduce_config``; MindSpore's own parallel context is untouched.

Limits: PyNative mode only (a collective is Python code that meets the other threads; Graph-mode
construct cannot call it), so Graph-mode multi-rank runs stay under ``msrun``. Collectives inside
``ms.jit`` functions are not supported either (ms_boost calls them between compiled pieces).
"""
from __future__ import annotations

import functools
import threading
from typing import Any, Callable, List, Optional, Sequence

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn

from ms_boost import comm

WORLD_GROUP = "loopback_world"


class LoopbackError(RuntimeError):
    """A rank of the loopback world failed, or the ranks disagree at a collective, or they deadlock."""


class _GlobalComm:
    INITED = True
    WORLD_COMM_GROUP = WORLD_GROUP


class LoopbackWorld:
    """The ranks, groups and collectives of one simulated job (see the module docstring).

    Args:
        size: number of ranks (>= 1).
        gradients_mean: the parallel context's ``gradients_mean`` seen by ``comm``.
        device_num: the parallel context's ``device_num`` (0: unset, the world size is used).
    """

    GlobalComm = _GlobalComm

    def __init__(self, size: int, gradients_mean: bool = True, device_num: int = 0,
                 parallel_mode: str = "data_parallel"):
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"LoopbackWorld: size={size!r} must be an int >= 1.")
        self.size = size
        self.context = {"parallel_mode": parallel_mode, "gradients_mean": bool(gradients_mean),
                        "device_num": int(device_num)}
        self.groups = {WORLD_GROUP: tuple(range(size))}
        self._local = threading.local()
        self._cond = threading.Condition()
        self._current = 0  # the rank allowed to run
        self._state = ["ready"] * size  # ready | blocked | done
        self._pending: dict = {}  # (group, seq) -> {"kind", "shapes", "values": {rank: value}, "result"}
        self._seq: List[dict] = [{} for _ in range(size)]  # per rank: group -> number of collectives called
        self._error: Optional[str] = None
        self.collectives = 0  # completed collectives (tests check that communication really happened)

    # ------------------------------------------------------------------ mindspore.communication stand-ins
    def rank(self) -> int:
        rank = getattr(self._local, "rank", None)
        if rank is None:
            raise LoopbackError("ms_boost.comm was called outside a rank thread of the loopback world.")
        return rank

    def _members(self, group: Optional[str]) -> tuple:
        group = group or WORLD_GROUP
        if group not in self.groups:
            raise LoopbackError(f"group {group!r} was never created in the loopback world.")
        return self.groups[group]

    def get_rank(self, group: Optional[str] = None) -> int:
        return self._members(group).index(self.rank())

    def get_group_size(self, group: Optional[str] = None) -> int:
        return len(self._members(group))

    def create_group(self, name: str, ranks: Sequence[int]) -> None:
        ranks = tuple(int(r) for r in ranks)
        if self.groups.setdefault(name, ranks) != ranks:
            raise LoopbackError(f"group {name!r} created with ranks {ranks} and {self.groups[name]}.")
        if self.rank() not in ranks:
            raise LoopbackError(f"rank {self.rank()} creates group {name!r} of ranks {ranks} without being in it.")

    def get_auto_parallel_context(self, key: str) -> Any:
        if key not in self.context:
            return ms.get_auto_parallel_context(key)
        return self.context[key]

    # ------------------------------------------------------------------ collective primitives (Cells)
    def AllReduce(self, op=None, group: Optional[str] = None) -> nn.Cell:  # noqa: N802 (MindSpore's name)
        if op is not None and op != ms.ops.ReduceOp.SUM:
            raise LoopbackError(f"AllReduce op={op!r}: the loopback world (like MCCL on CPU) only sums.")
        return _Collective(self, "all_reduce_sum", group)

    def AllGather(self, group: Optional[str] = None) -> nn.Cell:  # noqa: N802
        return _Collective(self, "all_gather", group)

    def Broadcast(self, root_rank: int, group: Optional[str] = None) -> nn.Cell:  # noqa: N802
        return _Collective(self, "broadcast", group, root=int(root_rank))

    def DistributedGradReducer(self, parameters, mean: bool = True, degree: Optional[int] = None,  # noqa: N802
                               group: Optional[str] = None, **_unused) -> nn.Cell:
        return _Collective(self, "grad_reduce", group, mean=bool(mean),
                           degree=degree or self.get_group_size(group))

    # ------------------------------------------------------------------ scheduling
    def _wait_turn(self, rank: int) -> None:
        """Block (condition held) until ``rank`` may run, or raise when the world failed."""
        while self._current != rank and self._error is None:
            self._cond.wait(timeout=5)
        if self._error is not None:
            raise LoopbackError(self._error)

    def _hand_over(self) -> None:
        """Give the turn to the lowest ready rank (condition held); detect a deadlock."""
        ready = [r for r in range(self.size) if self._state[r] == "ready"]
        if ready:
            self._current = ready[0]
        elif any(s == "blocked" for s in self._state) and self._error is None:
            waiting = {key: sorted(p["values"]) for key, p in self._pending.items() if p["result"] is None}
            self._error = ("deadlock: every live rank waits at a collective that some rank never calls "
                           f"(group, call number) -> ranks arrived: {waiting}")
        self._cond.notify_all()

    def exchange(self, kind: str, group: Optional[str], value, **options):
        """Contribute ``value`` (numpy arrays) to the next ``kind`` collective of ``group``; return its result."""
        rank = self.rank()
        group = group or WORLD_GROUP
        members = self._members(group)
        with self._cond:
            seq = self._seq[rank].get(group, 0)
            self._seq[rank][group] = seq + 1
            entry = self._pending.setdefault((group, seq), {"kind": (kind, options), "shapes": _shapes(value),
                                                            "values": {}, "result": None, "first": rank})
            if entry["kind"] != (kind, options) or entry["shapes"] != _shapes(value):
                self._error = (f"collective #{seq} of group {group!r}: rank {entry['first']} called "
                               f"{entry['kind']} on shapes {entry['shapes']}, rank {rank} called {(kind, options)} "
                               f"on shapes {_shapes(value)}")
                self._cond.notify_all()
                raise LoopbackError(self._error)
            entry["values"][rank] = value
            if len(entry["values"]) == len(members):
                try:
                    entry["result"] = _combine(kind, [entry["values"][r] for r in members], members, options)
                except LoopbackError as exc:
                    self._error = str(exc)
                    self._cond.notify_all()
                    raise
                self.collectives += 1
                for r in members:
                    self._state[r] = "ready"
            else:
                self._state[rank] = "blocked"
            self._hand_over()
            self._wait_turn(rank)
            result = entry["result"]
            entry.setdefault("taken", set()).add(rank)
            if len(entry["taken"]) == len(members):
                del self._pending[(group, seq)]
            return result

    def run(self, fn: Callable[[int], Any], timeout: float = 600) -> list:
        """Run ``fn(rank)`` on every rank (PyNative mode); return the results in rank order."""
        if ms.get_context("mode") != ms.PYNATIVE_MODE:
            raise LoopbackError("the loopback world runs in PYNATIVE_MODE only (Graph-mode collectives need msrun).")
        results: list = [None] * self.size
        errors: dict = {}

        def body(rank: int) -> None:
            self._local.rank = rank
            with self._cond:
                try:
                    self._wait_turn(rank)
                except LoopbackError:
                    self._state[rank] = "done"
                    return
            try:
                results[rank] = fn(rank)
            except BaseException as exc:  # noqa: BLE001 -- reported below, with the rank
                errors[rank] = exc
                with self._cond:
                    if self._error is None:
                        self._error = f"rank {rank} failed: {type(exc).__name__}: {exc}"
            finally:
                with self._cond:
                    self._state[rank] = "done"
                    self._hand_over()

        previous = comm.use_backend(self)
        try:
            threads = [threading.Thread(target=body, args=(r,), name=f"loopback-rank-{r}", daemon=True)
                       for r in range(self.size)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout)
            if any(t.is_alive() for t in threads):
                with self._cond:
                    self._error = self._error or f"timeout after {timeout}s"
                    self._cond.notify_all()
                raise LoopbackError(f"loopback world of {self.size} ranks did not finish: {self._error}")
        finally:
            comm.use_backend(previous)
        if errors:
            first = min(errors, key=lambda r: (isinstance(errors[r], LoopbackError), r))  # the root cause first
            raise errors[first]
        if self._error is not None:
            raise LoopbackError(self._error)
        return results


def run_ranks(size: int, fn: Callable[[int], Any], **world_options) -> list:
    """Run ``fn(rank)`` on each rank of a new :class:`LoopbackWorld` of ``size`` ranks; results in rank order."""
    return LoopbackWorld(size, **world_options).run(fn)


# ---------------------------------------------------------------------------------------------- internals
class _Collective(nn.Cell):
    """A collective primitive of the loopback world, called from a PyNative ``construct``."""

    def __init__(self, world: LoopbackWorld, kind: str, group: Optional[str], **options):
        super().__init__()
        self.world, self.kind, self.group, self.options = world, kind, group or WORLD_GROUP, options
        world._members(self.group)  # fail at build time on an unknown group, as MindSpore does

    def construct(self, x):
        if self.kind in ("broadcast", "grad_reduce"):  # tuple in, tuple out
            arrays = tuple(t.asnumpy() for t in x)
            out = self.world.exchange(self.kind, self.group, arrays, **self.options)
            return tuple(Tensor(a) for a in out)
        return Tensor(self.world.exchange(self.kind, self.group, x.asnumpy(), **self.options))


def _shapes(value) -> tuple:
    if isinstance(value, tuple):
        return tuple((a.shape, str(a.dtype)) for a in value)
    return (value.shape, str(value.dtype))


def _rank_sum(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """Sum in the arrays' dtype, in rank order (as a ring all-reduce in that dtype would)."""
    return functools.reduce(lambda a, b: (a + b).astype(a.dtype), arrays)


def _combine(kind: str, values: list, members: tuple, options: dict):
    """The result every rank of the group receives."""
    if kind == "all_reduce_sum":
        return _rank_sum(values)
    if kind == "all_gather":
        return np.concatenate(values, axis=0)
    if kind == "broadcast":
        root = options["root"]
        if root not in members:
            raise LoopbackError(f"Broadcast root {root} is not in the group {members}.")
        return values[members.index(root)]
    if kind == "grad_reduce":
        out = []
        for i in range(len(values[0])):
            total = _rank_sum([v[i] for v in values])
            out.append((total / options["degree"]).astype(total.dtype) if options["mean"] else total)
        return tuple(out)
    raise LoopbackError(f"unknown collective {kind!r}")

"""Topology: who this rank is and how the ranks form servers, built and validated once per train cell.

The one rule for ``common.device_number`` (devices per server): it is capped at the number of ranks
(fewer ranks than ``device_number`` all sit on one server, with a note), and the capped value must
divide the number of ranks. Server ``s`` holds ranks ``[s * server_size, (s + 1) * server_size)`` (the
layout of HCCL rank tables and of ``msrun`` node ranks).

The gradient reducer, AdaSum, DimReduce's PCA distribution and the plan summary all read the same
:class:`Topology` instead of re-deriving it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

from ms_boost import comm
from ms_boost.validation import INT32_MAX, BoostConfigError, check_int

__all__ = ["Topology", "check_device_number"]


def check_device_number(path: str, value: object) -> int:
    """The one rule for ``common.device_number``: an int in ``[1, 2**31 - 1]``."""
    return check_int(path, value, low=1, high=INT32_MAX)


@dataclass(frozen=True)
class Topology:
    """The ranks of one data-parallel run.

    Attributes:
        rank: this process's rank.
        size: number of ranks.
        device_number: ``common.device_number`` as configured.
        server_size: ranks per server, ``min(device_number, size)``.
        data_parallel: gradients are reduced across ranks (MindSpore's parallel context is data/hybrid
            parallel with more than one rank).
        mean: the context's ``gradients_mean``.
        degree: ranks a data-parallel mean divides by (the context's ``device_num``, else ``size``).
        note: what the cap changed ("" when nothing), for the plan summary.

    Raises:
        TypeError, BoostConfigError: a rank, size or ``device_number`` that is not an int in range; the
            server queries raise when ``device_number`` (after the cap) does not divide the number of ranks.
    """

    rank: int = 0
    size: int = 1
    device_number: int = 8
    data_parallel: bool = False
    mean: bool = True
    degree: int = 1

    def __post_init__(self):
        check_int("topology size", self.size, low=1)
        check_int("topology rank", self.rank, low=0, high=self.size - 1)
        check_device_number("common.device_number", self.device_number)

    def check_servers(self) -> None:
        """Raise unless the ranks split into whole servers (checked by every server-layout query).

        Raises:
            BoostConfigError: ``device_number`` is smaller than the number of ranks and does not divide it.
        """
        if self.size % self.server_size:
            raise BoostConfigError(
                f"boost config common.device_number={self.device_number} must divide the number of ranks "
                f"({self.size}) or be at least it (servers of device_number consecutive ranks).")

    @classmethod
    def current(cls, device_number: int = 8, size: Optional[int] = None) -> Topology:
        """The topology of this process from the communication layer and MindSpore's parallel context.

        Args:
            device_number: ``common.device_number``.
            size: describe a run on this many ranks instead (rank 0, data parallel when > 1); for plans
                made before communication starts.
        """
        if size is not None:
            check_int("ranks", size, low=1)
            return cls(0, size, device_number, size > 1, True, size)
        reduce, mean, degree = comm.data_parallel_reduce_config()
        return cls(comm.get_rank(), comm.get_size(), device_number, reduce, mean, degree)

    @property
    def server_size(self) -> int:
        """Ranks per server: ``device_number`` capped at the number of ranks."""
        return comm.server_size(self.device_number, self.size)

    @property
    def num_servers(self) -> int:
        """Number of servers."""
        self.check_servers()
        return self.size // self.server_size

    @property
    def server(self) -> int:
        """This rank's server."""
        self.check_servers()
        return self.rank // self.server_size

    @property
    def local_rank(self) -> int:
        """This rank's index inside its server."""
        self.check_servers()
        return self.rank % self.server_size

    @property
    def servers(self) -> Tuple[Tuple[int, ...], ...]:
        """Rank lists of every server."""
        self.check_servers()
        return comm.server_ranks(self.server_size, self.size)

    @property
    def server_roots(self) -> Tuple[int, ...]:
        """First rank of every server."""
        self.check_servers()
        return tuple(range(0, self.size, self.server_size))

    @property
    def note(self) -> str:
        """What the cap of ``device_number`` changed ("" when nothing)."""
        if self.device_number > self.size:
            return (f"common.device_number={self.device_number} is more than the {self.size} rank(s): "
                    f"they form one server")
        return ""

    def server_group(self) -> Optional[str]:
        """This rank's server group (created once); None when a server is one rank."""
        self.check_servers()
        return comm.server_groups(self.server_size)[0]

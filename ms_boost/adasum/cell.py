"""Upstream-named :class:`AdaSum` Cell (``mindspore.boost.AdaSum`` API) on :class:`AdaSumReduce`."""
from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops

from ms_boost import comm
from ms_boost.adasum.layout import server_layout
from ms_boost.adasum.stage import AdaSumReduce, check_weights

__all__ = ["AdaSum"]


class AdaSum(nn.Cell):
    """Upstream-named AdaSum Cell (``mindspore.boost.AdaSum`` API), on :class:`AdaSumReduce`.

    ``construct(delta_weights, parameters, old_parameters)`` follows upstream's convention
    ``delta = old - new``: it combines ``delta_weights`` across servers and assigns
    ``parameters[i] = old_parameters[i] - AdaSum(delta)[i]``, returning the tuple of parameters.
    Unlike upstream it takes any ``device_number`` and any number of servers (not only 8 devices and
    powers of two), and needs no backend-specific group name.

    Args:
        rank: this process's global rank (checked against the communication layer).
        device_number: devices per server.
        group_number: number of servers (checked: ``device_number * group_number`` = number of ranks).
        parameter_tuple: the parameters whose deltas are combined (sets the shapes).

    Raises:
        ValueError: ``rank`` or ``group_number`` disagree with the running job.
    """

    def __init__(self, rank: int, device_number: int, group_number: int, parameter_tuple):
        super().__init__()
        if rank != comm.get_rank():
            raise ValueError(f"AdaSum: rank={rank!r} is not this process's rank ({comm.get_rank()}).")
        num_servers, _ = server_layout(device_number)
        if group_number != num_servers:
            raise ValueError(f"AdaSum: group_number={group_number!r} must be the number of servers "
                             f"({comm.get_size()} ranks / device_number={device_number} -> {num_servers}).")
        self.rank, self.device_number, self.group_number = rank, device_number, group_number
        self.parameter_tuple = check_weights(parameter_tuple, "AdaSum")
        self.reduce = AdaSumReduce([p.shape for p in self.parameter_tuple], device_number)

    def construct(self, delta_weights, parameters, old_parameters):
        """Combine the servers' updates: write the AdaSum of the weight deltas into ``parameters``."""
        combined = self.reduce(delta_weights)
        out = ()
        for i in range(len(self.parameter_tuple)):
            value = ops.cast(old_parameters[i], ms.float32) - combined[i]
            out = out + (ops.assign(parameters[i], ops.cast(value, parameters[i].dtype)),)
        return out


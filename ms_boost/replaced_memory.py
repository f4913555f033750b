"""A train step compiled before a Parameter's memory was replaced: compile it again on the new memory.

``Parameter.set_data`` -- which ``mindspore.load_param_into_net`` calls for every entry -- gives a Parameter new
memory. A train step compiled before keeps the memory it was compiled with wherever a device-side branch reads or
writes a Parameter (MindSpore 2.10): gradient accumulation's update (``if count >= k``: the optimizer's moments,
step counter and the update of the weights), THOR's refresh. Training on after loading a checkpoint into a model
that has already trained then silently mixes the loaded values with the old memory (measured: the moments and the
step counter stayed at the loaded values while the weights moved from the old moments; a plain step without
branches is unaffected).

:class:`~ms_boost.model.Model` records the train network's Parameter addresses when a ``train`` / ``fit`` / trial
ends (:func:`memory_key`) and, when the next one starts with any address changed, gives every cell of the train
network a new creation stamp (:func:`compile_again`): MindSpore's graph cache keys a cell's graph by it, so the step
is compiled again once, on the Parameters' current memory. Loading in place (``ops.assign``, as
:func:`ms_boost.thor.load_thor_checkpoint` and the divergence rollback do) changes no address and compiles nothing.

Within one ``train`` / ``fit``, a callback may do the same between two steps -- ``opt.learning_rate.set_data(...)``
to change the rate, a weight clipped with ``set_data``. MindSpore's own Graph-mode step takes the new memory; a step
with such branches (gradient accumulation's update; the loss-scale cell's skip of an overflowing step) kept the old
rate, so the change was silently lost. For those steps ``Model`` adds a :class:`MemoryWatch`, which compares the
addresses before each Graph-mode step (on the host: 0.16 ms a step for 503 Parameters, median of 7 x 100 checks at
load 4.2 on 2 cores; 1.7 ms with :func:`memory_key`'s names, which only the log reads) and compiles the step again
when one changed. For a model that has trained, the first step of the next ``train`` / ``fit`` is compared with the
memory at its start, as a callback's ``on_train_begin`` may load a checkpoint (MindSpore's ``BackupAndRestore``); and
``Model`` keeps the memory the last step ran on, not the memory when training ends, since a callback may replace it
after that step (``EarlyStopping(restore_best_weights=True)``).
"""
from __future__ import annotations

import logging
import time
from typing import Optional, Tuple

import mindspore as ms
from mindspore import nn
from mindspore.train import Callback

__all__ = ["memory_key", "compile_again", "compile_again_for", "replaced_parameters", "MemoryWatch"]

logger = logging.getLogger("ms_boost")


def memory_key(network: Optional[nn.Cell]) -> Optional[Tuple[Tuple[str, int], ...]]:
    """``(name, data address)`` of every Parameter of ``network`` (None without a network)."""
    if not isinstance(network, nn.Cell):
        return None
    return tuple((param.name, param.data_ptr()) for param in network.get_parameters())


def replaced_parameters(before, after) -> list:
    """The names whose address differs between two :func:`memory_key` results (all of them when the sets differ)."""
    if before is None or after is None:
        return []
    if [name for name, _ in before] != [name for name, _ in after]:
        return [name for name, _ in after]
    return [name for (name, old), (_, new) in zip(before, after) if old != new]


def compile_again(network: nn.Cell) -> None:
    """Make MindSpore compile ``network`` (and every cell it holds) again at its next call.

    A cell's graph is cached under a phase that holds its creation stamp (``Cell.create_time``); a new stamp is a
    new phase, so the next call compiles on the Parameters' current memory. The old graphs are left to MindSpore.
    """
    stamp = time.time_ns()
    for offset, (_, cell) in enumerate(network.cells_and_names()):
        object.__setattr__(cell, "_create_time", stamp + offset)


def compile_again_for(network: nn.Cell, replaced: list, when: str) -> None:
    """Log which Parameters got new memory (``when``: since when, and by what) and :func:`compile_again`."""
    logger.info("ms_boost: %d Parameter(s) of the train network got new memory %s: %s); the train step is compiled "
                "again on it", len(replaced), when, ", ".join(replaced[:3]) + (", ..." if len(replaced) > 3 else ""))
    compile_again(network)


class MemoryWatch(Callback):
    """Compile ``network`` again before a Graph-mode step when a Parameter got new memory since the step before.

    ``Model`` adds it to ``train`` / ``fit`` when its train step reads Parameters inside device-side branches (see
    the module docstring); PyNative mode runs no such compiled branch and is left alone (MindSpore's own PyNative
    step is what ms_boost's equals there).

    Args:
        network: the train network.
        compiled: whether its step has been compiled on the Parameters' present memory (a model that has trained):
            then the first step is compared with the memory now, so that a callback replacing memory before it
            (``BackupAndRestore`` and other ``on_train_begin`` loads) compiles the step again too.
    """

    def __init__(self, network: nn.Cell, compiled: bool = False):
        super().__init__()
        self.network = network
        self.params: Optional[list] = None  # the network's Parameters, listed at the first step (or now: compiled)
        self.addresses: Optional[Tuple[int, ...]] = None
        if compiled and ms.get_context("mode") == ms.GRAPH_MODE:
            self.params = list(network.get_parameters())
            self.addresses = tuple(param.data_ptr() for param in self.params)

    def on_train_step_begin(self, run_context):
        """Compare the addresses with the previous step's; compile again when any changed."""
        if ms.get_context("mode") != ms.GRAPH_MODE:
            return
        if self.params is None:
            self.params = list(self.network.get_parameters())
        addresses = tuple(param.data_ptr() for param in self.params)
        before, self.addresses = self.addresses, addresses
        if before is None or before == addresses:
            return
        replaced = [param.name for param, old, new in zip(self.params, before, addresses) if old != new]
        compile_again_for(self.network, replaced, "between two steps (set_data")

    def last_step_key(self) -> Optional[Tuple[Tuple[str, int], ...]]:
        """:func:`memory_key` of the memory the last Graph-mode step ran on (None before one ran).

        ``Model`` keeps it as the memory its step was compiled on, so that memory replaced after the last step (by
        ``EarlyStopping(restore_best_weights=True)`` when training ends) compiles the step of the next ``train``.
        """
        if self.params is None or self.addresses is None:
            return None
        return tuple((param.name, address) for param, address in zip(self.params, self.addresses))

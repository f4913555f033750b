"""Upstream's gradient-freezing API.

:class:`GradientFreeze` (builds a FreezeOpt for a network) and :func:`freeze_cell` (one train cell per train parameter
group).
"""
from __future__ import annotations

import logging
from typing import List

import numpy as np
from mindspore import Parameter, nn, ops

from ms_boost import comm
from ms_boost.grad_accumulation import AccumulateUpdate
from ms_boost.grad_freeze.optimizer import FreezeOpt
from ms_boost.grad_freeze.schedule import (
    FreezeSchedule,
    FreezeStrategy,
    check_schedule,
    freeze_schedule,
    partition_parameters,
)
from ms_boost.grad_process import OptimizerProcess
from ms_boost.topology import Topology

logger = logging.getLogger("ms_boost")

__all__ = ["GradientFreeze", "freeze_cell", "apply_grad_freeze"]


class _GroupUpdate(nn.Cell):
    """Update stage applying one train group of a :class:`FreezeOpt`."""

    def __init__(self, freeze_opt: FreezeOpt, group: int):
        super().__init__(auto_prefix=False)
        self.freeze_opt = freeze_opt
        self.group = group

    def construct(self, loss, grads, *inputs):
        return self.freeze_opt.apply_group(self.group, grads)


class _TrainFreezeCell(nn.Cell):
    """Train step of one train group.

    gradients of that group only (the frozen layers' weight gradients are not computed), reduced, then applied (through
    gradient accumulation when asked).
    """

    def __init__(self, network, sens, grad, grad_reducer, freeze_opt, group, accumulation_step=1):
        super().__init__(auto_prefix=False)
        self.network = network
        self.weights = freeze_opt.group_parameters(group)
        self.grad = grad
        self.grad_reducer = grad_reducer
        self.sens = float(sens)
        stage = _GroupUpdate(freeze_opt, group)
        if accumulation_step > 1:
            stage = AccumulateUpdate(stage, self.weights, accumulation_step)
        self.update = stage

    def construct(self, *inputs):
        loss = self.network(*inputs)
        sens = ops.ones_like(loss) * self.sens
        grads = self.grad(self.network, self.weights)(*inputs, sens)
        grads = self.grad_reducer(grads)
        return ops.depend(loss, self.update(loss, grads, *inputs))


def freeze_cell(reducer_flag, network, optimizer, sens, grad, use_grad_accumulation, mean=None, degree=None,
                max_accumulation_step=1) -> tuple:
    """Upstream API: one train cell per train parameter group of a :class:`FreezeOpt`.

    Cell ``j`` computes the loss, the gradients of group ``j``'s parameters only, reduces them across
    ranks when ``reducer_flag``, and updates group ``j``. Running cell ``train_strategy[t]`` at step ``t``
    is the freezing schedule with the frozen layers' weight gradients never computed.

    Args:
        reducer_flag: reduce the gradients across ranks (data parallel).
        network: the loss network.
        optimizer: a :class:`FreezeOpt`.
        sens: sensitivity (constant scale of the loss).
        grad: ``ops.GradOperation(get_by_list=True, sens_param=True)``.
        use_grad_accumulation: accumulate ``max_accumulation_step`` gradients per update.
        mean: divide the reduced gradients by ``degree`` (default: MindSpore's ``gradients_mean``).
        degree: number of ranks averaged (default: the world size).
        max_accumulation_step: micro-steps per update.

    Returns:
        tuple of cells, one per train parameter group.
    """
    if not isinstance(optimizer, FreezeOpt):
        raise TypeError(f"freeze_cell: optimizer must be a FreezeOpt, got {type(optimizer).__name__}.")
    steps = int(max_accumulation_step) if use_grad_accumulation else 1
    cells = []
    for group in range(optimizer.groups_num):
        weights = optimizer.group_parameters(group)
        if reducer_flag:
            topology = Topology.current()
            default_mean, default_degree = topology.mean, topology.degree
            reducer = comm.GradReducer(weights, default_mean if mean is None else mean, degree or default_degree)
        else:
            reducer = nn.Identity()
        cells.append(_TrainFreezeCell(network, sens, grad, reducer, optimizer, group, steps))
    return tuple(cells)


class GradientFreeze:
    """Build a gradient-freezing optimizer for a network.

    Args:
        param_groups: number of parameter groups ``G`` (1 <= G <= number of trainable parameters).
        freeze_type: :class:`FreezeStrategy` (or its int: 0 continuous, 1 interval), see :func:`freeze_schedule`.
        freeze_p: share of steps training every group, in [0, 1].
        total_steps: schedule length (optimizer steps); the schedule repeats after it.
        seed: seed of the interval schedule (ms_boost addition; same seed, same schedule on every rank).

    Raises:
        TypeError, ValueError: an argument of the wrong type or out of range.

    Example:
        >>> network, optimizer = GradientFreeze(10, 1, 0.7, 2000).freeze_generate(loss_net, optimizer)
    """

    def __init__(self, param_groups: int, freeze_type: FreezeStrategy | int, freeze_p: float, total_steps: int,
                 seed: int = 0):
        cfg = check_schedule(param_groups=param_groups, freeze_type=freeze_type, freeze_p=freeze_p,
                             total_steps=total_steps, seed=seed)  # the grad_freeze section's rule for each value
        self._param_groups, self._freeze_type, self._freeze_p = cfg["param_groups"], cfg["freeze_type"], cfg["freeze_p"]
        self._total_steps, self._seed = cfg["total_steps"], cfg["seed"]

    def split_parameters_groups(self, net: nn.Cell, freeze_para_groups_number: int) -> List[List[Parameter]]:
        """The train parameter groups of ``net``: group ``i`` holds ``g_i .. g_{G-1}`` (see the module doc).

        Args:
            net: the network.
            freeze_para_groups_number: ``G``.
        """
        chunks = partition_parameters(net.trainable_params(), freeze_para_groups_number,
                                      OptimizerProcess.build_params_dict(net))
        return [[p for chunk in chunks[i:] for p in chunk] for i in range(len(chunks))]

    def generate_freeze_index_sequence(self, parameter_groups_number: int, freeze_strategy: FreezeStrategy | int,
                                       freeze_p: float,
                                       total_steps: int) -> List[int]:
        """The schedule as a list (see :func:`freeze_schedule`), seeded with this object's seed."""
        return freeze_schedule(parameter_groups_number, freeze_strategy, freeze_p, total_steps,
                               self._seed).tolist()

    def freeze_generate(self, network: nn.Cell, optimizer: nn.Optimizer) -> tuple:
        """``(network, FreezeOpt)``: the network unchanged and the freezing optimizer.

        The groups are cut over the network's trainable parameters that ``optimizer`` updates (network
        order); parameters the optimizer holds outside the network join the output-side group.

        More groups than trainable parameters are clamped to one group per parameter (logged, as upstream
        runs ``GradientFreeze(10, ...)`` on any network).
        """
        if not isinstance(optimizer, nn.Optimizer):
            raise TypeError(f"grad_freeze: optimizer must be a mindspore.nn.Optimizer, got "
                            f"{type(optimizer).__name__}.")
        opt_ids = {id(p) for p in optimizer.parameters}
        ordered = [p for p in network.trainable_params() if id(p) in opt_ids]
        seen = {id(p) for p in ordered}
        extra = [p for p in optimizer.parameters if id(p) not in seen]
        groups = min(self._param_groups, max(len(ordered), 1))
        if groups < self._param_groups:
            logger.info("grad_freeze: param_groups=%d clamped to %d, the number of trainable parameters",
                        self._param_groups, groups)
        chunks = partition_parameters(ordered, groups, OptimizerProcess.build_params_dict(network))
        chunks[-1] = chunks[-1] + extra
        train_groups = [[p for chunk in chunks[i:] for p in chunk] for i in range(len(chunks))]
        schedule = FreezeSchedule(groups, self._freeze_type, self._freeze_p, self._total_steps, self._seed)
        head = schedule.values(0, min(len(schedule), 65536))
        logger.info("grad_freeze: %d groups of %s parameters; %.1f%% of the first %d of %d steps freeze some group",
                    len(chunks), [len(c) for c in chunks], 100.0 * float(np.mean(head > 0)), len(head),
                    len(schedule))
        return network, FreezeOpt(optimizer, train_groups, schedule)


def apply_grad_freeze(network: nn.Cell, optimizer: nn.Optimizer, grad_freeze_cfg) -> tuple:
    """The gradient-freezing step of ``AutoBoost.network_auto_process_train``.

    Args:
        network: the (loss) network.
        optimizer: the optimizer (after LessBN's rebuild when that runs first).
        grad_freeze_cfg: object with ``param_groups``, ``freeze_type``, ``freeze_p``, ``total_steps``, ``seed`` and
            optionally ``graph_variants`` (default None: auto).

    Returns:
        ``(network, FreezeOpt)``.
    """
    freezer = GradientFreeze(grad_freeze_cfg.param_groups, grad_freeze_cfg.freeze_type, grad_freeze_cfg.freeze_p,
                             grad_freeze_cfg.total_steps, seed=grad_freeze_cfg.seed)
    network, freeze_opt = freezer.freeze_generate(network, optimizer)
    freeze_opt.graph_variants = getattr(grad_freeze_cfg, "graph_variants", None)
    return network, freeze_opt

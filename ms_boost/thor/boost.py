"""THOR through the boost configuration: :func:`apply_boost_thor` builds the THOR network and optimizer."""
from __future__ import annotations

import numbers

from mindspore import nn

from ms_boost.thor.convert import ConvertNetUtils
from ms_boost.thor.optimizer import THOR

__all__ = ["apply_boost_thor"]


def _user_learning_rate(optimizer: nn.Optimizer):
    if optimizer.is_group_lr:
        raise ValueError("boost thor: the optimizer has per-group learning rates; THOR takes one learning rate "
                         "(a float, a per-step array or a LearningRateSchedule).")
    if optimizer.dynamic_lr:
        return optimizer.learning_rate
    return float(optimizer.learning_rate.asnumpy().reshape(-1)[0])


def _user_momentum(optimizer: nn.Optimizer) -> float:
    momentum = getattr(optimizer, "momentum", None)
    if momentum is None:
        return 0.9
    if isinstance(momentum, numbers.Real):
        return float(momentum)
    return float(momentum.asnumpy().reshape(-1)[0])


def _user_weight_decay(optimizer: nn.Optimizer) -> tuple:
    """``(weight_decay, flags_by_parameter_id)`` of the user's optimizer."""
    flags = dict(zip((id(p) for p in optimizer.parameters), optimizer.decay_flags))
    decay = optimizer.weight_decay
    if isinstance(decay, nn.Cell) or getattr(optimizer, "dynamic_weight_decay", False):
        raise ValueError("boost thor: the optimizer has a dynamic weight decay; set thor.weight_decay to a float.")
    if isinstance(decay, tuple):
        values = {float(d.asnumpy()) if hasattr(d, "asnumpy") else float(d)
                  for d, f in zip(decay, optimizer.decay_flags) if f}
        values.discard(0.0)
        if len(values) > 1:
            raise ValueError(f"boost thor: the optimizer's parameter groups use different weight decays "
                             f"{sorted(values)}; set thor.weight_decay to one float.")
        decay = values.pop() if values else 0.0
    return float(decay), flags


def apply_boost_thor(network: nn.Cell, optimizer: nn.Optimizer, thor_cfg) -> tuple:
    """Boost hook: THOR network and optimizer replacing ``(network, optimizer)``.

    The network is converted on a copy sharing every Parameter with ``network`` (the caller's object is
    not modified). The THOR optimizer optimizes the user's optimizer's parameters with its learning rate
    (float, per-step array or schedule); momentum and weight decay come from the ``thor`` section, or from
    the user's optimizer when the section leaves them None (momentum 0.9 if it has none; weight decay on the
    parameters the user's optimizer decays).

    Args:
        network: the network the Model trains.
        optimizer: the user's ``nn.Optimizer``.
        thor_cfg: the ``thor`` section (damping, frequency, momentum, weight_decay, loss_scale, batch_size,
            use_nesterov, split_indices, enable_clip_grad, kl_clip, refresh_threshold, block_size, stat_fraction).

    Returns:
        ``(thor_network, thor_optimizer)``.
    """
    if not isinstance(optimizer, nn.Optimizer):
        raise TypeError(f"boost thor: optimizer must be a mindspore.nn.Optimizer, got {type(optimizer).__name__}.")
    converted = ConvertNetUtils().convert_to_thor_net(network)
    momentum = thor_cfg.momentum if thor_cfg.momentum is not None else _user_momentum(optimizer)
    if thor_cfg.weight_decay is not None:
        weight_decay, decay_filter = float(thor_cfg.weight_decay), None
    else:
        weight_decay, flags = _user_weight_decay(optimizer)

        def decay_filter(param, _flags=flags):
            return _flags.get(id(param), False)
    damping = list(thor_cfg.damping) if isinstance(thor_cfg.damping, (tuple, list)) else thor_cfg.damping
    split = list(thor_cfg.split_indices) if thor_cfg.split_indices is not None else None
    opt = THOR(converted, _user_learning_rate(optimizer), damping, momentum, weight_decay, thor_cfg.loss_scale,
               thor_cfg.batch_size, thor_cfg.use_nesterov, decay_filter, split, thor_cfg.enable_clip_grad,
               thor_cfg.frequency, params=list(optimizer.parameters), kl_clip=thor_cfg.kl_clip,
               refresh_threshold=thor_cfg.refresh_threshold, block_size=thor_cfg.block_size,
               stat_fraction=thor_cfg.stat_fraction)
    return converted, opt

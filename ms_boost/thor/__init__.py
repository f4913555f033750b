"""THOR: second-order (K-FAC style) training that runs on CPU, GPU and Ascend.

* :mod:`ms_boost.thor.math` -- factor statistics, im2col, damped Cholesky block inverses, the update.
* :mod:`ms_boost.thor.layers` -- :class:`DenseThor`, :class:`Conv2dThor`, :class:`EmbeddingThor`.
* :mod:`ms_boost.thor.optimizer` -- :func:`thor` / :class:`THOR`.
* :mod:`ms_boost.thor.convert` -- :class:`ConvertNetUtils`, :class:`ConvertModelUtils`.

Upstream-style use::

    opt = thor(net, lr, damping, momentum, weight_decay, loss_scale, batch_size, split_indices=[26, 53],
               frequency=100)
    model = ConvertModelUtils().convert_to_thor_model(model=Model(net, loss_fn=loss, optimizer=opt, ...),
                                                      network=net, loss_fn=loss, optimizer=opt, ...)

or through the boost configuration: ``Model(..., boost_level="O0", boost_config_dict={"boost": {"thor": True},
"thor": {"damping": 0.03, "frequency": 100}})``, which calls :func:`apply_boost_thor`.
"""
from __future__ import annotations

import numbers
import sys
import types

from mindspore import nn

from ms_boost.thor.convert import ConvertedLayer, ConvertModelUtils, ConvertNetUtils
from ms_boost.thor.layers import Conv2dThor, DenseThor, EmbeddingThor, ThorLayer
from ms_boost.thor.optimizer import THOR, ThorGuard, ThorNonFiniteError, thor

__all__ = ["thor", "THOR", "DenseThor", "Conv2dThor", "EmbeddingThor", "ThorLayer", "ConvertNetUtils",
           "ConvertModelUtils", "ConvertedLayer", "apply_boost_thor", "thor_state_parameters", "ThorGuard",
           "ThorNonFiniteError"]


def thor_state_parameters(network: nn.Cell) -> list:
    """THOR bookkeeping Parameters of ``network``'s THOR layers (capture flags, scratch statistics, factors).

    They are not model buffers: a skipped (overflow) step may leave new statistics in the scratch buffers
    without effect, so they need no snapshot/restore.
    """
    found, seen = [], set()
    for _, cell in network.cells_and_names():
        if isinstance(cell, ThorLayer):
            for param in cell.thor_parameters().values():
                if id(param) not in seen:
                    seen.add(id(param))
                    found.append(param)
    return found


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
            use_nesterov, split_indices, enable_clip_grad, kl_clip).

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
               thor_cfg.frequency, params=list(optimizer.parameters), kl_clip=thor_cfg.kl_clip)
    return converted, opt


class _CallableThorModule(types.ModuleType):
    """``ms_boost.thor`` is both this package and the optimizer factory: ``ms_boost.thor(net, lr, ...)``
    works whichever of the two the name is bound to (a package import binds the module)."""

    def __call__(self, *args, **kwargs):
        return thor(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableThorModule

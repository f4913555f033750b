"""The upstream-style THOR factory :func:`thor` (``mindspore.nn.thor`` signature)."""
from __future__ import annotations

from typing import Optional

from mindspore import nn

from ms_boost.thor.assignment import DEFAULT_BLOCK_SIZE
from ms_boost.thor.convert import ConvertNetUtils
from ms_boost.thor.optimizer import DEFAULT_KL_CLIP, DEFAULT_MAX_NONFINITE_STEPS, THOR, _default_decay_filter

__all__ = ["thor"]


def thor(net: nn.Cell, learning_rate, damping, momentum, weight_decay=0.0, loss_scale=1.0, batch_size=32,
         use_nesterov=False, decay_filter=_default_decay_filter, split_indices=None, enable_clip_grad=False,
         frequency=100, *, factor_decay: float = 0.0, block_size: int = DEFAULT_BLOCK_SIZE,
         kl_clip: Optional[float] = DEFAULT_KL_CLIP, pi_damping: bool = False,
         max_nonfinite_steps: int = DEFAULT_MAX_NONFINITE_STEPS, refresh_threshold: Optional[float] = None,
         stat_fraction: float = 1.0) -> THOR:
    r"""Build the THOR optimizer for ``net`` (upstream ``mindspore.nn.thor`` signature).

    ``net`` is **not** modified: its Dense / Conv2d / Embedding layers are converted on a copy of the
    cells that contain them (:meth:`ConvertNetUtils.convert_to_thor_net`), which shares every Parameter
    with ``net`` -- training the copy trains ``net``'s weights. Train the copy: ``opt.thor_network``, or
    let :meth:`ConvertModelUtils.convert_to_thor_model` put it in the Model.

    Args:
        net, learning_rate, damping, momentum, weight_decay, loss_scale, batch_size, use_nesterov,
            decay_filter, split_indices, enable_clip_grad, frequency: see :class:`THOR`.
        factor_decay: running-average decay of the factors in [0, 1) (0: latest capture only).
        block_size: diagonal block size of the factor inverses.
        kl_clip, pi_damping, max_nonfinite_steps, refresh_threshold, stat_fraction: see :class:`THOR` (trust
            region, damping split, stop rule, adaptive per-layer refresh, sub-batch statistics).

    Returns:
        The :class:`THOR` optimizer; ``opt.thor_network`` is the converted network.
    """
    converted = ConvertNetUtils().convert_to_thor_net(net, factor_decay=factor_decay)
    return THOR(converted, learning_rate, damping, momentum, weight_decay, loss_scale, batch_size, use_nesterov,
                decay_filter, split_indices, enable_clip_grad, frequency, block_size=block_size, kl_clip=kl_clip,
                pi_damping=pi_damping, max_nonfinite_steps=max_nonfinite_steps, refresh_threshold=refresh_threshold,
                stat_fraction=stat_fraction, source_network=net)

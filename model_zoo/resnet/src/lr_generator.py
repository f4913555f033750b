"""Per-step learning-rate schedules of the ResNet recipes, and THOR's learning-rate and damping schedules.

Every function returns a ``float32`` numpy array with one value per training step (from ``start_step``
on), ready for ``Tensor(lr)`` as an optimizer's dynamic learning rate.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

__all__ = ["LR_DECAY_MODES", "get_lr", "get_thor_lr", "get_thor_damping"]

LR_DECAY_MODES = ("linear", "cosine", "poly", "steps", "constant")


def _check_schedule_args(total_epochs: int, steps_per_epoch: int, start_step: int,
                         step_name: str = "start_step") -> int:
    for name, value in (("total_epochs", total_epochs), ("steps_per_epoch", steps_per_epoch)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name}={value!r} must be an int >= 1.")
    total_steps = int(total_epochs) * int(steps_per_epoch)
    bad_type = isinstance(start_step, bool) or not isinstance(start_step, (int, np.integer))
    if bad_type or not 0 <= start_step < total_steps:
        raise ValueError(f"{step_name}={start_step!r} must be an int in [0, {total_steps}).")
    return total_steps


def get_lr(lr_init: float, lr_end: float, lr_max: float, warmup_epochs: float, total_epochs: int,
           steps_per_epoch: int, lr_decay_mode: str = "linear", start_step: int = 0, poly_power: float = 2.0,
           step_boundaries: Sequence[float] = (0.3, 0.6, 0.8), step_gamma: float = 0.1) -> np.ndarray:
    r"""Learning rate for every step: linear warm-up, then a decay to ``lr_end``.

    With :math:`T` total steps and :math:`W = \operatorname{round}(\text{warmup\_epochs} \cdot S)` warm-up
    steps (:math:`S` steps per epoch), step :math:`i` (0-based) gets

    * warm-up, :math:`i < W`: :math:`\eta_i = \eta_{init} + (\eta_{max} - \eta_{init})\,(i + 1) / W`;
    * afterwards, with progress :math:`p = (i - W) / (T - W) \in [0, 1)`:

      - ``linear``: :math:`\eta_{max} + (\eta_{end} - \eta_{max})\, p`
      - ``cosine``: :math:`\eta_{end} + (\eta_{max} - \eta_{end})\,(1 + \cos \pi p) / 2`
      - ``poly``: :math:`\eta_{end} + (\eta_{max} - \eta_{end})\,(1 - p)^{\text{poly\_power}}`
      - ``steps``: :math:`\eta_{max}\,\gamma^{k}`, :math:`k = \#\{b \in \text{step\_boundaries} : i \ge b T\}`
      - ``constant``: :math:`\eta_{max}`

    Args:
        lr_init: learning rate the warm-up starts from.
        lr_end: final learning rate of the linear/cosine/poly decays.
        lr_max: peak learning rate (end of warm-up).
        warmup_epochs: warm-up length in epochs (may be fractional, 0 for none).
        total_epochs: schedule length in epochs.
        steps_per_epoch: steps in one epoch.
        lr_decay_mode: one of :data:`LR_DECAY_MODES`.
        start_step: first step returned (to resume a run).
        poly_power: exponent of ``poly``.
        step_boundaries: fractions of the total steps where ``steps`` multiplies by ``step_gamma``.
        step_gamma: factor of ``steps``.

    Returns:
        ``float32`` array of length ``total_epochs * steps_per_epoch - start_step``.

    Raises:
        ValueError: unknown ``lr_decay_mode`` or an argument out of range.
    """
    if lr_decay_mode not in LR_DECAY_MODES:
        raise ValueError(f"lr_decay_mode={lr_decay_mode!r} is not known; known: {', '.join(LR_DECAY_MODES)}.")
    total_steps = _check_schedule_args(total_epochs, steps_per_epoch, start_step)
    warmup_steps = int(round(float(warmup_epochs) * steps_per_epoch))
    if not 0 <= warmup_steps < total_steps:
        raise ValueError(f"warmup_epochs={warmup_epochs} must be >= 0 and shorter than total_epochs={total_epochs}.")
    step = np.arange(total_steps, dtype=np.float64)
    progress = np.clip((step - warmup_steps) / (total_steps - warmup_steps), 0.0, 1.0)
    if lr_decay_mode == "linear":
        decayed = lr_max + (lr_end - lr_max) * progress
    elif lr_decay_mode == "cosine":
        decayed = lr_end + (lr_max - lr_end) * 0.5 * (1.0 + np.cos(math.pi * progress))
    elif lr_decay_mode == "poly":
        decayed = lr_end + (lr_max - lr_end) * (1.0 - progress) ** float(poly_power)
    elif lr_decay_mode == "steps":
        crossed = sum((step >= float(b) * total_steps).astype(np.float64) for b in step_boundaries)
        decayed = lr_max * float(step_gamma) ** crossed
    else:
        decayed = np.full(total_steps, float(lr_max))
    if warmup_steps:
        warm = lr_init + (lr_max - lr_init) * (step + 1.0) / warmup_steps
        decayed = np.where(step < warmup_steps, warm, decayed)
    return decayed[start_step:].astype(np.float32)


def get_thor_lr(global_step: int, lr_init: float, decay: float, end_epoch: int, steps_per_epoch: int,
                decay_epochs: int = 100, total_epochs: int = 0) -> np.ndarray:
    r"""THOR's polynomial learning-rate decay with two late halvings.

    With epoch progress :math:`e = (i + 1) / S` of step :math:`i`:
    :math:`\eta_i = \eta_{init}\,\max(0, 1 - e / E)^{d} \cdot 0.5^{[e \ge D]} \cdot 0.5^{[e \ge D + 1]}`,
    where :math:`E` is ``end_epoch``, :math:`d` is ``decay`` and :math:`D` is ``decay_epochs``.

    The argument order is the ResNet THOR sample's (``get_thor_lr(0, lr_init, decay, lr_end_epoch,
    step_size, decay_epochs=39)``).

    Args:
        global_step: first step returned (0 for a new run; the resumed step otherwise).
        lr_init: initial learning rate.
        decay: exponent :math:`d`.
        end_epoch: epoch where the rate reaches 0.
        steps_per_epoch: steps in one epoch.
        decay_epochs: epoch of the first halving.
        total_epochs: schedule length in epochs (``end_epoch`` when 0).

    Returns:
        ``float32`` array of length ``total_epochs * steps_per_epoch - global_step``.
    """
    if isinstance(end_epoch, bool) or not isinstance(end_epoch, (int, np.integer)) or end_epoch < 1:
        raise ValueError(f"end_epoch={end_epoch!r} must be an int >= 1.")
    total_epochs = total_epochs or end_epoch
    total_steps = _check_schedule_args(total_epochs, steps_per_epoch, global_step, "global_step")
    epoch = (np.arange(total_steps, dtype=np.float64) + 1.0) / steps_per_epoch
    lr = lr_init * np.maximum(0.0, 1.0 - epoch / end_epoch) ** float(decay)
    lr = lr * np.where(epoch >= decay_epochs, 0.5, 1.0) * np.where(epoch >= decay_epochs + 1, 0.5, 1.0)
    return lr[global_step:].astype(np.float32)


def get_thor_damping(global_step: int, damping_init: float, decay_rate: float, total_epochs: int,
                     steps_per_epoch: int) -> np.ndarray:
    r"""THOR's damping: :math:`\lambda_i = \lambda_0\, r^{e / 10}` with :math:`e = (i + 1) / S`.

    The argument order is the ResNet THOR sample's (``get_thor_damping(0, damping_init, damping_decay,
    70, step_size)``).

    Args:
        global_step: first step returned.
        damping_init: :math:`\lambda_0`.
        decay_rate: :math:`r` (the damping shrinks by this factor every 10 epochs).
        total_epochs: schedule length in epochs.
        steps_per_epoch: :math:`S`.

    Returns:
        ``float32`` array of length ``total_epochs * steps_per_epoch - global_step``.
    """
    total_steps = _check_schedule_args(total_epochs, steps_per_epoch, global_step, "global_step")
    epoch = (np.arange(total_steps, dtype=np.float64) + 1.0) / steps_per_epoch
    return (damping_init * float(decay_rate) ** (epoch / 10.0))[global_step:].astype(np.float32)

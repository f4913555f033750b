"""The :class:`SkippedStepsWatch` training callback: says when loss-scaled training has stopped moving.

An overflow step is skipped whole (no weight, moment or statistic changes). A run where every step overflows
therefore trains nothing, and nothing else tells the user: MindSpore's own loop goes on printing a loss. The
usual causes are a loss that is itself inf/NaN (skipped at any loss scale: bad data, a learning rate that blew
the weights up earlier, a network output out of range) or gradients that overflow even at the smallest scale.
"""
from __future__ import annotations

import warnings
from typing import Optional

import numpy as np
from mindspore import Tensor
from mindspore.train.callback import Callback

__all__ = ["SkippedStepsWatch"]


def _scalar(value):
    if isinstance(value, Tensor):
        value = value.asnumpy()
    array = np.asarray(value)
    return array.reshape(-1)[0] if array.size else None


class SkippedStepsWatch(Callback):
    """Warns once per run when ``limit`` steps in a row were skipped as overflows.

    ``ms_boost.Model`` adds one to ``train`` / ``fit`` whenever it trains through the loss-scale cell (a loss-scale
    manager, or an amp level that brings one). It reads the cell's outputs ``(loss, overflow, loss_scale)`` after
    every step (every sink in sink mode), as ``LossMonitor`` reads the loss.

    Args:
        limit: skipped steps in a row that make the warning (None: :attr:`DEFAULT_LIMIT`, 50, longer than a
            dynamic manager needs to bring a scale of 2**24 down to 1).
        loss_only: after reading the outputs, hand the callbacks after it the loss alone, as MindSpore's Model does
            for ``FixedLossScaleManager(drop_overflow_update=False)`` (its train step is then
            ``nn.TrainOneStepCell(..., sens=scale)``, whose output is the loss): a script's callback reading
            ``cb_params.net_outputs`` as a Tensor works as with MindSpore. ``Model`` puts this watch first.
    """

    DEFAULT_LIMIT = 50

    def __init__(self, limit: Optional[int] = None, loss_only: bool = False):
        super().__init__()
        limit = self.DEFAULT_LIMIT if limit is None else limit
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"SkippedStepsWatch: limit={limit!r} must be an int >= 1.")
        if not isinstance(loss_only, bool):
            raise ValueError(f"SkippedStepsWatch: loss_only={loss_only!r} must be a bool.")
        self.limit = limit
        self.loss_only = loss_only
        self.streak = 0
        self.first_step = None
        self.warned = False

    def on_train_step_end(self, run_context):
        """Count the step when it overflowed; warn when the streak reaches ``limit``."""
        args = run_context.original_args()
        outputs = args.net_outputs
        if not isinstance(outputs, (tuple, list)) or len(outputs) < 3:
            return  # not the loss-scale cell's outputs
        if self.loss_only:
            args.net_outputs = outputs[0]
        step = int(getattr(args, "cur_step_num", 0))
        if not bool(_scalar(outputs[1])):
            self.streak, self.first_step = 0, None
            return
        self.streak += 1
        self.first_step = step if self.first_step is None else self.first_step
        if self.streak < self.limit or self.warned:
            return
        self.warned = True
        loss, scale = float(_scalar(outputs[0])), float(_scalar(outputs[2]))
        if np.isfinite(loss):
            cause = (f"the loss is finite ({loss:.6g}) but the step's gradients (or BatchNorm statistics) are not at "
                     f"this scale: check the data for inf/NaN, lower the learning rate or the loss scale")
        else:
            cause = (f"the loss itself is {loss} (skipped at any loss scale): check the data, the learning rate "
                     f"(weights blown up before the streak began) and the network's output")
        warnings.warn(f"ms_boost: {self.streak} steps in a row were skipped as overflows (steps {self.first_step}.."
                      f"{step}): the weights have not changed since step {self.first_step - 1}. The loss scale is "
                      f"now {scale:g}; {cause}.", UserWarning, stacklevel=2)

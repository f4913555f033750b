"""The :class:`ThorGuard` training callback and the error it raises."""
from __future__ import annotations

import logging

import numpy as np
from mindspore import Tensor, nn
from mindspore.train.callback import Callback

_log = logging.getLogger("ms_boost")

__all__ = ["ThorGuard", "ThorNonFiniteError"]


class ThorNonFiniteError(RuntimeError):
    """Training stopped: the loss (or THOR's update) stayed non-finite for too many consecutive steps."""


class ThorGuard(Callback):
    """Watches a THOR run: logs rejected refreshes and eigen fallbacks; stops a run that stays non-finite.

    ``ms_boost.Model.train`` adds one automatically when the optimizer is THOR (so the tutorial's
    ``convert_to_thor_model(...).train(...)`` is guarded). After every step (every sink in sink mode):

    * a layer whose refresh kept the previous inverses (factors with inf/NaN) is logged once, by name;
      blocks inverted through the clamped eigendecomposition are logged too;
    * a step is *non-finite* when its loss holds inf/NaN or THOR skipped its update; the next step then
      captures statistics (they show where inf/NaN first appear);
    * after ``optimizer.max_nonfinite_steps`` consecutive non-finite steps (0: never) it raises
      :class:`ThorNonFiniteError` naming the step and the first layer (network order) whose weights,
      input statistics or output-gradient statistics hold inf/NaN.

    (The compiled step variant, capturing/refresh or plain, is chosen by the train cell itself before every step:
    THOR's stage hook, :class:`~ms_boost.thor.variants.ThorStepVariants`.)

    Args:
        optimizer: the :class:`~ms_boost.thor.optimizer.THOR` optimizer.
    """

    def __init__(self, optimizer: nn.Optimizer):
        super().__init__()
        self.optimizer = optimizer
        self.streak = 0
        self.first_step = None
        self._seen = None

    def on_train_begin(self, run_context):
        """Start from the optimizer's counters as they are: earlier skips or rejections are not this run's."""
        del run_context
        self._seen = self.optimizer.health()

    def on_train_step_end(self, run_context):
        """Log new health events; count a non-finite step and stop the run after too many in a row."""
        args = run_context.original_args()
        step = int(getattr(args, "cur_step_num", 0))
        outputs = args.net_outputs
        loss = outputs[0] if isinstance(outputs, (tuple, list)) else outputs
        finite_loss = bool(np.isfinite(loss.asnumpy()).all()) if isinstance(loss, Tensor) else True
        health = self.optimizer.health()
        seen = self._seen or {"eigen_fallback_blocks": 0, "rejected_inverses": 0, "skipped_steps": 0,
                              "rejected_refreshes": dict.fromkeys(health["rejected_refreshes"], 0)}
        for path, count in health["rejected_refreshes"].items():
            if count > seen["rejected_refreshes"].get(path, 0):
                _log.warning("thor: step %d: layer %s: factors hold inf/NaN; its previous inverses are kept.",
                             step, path)
        if health["eigen_fallback_blocks"] > seen["eigen_fallback_blocks"]:
            _log.info("thor: step %d: %d factor blocks inverted through the clamped eigendecomposition "
                      "(damping small for their scale; %d so far).", step,
                      health["eigen_fallback_blocks"] - seen["eigen_fallback_blocks"], health["eigen_fallback_blocks"])
        if health["rejected_inverses"] > seen["rejected_inverses"]:
            _log.warning("thor: step %d: %d non-finite inverses discarded (previous ones kept).", step,
                         health["rejected_inverses"] - seen["rejected_inverses"])
        skipped = health["skipped_steps"] > seen["skipped_steps"]
        self._seen = health
        if finite_loss and not skipped:
            self.streak, self.first_step = 0, None
            return
        if skipped:
            _log.warning("thor: step %d: non-finite update (first layer: %s); step skipped.", step,
                         health["last_bad_layer"])
        self.streak += 1
        self.first_step = step if self.first_step is None else self.first_step
        self.optimizer.request_capture()
        limit = self.optimizer.max_nonfinite_steps
        if limit and self.streak >= limit:
            run_context.request_stop()
            what = "loss" if not finite_loss else "THOR update"
            raise ThorNonFiniteError(
                f"thor: the {what} was non-finite for {self.streak} consecutive steps (steps {self.first_step}.."
                f"{step}); training stopped at step {step}. First layer with non-finite values: "
                f"{self.locate()}. Lower the learning rate, raise the damping or check the data.")

    def locate(self) -> str:
        """The first THOR layer (network order) whose weights or captured statistics hold inf/NaN, described."""
        opt = self.optimizer
        for path, layer in zip(opt.layer_paths, opt.thor_layers):
            checks = [("weight", layer.embedding_table if layer.kind == "embedding" else layer.weight)]
            if getattr(layer, "bias", None) is not None:
                checks.append(("bias", layer.bias))
            checks += [("input statistics (its forward input)", layer.matrix_a_batch),
                       ("output-gradient statistics (its backward input)", layer.matrix_g_batch)]
            for what, param in checks:
                if not np.isfinite(param.asnumpy()).all():
                    return f"{path} ({what})"
        bad = opt.health()["last_bad_layer"]
        if bad is not None:
            return f"{bad} (preconditioned update)"
        return "none of the THOR layers' weights or statistics (the loss itself is non-finite: check the inputs)"

"""Group loss scaling: one dynamic loss scale per group of layers (the algorithm ``loss_scale_group``).

* :mod:`ms_boost.loss_scale_group.manager` -- :class:`GroupLossScaleManager` (the markers, the per-group scales
  and their update; the formulas);
* :mod:`ms_boost.loss_scale_group.spec` -- the ``loss_scale_group`` section and ``SPEC`` (Model checks the manager).

The train cell's loss scaler (:mod:`ms_boost.loss_scaler`) does the per-step work for every manager.
"""
from __future__ import annotations

from ms_boost.loss_scale_group.manager import (
    GroupLossScaleManager,
    group_scale_update,
    is_group_manager,
    require_group_manager,
)
from ms_boost.loss_scale_group.spec import SPEC, LossScaleGroupConfig

__all__ = ["GroupLossScaleManager", "is_group_manager", "require_group_manager", "group_scale_update",
           "LossScaleGroupConfig", "SPEC"]

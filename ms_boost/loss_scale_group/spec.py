"""Per-group loss scaling as the pipeline sees it: its ``loss_scale_group`` section and its ``SPEC``."""
from __future__ import annotations

import dataclasses

from ms_boost.loss_scale_group.manager import require_group_manager
from ms_boost.loss_scale_group.section import PLAN, LossScaleGroupConfig

__all__ = ["LossScaleGroupConfig", "SPEC"]


def _check_model(cfg: LossScaleGroupConfig, loss_scale_manager: object) -> None:
    require_group_manager(loss_scale_manager)


#: Per-group loss scaling for the pipeline: the train cell's loss scaler does the work; Model checks the
#: manager.
SPEC = dataclasses.replace(PLAN, check_model=_check_model)

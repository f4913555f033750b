"""Per-group loss scaling as the pipeline sees it: its ``loss_scale_group`` section and its ``SPEC``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ms_boost.loss_scale_group.manager import require_group_manager
from ms_boost.spec import AlgorithmSpec, Section

__all__ = ["LossScaleGroupConfig", "SPEC"]


@dataclass(frozen=True)
class LossScaleGroupConfig(Section):
    """``loss_scale_group`` section (no keys: groups come from the ``GroupLossScaleManager``)."""

    SECTION: ClassVar[str] = "loss_scale_group"


def _check_model(cfg: LossScaleGroupConfig, loss_scale_manager: object) -> None:
    require_group_manager(loss_scale_manager)


#: Per-group loss scaling for the pipeline: the train cell's loss scaler does the work; Model checks the
#: manager.
SPEC = AlgorithmSpec(name="loss_scale_group", section=LossScaleGroupConfig, order=50, check_model=_check_model)

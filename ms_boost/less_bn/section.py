"""The ``less_bn`` section and ``PLAN``, the algorithm's place in the boost plan (its spec without hooks).

No MindSpore here: the boost plan is checked from these alone (:mod:`ms_boost.plans`, the launchers' check);
``spec.py`` adds the hooks that build cells.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Dict, Optional

from ms_boost.spec import AlgorithmSpec, Rule, Section
from ms_boost.validation import check_bool, check_float

__all__ = ["LessBNConfig", "PLAN"]


def _check_fn_scale(path: str, value: Any) -> Optional[float]:
    """None, or a number > 0."""
    return None if value is None else check_float(path, value, low=0.0, low_open=True)


@dataclass(frozen=True)
class LessBNConfig(Section):
    """``less_bn`` section.

    ``fn_flag`` replaces the last Dense by a feature-normalised head, ``gc_flag`` applies gradient centralization.
    ``fn_scale`` (ms_boost addition) is the head's starting multiplier: None (default) gives
    :func:`~ms_boost.fn_head.default_fn_scale` of the number of classes, 1.0 upstream's start.
    """

    fn_flag: bool = True
    gc_flag: bool = True
    fn_scale: Optional[float] = None

    SECTION: ClassVar[str] = "less_bn"
    RULES: ClassVar[Dict[str, Rule]] = {"fn_flag": check_bool, "gc_flag": check_bool, "fn_scale": _check_fn_scale}


#: the ``less_bn`` algorithm's place in the plan (name, section, order, levels, exclusivity)
PLAN = AlgorithmSpec(name="less_bn", section=LessBNConfig, order=10, levels=("O1", "O2"), in_enable_all=True)

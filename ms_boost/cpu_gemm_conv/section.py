"""The ``cpu_gemm_conv`` section and ``PLAN``, the algorithm's place in the boost plan (its spec without hooks).

No MindSpore here: the boost plan is checked from these alone (:mod:`ms_boost.plans`, the launchers' check);
``spec.py`` adds the hooks that build cells.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Dict, Tuple

from ms_boost.spec import AlgorithmSpec, Rule, Section
from ms_boost.validation import BoostConfigError

__all__ = ["CpuGemmConvConfig", "PLAN"]


def _names(path: str, value) -> Tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or \
            not all(isinstance(v, str) and v for v in value):
        raise BoostConfigError(f"boost config '{path}' must be a list of layer names (non-empty strings, as in "
                               f"network.cells_and_names()), got {value!r}.")
    return tuple(value)


@dataclass(frozen=True)
class CpuGemmConvConfig(Section):
    """``cpu_gemm_conv`` section.

    Attributes:
        skip: names of ``nn.Conv2d`` layers (as in ``network.cells_and_names()``) to leave as they are.
    """

    skip: Tuple[str, ...] = ()

    SECTION: ClassVar[str] = "cpu_gemm_conv"
    RULES: ClassVar[Dict[str, Rule]] = {"skip": _names}


#: the ``cpu_gemm_conv`` algorithm's place in the plan (name, section, order, levels, exclusivity)
PLAN = AlgorithmSpec(name="cpu_gemm_conv", section=CpuGemmConvConfig, order=5, levels=("O1", "O2"), in_enable_all=True)

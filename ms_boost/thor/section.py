"""The ``thor`` section and ``PLAN``, the algorithm's place in the boost plan (its spec without hooks).

No MindSpore here: the boost plan is checked from these alone (:mod:`ms_boost.plans`, the launchers' check);
``spec.py`` adds the hooks that build cells.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Dict, Optional, Tuple, Union

from ms_boost.spec import AlgorithmSpec, Rule, Section
from ms_boost.thor.assignment import DEFAULT_BLOCK_SIZE
from ms_boost.thor.rules import RULES

__all__ = ["ThorConfig", "PLAN"]


@dataclass(frozen=True)
class ThorConfig(Section):
    """``thor`` section: second-order THOR replacing the user's optimizer (learning rate kept).

    Attributes:
        damping: damping lambda (float, or one value per step).
        frequency: steps between recomputations of the factor inverses (int32 step counter).
        momentum: None takes the user's optimizer momentum (0.9 if it has none).
        weight_decay: None takes the user's optimizer weight decay.
        loss_scale: static loss scale the gradients carry.
        batch_size: accepted for upstream compatibility; factors use the real sample counts.
        use_nesterov: Nesterov momentum.
        split_indices: layer indices splitting the fused all-reduce of factors (0 is valid).
        enable_clip_grad: clip each preconditioned update tensor to norm 1.
        kl_clip: trust-region bound c of the preconditioned step (None or 0: off); see docs/thor.md.
        refresh_threshold: adaptive per-layer refresh: a layer's inverses are recomputed at a refresh only when
            the trace of one of its factors moved by more than this fraction since its last inversion (None or
            0: every layer at every refresh); see docs/thor.md.
        block_size: largest diagonal block of a factor (wider factors are captured and inverted as their
            diagonal blocks); see docs/thor.md "Block size".
        stat_fraction: the factor statistics use the first ``ceil(stat_fraction * N)`` samples of each batch of
            ``N`` (in (0, 1]; 1: the whole batch); see docs/thor.md "Twelfth round".
    """

    damping: Union[float, Tuple[float, ...]] = 0.03
    frequency: int = 100
    momentum: Optional[float] = None
    weight_decay: Optional[float] = None
    loss_scale: float = 1.0
    batch_size: int = 32
    use_nesterov: bool = False
    split_indices: Optional[Tuple[int, ...]] = None
    enable_clip_grad: bool = False
    kl_clip: Optional[float] = 1e-3
    refresh_threshold: Optional[float] = None
    block_size: int = DEFAULT_BLOCK_SIZE
    stat_fraction: float = 1.0

    SECTION: ClassVar[str] = "thor"
    RULES: ClassVar[Dict[str, Rule]] = RULES  # shared with the THOR constructor (ms_boost/thor/rules.py)


#: the ``thor`` algorithm's place in the plan (name, section, order, levels, exclusivity)
PLAN = AlgorithmSpec(name="thor", section=ThorConfig, order=70, runs_alone=True)

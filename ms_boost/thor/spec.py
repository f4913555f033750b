"""THOR through the boost configuration, as the pipeline sees it: its ``thor`` section and its ``SPEC``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Dict, Optional, Tuple, Union

from ms_boost.spec import AlgorithmSpec, BuildContext, Rule, Section, int_rule, optional_rule
from ms_boost.thor.boost import apply_boost_thor
from ms_boost.validation import check_bool, check_float, check_float_or_list, check_int_list

__all__ = ["ThorConfig", "SPEC"]


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

    SECTION: ClassVar[str] = "thor"
    RULES: ClassVar[Dict[str, Rule]] = {
        "damping": check_float_or_list,
        "frequency": int_rule(low=1, holder="the step counter is an int32"),
        "momentum": optional_rule(lambda p, v: check_float(p, v, low=0.0, high=1.0, high_open=True)),
        "weight_decay": optional_rule(lambda p, v: check_float(p, v, low=0.0)),
        "loss_scale": lambda p, v: check_float(p, v, low=0.0, low_open=True),
        "batch_size": int_rule(low=1),
        "use_nesterov": check_bool,
        "split_indices": optional_rule(lambda p, v: check_int_list(p, v, low=0)),
        "enable_clip_grad": check_bool,
        "kl_clip": optional_rule(lambda p, v: check_float(p, v, low=0.0)),
    }


def _rewrite_train(network, optimizer, cfg: ThorConfig, ctx: BuildContext):
    return apply_boost_thor(network, optimizer, cfg)


#: THOR replaces the network (converted copy) and the optimizer, and runs alone.
SPEC = AlgorithmSpec(name="thor", section=ThorConfig, order=70, runs_alone=True, rewrite_train=_rewrite_train,
                     apply_text="THOR preconditioned optimizer")

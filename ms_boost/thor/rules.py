"""The rules of THOR's ``thor`` configuration section, one rule and one message per value.

Shared by the section (:class:`ms_boost.thor.spec.ThorConfig`) and the THOR constructor. Apart from the section
because the section's module imports the optimizer's package (through the boost hook), which checks its arguments
with these rules.
"""
from __future__ import annotations

from typing import Any, Dict

from ms_boost.spec import Rule, int_rule, optional_rule
from ms_boost.validation import check_bool, check_float, check_float_or_list, check_int_list

__all__ = ["SECTION", "RULES", "check"]

#: The section's name in the boost config (``thor.<key>`` in messages).
SECTION = "thor"

RULES: Dict[str, Rule] = {
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
    "refresh_threshold": optional_rule(lambda p, v: check_float(p, v, low=0.0)),
    "block_size": int_rule(low=1),
    # the fraction of each batch's samples the factor statistics use (1: the whole batch)
    "stat_fraction": lambda p, v: check_float(p, v, low=0, high=1, low_open=True),
}


def check(name: str, value: Any, path: str = "") -> Any:
    """``value`` checked and normalised by the rule of ``thor.<name>`` (``path``: the name said in messages)."""
    return RULES[name](path or f"{SECTION}.{name}", value)

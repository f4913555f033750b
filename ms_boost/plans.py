"""The built-in algorithms' places in the boost plan, without MindSpore: each one's ``PLAN`` (its spec without hooks).

``BUILTIN_PLANS`` lists them in upstream's switch order, as :mod:`ms_boost.builtins` registers their specs
(``tests/test_import_graph.py`` checks that the two agree field by field, hooks aside). A registry holding these
plans resolves and checks a boost configuration exactly as the package does (:class:`~ms_boost.config.AutoBoost`
reads only the specs' names, sections, order, levels, exclusivity and ``warn_config``), so the launchers'
pre-launch check (``scripts/check_overrides.py``) checks a recipe's plan without importing MindSpore. Nothing
here builds a cell: the package face still registers the full specs.
"""
from __future__ import annotations

from ms_boost.adasum import section as adasum
from ms_boost.cpu_gemm_conv import section as cpu_gemm_conv
from ms_boost.dim_reduce import section as dim_reduce
from ms_boost.grad_accumulation import section as grad_accumulation
from ms_boost.grad_freeze import section as grad_freeze
from ms_boost.less_bn import section as less_bn
from ms_boost.loss_scale_group import section as loss_scale_group
from ms_boost.thor import section as thor

__all__ = ["BUILTIN_PLANS"]

#: the built-ins' plans in upstream's switch order (the order :mod:`ms_boost.builtins` registers them)
BUILTIN_PLANS = (less_bn.PLAN, grad_freeze.PLAN, adasum.PLAN, grad_accumulation.PLAN, dim_reduce.PLAN,
                 loss_scale_group.PLAN, thor.PLAN, cpu_gemm_conv.PLAN)

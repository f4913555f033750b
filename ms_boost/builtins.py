"""The built-in algorithms, registered one line each, and the optimizer hooks of THOR.

The algorithms are registered in upstream's switch order (the display order); THOR's optimizer hooks are
registered here because the THOR optimizer does not implement them itself.

Adding a built-in is one package ``ms_boost/<name>/`` whose ``section.py`` defines its section and ``PLAN`` and
``spec.py`` its ``SPEC`` (named ``<name>``: the PLAN with hooks), plus one line here and one in
:mod:`ms_boost.plans` (``tests/test_import_graph.py`` checks all three). :mod:`ms_boost.registry` imports no
algorithm; the package face imports this module first.
"""
from __future__ import annotations

from ms_boost.adasum import spec as adasum
from ms_boost.cpu_gemm_conv import spec as cpu_gemm_conv
from ms_boost.dim_reduce import spec as dim_reduce
from ms_boost.grad_accumulation import spec as grad_accumulation
from ms_boost.grad_freeze import spec as grad_freeze
from ms_boost.less_bn import spec as less_bn
from ms_boost.loss_scale_group import spec as loss_scale_group
from ms_boost.registry import register_builtin
from ms_boost.stages import register_optimizer_hooks
from ms_boost.thor import spec as thor
from ms_boost.thor.convert import ThorModelHooks
from ms_boost.thor.optimizer import THOR

register_builtin(less_bn.SPEC)
register_builtin(grad_freeze.SPEC)
register_builtin(adasum.SPEC)
register_builtin(grad_accumulation.SPEC)
register_builtin(dim_reduce.SPEC)
register_builtin(loss_scale_group.SPEC)
register_builtin(thor.SPEC)
register_builtin(cpu_gemm_conv.SPEC)

# what Model asks a THOR optimizer (ms_boost.stages.OptimizerHooks): its network, frequency=, plan note, guard
register_optimizer_hooks(THOR, ThorModelHooks)

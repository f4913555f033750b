"""The built-in algorithms, registered one line each (in upstream's switch order, the display order).

Adding a built-in is one package ``ms_boost/<name>/`` whose ``spec.py`` defines ``SPEC`` (and its section),
plus one line here. :mod:`ms_boost.registry` imports no algorithm; the package face imports this module.
"""
from __future__ import annotations

from ms_boost import adasum, grad_accumulation, grad_freeze_spec, less_bn, loss_scale
from ms_boost.dim_reduce import spec as dim_reduce_spec
from ms_boost.registry import register_builtin
from ms_boost.thor import spec as thor_spec

register_builtin(less_bn.SPEC)
register_builtin(grad_freeze_spec.SPEC)
register_builtin(adasum.SPEC)
register_builtin(grad_accumulation.SPEC)
register_builtin(dim_reduce_spec.SPEC)
register_builtin(loss_scale.SPEC)
register_builtin(thor_spec.SPEC)

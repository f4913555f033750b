"""The algorithm registry: built-in specs plus those registered with :func:`register_algorithm`.

Semantics (no singleton surprises):

* The registry holds *which algorithms exist*, never a configuration. It changes only through
  :func:`register_algorithm` / :func:`unregister_algorithm` (or the :func:`registered` context manager).
* An :class:`~ms_boost.config.AutoBoost` takes a snapshot of the registry when it is built: registering
  or unregistering later changes no existing AutoBoost, train cell or Model.
* A name is registered once: registering a taken name raises (built-ins cannot be replaced or removed).
* A registered algorithm is off at every boost level unless its spec lists the level; it is switched
  on with ``{"boost": {"mode": "manual", "<name>": True}, "<name>": {...}}``, exactly like a built-in.
"""
from __future__ import annotations

import contextlib
from typing import Dict, Iterator, Tuple

from ms_boost import adasum, grad_accumulation, grad_freeze_spec, less_bn, loss_scale
from ms_boost.cpu_gemm_conv import spec as cpu_gemm_conv_spec
from ms_boost.dim_reduce import spec as dim_reduce_spec
from ms_boost.spec import AlgorithmSpec
from ms_boost.thor import spec as thor_spec

__all__ = ["BUILTIN_SPECS", "register_algorithm", "unregister_algorithm", "registered", "specs", "get_spec"]

#: Built-in algorithms in the order of upstream's switch list (the display order of switches).
BUILTIN_SPECS: Tuple[AlgorithmSpec, ...] = (
    less_bn.SPEC, grad_freeze_spec.SPEC, adasum.SPEC, grad_accumulation.SPEC, dim_reduce_spec.SPEC,
    loss_scale.SPEC, thor_spec.SPEC,
    cpu_gemm_conv_spec.SPEC,
)

#: Names an algorithm cannot take (sections of the boost config and AutoBoost's own attributes).
RESERVED_NAMES = frozenset({
    "boost", "common", "mode", "level", "notes", "specs", "sections", "summary", "enabled", "enabled_specs",
    "section", "to_dict", "boost_config", "is_active", "network_auto_process_train", "network_auto_process_eval",
})

_REGISTRY: Dict[str, AlgorithmSpec] = {spec.name: spec for spec in BUILTIN_SPECS}


def specs() -> Tuple[AlgorithmSpec, ...]:
    """The registered specs: built-ins first, then user algorithms in registration order (a snapshot)."""
    return tuple(_REGISTRY.values())


def get_spec(name: str) -> AlgorithmSpec:
    """The spec registered as ``name``.

    Raises:
        KeyError: no such algorithm (the message lists the known ones).
    """
    if name not in _REGISTRY:
        raise KeyError(f"no boost algorithm {name!r} is registered; known: {list(_REGISTRY)}.")
    return _REGISTRY[name]


def register_algorithm(spec: AlgorithmSpec) -> AlgorithmSpec:
    """Make ``spec`` available to every AutoBoost built from now on.

    Args:
        spec: the algorithm (:class:`~ms_boost.spec.AlgorithmSpec`).

    Returns:
        ``spec`` (so it can be used as ``SPEC = register_algorithm(AlgorithmSpec(...))``).

    Raises:
        TypeError: ``spec`` is not an AlgorithmSpec.
        ValueError: the name is reserved or already registered, or ``excludes`` names an unknown algorithm.
    """
    if not isinstance(spec, AlgorithmSpec):
        raise TypeError(f"register_algorithm: expected an ms_boost.AlgorithmSpec, got {type(spec).__name__}.")
    if spec.name in RESERVED_NAMES:
        raise ValueError(f"register_algorithm: the name {spec.name!r} is reserved; choose another.")
    if any(builtin.name == spec.name for builtin in BUILTIN_SPECS):
        raise ValueError(f"register_algorithm: {spec.name!r} is a built-in algorithm; give yours another name.")
    if spec.name in _REGISTRY:
        raise ValueError(f"register_algorithm: an algorithm named {spec.name!r} is already registered "
                         f"(unregister_algorithm({spec.name!r}) first if it is yours).")
    clash = [other.name for other in _REGISTRY.values() if other.order == spec.order]
    if clash:
        raise ValueError(f"register_algorithm: {spec.name!r} has order={spec.order}, the place of {clash[0]!r} in "
                         f"the pipeline; choose a free order (taken: {sorted(o.order for o in _REGISTRY.values())}).")
    unknown = [name for name in spec.excludes if name not in _REGISTRY]
    if unknown:
        raise ValueError(f"register_algorithm: {spec.name!r} excludes unknown algorithm(s) {unknown}; "
                         f"known: {list(_REGISTRY)}.")
    _REGISTRY[spec.name] = spec
    return spec


def unregister_algorithm(name: str) -> AlgorithmSpec:
    """Remove the user algorithm ``name`` (existing AutoBoost objects keep their snapshot).

    Raises:
        ValueError: ``name`` is a built-in algorithm.
        KeyError: nothing is registered as ``name``.
    """
    if any(spec.name == name for spec in BUILTIN_SPECS):
        raise ValueError(f"unregister_algorithm: {name!r} is a built-in algorithm and cannot be removed.")
    spec = get_spec(name)
    del _REGISTRY[name]
    return spec


@contextlib.contextmanager
def registered(spec: AlgorithmSpec) -> Iterator[AlgorithmSpec]:
    """``with registered(SPEC): ...`` -- the algorithm is registered inside the block only (tests)."""
    register_algorithm(spec)
    try:
        yield spec
    finally:
        unregister_algorithm(spec.name)

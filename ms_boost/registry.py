"""The algorithm registry: which algorithms exist (a leaf: it imports no algorithm).

The built-ins are registered by :mod:`ms_boost.builtins` (one line each), which the package face imports
first; a user's algorithm with :func:`register_algorithm`. Semantics (no singleton surprises):

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
from typing import Dict, Iterator, List, Tuple

from ms_boost.spec import AlgorithmSpec

__all__ = ["register_builtin", "builtin_specs", "register_algorithm", "unregister_algorithm", "registered", "specs",
           "get_spec"]

_REGISTRY: Dict[str, AlgorithmSpec] = {}
_BUILTIN_NAMES: List[str] = []


def register_builtin(spec: AlgorithmSpec) -> AlgorithmSpec:
    """Register a built-in algorithm; it can never be removed or shadowed.

    :mod:`ms_boost.builtins` calls this once per built-in, in upstream's switch order (the display order of the
    switches).

    Raises:
        ValueError: as :func:`register_algorithm`.
    """
    _check_new(spec, "register_builtin")
    _REGISTRY[spec.name] = spec
    _BUILTIN_NAMES.append(spec.name)
    return spec


def builtin_specs() -> Tuple[AlgorithmSpec, ...]:
    """The built-in specs, in upstream's switch order."""
    return tuple(_REGISTRY[name] for name in _BUILTIN_NAMES)


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
    _check_new(spec, "register_algorithm")
    _REGISTRY[spec.name] = spec
    return spec


def _check_new(spec: AlgorithmSpec, caller: str) -> None:
    """Raise unless ``spec`` can join the registry (reserved names are refused by AlgorithmSpec itself)."""
    if not isinstance(spec, AlgorithmSpec):
        raise TypeError(f"{caller}: expected an ms_boost.AlgorithmSpec, got {type(spec).__name__}.")
    if spec.name in _BUILTIN_NAMES:
        raise ValueError(f"{caller}: {spec.name!r} is a built-in algorithm; give yours another name.")
    if spec.name in _REGISTRY:
        raise ValueError(f"{caller}: an algorithm named {spec.name!r} is already registered "
                         f"(unregister_algorithm({spec.name!r}) first if it is yours).")
    clash = [other.name for other in _REGISTRY.values() if other.order == spec.order]
    if clash:
        raise ValueError(f"{caller}: {spec.name!r} has order={spec.order}, the place of {clash[0]!r} in "
                         f"the pipeline; choose a free order (taken: {sorted(o.order for o in _REGISTRY.values())}).")
    unknown = [name for name in spec.excludes if name not in _REGISTRY]
    if unknown:
        raise ValueError(f"{caller}: {spec.name!r} excludes unknown algorithm(s) {unknown}; "
                         f"known: {list(_REGISTRY)}.")


def unregister_algorithm(name: str) -> AlgorithmSpec:
    """Remove the user algorithm ``name`` (existing AutoBoost objects keep their snapshot).

    Raises:
        ValueError: ``name`` is a built-in algorithm.
        KeyError: nothing is registered as ``name``.
    """
    if name in _BUILTIN_NAMES:
        raise ValueError(f"unregister_algorithm: {name!r} is a built-in algorithm and cannot be removed.")
    spec = get_spec(name)
    del _REGISTRY[name]
    return spec


@contextlib.contextmanager
def registered(spec: AlgorithmSpec) -> Iterator[AlgorithmSpec]:
    """Register ``spec`` for the duration of a ``with`` block only (tests)."""
    register_algorithm(spec)
    try:
        yield spec
    finally:
        unregister_algorithm(spec.name)

"""The pipeline: one ordered list of enabled algorithm specs -> rewrites, reducer, update stages, summary.

Everything the train cell runs and everything :meth:`AutoBoost.summary` says is derived here from the
same list (``boost.enabled_specs()``, sorted by :attr:`AlgorithmSpec.order`), so the description cannot
drift from what is built (the summary's line, :func:`~ms_boost.config.describe_steps`, reads the same list).
The functions take the resolved :class:`~ms_boost.config.AutoBoost`; this module imports no algorithm.
``AutoBoost`` applies nothing itself: :func:`rewrite_train` / :func:`rewrite_eval` are its rewrites
(upstream's ``network_auto_process_*``, kept by :mod:`ms_boost.compat`).

Chain built by :func:`build_update` (lower order wraps higher)::

    stage(order 30) -> stage(order 40) -> ... -> apply (the spec's ``apply`` or OptimizerUpdate)
"""
from __future__ import annotations

import logging
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple

from mindspore import nn

from ms_boost import comm
from ms_boost.config import AutoBoost, describe_steps
from ms_boost.spec import BuildContext, call_hook, single_hook
from ms_boost.stages import OptimizerUpdate
from ms_boost.topology import Topology

logger = logging.getLogger("ms_boost")

#: optimizers returned by :func:`rewrite_train` (weakly held): their pair went through the plan's rewrites
_REWRITTEN_OPTIMIZERS: weakref.WeakSet[Any] = weakref.WeakSet()

__all__ = ["build_context", "rewrite_train", "not_rewritten", "rewrite_eval", "build_reducer", "build_update",
           "describe_steps", "preview_network"]


def build_context(boost: AutoBoost, topology: Optional[Topology] = None) -> BuildContext:
    """The :class:`BuildContext` of ``boost`` (the topology of this process when None)."""
    if topology is None:
        topology = Topology.current(boost.common.device_number)
    return BuildContext(common=boost.common, topology=topology, level=boost.level)


def rewrite_train(boost: AutoBoost, network: nn.Cell, optimizer: Any,
                  ctx: Optional[BuildContext] = None) -> Tuple[nn.Cell, Any]:
    """Apply every enabled spec's ``rewrite_train`` in order; returns ``(network, optimizer)``."""
    ctx = build_context(boost) if ctx is None else ctx
    for spec in boost.enabled_specs():
        if spec.rewrite_train is not None:
            network, optimizer = call_hook(spec, "rewrite_train", network, optimizer, boost.section(spec.name), ctx)
    try:  # the optimizer outlives what may be done to the network afterwards (an amp cast, a rewrite)
        _REWRITTEN_OPTIMIZERS.add(optimizer)
    except TypeError:  # not weakly referenceable
        pass
    return network, optimizer


def not_rewritten(boost: AutoBoost, network: nn.Cell, optimizer: Any) -> List[str]:
    """The enabled algorithms whose ``rewrite_train`` the pair evidently did not go through.

    A spec without a ``rewritten`` hook cannot tell, and is not listed; an optimizer :func:`rewrite_train` returned
    lists none (the network it came with may have been cast or rewritten since, e.g. by amp).
    """
    try:
        if optimizer in _REWRITTEN_OPTIMIZERS:
            return []
    except TypeError:
        pass
    names = []
    for spec in boost.enabled_specs():
        if spec.rewrite_train is not None and spec.rewritten is not None and not spec.rewritten(network, optimizer):
            names.append(spec.name)
    return names


def preview_network(boost: AutoBoost, network: nn.Cell) -> Dict[str, Dict[str, int]]:
    """What each registered algorithm's training rewrite would change in ``network``, which is left unchanged.

    ``{name: counts}`` from every spec of ``boost`` with a ``preview`` hook, enabled or not (its section as
    ``boost`` resolved it): e.g. ``{"less_bn": {"batchnorm": 12, "removed_bn": 4, "fn_head": 1}}``. A preview is a
    guess for the autotune trial's priors, never a reason to stop: one that raises (or does not return counts) is
    left out with a warning naming the algorithm and the error.
    """
    out: Dict[str, Dict[str, int]] = {}
    for spec in sorted(boost.specs, key=lambda s: s.order):
        if spec.preview is not None:
            try:
                counts = call_hook(spec, "preview", network, boost.section(spec.name))
                out[spec.name] = {str(key): int(value) for key, value in dict(counts).items()}
            except Exception as exc:  # noqa: BLE001 - said, and the trial goes on without it
                logger.warning("preview of algorithm %r failed (%s: %s); the autotune trial goes on without it",
                               spec.name, type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
    return out


def rewrite_eval(boost: AutoBoost, network: nn.Cell, ctx: Optional[BuildContext] = None) -> nn.Cell:
    """Apply every enabled spec's ``rewrite_eval`` in order."""
    ctx = build_context(boost) if ctx is None else ctx
    for spec in boost.enabled_specs():
        if spec.rewrite_eval is not None:
            network = call_hook(spec, "rewrite_eval", network, boost.section(spec.name), ctx)
    return network


def build_reducer(boost: AutoBoost, weights: Sequence[Any], ctx: BuildContext) -> comm.GradReducer:
    """The data-parallel gradient reducer.

    an enabled spec's ``reducer`` (data-parallel runs only), else the mean over ``topology.degree`` ranks (identity in
    stand-alone mode or on one rank).
    """
    topology = ctx.topology
    spec = single_hook(boost.enabled_specs(), "reducer")
    if topology.data_parallel and spec is not None:
        return call_hook(spec, "reducer", weights, boost.section(spec.name), ctx)
    return comm.GradReducer(weights, topology.mean, topology.degree, None, enabled=topology.data_parallel)


def build_update(boost: AutoBoost, network: nn.Cell, optimizer: Any, weights: Sequence[Any],
                 ctx: BuildContext) -> nn.Cell:
    """Compose the update stages of the enabled specs around the apply stage; returns the outermost."""
    specs = boost.enabled_specs()
    weights = tuple(weights)
    applier = single_hook(specs, "apply")
    if applier is not None:
        stage = call_hook(applier, "apply", network, optimizer, weights, boost.section(applier.name), ctx)
    else:
        stage = OptimizerUpdate(optimizer)
    for spec in reversed(specs):
        if spec.stage is not None:
            built = call_hook(spec, "stage", stage, weights, boost.section(spec.name), ctx)
            if built is not None:
                stage = built
    return stage

"""The pipeline: one ordered list of enabled algorithm specs -> rewrites, reducer, update stages, summary.

Everything the train cell runs and everything :meth:`AutoBoost.summary` says is derived here from the
same list (``boost.enabled_specs()``, sorted by :attr:`AlgorithmSpec.order`), so the description cannot
drift from what is built. The functions take the resolved :class:`~ms_boost.config.AutoBoost` (duck:
``enabled_specs()``, ``section(name)``, ``common``, ``level``); this module imports no algorithm.

Chain built by :func:`build_update` (lower order wraps higher)::

    stage(order 30) -> stage(order 40) -> ... -> apply (the spec's ``apply`` or OptimizerUpdate)
"""
from __future__ import annotations

import inspect
from typing import Any, List, Optional, Tuple

from mindspore import nn

from ms_boost import comm
from ms_boost.spec import AlgorithmSpec, BuildContext
from ms_boost.topology import Topology
from ms_boost.update import OptimizerUpdate

__all__ = ["build_context", "rewrite_train", "rewrite_eval", "build_reducer", "build_update", "describe_steps"]


def build_context(boost, topology: Optional[Topology] = None) -> BuildContext:
    """The :class:`BuildContext` of ``boost`` (the topology of this process when None)."""
    if topology is None:
        topology = Topology.current(boost.common.device_number)
    return BuildContext(common=boost.common, topology=topology, level=boost.level)


def _single(specs: List[AlgorithmSpec], hook: str) -> Optional[AlgorithmSpec]:
    found = [s for s in specs if getattr(s, hook) is not None]
    if len(found) > 1:
        raise ValueError(f"boost: {[s.name for s in found]} each provide a '{hook}' hook; at most one enabled "
                         f"algorithm may (switch one off).")
    return found[0] if found else None


#: each hook's arguments, for the message when a user's hook cannot take them
_HOOK_ARGS = {"rewrite_train": "(network, optimizer, cfg, ctx)", "rewrite_eval": "(network, cfg, ctx)",
              "reducer": "(weights, cfg, ctx)", "apply": "(network, optimizer, weights, cfg, ctx)",
              "stage": "(inner, weights, cfg, ctx)", "describe": "(cfg, ctx)"}


def call_hook(spec, hook: str, *args):
    """``spec.<hook>(*args)``; a hook whose signature cannot take these arguments is a ``TypeError`` naming the
    algorithm, the hook and what it is called with (rather than Python's bare message from inside the pipeline),
    and a ``stage`` or ``apply`` hook must return a Cell (a plain function trains in PyNative and fails in Graph
    mode)."""
    fn = getattr(spec, hook)
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C callable: no signature to check
        signature = None
    if signature is not None:
        try:
            signature.bind(*args)
        except TypeError as exc:
            raise TypeError(f"algorithm {spec.name!r}: its {hook} hook {getattr(fn, '__name__', fn)}{signature} "
                            f"cannot be called as {hook}{_HOOK_ARGS.get(hook, '')} ({exc}).") from None
    result = fn(*args)
    if hook in ("stage", "apply") and result is not None and not isinstance(result, nn.Cell):
        raise TypeError(f"algorithm {spec.name!r}: its {hook} hook returned {type(result).__name__}; it must return "
                        f"an nn.Cell (an UpdateStage with construct(loss, grads, *inputs)).")
    return result


def rewrite_train(boost, network: nn.Cell, optimizer, ctx: Optional[BuildContext] = None) -> Tuple[nn.Cell, Any]:
    """Apply every enabled spec's ``rewrite_train`` in order; returns ``(network, optimizer)``."""
    ctx = build_context(boost) if ctx is None else ctx
    for spec in boost.enabled_specs():
        if spec.rewrite_train is not None:
            network, optimizer = call_hook(spec, "rewrite_train", network, optimizer, boost.section(spec.name), ctx)
    return network, optimizer


def rewrite_eval(boost, network: nn.Cell, ctx: Optional[BuildContext] = None) -> nn.Cell:
    """Apply every enabled spec's ``rewrite_eval`` in order."""
    ctx = build_context(boost) if ctx is None else ctx
    for spec in boost.enabled_specs():
        if spec.rewrite_eval is not None:
            network = call_hook(spec, "rewrite_eval", network, boost.section(spec.name), ctx)
    return network


def build_reducer(boost, weights, ctx: BuildContext) -> comm.GradReducer:
    """The data-parallel gradient reducer: an enabled spec's ``reducer`` (data-parallel runs only), else
    the mean over ``topology.degree`` ranks (identity in stand-alone mode or on one rank)."""
    topology = ctx.topology
    spec = _single(boost.enabled_specs(), "reducer")
    if topology.data_parallel and spec is not None:
        return call_hook(spec, "reducer", weights, boost.section(spec.name), ctx)
    return comm.GradReducer(weights, topology.mean, topology.degree, None, enabled=topology.data_parallel)


def build_update(boost, network: nn.Cell, optimizer, weights, ctx: BuildContext) -> nn.Cell:
    """Compose the update stages of the enabled specs around the apply stage; returns the outermost."""
    specs = boost.enabled_specs()
    weights = tuple(weights)
    applier = _single(specs, "apply")
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


def _default_reduction(topology: Topology) -> str:
    if topology.size == 1:
        return "no gradient reduction (1 rank)"
    return f"mean all-reduce across {topology.size} ranks (data parallel)"


def describe_steps(boost, topology: Topology) -> str:
    """The summary's pipeline line in the order the train step runs: the gradient reduction (the reducer
    spec's text, else the data-parallel mean; it runs in the train cell before every stage), the stages of
    the enabled specs in ``order``, the apply step, then what stages do with the update (``describe``'s
    ``after`` texts, outermost last)."""
    ctx = BuildContext(common=boost.common, topology=topology, level=boost.level)
    specs = boost.enabled_specs()
    reducer = _single(specs, "reducer")
    reduction, steps, after_apply = None, [], []
    for spec in specs:
        if spec.describe is None:
            continue
        text = call_hook(spec, "describe", boost.section(spec.name), ctx)
        before, after = text if isinstance(text, tuple) else (text, None)  # (before, after): see spec.py
        if spec is reducer:
            reduction = before
        elif before:
            steps.append(before)
        if after:
            after_apply.append(after)
    apply_texts = [s.apply_text for s in specs if s.apply_text]
    apply = apply_texts[-1] if apply_texts else "optimizer"
    return " -> ".join([reduction or _default_reduction(topology), *steps, apply, *after_apply[::-1]])

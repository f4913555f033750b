"""What an algorithm is to the pipeline: an :class:`AlgorithmSpec` (data, no behaviour of its own).

An algorithm module defines one ``SPEC`` and registers it (built-ins in :mod:`ms_boost.registry`, a
user's with :func:`ms_boost.register_algorithm`). The pipeline reads the enabled specs in ``order``:

* ``rewrite_train(network, optimizer, cfg, ctx) -> (network, optimizer)`` -- network/optimizer
  transformations for training (LessBN's BatchNorm removal, the freezing optimizer, THOR), applied in
  ``order``; ``rewrite_eval(network, cfg, ctx) -> network`` for the evaluation network.
* ``reducer(weights, cfg, ctx) -> comm.GradReducer`` -- replaces the data-parallel mean of the
  gradients (AdaSum: a mean inside each server); at most one enabled spec has one.
* ``apply(network, optimizer, weights, cfg, ctx) -> Cell`` -- replaces the optimizer step at the end
  of the chain (DimReduce); at most one enabled spec has one.
* ``stage(inner, weights, cfg, ctx) -> Cell`` -- an update stage wrapping the next one
  (``construct(loss, grads, *inputs)``); lower ``order`` wraps higher, so the chain reads in ``order``.
* ``describe(cfg, ctx) -> str`` -- this algorithm's step in the plan summary (None: no step of its own; a
  pair ``(before, after)`` places ``after`` behind the apply step, for a stage acting on the update's result);
  ``apply_text`` names the apply step when this algorithm changes it.

``cfg`` is the algorithm's section (an instance of ``section``, a frozen dataclass validating itself in
``__post_init__``); ``ctx`` is the :class:`BuildContext`.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Tuple

from ms_boost.sections import CommonConfig
from ms_boost.topology import Topology

__all__ = ["AlgorithmSpec", "BuildContext", "REDUCTION_ORDER"]

#: Kept for plugins that import it: the summary now shows the gradient reduction first, where the train cell
#: runs it (before every stage), whatever the stages' ``order``.
REDUCTION_ORDER = 35

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


@dataclass(frozen=True)
class BuildContext:
    """What a spec's hooks may read besides their own section.

    Attributes:
        common: the ``common`` section.
        topology: the ranks (built once per train cell; :meth:`Topology.current` for plans).
        level: the boost level.
    """

    common: CommonConfig = field(default_factory=CommonConfig)
    topology: Topology = field(default_factory=Topology)
    level: str = "O0"


@dataclass(frozen=True)
class AlgorithmSpec:
    """One algorithm as the pipeline sees it.

    Attributes:
        name: switch name in ``boost_config_dict["boost"]`` and the name of its section
            (lower-case identifier).
        section: frozen dataclass of its options, default-constructible, validating itself in
            ``__post_init__``; optional class attribute ``ALIASES`` maps other spellings to field names.
        order: place in the pipeline (built-ins: less_bn 10, grad_freeze 20, grad_accumulation 30,
            adasum 40, loss_scale_group 50, dim_reduce 60, thor 70).
        levels: boost levels that switch it on (user algorithms: usually none).
        runs_alone: switching it on switches every other algorithm off (with a note or warning).
        excludes: names switched off when this one is on.
        in_enable_all: ``boost.mode: enable_all`` switches it on.
        rewrite_train, rewrite_eval, reducer, apply, stage, describe: hooks, see the module doc.
        apply_text: the summary's apply step when this algorithm is on (e.g. ``"THOR preconditioned
            optimizer"``).
        check_model: ``check_model(cfg, loss_scale_manager)`` raises when ``Model`` got arguments the
            algorithm cannot work with (loss_scale_group needs a group manager).
        warn_config: ``warn_config(cfg) -> str or None``: a warning about legal but useless values (recorded
            in ``AutoBoost.notes`` and warned when the algorithm is on).
    """

    name: str
    section: type
    order: int
    levels: Tuple[str, ...] = ()
    runs_alone: bool = False
    excludes: Tuple[str, ...] = ()
    in_enable_all: bool = False
    rewrite_train: Optional[Callable[..., Tuple[Any, Any]]] = None
    rewrite_eval: Optional[Callable[..., Any]] = None
    reducer: Optional[Callable[..., Any]] = None
    apply: Optional[Callable[..., Any]] = None
    stage: Optional[Callable[..., Any]] = None
    describe: Optional[Callable[..., Optional[str]]] = None
    apply_text: Optional[str] = None
    check_model: Optional[Callable[..., None]] = None
    warn_config: Optional[Callable[..., Optional[str]]] = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ValueError(f"AlgorithmSpec: name={self.name!r} must be a lower-case identifier "
                             f"([a-z][a-z0-9_]*, at most 64 characters).")
        if self.name in ("boost", "common", "mode"):
            raise ValueError(f"AlgorithmSpec: name={self.name!r} is reserved.")
        if not (isinstance(self.section, type) and dataclasses.is_dataclass(self.section)):
            raise TypeError(f"AlgorithmSpec {self.name!r}: section must be a dataclass type, got "
                            f"{self.section!r}.")
        params = getattr(self.section, "__dataclass_params__", None)
        if params is None or not params.frozen:
            raise TypeError(f"AlgorithmSpec {self.name!r}: section {self.section.__name__} must be a frozen "
                            f"dataclass (@dataclass(frozen=True)).")
        try:
            self.section()
        except Exception as exc:  # noqa: BLE001 -- reported with the spec's name
            raise TypeError(f"AlgorithmSpec {self.name!r}: section {self.section.__name__}() must build with "
                            f"its defaults: {exc}") from exc
        if isinstance(self.order, bool) or not isinstance(self.order, int):
            raise TypeError(f"AlgorithmSpec {self.name!r}: order must be an int, got {self.order!r}.")
        for hook in ("rewrite_train", "rewrite_eval", "reducer", "apply", "stage", "describe", "check_model",
                     "warn_config"):
            value = getattr(self, hook)
            if value is not None and not callable(value):
                raise TypeError(f"AlgorithmSpec {self.name!r}: {hook} must be callable or None.")
        object.__setattr__(self, "levels", tuple(self.levels))
        object.__setattr__(self, "excludes", tuple(self.excludes))

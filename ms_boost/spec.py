"""What an algorithm is to the pipeline: an :class:`AlgorithmSpec` (data, no behaviour of its own).

An algorithm module defines one ``SPEC`` and registers it (built-ins in :mod:`ms_boost.registry`, a
user's with :func:`ms_boost.register_algorithm`). The pipeline reads the enabled specs in ``order``:

* ``rewrite_train(network, optimizer, cfg, ctx) -> (network, optimizer)`` -- network/optimizer
  transformations for training (LessBN's BatchNorm removal, the freezing optimizer, THOR), applied in
  ``order``; ``rewrite_eval(network, cfg, ctx) -> network`` for the evaluation network;
  ``rewritten(network, optimizer) -> bool`` tells whether a pair already went through ``rewrite_train``
  (a train cell built by hand on an unrewritten pair warns that the algorithm does not run).
* ``reducer(weights, cfg, ctx) -> comm.GradReducer`` -- replaces the data-parallel mean of the
  gradients (AdaSum: a mean inside each server); at most one enabled spec has one.
* ``apply(network, optimizer, weights, cfg, ctx) -> Cell`` -- replaces the optimizer step at the end
  of the chain (DimReduce); at most one enabled spec has one.
* ``stage(inner, weights, cfg, ctx) -> Cell`` -- an update stage wrapping the next one
  (``construct(loss, grads, *inputs)``); lower ``order`` wraps higher, so the chain reads in ``order``.
* ``describe(cfg, ctx) -> str`` -- this algorithm's step in the plan summary (None: no step of its own; a
  pair ``(before, after)`` places ``after`` behind the apply step, for a stage acting on the update's result);
  ``apply_text`` names the apply step when this algorithm changes it.
* ``preview(network, cfg) -> Mapping[str, int]`` -- what ``rewrite_train`` would change in ``network``, without
  changing it, as counts by name (LessBN: the BatchNorm layers it would remove and whether it adds its FN head);
  the autotune trial's context reads it (a candidate's priors may depend on it).

``cfg`` is the algorithm's section (an instance of ``section``, a frozen dataclass validating itself in
``__post_init__``); ``ctx`` is the :class:`BuildContext`.
"""
from __future__ import annotations

import dataclasses
import inspect
import re
from dataclasses import dataclass, field, fields
from typing import Any, Callable, ClassVar, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ms_boost.topology import Topology, check_device_number
from ms_boost.validation import INT32_MAX, BoostConfigError, check_int, check_int_list, short_repr

__all__ = [
    "AlgorithmSpec", "BuildContext", "Section", "check_fields", "CommonConfig", "build_section", "section_dict",
    "int_rule", "optional_rule", "Rule", "RESERVED_NAMES", "call_hook", "single_hook", "TrainingData",
]

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")

#: Names an algorithm cannot take: the boost config's own sections and AutoBoost's attributes.
RESERVED_NAMES = frozenset({
    "boost", "common", "mode", "level", "notes", "specs", "sections", "summary", "enabled", "enabled_specs",
    "section", "to_dict", "boost_config", "is_active", "network_auto_process_train", "network_auto_process_eval",
})

Rule = Callable[[str, Any], Any]


# -- sections: an algorithm's options ---------------------------------------------------------------------
@dataclass(frozen=True)
class Section:
    """Base of a self-validating section: ``RULES`` maps a field to ``rule(path, value) -> normalised``.

    Each built-in algorithm defines its section in its package's ``spec.py``; the boost config
    (:class:`~ms_boost.config.AutoBoost`), the pipeline and the upstream-style constructors
    (``GradientFreeze(...)``, ``GradientAccumulation(...)``, ``AdaSum(...)``, ``DimReduce(...)``) all build
    these same objects, so each value has one rule and one message.

    Attributes:
        SECTION: the section's name in the boost config (used in messages: ``SECTION.field``).
        ALIASES: other spellings accepted by :func:`build_section` (``{"n_component": "n_components"}``).
        RULES: per-field checker; a field without a rule is taken as is.
    """

    SECTION: ClassVar[str] = ""
    ALIASES: ClassVar[Dict[str, str]] = {}
    RULES: ClassVar[Dict[str, Rule]] = {}

    def __post_init__(self) -> None:
        """Check and normalise every field that has a rule."""
        checked = check_fields(self.SECTION, self.RULES, **{f.name: getattr(self, f.name) for f in fields(self)})
        for name, value in checked.items():
            object.__setattr__(self, name, value)


def check_fields(section: str, rules: Mapping[str, Rule], **values: Any) -> Dict[str, Any]:
    """``values`` checked and normalised by ``rules`` (a value without a rule is kept as is).

    The section's name prefixes each path in messages (``dim_reduce.rho``): a stage or an upstream constructor
    taking some of a section's values as arguments checks them with the section's own rules.
    """
    out = dict(values)
    for name, value in values.items():
        rule = rules.get(name)
        if rule is not None:
            out[name] = rule(f"{section}.{name}", value)
    return out


def build_section(name: str, cls: type, raw: Any) -> Any:
    """The section ``cls`` from the user's mapping ``raw`` (None: defaults), with aliases resolved.

    Raises:
        TypeError: ``raw`` is not a mapping (or a value has the wrong type).
        BoostConfigError: an unknown key, a key given under two spellings, a value out of range.
    """
    if raw is None:
        return cls()
    if not isinstance(raw, Mapping):
        raise TypeError(f"boost config section '{name}' must be a dict, got {short_repr(raw)} "
                        f"({type(raw).__name__}).")
    allowed = tuple(f.name for f in fields(cls))
    aliases = dict(getattr(cls, "ALIASES", {}) or {})
    values: Dict[str, Any] = {}
    spelled_as: Dict[str, Any] = {}
    for key, value in raw.items():
        canonical = aliases.get(key, key)
        if canonical not in allowed:
            spelled = sorted(allowed) + sorted(aliases)
            shown = key if isinstance(key, str) and len(key) <= 80 else short_repr(key)
            raise BoostConfigError(f"unknown boost config key '{name}.{shown}'; allowed keys: {spelled or 'none'}.")
        if canonical in values:
            raise BoostConfigError(f"boost config '{name}.{canonical}' is given twice, as "
                                   f"'{name}.{spelled_as[canonical]}' and as '{name}.{key}' (two spellings of one "
                                   f"key; a dict or recipe merged over another may hold the other one); give it once.")
        values[canonical] = value
        spelled_as[canonical] = key
    return cls(**values)


def section_dict(section: Any) -> Dict[str, Any]:
    """A section's values as plain data (tuples as lists)."""
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(section).items()}


def int_rule(low: Optional[int] = None, high: int = INT32_MAX, holder: str = "") -> Rule:
    """A rule for an int in ``[low, high]``; ``holder`` names the counter that bounds it."""
    return lambda p, v: check_int(p, v, low=low, high=high, holder=holder)


def optional_rule(rule: Rule) -> Rule:
    """``rule``, with None allowed."""
    return lambda p, v: None if v is None else rule(p, v)


@dataclass(frozen=True)
class CommonConfig(Section):
    """``common`` section.

    Attributes:
        gradient_split_groups: parameter indices where gradient groups are split (fused all-reduce
            boundaries and LessBN parameter groups). Upstream default ``[50, 100]``.
        device_number: devices per server; AdaSum combines across servers, a mean is taken inside one.
            Capped at the number of ranks (:class:`~ms_boost.topology.Topology`). Upstream also spells it
            ``device_num``.
    """

    gradient_split_groups: Tuple[int, ...] = (50, 100)
    device_number: int = 8

    SECTION: ClassVar[str] = "common"
    ALIASES: ClassVar[Dict[str, str]] = {"device_num": "device_number"}
    RULES: ClassVar[Dict[str, Rule]] = {
        "gradient_split_groups": lambda p, v: check_int_list(p, v, low=1),
        "device_number": check_device_number,
    }


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
class TrainingData:
    """What ``Model.train`` / ``fit`` know of the training data set before the first step (for ``warn_data``).

    Attributes:
        batch_size: the rows per batch of the data set's (outermost) ``batch``; None when unknown (no ``batch``, or a
            per-batch size function).
        last_batch: the rows of an epoch's last batch when it is shorter than ``batch_size``
            (``batch(..., drop_remainder=False)`` over a row count that ``batch_size`` does not divide); None when
            every batch is full (or unknown).
    """

    batch_size: Optional[int] = None
    last_batch: Optional[int] = None


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
        rewrite_train, rewrite_eval, rewritten, reducer, apply, stage, describe, preview: hooks, see the module
            doc.
        apply_text: the summary's apply step when this algorithm is on (e.g. ``"THOR preconditioned
            optimizer"``).
        check_model: ``check_model(cfg, loss_scale_manager)`` raises when ``Model`` got arguments the
            algorithm cannot work with (loss_scale_group needs a group manager).
        warn_config: ``warn_config(cfg) -> str or None``: a warning about legal but useless values (recorded
            in ``AutoBoost.notes`` and warned when the algorithm is on).
        warn_data: ``warn_data(cfg, data) -> str or None``, ``data`` a :class:`TrainingData`: a warning about
            what the algorithm computes on this training data set that the user would not expect (gradient
            accumulation: a short last batch weighs as much as a full one); ``Model.train`` / ``fit`` warn it.
        branches_on_device: its stage reads or writes Parameters inside a device-side branch of the compiled step
            (gradient accumulation's update, DimReduce's line search). MindSpore 2.10 keeps such a branch on the
            memory it was compiled with, so ``Model`` then watches, between the steps of a Graph-mode run, for
            Parameters a callback gave new memory (``set_data``) and compiles the step again
            (:class:`~ms_boost.replaced_memory.MemoryWatch`).
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
    rewritten: Optional[Callable[[Any, Any], bool]] = None
    reducer: Optional[Callable[..., Any]] = None
    apply: Optional[Callable[..., Any]] = None
    stage: Optional[Callable[..., Any]] = None
    describe: Optional[Callable[..., Union[None, str, Tuple[str, str]]]] = None
    apply_text: Optional[str] = None
    check_model: Optional[Callable[..., None]] = None
    warn_config: Optional[Callable[..., Optional[str]]] = None
    warn_data: Optional[Callable[..., Optional[str]]] = None
    branches_on_device: bool = False
    preview: Optional[Callable[..., Mapping[str, int]]] = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ValueError(f"AlgorithmSpec: name={self.name!r} must be a lower-case identifier "
                             f"([a-z][a-z0-9_]*, at most 64 characters).")
        if self.name in RESERVED_NAMES:
            raise ValueError(f"AlgorithmSpec: the name {self.name!r} is reserved (a section of the boost config or "
                             f"an AutoBoost attribute); choose another.")
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
        for hook in ("rewrite_train", "rewrite_eval", "rewritten", "reducer", "apply", "stage", "describe",
                     "check_model", "warn_config", "warn_data", "preview"):
            value = getattr(self, hook)
            if value is not None and not callable(value):
                raise TypeError(f"AlgorithmSpec {self.name!r}: {hook} must be callable or None.")
        object.__setattr__(self, "levels", tuple(self.levels))
        object.__setattr__(self, "excludes", tuple(self.excludes))


#: each hook's arguments, for the message when a user's hook cannot take them
_HOOK_ARGS = {"rewrite_train": "(network, optimizer, cfg, ctx)", "rewrite_eval": "(network, cfg, ctx)",
              "reducer": "(weights, cfg, ctx)", "apply": "(network, optimizer, weights, cfg, ctx)",
              "stage": "(inner, weights, cfg, ctx)", "describe": "(cfg, ctx)", "preview": "(network, cfg)"}


def call_hook(spec: AlgorithmSpec, hook: str, *args: Any) -> Any:
    """``spec.<hook>(*args)``, with a clear error for a hook that does not fit.

    Raises:
        TypeError: the hook's signature cannot take these arguments (the message names the algorithm, the hook
            and what it is called with, rather than Python's bare message from inside the pipeline), or a
            ``stage``/``apply`` hook returned something other than an ``nn.Cell`` (a plain function trains in
            PyNative and fails in Graph mode).
    """
    from mindspore import nn  # only here: sections and specs load without MindSpore (ms_boost.plans)

    fn = getattr(spec, hook)
    try:
        signature: Optional[inspect.Signature] = inspect.signature(fn)
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


def single_hook(specs: Sequence[AlgorithmSpec], hook: str) -> Optional[AlgorithmSpec]:
    """The one spec of ``specs`` that has ``hook`` (None when none has).

    Raises:
        ValueError: more than one has it (``reducer`` and ``apply`` are taken by at most one algorithm).
    """
    found: List[AlgorithmSpec] = [s for s in specs if getattr(s, hook) is not None]
    if len(found) > 1:
        raise ValueError(f"boost: {[s.name for s in found]} each provide a '{hook}' hook; at most one enabled "
                         f"algorithm may (switch one off).")
    return found[0] if found else None

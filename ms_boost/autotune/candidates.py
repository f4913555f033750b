"""The plans an autotune trial can try, by name.

A :class:`Candidate` is a boost plan (a level and a ``boost_config_dict``) with a name. Every plan is
expressible as a ``boost_config_dict`` -- THOR too, through its ``thor`` switch -- so the pick is written as a
YAML file that reproduces it. Built-in names:

====================  ==============================================================================
name                  plan
====================  ==============================================================================
``O0``                no boost algorithm (the plain step)
``O0_cpu_gemm_conv``  the plain step with ``nn.Conv2d`` swapped for im2col + GEMM (in the default list on CPU)
``O1``                LessBN + gradient freezing (schedule over the planned run's steps)
``O2``                O1 + AdaSum across the ranks (several ranks only; each rank its own server unless
                      the user's ``common.device_number`` says otherwise)
``grad_accumulation_2``  one update per 2 batches (small batches only in the default list)
``thor_d0.03_f5``     THOR, damping 0.03, factors and inverses refreshed every 5 steps
``thor_d0.03_f20``    THOR, damping 0.03, refreshed every 20 steps
``thor_d0.3_f5``      THOR, damping 0.3, refreshed every 5 steps
====================  ==============================================================================

Each candidate carries **priors**, what the trial expects of it before measuring, as multiples of ``O0``'s figures
(from the time-to-accuracy measurements, ``bench/results/tta.md``, and ``bench/autotune_priors.py``;
``docs/autotune.md`` gives the table):

* ``compile_prior(ctx)`` and ``step_prior(ctx)``: its compile and its steady step time over ``O0``'s;
* ``progress_prior``: the expected held-out loss decrease per step relative to ``O0``, used until the trial
  measures it: a number, or a function of the context (O1's and O2's: higher where LessBN, by its preview in
  :attr:`TrialContext.previews`, keeps every BatchNorm layer of the network and adds its FN head);
  ``exact_progress`` marks a plan that computes exactly ``O0``'s function (``O0_cpu_gemm_conv``), whose progress
  is ``O0``'s by construction and is never measured.

With the context's guess of ``O0``'s compile in ``O0`` steps (:attr:`TrialContext.compile_steps`) they predict each
plan's run before anything is measured (:func:`prior_run`): the trial probes the shortest predicted run first
(:func:`probe_order`), so a plan that is cheap to compile and saves much per step comes first even in a short run.

:func:`register_candidate` adds a plan of the user's (or a test's) under a new name.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ms_boost.validation import BoostConfigError, short_repr

__all__ = ["Candidate", "TrialContext", "SMALL_BATCH", "register_candidate", "unregister_candidate",
           "candidate_names", "get_candidate", "default_candidates", "resolve_candidates", "candidate_plan",
           "probe_order", "prior_run", "progress_of", "lessbn_keeps_batchnorm", "COMPILE_STEPS",
           "COMPILE_STEPS_SLOW_CONV", "O1_PROGRESS"]

#: per-rank batch sizes up to this count as small: gradient accumulation joins the default list
SMALL_BATCH = 32


@dataclass(frozen=True)
class TrialContext:
    """What a candidate's plan may depend on.

    Attributes:
        ranks: data-parallel ranks of the run.
        batch_size: samples per batch on one rank.
        planned_steps: training steps of the planned run (trial excluded).
        user_sections: the user's algorithm sections (``boost_config_dict`` without ``boost``/``autotune``).
        device: MindSpore's device target (``"CPU"``, ``"GPU"``, ``"Ascend"``; ``""`` unknown).
        conv2d_layers: ``nn.Conv2d`` cells of the network (what the ``cpu_gemm_conv`` rewrite would replace).
        previews: per algorithm, what its training rewrite would change in the network, as counts by name (the
            specs' ``preview`` hooks, :func:`ms_boost.pipeline.preview_network`): LessBN's ``{"batchnorm": ...,
            "removed_bn": ..., "fn_head": 0 or 1}``; empty when unknown.
    """

    ranks: int
    batch_size: int
    planned_steps: int
    user_sections: Mapping[str, Any] = field(default_factory=dict)
    device: str = ""
    conv2d_layers: int = 0
    previews: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    @property
    def slow_convolutions(self) -> bool:
        """Whether the network has ``nn.Conv2d`` layers on CPU (slow there; ``cpu_gemm_conv`` replaces them)."""
        return self.device == "CPU" and self.conv2d_layers > 0

    @property
    def compile_steps(self) -> float:
        """The guess of ``O0``'s compile time in ``O0`` steady steps, before anything is measured.

        It scales the candidates' compile priors against their step priors for the first probe only (later probes
        are ordered by the measured times). ``nn.Conv2d`` on CPU steps slowly (:data:`COMPILE_STEPS_SLOW_CONV`),
        other networks compile for the time of hundreds of steps (:data:`COMPILE_STEPS`).
        """
        return COMPILE_STEPS_SLOW_CONV if self.slow_convolutions else COMPILE_STEPS


#: O0's compile in O0 steady steps, nn.Conv2d on CPU (a slow step) and otherwise (bench/autotune_priors.py)
COMPILE_STEPS_SLOW_CONV = 10.0
COMPILE_STEPS = 200.0


def _same_as_o0(ctx: TrialContext) -> float:
    """The prior of a plan nothing is known about: O0's compile and step time."""
    del ctx
    return 1.0


@dataclass(frozen=True)
class Candidate:
    """A named boost plan the trial can try.

    Attributes:
        name: the name given in ``autotune.candidates``.
        level: the boost level the plan starts from.
        sections: ``context -> dict`` of ``boost_config_dict`` sections (``boost`` switches included) that
            make this plan; they override the user's sections of the same name key by key.
        description: one line for the log table.
        unavailable: ``context -> reason or None``: why the plan cannot run here (the candidate is dropped
            with that reason).
        in_default: ``context -> bool``: whether the default list tries it.
        wrap_step: instrumentation only (tests, profiling): ``step -> step`` wrapping the trial's train step.
        compile_prior: ``context -> float``: its compile time over O0's (default 1).
        step_prior: ``context -> float``: its steady step time over O0's (default 1).
        progress_prior: expected held-out loss decrease per step relative to O0, used while unmeasured (> 0):
            a number, or ``context -> float`` (:func:`progress_of` reads either).
        exact_progress: the plan computes O0's function exactly (only faster or slower): its progress per step
            is O0's by construction and the trial never measures it.
    """

    name: str
    level: str
    sections: Callable[[TrialContext], Dict[str, Any]]
    description: str
    unavailable: Callable[[TrialContext], Optional[str]] = lambda ctx: None
    in_default: Callable[[TrialContext], bool] = lambda ctx: True
    wrap_step: Optional[Callable[[Callable], Callable]] = None
    compile_prior: Callable[[TrialContext], float] = _same_as_o0
    step_prior: Callable[[TrialContext], float] = _same_as_o0
    progress_prior: Union[float, Callable[[TrialContext], float]] = 1.0
    exact_progress: bool = False


def progress_of(candidate: Candidate, ctx: TrialContext) -> float:
    """``candidate``'s progress prior in this run: its ``progress_prior``, called on ``ctx`` when it is callable.

    Raises:
        ValueError: the prior is not a finite number > 0 (the candidate is named).
    """
    prior = candidate.progress_prior
    value = prior(ctx) if callable(prior) else prior
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < float(value) < math.inf:
        raise ValueError(f"candidate {candidate.name!r}: progress_prior={short_repr(value)} is not allowed; allowed: "
                         f"a number > 0, or a function of the trial context returning one.")
    return float(value)


def _freeze_schedule(ctx: TrialContext) -> Dict[str, Any]:
    """Gradient freezing's schedule over the planned run (unless the user set its length), in one graph.

    Unless the user chose, Graph mode runs freezing's one masked graph (``graph_variants`` off): with a graph per
    train set, the trial's few steps would each compile the graph of a set not seen before, so it would measure
    compiles, not the steps the run repeats.
    """
    user = ctx.user_sections.get("grad_freeze") or {}
    out: Dict[str, Any] = {}
    if "total_steps" not in user:
        out["total_steps"] = max(1, int(ctx.planned_steps))
    if "graph_variants" not in user:
        out["graph_variants"] = False
    return {"grad_freeze": out} if out else {}


def _o2_sections(ctx: TrialContext) -> Dict[str, Any]:
    out = _freeze_schedule(ctx)
    if "device_number" not in (ctx.user_sections.get("common") or {}):
        out["common"] = {"device_number": 1}  # AdaSum combines servers: each rank is one here
    return out


def _needs_ranks(ctx: TrialContext) -> Optional[str]:
    return None if ctx.ranks > 1 else "O2 (AdaSum across ranks) needs several ranks; this run has 1"


def _needs_conv2d(ctx: TrialContext) -> Optional[str]:
    return None if ctx.conv2d_layers > 0 else "cpu_gemm_conv rewrites nn.Conv2d layers; the network has none"


def _by_conv(slow_conv: float, other: float) -> Callable[[TrialContext], float]:
    """A prior that depends on whether the network has ``nn.Conv2d`` layers on CPU."""
    return lambda ctx: slow_conv if ctx.slow_convolutions else other


def _thor(damping: float, frequency: int) -> Candidate:
    def sections(ctx: TrialContext) -> Dict[str, Any]:
        return {"boost": {"mode": "manual", "thor": True},
                "thor": {"damping": damping, "frequency": frequency, "batch_size": int(ctx.batch_size)}}
    return Candidate(f"thor_d{damping:g}_f{frequency}", "O0", sections,
                     f"THOR, damping {damping:g}, refreshed every {frequency} steps",
                     compile_prior=_by_conv(*THOR_COMPILE), step_prior=_by_conv(*THOR_STEP), progress_prior=1.5)


def _accumulation(steps: int) -> Candidate:
    def sections(ctx: TrialContext) -> Dict[str, Any]:
        return {"boost": {"mode": "manual", "grad_accumulation": True},
                "grad_accumulation": {"grad_accumulation_step": steps}}
    return Candidate(f"grad_accumulation_{steps}", "O0", sections, f"one update per {steps} batches",
                     in_default=lambda ctx: ctx.batch_size <= SMALL_BATCH,
                     compile_prior=_by_conv(*ACCUMULATION_COMPILE), step_prior=_by_conv(*ACCUMULATION_STEP),
                     progress_prior=0.6)


# The priors, as multiples of O0's compile and steady step time: (nn.Conv2d on CPU, other networks). Measured on CPU,
# digits at 16 px, batch 32, the time-to-accuracy page's conv net and GEMM ResNet-10 (docs/autotune.md gives the
# figures): the steady step from the median steps of the page's idle runs (bench/results/tta.md, tta_autotune.md), the
# compile from their first steps and from the probes of bench/autotune_priors.py. With nn.Conv2d layers, O0 +
# cpu_gemm_conv and O1 (which includes the rewrite on CPU) step about 6x faster than O0 (O1 no faster than the rewrite
# alone); O1 compiles LessBN's and freezing's larger graph; THOR compiles its factor and inverse graphs, and on GEMM
# convolutions steps 2.4x slower (its refreshes included).
GEMM_CONV_COMPILE, GEMM_CONV_STEP = 1.5, 0.15
O1_COMPILE, O1_STEP = (3.5, 1.4), (0.15, 1.1)
ACCUMULATION_COMPILE, ACCUMULATION_STEP = (1.4, 1.15), (1.0, 1.3)
THOR_COMPILE, THOR_STEP = (8.5, 5.5), (1.0, 2.4)

#: O1's (and O2's) progress prior: (LessBN keeps every BatchNorm layer and adds its FN head, otherwise). On the conv
#: net (three nn.Conv2d + BatchNorm stages: LessBN removes none, replaces the Dense head) O1 reached the target in
#: fewer epochs than O0's function: 1.2 is the geometric mean of the per-seed ratios of epochs to the target, O0 + the
#: GEMM rewrite over O1, of the 9 paired seeds measured (mnist5k/conv 6, digits/conv 3;
#: bench/results/autotune_o1_ablation.md); LessBN's FN head and gradient centralization make it (epoch-1 accuracy
#: 0.70-0.86 against 0.31-0.62), freezing alone slows it. Where LessBN removes BatchNorm layers (the GEMM ResNet-10:
#: 4 of 12) O1 needed as many epochs or more: the cautious 0.9.
O1_PROGRESS = (1.2, 0.9)


def lessbn_keeps_batchnorm(ctx: TrialContext) -> bool:
    """Whether O1's LessBN leaves the network's BatchNorm layers all in place and adds its FN head (its preview).

    There O1 trains the network's own function with a feature-normalised head (and gradient centralization and
    freezing); where LessBN removes BatchNorm layers (a residual addition after a chain of them) it changes the
    function more. False when the context holds no preview of LessBN or the network has no BatchNorm layer.
    """
    lessbn = ctx.previews.get("less_bn") or {}
    return (lessbn.get("batchnorm", 0) > 0 and lessbn.get("removed_bn", -1) == 0
            and lessbn.get("fn_head", 0) > 0)


def _o1_progress(ctx: TrialContext) -> float:
    """O1's progress prior: :data:`O1_PROGRESS`, by :func:`lessbn_keeps_batchnorm`."""
    return O1_PROGRESS[0] if lessbn_keeps_batchnorm(ctx) else O1_PROGRESS[1]


_BUILTIN: Tuple[Candidate, ...] = (
    Candidate("O0", "O0", lambda ctx: {}, "no boost algorithm", exact_progress=True),
    Candidate("O0_cpu_gemm_conv", "O0", lambda ctx: {"boost": {"mode": "manual", "cpu_gemm_conv": True}},
              "O0 with nn.Conv2d as im2col + GEMM (CPU)", unavailable=_needs_conv2d,
              in_default=lambda ctx: ctx.slow_convolutions, compile_prior=_by_conv(GEMM_CONV_COMPILE, 1.0),
              step_prior=_by_conv(GEMM_CONV_STEP, 1.0), exact_progress=True),
    Candidate("O1", "O1", _freeze_schedule, "LessBN + gradient freezing", compile_prior=_by_conv(*O1_COMPILE),
              step_prior=_by_conv(*O1_STEP), progress_prior=_o1_progress),
    Candidate("O2", "O2", _o2_sections, "O1 + AdaSum across ranks", unavailable=_needs_ranks,
              in_default=lambda ctx: ctx.ranks > 1, compile_prior=_by_conv(*O1_COMPILE), step_prior=_by_conv(*O1_STEP),
              progress_prior=_o1_progress),
    _accumulation(2),
    _thor(0.03, 5),
    _thor(0.03, 20),
    _thor(0.3, 5),
)
_BUILTIN_NAMES = frozenset(c.name for c in _BUILTIN)
_REGISTRY: Dict[str, Candidate] = {c.name: c for c in _BUILTIN}


def register_candidate(candidate: Candidate) -> None:
    """Make ``candidate`` available by its name in ``autotune.candidates`` (never in the default list).

    Raises:
        TypeError: not a :class:`Candidate`.
        ValueError: the name is taken.
    """
    if not isinstance(candidate, Candidate):
        raise TypeError(f"register_candidate: expected an ms_boost.autotune.Candidate, got "
                        f"{type(candidate).__name__}.")
    if candidate.name in _REGISTRY:
        raise ValueError(f"register_candidate: the name {candidate.name!r} is taken"
                         f"{' by a built-in candidate' if candidate.name in _BUILTIN_NAMES else ''}.")
    _REGISTRY[candidate.name] = candidate


def unregister_candidate(name: str) -> None:
    """Remove a candidate :func:`register_candidate` added (built-ins stay)."""
    if name in _BUILTIN_NAMES:
        raise ValueError(f"unregister_candidate: {name!r} is a built-in candidate.")
    if name not in _REGISTRY:
        raise ValueError(f"unregister_candidate: no candidate {short_repr(name)}; registered: {candidate_names()}.")
    del _REGISTRY[name]


def candidate_names() -> List[str]:
    """Every candidate name, built-ins first."""
    return list(_REGISTRY)


def get_candidate(name: str) -> Candidate:
    """The candidate called ``name``.

    Raises:
        BoostConfigError: no candidate has that name (the allowed names are listed).
    """
    if name not in _REGISTRY:
        raise BoostConfigError(f"boost config autotune.candidates: unknown candidate {short_repr(name)}; allowed: "
                               f"{candidate_names()}.")
    return _REGISTRY[name]


def default_candidates(ctx: TrialContext) -> List[Candidate]:
    """The built-in candidates the default trial tries for this run, simplest first."""
    return [c for c in _BUILTIN if c.in_default(ctx)]


def prior_run(candidate: Candidate, ctx: TrialContext, compile_o0: Optional[float] = None,
              step_o0: float = 1.0) -> float:
    r"""The run ``candidate`` is predicted to take from its priors: :math:`\kappa K + N \tau T / q`.

    ``K`` and ``T`` are O0's compile and steady step time: by default (nothing measured yet) ``T`` is the unit and
    ``K`` is :attr:`TrialContext.compile_steps` of it, so the result is in O0 steps; ``kappa``, ``tau`` and ``q`` are
    the candidate's compile, step and progress priors, ``N`` the planned steps.
    """
    compile_o0 = ctx.compile_steps * step_o0 if compile_o0 is None else compile_o0
    kappa, tau = float(candidate.compile_prior(ctx)), float(candidate.step_prior(ctx))
    return kappa * compile_o0 + ctx.planned_steps * tau * step_o0 / progress_of(candidate, ctx)


def probe_order(candidates: Sequence[Candidate], ctx: TrialContext) -> List[int]:
    """Indices of ``candidates`` in increasing :func:`prior_run` (list order on ties): the first is probed first."""
    runs = [prior_run(c, ctx) for c in candidates]
    return sorted(range(len(candidates)), key=lambda i: (runs[i], i))


def resolve_candidates(names: Sequence[str], ctx: TrialContext) -> List[Candidate]:
    """The candidates named (all checked before any trial), or the default list when ``names`` is empty."""
    if not names:
        return default_candidates(ctx)
    return [get_candidate(name) for name in names]


def _merge(base: Dict[str, Any], over: Mapping[str, Any]) -> Dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(dict(out[key]), value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def candidate_plan(candidate: Candidate, ctx: TrialContext) -> Tuple[str, Dict[str, Any]]:
    """``(boost_level, boost_config_dict)`` of ``candidate`` in this run.

    The user's sections, overridden key by key by the candidate's own.
    """
    return candidate.level, _merge(dict(ctx.user_sections), candidate.sections(ctx))

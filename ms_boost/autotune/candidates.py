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

Each candidate carries two **priors**, what the trial expects of it before measuring (from the
time-to-accuracy measurements, ``bench/results/tta.md``; ``docs/autotune.md`` gives the table):

* ``speed_prior(ctx)``: the expected speed-up of the planned run over ``O0`` (> 1: faster). The trial probes the
  candidates in decreasing order of it, so a short run whose budget pays for one probe probes the likeliest
  winner (on CPU with ``nn.Conv2d`` layers: ``O1``, which computes them as im2col + GEMM);
* ``progress_prior``: the expected held-out loss decrease per step relative to ``O0``, used until the trial
  measures it; ``exact_progress`` marks a plan that computes exactly ``O0``'s function (``O0_cpu_gemm_conv``),
  whose progress is ``O0``'s by construction and is never measured.

:func:`register_candidate` adds a plan of the user's (or a test's) under a new name.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ms_boost.validation import BoostConfigError, short_repr

__all__ = ["Candidate", "TrialContext", "SMALL_BATCH", "register_candidate", "unregister_candidate",
           "candidate_names", "get_candidate", "default_candidates", "resolve_candidates", "candidate_plan",
           "probe_order"]

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
    """

    ranks: int
    batch_size: int
    planned_steps: int
    user_sections: Mapping[str, Any] = field(default_factory=dict)
    device: str = ""
    conv2d_layers: int = 0

    @property
    def slow_convolutions(self) -> bool:
        """Whether the network has ``nn.Conv2d`` layers on CPU (slow there; ``cpu_gemm_conv`` replaces them)."""
        return self.device == "CPU" and self.conv2d_layers > 0


def _no_prior(ctx: TrialContext) -> float:
    """The speed prior of a plan nothing is known about: as fast as O0."""
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
        speed_prior: ``context -> float``: the expected speed-up of the planned run over O0 (> 1 faster); the
            trial probes candidates in decreasing order of it (default 1).
        progress_prior: expected held-out loss decrease per step relative to O0, used while unmeasured (> 0).
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
    speed_prior: Callable[[TrialContext], float] = _no_prior
    progress_prior: float = 1.0
    exact_progress: bool = False


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


def _thor(damping: float, frequency: int, speed: float) -> Candidate:
    def sections(ctx: TrialContext) -> Dict[str, Any]:
        return {"boost": {"mode": "manual", "thor": True},
                "thor": {"damping": damping, "frequency": frequency, "batch_size": int(ctx.batch_size)}}
    return Candidate(f"thor_d{damping:g}_f{frequency}", "O0", sections,
                     f"THOR, damping {damping:g}, refreshed every {frequency} steps",
                     speed_prior=lambda ctx: speed, progress_prior=1.5)


def _accumulation(steps: int) -> Candidate:
    def sections(ctx: TrialContext) -> Dict[str, Any]:
        return {"boost": {"mode": "manual", "grad_accumulation": True},
                "grad_accumulation": {"grad_accumulation_step": steps}}
    return Candidate(f"grad_accumulation_{steps}", "O0", sections, f"one update per {steps} batches",
                     in_default=lambda ctx: ctx.batch_size <= SMALL_BATCH, speed_prior=lambda ctx: 0.9,
                     progress_prior=0.6)


# The speed priors (expected speed-up of the run over O0) read the time-to-accuracy page (bench/results/tta.md, CPU):
# with nn.Conv2d layers, O0 + cpu_gemm_conv trained a steady epoch ~3.5x faster than O0 and O1 (which includes it
# on CPU) ~10x faster, 2x with its compile; on the GEMM ResNet O1's steady epoch was 1.9x O0's; THOR reached the
# target in 0.8x the baseline's time on the conv network and 5x on the GEMM ResNet.
_BUILTIN: Tuple[Candidate, ...] = (
    Candidate("O0", "O0", lambda ctx: {}, "no boost algorithm", exact_progress=True),
    Candidate("O0_cpu_gemm_conv", "O0", lambda ctx: {"boost": {"mode": "manual", "cpu_gemm_conv": True}},
              "O0 with nn.Conv2d as im2col + GEMM (CPU)", unavailable=_needs_conv2d,
              in_default=lambda ctx: ctx.slow_convolutions,
              speed_prior=lambda ctx: 3.0 if ctx.slow_convolutions else 1.0, exact_progress=True),
    Candidate("O1", "O1", _freeze_schedule, "LessBN + gradient freezing",
              speed_prior=lambda ctx: 4.0 if ctx.slow_convolutions else 0.7, progress_prior=0.9),
    Candidate("O2", "O2", _o2_sections, "O1 + AdaSum across ranks", unavailable=_needs_ranks,
              in_default=lambda ctx: ctx.ranks > 1, speed_prior=lambda ctx: 1.0, progress_prior=0.9),
    _accumulation(2),
    _thor(0.03, 5, 0.7),
    _thor(0.03, 20, 0.8),
    _thor(0.3, 5, 0.6),
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


def probe_order(candidates: Sequence[Candidate], ctx: TrialContext) -> List[int]:
    """Indices of ``candidates`` in the order the trial probes them: decreasing speed prior, list order on ties."""
    priors = [float(c.speed_prior(ctx)) for c in candidates]
    return sorted(range(len(candidates)), key=lambda i: (-priors[i], i))


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

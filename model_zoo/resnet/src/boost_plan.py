"""The recipe's boost plan checked and resolved as the run builds it, without building anything.

:func:`check_boost_plan` (train.py before anything is built, and the launchers' override check
``scripts/check_overrides.py``), :func:`boost_config_dict` (the recipe's sections with the zoo's conventions) and
the saved autotune pick (:func:`saved_plan`, :func:`concrete_plan`). This module imports no MindSpore itself: it
reads only the recipe (:mod:`.config`) and ms_boost's configuration pieces (``AutoBoost``, the registry's sections,
the ``autotune`` options), so the launchers' check needs nothing heavier than those
(``tests/test_import_graph.py`` keeps it so). :mod:`.trainer` re-exports every name.
"""
from __future__ import annotations

import copy
import os
import re
from pathlib import Path
from typing import Any, Dict, Optional

from model_zoo.resnet.src.config import Config, command_line_keys
from ms_boost import registry
from ms_boost.autotune.options import AUTO_LEVEL, split_auto_config
from ms_boost.config import AutoBoost
from ms_boost.spec import CommonConfig
from ms_boost.validation import load_mapping_file

__all__ = ["check_schedule_keys", "check_boost_plan", "AUTOTUNE_FILE", "saved_plan", "concrete_plan",
           "boost_config_dict"]


_FIRST_ORDER_SCHEDULE = ("lr_init", "lr_max", "lr_end", "lr_decay_mode", "warmup_epochs")


def check_schedule_keys(cfg: Config) -> None:
    """Refuse overrides that ``optimizer: THOR`` would ignore: the first-order schedule (its schedule is ``thor.*``)
    and ``boost_config_dict`` keys (THOR trains alone at boost level O0).

    Raises:
        ValueError: naming the keys given, their values and the ``thor.*`` keys to set instead.
    """
    if cfg.optimizer != "THOR":
        return
    boost = [key for key in command_line_keys(cfg) if key.startswith("boost_config_dict.")]
    if boost:
        raise ValueError(f"{', '.join('--' + key for key in boost)}: not used by optimizer='THOR', which trains alone "
                         f"at boost_level O0 (no boost algorithm runs beside it); THOR's own settings are the thor.* "
                         f"keys (--help lists them).")
    given = [key for key in _FIRST_ORDER_SCHEDULE if key in command_line_keys(cfg)
             and not (key == "warmup_epochs" and not cfg.warmup_epochs)]  # 0: THOR has no warm-up, as given
    if given:
        raise ValueError(f"{', '.join(f'--{key} {getattr(cfg, key)!r}' for key in given)}: not used by "
                         f"optimizer='THOR', whose learning rate is thor.lr_init * (1 - epoch / thor.lr_end_epoch) ** "
                         f"thor.lr_decay, halved at thor.decay_epochs (no warm-up); set --thor.lr_init, "
                         f"--thor.lr_decay, --thor.lr_end_epoch or --thor.decay_epochs instead.")


def _thor_level(cfg: Config) -> None:
    if cfg.optimizer == "THOR" and str(cfg.boost_level) != "O0":
        raise ValueError(f"boost_level={cfg.boost_level!r} does not combine with optimizer='THOR' (THOR replaces the "
                         f"optimizer and trains alone, so the level's algorithms would be dropped); allowed: 'O0'.")


def check_boost_plan(cfg: Config) -> None:
    """The run's boost plan checked as the run will build it, before anything is built (train.py, and the launchers'
    override check, ``scripts/check_overrides.py``).

    THOR takes no boost key and only level O0 (:func:`check_schedule_keys`); ``autotune.plan`` needs ``boost_level:
    auto`` and an existing file (:func:`saved_plan`); with ``boost_level: auto`` the ``autotune`` options and the
    sections are checked as the trial reads them, else ``ms_boost.AutoBoost`` checks the sections (unknown section or
    key, type, range). A ``--boost_config_dict.<section>.*`` key given on the command line for an algorithm the plan
    leaves off is refused (its value would be unused; a section written in the recipe file is not: the quick start's
    sections stay valid under ``--boost_level O0``).

    Raises:
        ValueError / TypeError: naming the key, the value and what is allowed.
    """
    check_schedule_keys(cfg)
    _thor_level(cfg)
    plan = saved_plan(cfg)
    sections = boost_config_dict(cfg, total_steps=1, for_structure=True) or {}
    if cfg.boost_level == AUTO_LEVEL and plan is None:
        options = {key: value for key, value in _autotune_section(cfg).items() if key != "plan"}
        split_auto_config(dict(sections, autotune=options))
        return
    if plan is not None:  # the saved pick with the command line's keys over it: checked as a fixed plan
        cfg = concrete_plan(cfg, plan)
        sections = boost_config_dict(cfg, total_steps=1, for_structure=True) or {}
    boost = AutoBoost(cfg.boost_level, sections)
    given = sorted({key.split(".")[1] for key in command_line_keys(cfg)
                    if key.startswith("boost_config_dict.") and key.count(".") >= 2})
    for name in given:
        if name in ("boost", "common") or boost.enabled(name):
            continue
        spec = next(spec for spec in boost.specs if spec.name == name)
        levels = [level for level in ("O1", "O2") if level in spec.levels]
        way = f"--boost_level {levels[0]}, or " if levels else ""
        raise ValueError(f"--boost_config_dict.{name}.*: the {name!r} algorithm is off in this run's plan "
                         f"(boost_level {cfg.boost_level}, boost.mode {boost.mode!r}), so these values would be "
                         f"unused; switch it on ({way}--boost_config_dict.boost.mode manual "
                         f"--boost_config_dict.boost.{name} true) or leave them out.")


AUTOTUNE_FILE = "autotune.yaml"


def _autotune_section(cfg: Config) -> Dict[str, Any]:
    section = cfg.get("autotune")
    return section.to_dict() if isinstance(section, Config) else dict(section or {})


def saved_plan(cfg: Config) -> Optional[Path]:
    """With ``boost_level: auto``, the saved pick to train without a trial: ``autotune.plan``, or on ``--resume`` the
    resumed run's ``autotune.yaml``; None: run the trial.

    Raises:
        ValueError: ``autotune.plan`` without ``boost_level: auto``, a missing file, or a resumed autotuned run
            without its ``autotune.yaml``.
    """
    given = str(_autotune_section(cfg).get("plan") or "")
    if cfg.boost_level != AUTO_LEVEL:
        if given:
            raise ValueError(f"autotune.plan={given!r} is only read with boost_level auto (this run has "
                             f"boost_level {cfg.boost_level}); give --boost_level auto, or pass the plan's sections "
                             f"as boost_config_dict.")
        return None
    if given:
        path = Path(os.path.expanduser(given))
        if not path.is_file():
            raise ValueError(f"autotune.plan={given!r} is not a file; give the {AUTOTUNE_FILE} an autotuned run "
                             f"wrote to its output_path.")
        return path
    if cfg.resume:
        path = Path(os.path.expanduser(str(cfg.resume)))
        path = (path if path.is_dir() else path.parent.parent) / AUTOTUNE_FILE
        if not path.is_file():
            raise ValueError(f"resume: boost_level auto needs the plan the resumed run picked, {str(path)!r}, which "
                             f"does not exist; give --autotune.plan <its {AUTOTUNE_FILE}> (or the run's boost_level).")
        return path
    return None


_PICK_LEVEL = re.compile(r"^# ms_boost autotune pick: .*\(boost_level (O[0-2])\)", re.MULTILINE)


def concrete_plan(cfg: Config, plan: Path) -> Config:
    """``cfg`` with the saved pick ``plan`` as its boost plan: the file's sections (its manual switches decide) with
    the command line's ``--boost_config_dict.*`` keys over them, at the level its header names (the trial's run
    recorded that level; O0 for a file without the header: the switches decide either way)."""
    data = load_mapping_file(plan, "autotune.plan file")
    try:
        found = _PICK_LEVEL.search(Path(plan).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        found = None
    section = cfg.boost_config_dict.to_dict() if isinstance(cfg.boost_config_dict, Config) else {}
    for key in sorted(command_line_keys(cfg)):  # your overrides win over the saved sections, as over a recipe's
        if not key.startswith("boost_config_dict."):
            continue
        parts, value, node = key.split(".")[1:], section, data
        for part in parts:
            value = value[part]
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[parts[-1]] = value
    return cfg.replace(boost_level=found.group(1) if found else "O0", boost_config_dict=data)


def _section_aliases() -> Dict[str, Dict[str, str]]:
    """Section name -> {alias: key} of ms_boost's sections (``common.device_num``, ``dim_reduce.n_component``)."""
    classes = {"common": CommonConfig, **{spec.name: spec.section for spec in registry.specs()}}
    return {name: dict(getattr(cls, "ALIASES", {}) or {}) for name, cls in classes.items()}


def _one_spelling(sections: Dict[str, Any], given) -> None:
    """A command-line key of a section drops the recipe's other spelling of it (upstream's ``n_components`` over the
    stage-2 recipe's ``n_component``, ``device_num`` over ``device_number``), in place: the two together were refused
    as the key given twice although the user gave it once."""
    aliases = _section_aliases()
    for key in sorted(given):
        parts = key.split(".")
        if len(parts) != 3 or parts[0] != "boost_config_dict" or not isinstance(sections.get(parts[1]), dict):
            continue
        section, name = parts[1], parts[2]
        table = aliases.get(section, {})
        canonical = table.get(name, name)
        for spelling in {canonical, *[a for a, c in table.items() if c == canonical]} - {name}:
            sections[section].pop(spelling, None)


def boost_config_dict(cfg: Config, total_steps: int, for_structure: bool = False) -> Optional[Dict[str, Any]]:
    """The recipe's ``boost_config_dict`` with the model zoo's conventions filled in.

    * ``grad_freeze.total_steps: 0`` becomes the run's total number of steps;
    * ``dim_reduce.weight_load_dir: ""`` becomes ``<folder of pretrained>/checkpoint_pca`` (where stage 1
      saved its weight-only checkpoints), and ``dim_reduce.pca_mat_path: ""`` becomes ``None``
      (computed from the checkpoints).

    With ``for_structure`` (eval/export only need to know how the plan changes the network) an empty
    ``weight_load_dir`` without ``pretrained`` is accepted.
    """
    raw = cfg.boost_config_dict.to_dict() if isinstance(cfg.boost_config_dict, Config) else {}
    if not raw:
        return None
    result = copy.deepcopy(raw)
    _one_spelling(result, command_line_keys(cfg))
    freeze = result.get("grad_freeze")
    if isinstance(freeze, dict) and freeze.get("total_steps") == 0:
        freeze["total_steps"] = int(total_steps)
    dim = result.get("dim_reduce")
    if isinstance(dim, dict):
        if dim.get("weight_load_dir") == "" and for_structure and not cfg.pretrained:
            dim["weight_load_dir"] = "<not needed for the network structure>"
        if dim.get("weight_load_dir") == "":
            if not cfg.pretrained:
                raise ValueError("boost_config_dict.dim_reduce.weight_load_dir is empty and pretrained is not set; "
                                 "give --pretrained <stage-1 checkpoint> or the folder of stage 1's weight "
                                 "checkpoints.")
            dim["weight_load_dir"] = str(Path(os.path.expanduser(cfg.pretrained)).parent / cfg.pca_checkpoint_dir)
        if dim.get("pca_mat_path") == "":
            dim["pca_mat_path"] = None
    return result

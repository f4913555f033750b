"""eval.py / export.py take the network's shape from the checkpoint's run manifest.

A checkpoint written by train.py carries its run manifest (``ms_boost_run``: the recipe, the network's
structure and the whole configuration; see :mod:`.run_state`). The keys of :data:`SHAPE_KEYS` (what decides
the network's Parameters) and :data:`INPUT_KEYS` (the input side the run evaluated at) are taken from there
unless the command line gives them, so a user does not repeat the training run's overrides (``--net_name
resnet10 --base_width 4 ...``) to evaluate or export its checkpoint; the recipe file's own values never
override the manifest's. A command-line value of a :data:`SHAPE_KEYS` key that differs from the manifest's
is an error naming both; one of :data:`INPUT_KEYS` is used as given (a ResNet evaluates at any image size).
A run trained on the built-in data set (``data_path: synthetic``) also hands on its ``synthetic.*`` keys
(classes, image size, split sizes, seed, cache) unless ``--data_path`` or that key is given, so eval.py
evaluates on the set the run trained on (``--data_path synthetic``, the launchers' way of naming that set, counts as
not given). With ``plan`` (eval.py / export.py given no ``--config``: the recipe is the checkpoint's) the run's boost
plan, :data:`PLAN_KEYS`, comes from the manifest too unless the command line gives ``--boost_level`` or a
``--boost_config_dict.*`` / ``--autotune.*`` key: a run whose plan came from the command line (``--boost_level O1`` on
the Momentum recipe) or from an autotune trial evaluates and exports with that plan. Checkpoints without a manifest
keep the configuration as it is.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, Tuple

from model_zoo.resnet.src.config import Config, command_line_keys, quote
from model_zoo.resnet.src.run_state import read_manifest

__all__ = ["SHAPE_KEYS", "INPUT_KEYS", "PLAN_KEYS", "with_checkpoint_shape", "checkpoint_config"]

SHAPE_KEYS = ("net_name", "base_width", "class_num")
"""Keys of the network's structure: from the manifest's ``structure``; a contradicting command line is an error."""
INPUT_KEYS = ("eval_image_size",)
"""Keys of the input: from the manifest's ``config`` unless the command line gives them."""
PLAN_KEYS = ("boost_level", "boost_config_dict")
"""Keys of the boost plan (the run's concrete one: an autotuned run records its pick): from the manifest's ``config``
when the recipe is the checkpoint's own (no ``--config``) and the command line sets no part of the plan."""


def _plan_given(given) -> bool:
    return any(key == "boost_level" or key.startswith(("boost_config_dict.", "autotune.")) for key in given)


def with_checkpoint_shape(cfg: Config, plan: bool = False) -> Tuple[Config, Dict[str, Any]]:
    """``cfg`` with the shape keys of ``checkpoint_file_path``'s manifest where the command line does not give them.

    ``plan``: also the run's boost plan (:data:`PLAN_KEYS`) unless the command line sets part of it (the module doc).

    Returns:
        ``(config, taken)``: the config to build the network from, and the keys taken from the manifest whose
        value differs from the recipe file's (``{}`` when nothing changed or the checkpoint has no manifest).

    Raises:
        ValueError: a command-line value of a :data:`SHAPE_KEYS` key contradicts the manifest (naming the key,
            both values and the checkpoint).
    """
    path = Path(os.path.expanduser(str(cfg.checkpoint_file_path or "")))
    if not cfg.checkpoint_file_path or not path.is_file():
        return cfg, {}  # inference_network names the missing file
    manifest = read_manifest(path, what="checkpoint_file_path")
    if manifest is None:
        return cfg, {}
    given = command_line_keys(cfg)
    structure, recorded = manifest.get("structure") or {}, manifest.get("config") or {}
    values = {key: structure.get(key, recorded.get(key)) for key in SHAPE_KEYS}
    values.update({key: recorded.get(key) for key in INPUT_KEYS})
    taken: Dict[str, Any] = {}
    for key, value in values.items():
        if value is None:
            continue
        if key in given:
            if key in SHAPE_KEYS and cfg[key] != value:
                recipe = manifest.get("recipe") or "?"
                raise ValueError(f"--{key} {cfg[key]!r} contradicts checkpoint {str(path)!r}: its run manifest "
                                 f"(recipe {recipe!r}) records {key}={value!r}, the network its weights belong to; "
                                 f"drop --{key} (the checkpoint's value is used) or give --{key} {value}.")
            continue
        if cfg[key] != value:
            taken[key] = value
    if plan and not _plan_given(given) and recorded.get("boost_level") in ("O0", "O1", "O2") \
            and isinstance(recorded.get("boost_config_dict"), dict):
        for key in PLAN_KEYS:
            mine = cfg[key].to_dict() if isinstance(cfg[key], Config) else cfg[key]
            if mine != recorded[key]:
                taken[key] = recorded[key]
    changes = dict(taken)
    if recorded.get("data_path") == "synthetic" and ("data_path" not in given or cfg.data_path == "synthetic") \
            and isinstance(recorded.get("synthetic"), dict):
        # the built-in data set the run trained on (its classes, image size and split sizes), unless given
        synthetic = cfg.synthetic.to_dict()
        for key, value in recorded["synthetic"].items():
            if key in synthetic and f"synthetic.{key}" not in given and synthetic[key] != value:
                synthetic[key] = taken[f"synthetic.{key}"] = value
        if cfg.data_path != "synthetic":
            taken["data_path"] = changes["data_path"] = "synthetic"
        if synthetic != cfg.synthetic.to_dict():
            changes["synthetic"] = synthetic
    return (cfg.replace(**changes) if changes else cfg), taken


def checkpoint_config(cfg: Config, prog: str, plan: bool = False) -> Config:
    """:func:`with_checkpoint_shape`, printing ``<prog>: from the checkpoint's run manifest: key=value, ...`` when
    it took something."""
    cfg, taken = with_checkpoint_shape(cfg, plan=plan)
    if taken:
        print(f"{prog}: from the checkpoint's run manifest: {', '.join(f'{k}={quote(v)}' for k, v in taken.items())}",
              flush=True)
    return cfg

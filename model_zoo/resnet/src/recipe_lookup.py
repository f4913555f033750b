"""Which recipe evaluates or exports a checkpoint when the command line names none (no ``--config``).

Every checkpoint train.py writes carries its run manifest (``ms_boost_run``, :mod:`.run_state`), which names the
recipe file the run was started with (``recipe_path``) and the recipe's name (``recipe``). eval.py, export.py and
``scripts/run_eval.sh`` given no ``--config`` take that recipe, in this order: the recorded file if it still
exists, else the zoo's ``configs/<recipe>.yaml``; and say which they took. A checkpoint without a manifest, or whose
recipe cannot be found here, keeps the script's default recipe (the Momentum baseline), and the recipe check of
eval/export names the ``--config`` to give when the two do not fit. A ``--config`` on the command line always wins.

Only the checkpoint file and the YAML paths are read here; MindSpore is imported by the checkpoint reader alone (the
launchers' override check loads this module without the rest of the zoo).
"""
from __future__ import annotations

import copy
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

from ms_boost.checkpoint_file import read_checkpoint

__all__ = ["CONFIG_DIR", "MANIFEST_KEY", "CHECKPOINT_NAME", "checkpoint_argument", "checkpoints_in", "config_given",
           "newest_checkpoint", "checkpoint_folder_resolved", "read_manifest", "recipe_of_checkpoint", "default_recipe"]

MANIFEST_KEY = "ms_boost_run"
"""The checkpoint entry holding a run's manifest (a JSON string)."""
CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
"""The zoo's recipe folder, searched for ``<recipe>.yaml`` when the recorded recipe file is gone."""

_CONFIG_FLAGS = ("--config", "--config_path")


def config_given(argv: Sequence[str]) -> bool:
    """Whether ``argv`` names a recipe (``--config FILE``, ``--config=FILE`` or the ``--config_path`` forms)."""
    return any(arg in _CONFIG_FLAGS or arg.startswith(tuple(f"{flag}=" for flag in _CONFIG_FLAGS)) for arg in argv)


def checkpoint_argument(argv: Sequence[str]) -> Optional[str]:
    """The last ``--checkpoint_file_path`` value in ``argv`` (``None`` if none is given)."""
    return _option(argv, "checkpoint_file_path")


CHECKPOINT_NAME = re.compile(r"^(?P<prefix>.+)-(?P<epoch>\d+)_(?P<step>\d+)\.ckpt$")
"""A run's checkpoint file name, ``<prefix>-<epoch>_<step>.ckpt``."""


def checkpoints_in(folder: Path, prefix: Optional[str] = None) -> List[Path]:
    """The ``<prefix>-<epoch>_<step>.ckpt`` files directly in ``folder`` (any prefix when None; none when the folder
    does not exist)."""
    if not folder.is_dir():
        return []
    return [p for p in folder.glob(f"{prefix}-*.ckpt" if prefix else "*.ckpt") if CHECKPOINT_NAME.match(p.name)]


def newest_checkpoint(folder: Path, checkpoint_dir: str, prefix: Optional[str] = None) -> Optional[Path]:
    """The newest ``<prefix>-<epoch>_<step>.ckpt`` (largest epoch, then step) of a run folder: searched in
    ``<folder>/<checkpoint_dir>``, then ``<folder>``; any prefix when ``prefix`` is None. None: no such file."""
    for where in (folder / checkpoint_dir, folder):
        found = checkpoints_in(where, prefix)
        if found:
            def order(path: Path):
                match = CHECKPOINT_NAME.match(path.name)
                return int(match.group("epoch")), int(match.group("step")), path.name
            return max(found, key=order)
    return None


def _option(argv: Sequence[str], name: str) -> Optional[str]:
    """The last value of ``--name`` in ``argv`` (``--name value`` or ``--name=value``), None if not given."""
    found = None
    for index, arg in enumerate(argv):
        if arg == f"--{name}" and index + 1 < len(argv):
            found = argv[index + 1]
        elif arg.startswith(f"--{name}="):
            found = arg.split("=", 1)[1]
    return found


def checkpoint_folder_resolved(argv: Sequence[str], prog: Optional[str]) -> List[str]:
    """``argv`` with a run folder given as ``--checkpoint_file_path`` replaced by its newest checkpoint (said on
    stderr as ``prog`` unless None), as ``--resume`` takes a run folder; anything else unchanged.

    Raises:
        ValueError: the folder holds no ``<prefix>-<epoch>_<step>.ckpt`` (naming both places searched).
    """
    given = checkpoint_argument(argv)
    if not given or not Path(os.path.expanduser(given)).is_dir():
        return list(argv)
    folder = Path(os.path.expanduser(given))
    checkpoint_dir = _option(argv, "checkpoint_dir") or "checkpoint"
    newest = newest_checkpoint(folder, checkpoint_dir)
    if newest is None:
        raise ValueError(f"checkpoint_file_path={given!r} is a folder with no '<prefix>-<epoch>_<step>.ckpt' "
                         f"checkpoint in {str(folder / checkpoint_dir)!r} or {str(folder)!r}; give a checkpoint file "
                         f"or a run's output folder.")
    if prog is not None:
        verb = "exporting" if prog == "export.py" else "evaluating"
        print(f"{prog}: checkpoint_file_path {given!r} is a run folder: {verb} its newest checkpoint, {newest}",
              file=sys.stderr, flush=True)
    out, skip = [], False
    for index, arg in enumerate(argv):
        if skip:
            skip = False
        elif arg == "--checkpoint_file_path" and index + 1 < len(argv):
            out += [arg, str(newest)]
            skip = True
        elif arg.startswith("--checkpoint_file_path="):
            out.append(f"--checkpoint_file_path={newest}")
        else:
            out.append(arg)
    return out


def read_manifest(path: Path, entries: Optional[Dict[str, Any]] = None,
                  what: str = "checkpoint") -> Optional[Dict[str, Any]]:
    """The ``ms_boost_run`` manifest of a checkpoint (``None`` for checkpoints written before it existed).

    ``entries``: the checkpoint's entries if already read; ``what`` names the file in a read error (the option that
    gave it, e.g. ``checkpoint_file_path``). Without ``entries`` the file is read once per process and version (its
    path, size and modification time): eval.py given no ``--config`` asks for the recipe, then for the shape, before
    loading the weights, and each read loads every tensor of the file.
    """
    if entries is None:
        stat = os.stat(path) if os.path.isfile(path) else None
        key = (os.path.realpath(path), stat.st_size, stat.st_mtime_ns) if stat is not None else None
        if key is None or key not in _MANIFESTS:
            manifest = _manifest_of(read_checkpoint(path, what=what))
            if key is None:
                return manifest
            _MANIFESTS.clear()  # one file's at a time: a script reads one checkpoint's manifest repeatedly
            _MANIFESTS[key] = manifest
        return copy.deepcopy(_MANIFESTS[key])
    return _manifest_of(entries)


_MANIFESTS: Dict[Any, Optional[Dict[str, Any]]] = {}


def _manifest_of(entries: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    raw = entries.get(MANIFEST_KEY)
    if not isinstance(raw, str):
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def recipe_of_checkpoint(path: Union[str, os.PathLike]) -> Optional[Path]:
    """The recipe file a checkpoint's run was trained with, if its manifest names one that exists here."""
    manifest = read_manifest(Path(path), what="checkpoint_file_path")
    if manifest is None:
        return None
    recorded = manifest.get("recipe_path")
    if isinstance(recorded, str) and Path(os.path.expanduser(recorded)).is_file():
        return Path(os.path.expanduser(recorded))
    name = manifest.get("recipe")
    if isinstance(name, str) and name and (CONFIG_DIR / f"{name}.yaml").is_file():
        return CONFIG_DIR / f"{name}.yaml"
    return None


def default_recipe(argv: Sequence[str], fallback: Union[str, Path], prog: Optional[str]) -> Union[str, Path]:
    """The recipe to read when ``argv`` gives no ``--config``: the checkpoint's (said on stderr as ``prog``; ``None``:
    not said, as the launchers' override check, whose output becomes the launcher's error message), else ``fallback``.

    With ``--config`` given, or no readable checkpoint file given, ``fallback`` is returned unchanged (a missing or
    unreadable checkpoint is reported by the script where it loads it).
    """
    if config_given(argv):
        return fallback
    checkpoint = checkpoint_argument(argv)
    if not checkpoint or not Path(os.path.expanduser(checkpoint)).is_file():
        return fallback
    try:
        recipe = recipe_of_checkpoint(Path(os.path.expanduser(checkpoint)))
    except ValueError:
        return fallback  # not a checkpoint: the script's own load names the fault
    if recipe is None:
        return fallback
    if prog is not None:
        print(f"{prog}: no --config given: using the recipe the checkpoint was trained with (its run manifest): "
              f"{recipe}", file=sys.stderr, flush=True)
    return recipe

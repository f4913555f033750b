"""YAML recipe configuration with ``--key value`` command-line overrides.

A recipe is one YAML mapping. A top-level ``base: other.yaml`` key (a path relative to the file)
inherits another recipe and deep-merges this file's keys over it. Such a child recipe may only set keys its
base has (or add a section of :data:`OPTIONAL_SECTIONS`, or keys under an :data:`OPEN_SECTIONS` section), each
with the base value's type (an int where a float is expected, made a float; null only where the base's is
null); anything else is a ``ValueError`` naming the file, the dotted key, the value and what is allowed
(:func:`check_against_base`). Nested mappings are addressed with dotted keys (``synthetic.image_size``,
``boost_config_dict.dim_reduce.n_component``).

Every scalar or list key can be overridden on the command line as ``--key value`` or ``--key=value``;
the value is converted to the type of the YAML default:

* ``bool``: ``true/false``, ``yes/no``, ``on/off``, ``1/0`` (any case);
* ``int`` / ``float``: Python literals (``1e-4`` is fine for a float);
* ``str``: taken as is;
* ``null`` default: ``null``/``none`` give ``None``, anything else is taken as a string;
* list: ``a,b,c`` or a YAML flow list ``[a, b]``; items take the type of the default's first item.

A key under an :data:`OPEN_SECTIONS` section that the recipe does not have (``--boost_config_dict.grad_freeze.freeze_p
0.5`` on a recipe whose ``boost_config_dict`` is ``{}``) is added with YAML's reading of its text, as a child recipe
may add it; ms_boost checks it when the boost plan is built (the launchers check it before starting, see
``scripts/check_overrides.py``). Any other unknown key raises ``ValueError`` naming it and the closest known
keys. ``--help`` prints every key
with its value, type and the comment written next to it in the YAML file. Files are read with ms_boost's one
safe loader (:func:`ms_boost.validation.load_mapping_file`, also used for ``boost_config_dict`` files): a
``yaml.SafeLoader`` (nothing read is ever evaluated) that also rejects a key given twice in one mapping
(naming both lines), a file that is not UTF-8 (naming the file and the byte offset) and documents whose
aliases expand to more than :data:`MAX_NODES` values; values quoted in error messages are cut to
:data:`MAX_QUOTE` characters.
"""
from __future__ import annotations

import copy
import difflib
import re
import reprlib
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import yaml

from ms_boost.validation import MAX_FILE_VALUES, load_mapping_file

__all__ = ["CHOICES", "check_choices",
           "Config", "ConfigHelp", "MAX_NODES", "MAX_QUOTE", "OPEN_SECTIONS", "OPTIONAL_SECTIONS", "load_yaml",
           "check_against_base", "parse_value", "apply_overrides", "parse_config", "config_source",
           "command_line_keys", "added_keys", "quote"]

MAX_NODES = MAX_FILE_VALUES
"""Most values (mappings, lists and scalars, aliases counted as expanded) a recipe may hold."""
MAX_QUOTE = 200
"""Longest quoted value in an error message (longer ones are cut with ``...``)."""

_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")
_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def quote(value: Any, limit: int = MAX_QUOTE) -> str:
    """``repr(value)`` cut to ``limit`` characters (error messages stay short whatever the input)."""
    text = reprlib.Repr()
    text.maxstring = text.maxother = limit
    text.maxlist = text.maxdict = text.maxtuple = text.maxset = 8
    text.maxlevel = 3
    out = text.repr(value)
    return out if len(out) <= limit else out[: limit - 3] + "..."


class Config(Mapping):
    """Read-only recipe configuration: ``cfg.batch_size`` or ``cfg["batch_size"]``.

    Nested mappings are ``Config`` objects too. ``source`` is the recipe file it was read from (if any).
    """

    def __init__(self, data: Mapping, source: Optional[Union[str, Path]] = None, given: Sequence[str] = ()):
        object.__setattr__(self, "_data", {k: Config(v) if isinstance(v, Mapping) else copy.deepcopy(v)
                                           for k, v in data.items()})
        object.__setattr__(self, "_source", None if source is None else str(source))
        object.__setattr__(self, "_given", frozenset(given))

    def __getattr__(self, name: str) -> Any:
        if name in ("_data", "_source", "_given"):  # not initialised yet (copy/pickle protocols probe attributes first)
            raise AttributeError(name)
        try:
            return self._data[name]
        except KeyError:
            raise AttributeError(f"config has no key {name!r}; known: {', '.join(sorted(self._data))}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Config is read-only; use --key value on the command line or replace(**changes).")

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"Config({self.to_dict()!r})"

    def to_dict(self) -> Dict[str, Any]:
        """Plain nested ``dict`` copy."""
        return {k: v.to_dict() if isinstance(v, Config) else copy.deepcopy(v) for k, v in self._data.items()}

    def replace(self, **changes: Any) -> Config:
        """Copy with top-level keys changed (keys must exist)."""
        unknown = sorted(set(changes) - set(self._data))
        if unknown:
            raise ValueError(f"replace: unknown config keys {unknown}.")
        data = self.to_dict()
        data.update(changes)
        return Config(data, source=self._source, given=self.__dict__.get("_given", ()))


def config_source(cfg: Config) -> Optional[str]:
    """The recipe file ``cfg`` was read from (``None`` for a config built in code)."""
    return cfg.__dict__.get("_source")


def command_line_keys(cfg: Config) -> frozenset:
    """The dotted keys :func:`parse_config` was given as ``--key value`` (empty for a config built in code)."""
    return cfg.__dict__.get("_given", frozenset())


def added_keys(cfg: Config) -> List[str]:
    """The command-line keys the recipe file does not have (keys added below an :data:`OPEN_SECTIONS` section)."""
    source = config_source(cfg)
    if not source:
        return []
    known = _flatten(load_yaml(source))
    return sorted(key for key in command_line_keys(cfg) if key not in known)


def _deep_merge(base: Dict[str, Any], update: Mapping) -> Dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping) and value:
            merged[key] = _deep_merge(dict(merged[key]), value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _read_mapping(path: Path) -> Dict[str, Any]:
    """One recipe file through ms_boost's safe loader (:func:`ms_boost.validation.load_mapping_file`: UTF-8,
    ``yaml.SafeLoader``, a key given twice named with both lines, at most :data:`MAX_NODES` values)."""
    return load_mapping_file(path, "config file", max_values=MAX_NODES)


OPEN_SECTIONS = ("boost_config_dict",)
"""Sections under which a recipe may add keys its base lacks: ``boost_config_dict`` holds ms_boost's own
sections, which :class:`ms_boost.AutoBoost` checks key by key (names, types, ranges) when train.py, eval.py or
export.py build the boost plan. Keys the base does give there are still type-checked."""

OPTIONAL_SECTIONS: Dict[str, Dict[str, Any]] = {
    "thor": {"lr_init": 0.0, "lr_decay": 0.0, "lr_end_epoch": 0, "decay_epochs": 0, "damping_init": 0.0,
             "damping_decay": 0.0, "damping_epochs": 0, "frequency": 0, "split_indices": [0], "kl_clip": 0.0,
             "block_size": 0, "stat_fraction": 0.0},
}
"""Top-level sections a recipe may add although its base lacks them, each key with a value of its type
(``optimizer: THOR`` needs ``thor``; see configs/resnet50_imagenet_thor.yaml)."""


def _kind(reference: Any) -> str:
    """What a value must be to replace ``reference`` (in words, for error messages)."""
    if isinstance(reference, Mapping):
        return "a section (a mapping of keys)"
    if isinstance(reference, bool):
        return "a bool (true or false, unquoted)"
    if isinstance(reference, int):
        return "an int"
    if isinstance(reference, float):
        return "a float (or an int)"
    if isinstance(reference, str):
        return "a str"
    if isinstance(reference, list):
        return f"a list whose items are each {_kind(reference[0])}" if reference else "a list"
    return "a value (the base's is null)"


def _fits(value: Any, reference: Any) -> bool:
    if isinstance(reference, bool):
        return isinstance(value, bool)
    if isinstance(reference, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(reference, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(reference, str):
        return isinstance(value, str)
    if isinstance(reference, list):
        return isinstance(value, list) and (not reference or all(_fits(item, reference[0]) for item in value))
    return reference is None and not isinstance(value, Mapping)


def _typed(value: Any, reference: Any) -> Any:
    """``value`` (which fits ``reference``) with ints given for float defaults made floats, so that a later
    ``--key`` override still parses as a float."""
    if isinstance(reference, float) and not isinstance(value, bool) and isinstance(value, int):
        return float(value)
    if isinstance(reference, list) and reference:
        return [_typed(item, reference[0]) for item in value]
    return value


def check_against_base(data: Mapping, base: Mapping, path: Union[str, Path], base_path: Union[str, Path],
                       prefix: str = "", open_section: bool = False) -> Dict[str, Any]:
    """Check a child recipe's keys against its (merged) base: every key must exist in the base, or be one of
    :data:`OPTIONAL_SECTIONS`, or sit under one of :data:`OPEN_SECTIONS`, and its value must have the base
    value's type (an int where a float is expected is made a float; null only where the base's is null).

    Returns:
        ``data`` with those ints made floats.

    Raises:
        ValueError: naming the file, the dotted key, the value and what is allowed.
    """
    where = f"config {str(path)!r}"
    checked: Dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if key in base:
            reference = base[key]
        elif not prefix and key in OPTIONAL_SECTIONS:
            reference = OPTIONAL_SECTIONS[key]
        elif open_section:
            checked[key] = copy.deepcopy(value)
            continue
        else:
            known = [f"{prefix}{k}" for k in base] + ([] if prefix else list(OPTIONAL_SECTIONS))
            close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
            hint = f" Did you mean: {', '.join(close)}?" if close else ""
            raise ValueError(f"{where}: unknown key {quote(name)} (value {quote(value)}); a recipe may only set "
                             f"the keys of its base {str(base_path)!r}, which has no such key.{hint} "
                             f"(--help --config <base> lists every key)")
        if isinstance(reference, Mapping) or isinstance(value, Mapping):
            if not (isinstance(reference, Mapping) and isinstance(value, Mapping)):
                raise ValueError(f"{where}: {name}={quote(value)} ({type(value).__name__}): expected "
                                 f"{_kind(reference)}, as in the base {str(base_path)!r} ({quote(reference)}).")
            is_open = open_section or (not prefix and key in OPEN_SECTIONS)
            if not value and reference and not is_open:
                raise ValueError(f"{where}: {name} is an empty section; the base {str(base_path)!r} gives it the "
                                 f"keys {sorted(reference)}; set the keys to change, do not empty the section.")
            checked[key] = check_against_base(value, reference, path, base_path, f"{name}.", is_open)
        elif value is None and reference is not None:
            raise ValueError(f"{where}: {name}=null: expected {_kind(reference)}, as in the base "
                             f"{str(base_path)!r} ({quote(reference)}); null is allowed only where the base's "
                             f"value is null.")
        elif not _fits(value, reference):
            raise ValueError(f"{where}: {name}={quote(value)} ({type(value).__name__}): expected "
                             f"{_kind(reference)}, as in the base {str(base_path)!r} ({quote(reference)}).")
        else:
            checked[key] = _typed(value, reference)
    return checked


def load_yaml(path: Union[str, Path], _seen: Tuple[Path, ...] = ()) -> Dict[str, Any]:
    """Read a recipe, resolving ``base:`` inheritance (deep merge, child wins).

    Raises:
        ValueError: missing file, a non-mapping document, or a ``base`` cycle.
    """
    path = Path(path).resolve()
    if path in _seen:
        raise ValueError(f"config 'base' cycle: {' -> '.join(str(p) for p in (*_seen, path))}.")
    data = _read_mapping(path)
    base = data.pop("base", None)
    if base is None:
        return data
    if not isinstance(base, str):
        raise ValueError(f"config {str(path)!r}: 'base' must be a file name, got {quote(base)}.")
    base_path = (path.parent / base).resolve()
    if not base_path.is_file():
        raise ValueError(f"config {str(path)!r}: base={quote(base)} names {str(base_path)!r}, which does not exist or "
                         f"is not a file; a base is a path relative to the recipe's own folder (the shipped recipes "
                         f"are in {str(Path(__file__).resolve().parents[1] / 'configs')!r}).")
    inherited = load_yaml(base_path, (*_seen, path))
    return _deep_merge(inherited, check_against_base(data, inherited, path, base_path))


def _flatten(data: Mapping, prefix: str = "") -> Dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; empty mappings stay as leaves."""
    flat: Dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def _parse_scalar(key: str, text: str, default: Any) -> Any:
    if isinstance(default, bool):
        lowered = text.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise ValueError(f"--{key}={quote(text)}: expected a bool (true/false, yes/no, on/off, 1/0).")
    if isinstance(default, int):
        try:
            return int(text.strip())
        except ValueError:
            raise ValueError(f"--{key}={quote(text)}: expected an int.") from None
    if isinstance(default, float):
        try:
            return float(text.strip())
        except ValueError:
            raise ValueError(f"--{key}={quote(text)}: expected a float.") from None
    if default is None:
        return None if text.strip().lower() in ("null", "none", "~") else text
    return text


def parse_value(key: str, text: str, default: Any) -> Any:
    """Convert the command-line ``text`` for ``key`` to the type of its YAML ``default``.

    Raises:
        ValueError: the text does not parse as that type, or ``key`` names a whole mapping.
    """
    if isinstance(default, Mapping):
        raise ValueError(f"--{key} is a section; override its keys one by one (--{key}.<name> value).")
    if isinstance(default, (list, tuple)):
        stripped = text.strip()
        if stripped.startswith("["):
            items = yaml.safe_load(stripped)
            if not isinstance(items, list):
                raise ValueError(f"--{key}={quote(text)}: expected a list.")
            items = [str(item) for item in items]
        else:
            items = [item.strip() for item in stripped.split(",")] if stripped else []
        if default:
            return [_parse_scalar(key, item, default[0]) for item in items]
        return [yaml.safe_load(item) for item in items]
    return _parse_scalar(key, text, default)


def _split_argv(argv: Sequence[str]) -> List[Tuple[str, Optional[str]]]:
    """``["--a", "1", "--b=2", "--flag"]`` -> ``[("a", "1"), ("b", "2"), ("flag", None)]``."""
    pairs: List[Tuple[str, Optional[str]]] = []
    index = 0
    argv = list(argv)
    while index < len(argv):
        token = argv[index]
        if not token.startswith("--") or len(token) == 2:
            raise ValueError(f"unexpected command-line argument {quote(token)}: expected --key value.")
        if "=" in token:
            key, value = token[2:].split("=", 1)
            pairs.append((key, value))
            index += 1
        elif index + 1 < len(argv) and not (argv[index + 1].startswith("--") and len(argv[index + 1]) > 2):
            pairs.append((token[2:], argv[index + 1]))
            index += 2
        else:
            pairs.append((token[2:], None))
            index += 1
    return pairs


def _set_dotted(data: Dict[str, Any], dotted: str, value: Any) -> None:
    node = data
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node[part]
    node[parts[-1]] = value


def _open_key(data: Mapping, key: str) -> bool:
    """Whether ``key`` may be added on the command line: below an :data:`OPEN_SECTIONS` section, through mappings
    only (a child recipe may add such keys too; ms_boost checks them when the boost plan is built)."""
    parts = key.split(".")
    if len(parts) < 2 or parts[0] not in OPEN_SECTIONS or not all(_KEY_RE.match(part) for part in parts):
        return False
    node: Any = data
    for part in parts[:-1]:
        if not isinstance(node, Mapping):
            return False
        node = node.get(part, {})
    return isinstance(node, Mapping)


def _open_value(key: str, text: Optional[str]) -> Any:
    """A value for a key the recipe does not have: YAML's reading of the text (``0.5`` a float, ``true`` a bool,
    ``[1, 2]`` a list, anything else a string); the key's type is checked where the section is used."""
    if text is None:
        raise ValueError(f"--{key} needs a value (the recipe has no such key, so no type or default is known).")
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _set_open(data: Dict[str, Any], dotted: str, value: Any) -> None:
    node = data
    parts = dotted.split(".")
    for part in parts[:-1]:
        if not node.get(part):  # absent, or an empty section ({} in the recipe)
            node[part] = {}
        node = node[part]
    node[parts[-1]] = value


def apply_overrides(data: Mapping, overrides: Sequence[Tuple[str, Optional[str]]]) -> Dict[str, Any]:
    """Apply ``(key, text)`` overrides to a copy of ``data`` with type conversion (see module doc).

    Raises:
        ValueError: unknown key (with the closest known keys), missing value, or a value of the wrong type.
    """
    result = copy.deepcopy(dict(data))
    flat = _flatten(result)
    for key, text in overrides:
        if key not in flat and _open_key(result, key):
            _set_open(result, key, _open_value(key, text))
            flat = _flatten(result)
            continue
        if key not in flat:
            sections = {name.rsplit(".", 1)[0] for name in flat if "." in name}
            if key in sections:
                raise ValueError(f"--{key} is a section; override its keys one by one (--{key}.<name> value).")
            close = difflib.get_close_matches(key, list(flat), n=5, cutoff=0.6)
            hint = f" Did you mean: {', '.join('--' + c for c in close)}?" if close else ""
            raise ValueError(f"unknown config key --{quote(key)[1:-1]}.{hint} (--help lists every key)")
        if text is None:
            if isinstance(flat[key], bool):
                text = "true"
            else:
                raise ValueError(f"--{key} needs a value (current: {quote(flat[key])}).")
        value = parse_value(key, text, flat[key])
        flat[key] = value
        _set_dotted(result, key, value)
    return result


class ConfigHelp:
    """``--help`` text: every key with its value, type and the comment written after it in the YAML files."""

    _LINE = re.compile(r"^(?P<indent>\s*)(?P<key>[A-Za-z_][A-Za-z0-9_]*)\s*:(?P<rest>.*)$")

    @classmethod
    def comments(cls, path: Union[str, Path]) -> Dict[str, str]:
        """Dotted key -> trailing ``# comment`` of that key's line, for ``path`` and its ``base`` chain."""
        path = Path(path).resolve()
        found: Dict[str, str] = {}
        base = _read_mapping(path).get("base")
        if isinstance(base, str) and (path.parent / base).resolve() != path:
            found.update(cls.comments(path.parent / base))
        stack: List[Tuple[int, str]] = []
        for raw in path.read_text(encoding="utf-8").splitlines():
            match = cls._LINE.match(raw)
            if not match or raw.lstrip().startswith("#"):
                continue
            indent = len(match.group("indent"))
            while stack and stack[-1][0] >= indent:
                stack.pop()
            dotted = ".".join([name for _, name in stack] + [match.group("key")])
            rest = match.group("rest")
            if "#" in rest:
                found[dotted] = rest.split("#", 1)[1].strip()
            if rest.split("#", 1)[0].strip() == "":
                stack.append((indent, match.group("key")))
        return found

    @classmethod
    def render(cls, data: Mapping, path: Union[str, Path], prog: str) -> str:
        comments = cls.comments(path)
        lines = [f"usage: {prog} [--config FILE] [--key value ...]", "", f"config: {path}", "", "keys:"]
        for key, value in _flatten(data).items():
            kind = "list" if isinstance(value, list) else ("null" if value is None else type(value).__name__)
            note = f"  # {comments[key]}" if key in comments else ""
            lines.append(f"  --{key} {value!r} ({kind}){note}")
        return "\n".join(lines)


#: keys whose value is one of a few names: checked when the command line is parsed, before MindSpore loads, so a
#: launcher's check (``scripts/check_overrides.py``, dry runs included) stops on a misspelt one as train.py would.
#: ``mode`` and ``export_file_format`` take any case (``GRAPH``, ``onnx``) and are stored as listed here.
CHOICES: Dict[str, Tuple[str, ...]] = {
    "mode": ("graph", "pynative"),
    "device_target": ("auto", "Ascend", "GPU", "CPU"),
    "optimizer": ("Momentum", "SGD", "THOR"),
    "loss_scale_type": ("fixed", "dynamic", "none"),
    "resume_data": ("exact", "fast"),
    "boost_level": ("O0", "O1", "O2", "auto"),
    "export_file_format": ("MINDIR", "AIR", "ONNX"),
}
_ANY_CASE = {"mode": str.lower, "export_file_format": str.upper}


def check_choices(data: Dict[str, Any], source: Union[str, Path] = "") -> Dict[str, Any]:
    """Check the :data:`CHOICES` keys ``data`` holds (top level), in place; the case-free ones are normalised.

    Raises:
        ValueError: naming the key, its value, where it came from and the allowed values.
    """
    for key, allowed in CHOICES.items():
        if key not in data:
            continue
        value = data[key]
        if isinstance(value, str) and key in _ANY_CASE:
            value = _ANY_CASE[key](value)
        if not isinstance(value, str) or value not in allowed:
            where = f" (config {str(source)!r} or the command line)" if source else ""
            case = " (any case)" if key in _ANY_CASE else ""
            raise ValueError(f"{key}={quote(data[key])}{where} is not allowed; allowed{case}: {', '.join(allowed)}.")
        data[key] = value
    return data


def parse_config(argv: Sequence[str], default_config: Union[str, Path], prog: str = "train.py") -> Config:
    """Read ``--config FILE`` (else ``default_config``) and apply the other ``--key value`` arguments.

    ``--help``/``-h`` prints the keys and exits (``SystemExit(0)``).

    Raises:
        ValueError: unknown keys, bad values, bad files.
    """
    argv = list(argv)
    config_path: Union[str, Path] = default_config
    rest: List[str] = []
    want_help = False
    index = 0
    while index < len(argv):
        token = argv[index]
        if token in ("-h", "--help"):
            want_help = True
        elif token == "--config" or token == "--config_path":
            if index + 1 >= len(argv):
                raise ValueError("--config needs a file name.")
            config_path = argv[index + 1]
            index += 1
        elif token.startswith("--config=") or token.startswith("--config_path="):
            config_path = token.split("=", 1)[1]
        else:
            rest.append(token)
        index += 1
    data = load_yaml(config_path)
    for key in _flatten(data):
        if not all(_KEY_RE.match(part) for part in key.split(".")):
            raise ValueError(f"config {str(config_path)!r}: key {quote(key)} is not an identifier.")
    overrides = _split_argv(rest)
    data = check_choices(apply_overrides(data, overrides), config_path)
    if want_help:
        print(ConfigHelp.render(data, config_path, prog))
        raise SystemExit(0)
    return Config(data, source=Path(config_path).resolve(), given=[key for key, _ in overrides])

"""Value rules and safe config-file loading: the bottom layer every other ms_boost module may use.

Nothing here knows an algorithm. Each checker takes the *path* of the value (``dim_reduce.rho``) and
raises with one message shape::

    boost config dim_reduce.rho=1.5 is out of range; allowed: 0 < value < 1.

``TypeError`` for a wrong type, :class:`BoostConfigError` (a ``ValueError``) for a wrong value. Quoted
values are shortened (:func:`short_repr`), so a huge or self-referencing value (a YAML alias bomb)
never makes a huge message. Integers are bounded by the counter that holds them: :data:`INT32_MAX`
for values MindSpore keeps in an int32 Parameter (micro-step counters, step frequencies), else
:data:`INT64_MAX`.

:func:`load_mapping_file` reads a YAML or JSON file with ``yaml.SafeLoader`` / ``json`` only, rejects a
key given twice in one mapping (naming both lines), reports invalid UTF-8 naming the file and the
byte offset, and never quotes more than a few hundred characters of the file in an error.
"""
from __future__ import annotations

import json
import math
import os
import reprlib
from typing import Any, Dict, Optional, Tuple

import numpy as np
import yaml

__all__ = [
    "BoostConfigError", "INT32_MAX", "INT64_MAX", "short_repr", "check_bool", "check_int", "check_float",
    "check_optional_path", "check_int_list", "check_float_or_list", "load_mapping_file", "count_values",
    "MAX_FILE_VALUES",
]

INT32_MAX = 2 ** 31 - 1
INT64_MAX = 2 ** 63 - 1
_MESSAGE_VALUE_CHARS = 120


class BoostConfigError(ValueError):
    """A boost configuration value is not allowed. Subclass of ``ValueError``."""


_repr = reprlib.Repr()
_repr.maxstring = _MESSAGE_VALUE_CHARS
_repr.maxother = _MESSAGE_VALUE_CHARS
_repr.maxlong = 60
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 8
_repr.maxlevel = 3


def short_repr(value: Any) -> str:
    """``repr(value)`` cut to a bounded length (nested containers and long strings abbreviated with ``...``)."""
    text = _repr.repr(value)
    if len(text) > 2 * _MESSAGE_VALUE_CHARS:
        text = text[:2 * _MESSAGE_VALUE_CHARS] + "..."
    return text


def _type_name(value: Any) -> str:
    return type(value).__name__


def _fmt(number) -> str:
    return repr(number) if isinstance(number, float) else str(number)


def check_bool(path: str, value: Any) -> bool:
    """``value`` if it is a bool: ``True``/``False`` or numpy's ``np.bool_`` (as numpy ints pass); not 1 or 0."""
    if isinstance(value, np.bool_):  # e.g. a value read from a numpy array or a comparison: "got True (bool_)" before
        value = bool(value)
    if not isinstance(value, bool):
        raise TypeError(f"boost config {path} must be a bool (True/False), got {short_repr(value)} "
                        f"({_type_name(value)}).")
    return value


def check_int(path: str, value: Any, low: Optional[int] = None, high: Optional[int] = INT64_MAX,
              holder: str = "") -> int:
    """``value`` if it is an int in ``[low, high]`` (bools are not ints here).

    Args:
        path: the value's name in messages (``grad_freeze.param_groups``).
        value: the value.
        low, high: inclusive bounds (None: unbounded). ``high`` defaults to :data:`INT64_MAX`.
        holder: what bounds ``high`` (e.g. ``"the int32 micro-step counter"``), said in the message.
    """
    if isinstance(value, np.integer):  # e.g. a value read from a numpy array
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"boost config {path} must be an int, got {short_repr(value)} ({_type_name(value)}).")
    if (low is not None and value < low) or (high is not None and value > high):
        because = f" ({holder})" if holder else ""
        raise BoostConfigError(f"boost config {path}={short_repr(value)} is out of range; allowed: "
                               f"{_range_text(low, high)}{because}.")
    return value


def check_float(path: str, value: Any, low: Optional[float] = None, high: Optional[float] = None,
                low_open: bool = False, high_open: bool = False) -> float:
    """``float(value)`` if it is a finite real number in the interval.

    Ints and numpy numbers are accepted, bools are not.
    """
    if isinstance(value, (np.integer, np.floating)):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"boost config {path} must be a number, got {short_repr(value)} ({_type_name(value)}).")
    number = float(value)
    bad_low = low is not None and (number <= low if low_open else number < low)
    bad_high = high is not None and (number >= high if high_open else number > high)
    if bad_low or bad_high or not math.isfinite(number):
        raise BoostConfigError(f"boost config {path}={short_repr(value)} is out of range; allowed: "
                               f"{_interval_text(low, high, low_open, high_open)}.")
    return number


def _range_text(low, high) -> str:
    if low is not None and high is not None:
        return f"{_fmt(low)} <= value <= {_fmt(high)}"
    if low is not None:
        return f"value >= {_fmt(low)}"
    if high is not None:
        return f"value <= {_fmt(high)}"
    return "any value"


def _interval_text(low, high, low_open: bool, high_open: bool) -> str:
    parts = []
    if low is not None:
        parts.append(f"{_fmt(low)} {'<' if low_open else '<='} ")
    parts.append("value")
    if high is not None:
        parts.append(f" {'<' if high_open else '<='} {_fmt(high)}")
    text = "".join(parts)
    return text + ", finite" if low is None or high is None else text


def check_optional_path(path: str, value: Any) -> Optional[str]:
    """``None`` for None/``""``, else the path as a ``str``."""
    if value is None or value == "":
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"boost config {path} must be a path string or None, got {short_repr(value)} "
                        f"({_type_name(value)}).")
    return os.fspath(value)


def check_int_list(path: str, value: Any, low: int = 0, high: int = INT32_MAX) -> Tuple[int, ...]:
    """A strictly increasing tuple of ints in ``[low, high]`` (a single int is a one-element list)."""
    if isinstance(value, bool):
        raise TypeError(f"boost config {path} must be a list of ints, got {short_repr(value)}.")
    if isinstance(value, (int, np.integer)):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"boost config {path} must be a list of ints, got {short_repr(value)} "
                        f"({_type_name(value)}).")
    out = [check_int(f"{path}[{i}]", item, low=low, high=high) for i, item in enumerate(value)]
    if out != sorted(out) or len(set(out)) != len(out):
        raise BoostConfigError(f"boost config {path}={short_repr(list(value))} must be strictly increasing.")
    return tuple(out)


def check_float_or_list(path: str, value: Any, low: float = 0.0, low_open: bool = True):
    """A number, or a non-empty list of numbers (returned as a tuple), each above ``low``."""
    if isinstance(value, (list, tuple)):
        if not value:
            raise BoostConfigError(f"boost config {path} must not be an empty list.")
        return tuple(check_float(f"{path}[{i}]", v, low=low, low_open=low_open) for i, v in enumerate(value))
    return check_float(path, value, low=low, low_open=low_open)


# --------------------------------------------------------------------------------------------------
# safe file loading
# --------------------------------------------------------------------------------------------------
class _UniqueKeyLoader(yaml.SafeLoader):  # pylint: disable=too-many-ancestors
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping (naming both lines)."""


def _construct_unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False):
    seen: Dict[Any, int] = {}
    for key_node, _ in node.value:  # the keys written in this mapping (merge keys ``<<`` may be overridden)
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError:
            continue  # construct_mapping reports unhashable keys
        line = key_node.start_mark.line + 1
        if key in seen:
            raise BoostConfigError(f"key {short_repr(key)} is given twice in one mapping (lines {seen[key]} and "
                                   f"{line}); give it once.")
        seen[key] = line
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)


def _json_pairs_hook(text: str):
    """A JSON ``object_pairs_hook`` rejecting duplicate keys; line numbers found by scanning ``text``."""

    def hook(pairs):
        out: Dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                lines = _json_key_lines(text, key)
                where = f" (lines {lines[0]} and {lines[1]})" if len(lines) >= 2 else ""
                raise BoostConfigError(f"key {short_repr(key)} is given twice in one object{where}; give it once.")
            out[key] = value
        return out

    return hook


def _json_key_lines(text: str, key: str) -> list:
    token = json.dumps(key)
    lines = []
    for number, line in enumerate(text.splitlines(), start=1):
        if f"{token}" in line and line.split(token, 1)[1].lstrip().startswith(":"):
            lines.append(number)
    return lines


MAX_FILE_VALUES = 100_000
"""Most values (mappings, lists and scalars, YAML aliases counted as expanded) a config file may hold."""


def count_values(data: Any, limit: int) -> int:
    """Values in ``data`` (mappings, lists and scalars); stops counting past ``limit``.

    Shared objects (YAML aliases) are counted each time they appear.
    """
    count, stack = 0, [data]
    while stack and count <= limit:
        item = stack.pop()
        count += 1
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return count


def load_mapping_file(path: Any, what: str = "config file", max_values: int = MAX_FILE_VALUES) -> Dict[str, Any]:
    """Read a YAML or JSON file that must hold a mapping (``.json``: JSON, anything else: YAML).

    Safe: ``yaml.SafeLoader`` (no tags that run code), ``json`` with a duplicate-key check, and a bound on
    the values the document expands to (a few hundred bytes of nested YAML aliases can stand for billions).
    Empty file -> ``{}``. The one loader for ``boost_config_dict`` files and the model zoo's recipes.

    Args:
        path: the file.
        what: what the file is, for messages (``"boost_config_dict file"``).
        max_values: most values the document may expand to (:func:`count_values`).

    Raises:
        BoostConfigError: the file is missing, not UTF-8 (naming the byte offset), not valid YAML/JSON,
            has a key twice in one mapping (naming both lines), expands to more than ``max_values`` values,
            or does not hold a mapping. Messages quote at most a few hundred characters of the file.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise BoostConfigError(f"{what} path '{short_repr(path)[1:-1]}' does not exist or is not a file.")
    with open(path, "rb") as fh:
        raw = fh.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BoostConfigError(f"{what} '{path}' is not valid UTF-8 (byte {exc.start}: "
                               f"{short_repr(raw[exc.start:exc.start + 4])}); save it as UTF-8.") from None
    try:
        if path.endswith(".json"):
            data = json.loads(text, object_pairs_hook=_json_pairs_hook(text))
        else:
            data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 -- a SafeLoader subclass
    except BoostConfigError as exc:
        raise BoostConfigError(f"{what} '{path}': {exc}") from None
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        detail = str(exc)
        if len(detail) > 400:
            detail = detail[:400] + "..."
        kind = "JSON" if path.endswith(".json") else "YAML"
        raise BoostConfigError(f"{what} '{path}' is not valid {kind}: {detail}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise BoostConfigError(f"{what} '{path}' must hold a mapping, got {_type_name(data)}.")
    if count_values(data, max_values) > max_values:
        raise BoostConfigError(f"{what} '{path}' expands to more than {max_values} values (YAML aliases repeat "
                               f"their anchor); a config file is a small mapping.")
    return data

"""Keep the source text MindSpore compiles from equal to the code Python loaded.

MindSpore's Graph mode and ``ms.jit`` compile a Cell's ``construct`` (and what it calls) from its source text,
which :mod:`inspect` reads from the file when the graph is compiled, at the line numbers of the code Python
loaded. When the file was edited after the import (a merge into the checkout, an editor saving the script
while a long run goes on), a graph compiled later -- the model of a second seed, a freezing variant, the first
evaluation -- is parsed from other lines. Measured with MindSpore 2.10: a ``construct`` whose first line now
holds another class's ``def __init__(self):`` fails with "TypeError: The parameters number of the function is
0, but the number of provided arguments is 1" pointing at that ``def __init__(self):`` (issue 30); an edit
that moves no line compiles the new text against the old code, silently.

:func:`pin_module_sources` keeps in :mod:`linecache` the text a module's file has when first checked, as an
entry without a modification time (``linecache.checkcache``, which :mod:`inspect` runs before every read,
leaves those alone), after checking that the text fits the loaded code: the first line of every function
defined in the module holds its ``def`` (or a decorator, or a ``lambda``). A file that no longer fits raises,
naming the file and the function. ms_boost pins its own modules when imported, and when a ``Model`` is built
the modules defining the cells of the network, the loss and the optimizer (:func:`pin_cell_sources`). A module
reloaded with ``importlib.reload`` (new code objects) is read again. Not covered: plain functions of other
modules that a ``construct`` calls.
"""
from __future__ import annotations

import functools
import inspect
import linecache
import os
import sys
import sysconfig
import types
from typing import Dict, FrozenSet, Iterable, List, Optional, Tuple

__all__ = ["SourceChangedError", "pin_module_sources", "pin_loaded_sources", "pin_cell_sources"]


class SourceChangedError(RuntimeError):
    """A module's file changed on disk since Python loaded it, so a graph compiled now would not match."""


# file -> (the code objects its text was checked against, that text's lines): the lines put back into linecache
# when an entry was dropped (``linecache.clearcache``), the code objects to notice a reload.
_PINNED: Dict[str, Tuple[FrozenSet[types.CodeType], List[str]]] = {}


@functools.cache
def _unchecked_roots() -> Tuple[str, ...]:
    """Folders whose files are installed, not edited: MindSpore's package and Python's standard library."""
    roots = [sysconfig.get_paths().get("stdlib", "")]
    ms = sys.modules.get("mindspore")
    ms_file = getattr(ms, "__file__", None) if ms is not None else None
    if ms_file:
        roots.append(os.path.dirname(ms_file))
    return tuple(os.path.join(os.path.realpath(r), "") for r in roots if r)


def _module_codes(module: types.ModuleType) -> Dict[str, List[Tuple[str, types.CodeType]]]:
    """``{file: [(qualified name, code object), ...]}`` of the functions and methods ``module`` defines."""
    found: Dict[str, List[Tuple[str, types.CodeType]]] = {}

    def add(value) -> None:
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if isinstance(value, property):
            for part in (value.fget, value.fset, value.fdel):
                add(part)
            return
        if isinstance(value, types.FunctionType):
            value = inspect.unwrap(value)
            if isinstance(value, types.FunctionType):
                code = value.__code__
                found.setdefault(code.co_filename, []).append((value.__qualname__, code))

    for value in list(vars(module).values()):
        if inspect.isclass(value):
            if value.__module__ == module.__name__:
                for member in list(vars(value).values()):
                    add(member)
        else:
            add(value)
    return found


def _misfit(lines: List[str], codes: List[Tuple[str, types.CodeType]]) -> Optional[Tuple[str, int, str]]:
    """The first ``(qualified name, line number, text)`` whose line does not start that function, else None."""
    for name, code in codes:
        number = code.co_firstlineno
        text = lines[number - 1].strip() if 0 < number <= len(lines) else ""
        if text.startswith("@") or "lambda" in text:
            continue
        if text.startswith((f"def {code.co_name}(", f"async def {code.co_name}(")):
            continue
        return name, number, text
    return None


def pin_module_sources(module: types.ModuleType) -> None:
    """Pin the source text of ``module``'s file(s) in :mod:`linecache` (see the module docstring).

    A file is read and checked once: later calls whose functions were all checked against its pinned text (the
    module itself again, or another module holding some of its functions by ``from ... import``) reuse that text
    without reading the file. A function not checked yet (a reload's new code, or a view of the file seen for the
    first time) reads the file again: the same text adds the function to the checked ones, another text (a reload)
    is checked and pinned instead.

    Raises:
        SourceChangedError: the file on disk no longer fits the loaded code (a function's first line moved).
    """
    own_file = getattr(module, "__file__", None)
    if isinstance(own_file, str) and _installed(own_file):
        return  # MindSpore's or the standard library's: installed code, not checked (as its files below)
    for filename, codes in _module_codes(module).items():
        code_set = frozenset(code for _, code in codes)
        pinned = _PINNED.get(filename)
        if pinned is not None and code_set <= pinned[0]:
            lines = pinned[1]
        elif not os.path.isfile(filename) or _installed(filename):
            continue
        else:  # first time, a function not checked yet, or reloaded: the text on disk now
            with open(filename, encoding="utf-8") as handle:
                lines = handle.readlines()
            bad = _misfit(lines, codes)
            if bad is not None:
                name, number, text = bad
                raise SourceChangedError(
                    f"{filename} changed on disk since Python loaded module {module.__name__!r}: line {number}, "
                    f"where {name} starts, now reads {text[:80]!r}. MindSpore compiles a graph from the source "
                    f"text at these line numbers, so it would compile other code (MindSpore 2.10 then fails with "
                    f"e.g. 'The parameters number of the function is 0, but the number of provided arguments is "
                    f"1' at an unrelated def); restart the process to run the edited file.")
            if pinned is not None and lines == pinned[1]:
                lines, code_set = pinned[1], code_set | pinned[0]
            _PINNED[filename] = (code_set, lines)
        entry = linecache.cache.get(filename)
        if entry is None or len(entry) != 4 or entry[1] is not None or entry[2] is not lines:
            linecache.cache[filename] = (sum(len(line) for line in lines), None, lines, filename)


@functools.cache
def _installed(filename: str) -> bool:
    """True for a file of MindSpore's package or of Python's standard library (:func:`_unchecked_roots`)."""
    return os.path.realpath(filename).startswith(_unchecked_roots())


def pin_loaded_sources(prefix: str = "ms_boost") -> None:
    """:func:`pin_module_sources` of every loaded module named ``prefix`` or ``prefix.*``."""
    for name, module in list(sys.modules.items()):
        if module is not None and (name == prefix or name.startswith(prefix + ".")):
            pin_module_sources(module)


def pin_cell_sources(objects: Iterable) -> None:
    """Pin the modules defining the classes (and bases) of ``objects`` and of every cell inside them.

    Every cell of ``cells_and_names`` counts, plus every loaded ms_boost module: what a ``Model`` compiles later.
    """
    modules = {}
    for obj in objects:
        if obj is None:
            continue
        cells = [cell for _, cell in obj.cells_and_names()] if hasattr(obj, "cells_and_names") else [obj]
        for cell in cells:
            for cls in type(cell).__mro__:
                module = sys.modules.get(cls.__module__)
                if module is not None:
                    modules[module.__name__] = module
    for module in modules.values():
        pin_module_sources(module)
    pin_loaded_sources()

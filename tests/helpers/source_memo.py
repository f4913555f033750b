"""``inspect.getsourcelines`` remembered per code object while its file's text in :mod:`linecache` stays the same.

MindSpore's parser calls ``inspect.getsourcelines`` for every function of a graph at every compile, and each call
tokenizes the function's text again (``inspect.getblock``): ~2.7% of a compile-heavy test process's CPU
(docs/testing.md, twelfth session). The answer for a code object depends only on the lines :mod:`linecache` holds
for its file, so it is computed once, by ``inspect.getsourcelines`` itself, and handed out again (a fresh list) as
long as, after ``linecache.checkcache`` -- which ``inspect`` runs first too, and which drops the entry of a file
changed on disk -- the file's entry holds the very same lines object. A file edited since (``tests/test_source_pin.py``
checks what MindSpore reads then), an entry replaced (a reload, ms_boost's pinning), an object without code: the
original answers. Installed in the processes that run tests (tests/conftest.py), not in their subprocesses.
"""
from __future__ import annotations

import inspect
import linecache
import types

_ORIGINAL = inspect.getsourcelines
# code object -> (the linecache lines object the answer was read from, the answer)
_MEMO: dict = {}


def _code_of(obj):
    if isinstance(obj, types.MethodType):
        obj = obj.__func__
    if isinstance(obj, types.FunctionType) and not hasattr(obj, "__wrapped__"):
        return obj.__code__
    return None


def _lines_now(code):
    linecache.checkcache(code.co_filename)
    entry = linecache.cache.get(code.co_filename)
    return entry[2] if entry is not None and len(entry) == 4 else None


def getsourcelines(obj):
    """``inspect.getsourcelines(obj)``, remembered (module docstring)."""
    code = _code_of(obj)
    if code is None:
        return _ORIGINAL(obj)
    kept = _MEMO.get(code)
    if kept is not None and kept[0] is _lines_now(code):
        return list(kept[1][0]), kept[1][1]
    answer = _ORIGINAL(obj)
    lines = _lines_now(code)
    if lines is not None:
        _MEMO[code] = (lines, (list(answer[0]), answer[1]))
    return answer


def install() -> None:
    """Replace ``inspect.getsourcelines`` in this process (idempotent)."""
    inspect.getsourcelines = getsourcelines

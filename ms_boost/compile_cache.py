"""MindSpore's compile cache, kept apart per boost plan.

MindSpore can save compiled graphs to disk and load them in the next run (``mindspore.set_context(
enable_compile_cache=True, compile_cache_path=...)`` or the environment variables ``MS_COMPILER_CACHE_ENABLE=1`` /
``MS_COMPILER_CACHE_PATH``). It decides that a saved graph still fits by the Python source, not by the values
compiled into the graph: measured with MindSpore 2.10, a run with ``grad_accumulation_step`` 1 followed by a run
with 4 from the same script trained the second run with 1 accumulation step, silently. ms_boost compiles its
settings (the boost plan, THOR's frequency, amp casts, ...) into the graph as constants, so when the cache is on,
:func:`scope_compile_cache` moves it into a sub-folder named after a hash of those settings: a run with other
settings compiles (and saves) its own graphs, a rerun with the same settings loads them.

One folder per process: MindSpore keeps the cache folder of the first compile for the whole process (a later
``compile_cache_path``, from the context or ``MS_COMPILER_CACHE_PATH``, changes nothing) and names the graphs by
compile order. Measured with MindSpore 2.10: a process training with ``grad_accumulation_step`` 2, then 4, saved
the second model's graph beside the first one's, in the folder of step 2; a later process training with 2, then
3, loaded it and trained its step-3 model with 4 accumulation steps, silently. So the first Model of a process
fixes the scope, a later Model with the same settings uses it, and a later Model with other settings turns
MindSpore's compile cache off for the rest of the process (with a warning): it compiles, saves and loads nothing.
Graphs compiled with the cache on before the first Model (your own ``ms.jit`` functions) fix the folder at your
path instead; build the Model first, or keep such runs apart.

Constants of the user's own network (a layer's Python attribute) are not part of the key: that stays MindSpore's
behaviour (delete the cache folder after changing them).
"""
from __future__ import annotations

import hashlib
import logging
import os
from typing import Optional

import mindspore as ms

logger = logging.getLogger("ms_boost")

__all__ = ["cache_enabled", "constant_settings", "optimizer_settings", "scope_compile_cache", "SCOPE_PREFIX"]

SCOPE_PREFIX = "ms_boost-"
_SCALARS = (bool, int, float, str)

# The scope this process's first Model set (None: none yet). It mirrors MindSpore's own process-wide state (the
# cache folder is fixed at the first compile, see the module docstring), so it lives as long as the process.
_process_scope: Optional[str] = None


def cache_enabled() -> bool:
    """True when MindSpore's compile cache is on, by MindSpore's rule.

    The ``enable_compile_cache`` context when it was set (also to False), else ``MS_COMPILER_CACHE_ENABLE=1``.
    """
    try:
        value = ms.get_context("enable_compile_cache")
    except (ValueError, KeyError):  # a MindSpore without this context key has no compile cache to scope
        return False
    if value is None:
        return os.environ.get("MS_COMPILER_CACHE_ENABLE", "") == "1"
    return bool(value)


def _is_constant(value) -> bool:
    if isinstance(value, _SCALARS) or value is None:
        return True
    return isinstance(value, tuple) and all(_is_constant(v) for v in value)


def constant_settings(obj, private: bool = False) -> str:
    """What of ``obj`` a compiled graph can hold as constants.

    its class, its Python scalars (and tuples of them; the ``_``-prefixed ones too when ``private``), and what its
    ``compile_settings()`` returns when it has one.
    """
    cls = type(obj)
    items = sorted((k, repr(v)) for k, v in vars(obj).items()
                   if (private or not k.startswith("_")) and _is_constant(v))
    extra = obj.compile_settings() if callable(getattr(obj, "compile_settings", None)) else {}
    return f"{cls.__module__}.{cls.__qualname__} {items} {sorted((k, repr(v)) for k, v in extra.items())}"


def optimizer_settings(optimizer) -> str:
    """:func:`constant_settings` of ``optimizer``, public attributes only.

    An optimizer's private attributes hold per-instance bookkeeping, which would make every run's key new.
    """
    return "optimizer: none" if optimizer is None else f"optimizer: {constant_settings(optimizer)}"


def scope_compile_cache(settings: str) -> Optional[str]:
    """With the compile cache on, point ``compile_cache_path`` at ``<base>/ms_boost-<hash of settings>``.

    ``<base>`` is the path the user chose (context, else ``MS_COMPILER_CACHE_PATH``, else the working directory).
    The first call of a process fixes the scope (MindSpore keeps one cache folder per process); a later call with
    the same settings returns it, one with other settings turns the compile cache off for the rest of the process
    and logs a warning saying why (see the module docstring).

    Args:
        settings: text holding every setting compiled into the graphs (the boost plan's summary, the amp
            settings, :func:`optimizer_settings`).

    Returns:
        The cache path now in use, or None when the compile cache is off (already, or from now on).
    """
    global _process_scope
    if not cache_enabled():
        return None
    current = ms.get_context("compile_cache_path") or os.environ.get("MS_COMPILER_CACHE_PATH", "") or "."
    base = current.rstrip("/\\") or current
    if os.path.basename(base).startswith(SCOPE_PREFIX):
        base = os.path.dirname(base) or "."
    text = "\n".join((settings, f"mindspore {ms.__version__}"))
    path = os.path.join(base, SCOPE_PREFIX + hashlib.sha256(text.encode("utf-8")).hexdigest()[:16])
    if _process_scope is not None and path != _process_scope:
        ms.set_context(enable_compile_cache=False)
        logger.warning("MindSpore's compile cache is now off for this process: it keeps the folder of the first "
                       "model's settings (%s) for every later graph and names graphs by compile order, so a model "
                       "with other settings (%s) would be saved there and loaded by a later run with other settings "
                       "again. Run one setting per process to cache each.", _process_scope, path)
        return None
    if path != current:
        ms.set_context(compile_cache_path=path)
        logger.info("MindSpore's compile cache is on; graphs of these settings are cached in %s "
                    "(keyed by the boost plan, amp and optimizer settings)", path)
    _process_scope = path
    return path

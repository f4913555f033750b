"""A device target this MindSpore build cannot use, as one line naming it and the targets it can.

MindSpore refuses such a target with a ``RuntimeError`` (``Unsupported device target GPU. This process only
supports one of the ['CPU']. ...`` and a page of load messages) from deep inside ``set_context``/``set_device``.
train.py, eval.py and export.py turn exactly that error into ``<script>: error: <line>`` (exit status 1).
"""
from __future__ import annotations

import ast
import re
import signal
import sys
from typing import Callable, Optional, Tuple, Type

__all__ = ["unsupported_device_message", "run_script"]

_UNSUPPORTED = re.compile(r"Unsupported device target (?P<target>\w+)\.")
_SUPPORTED = re.compile(r"only supports one of the (?P<list>\[[^\]]*\])")


def unsupported_device_message(err: BaseException) -> Optional[str]:
    """The one-line message for MindSpore's "unsupported device target" error, ``None`` for any other error."""
    text = str(err)
    match = _UNSUPPORTED.search(text)
    if not isinstance(err, RuntimeError) or match is None:
        return None
    found = _SUPPORTED.search(text)
    try:
        supported = [str(name) for name in ast.literal_eval(found.group("list"))] if found else []
    except (ValueError, SyntaxError):
        supported = []
    allowed = ", ".join(supported) if supported else "see MindSpore's message (rerun with --device_target auto)"
    return (f"device_target={match.group('target')!r} is not supported by this MindSpore build on this machine; "
            f"supported here: {allowed} (or auto, MindSpore's default device).")


def run_script(main: Callable[[], object], script: str,
               expected: Tuple[Type[BaseException], ...] = (ValueError,)) -> None:
    """Run a zoo script's ``main``: an ``expected`` error, or MindSpore's "unsupported device target", becomes
    ``<script>: error: <message>`` on stderr and exit status 1 instead of a traceback; Ctrl-C (SIGINT) and
    SIGTERM end it with status 130 / 143 and no traceback (``main`` sees a ``KeyboardInterrupt`` for both, so
    it can say how to resume); anything else is raised. Once MindSpore has run a graph its own SIGINT handler
    turns a Ctrl-C into a SIGTERM to this process, so a Ctrl-C during training exits 143 (docs/model_zoo.md)."""
    stopped_by = {"signal": signal.SIGINT}

    def on_sigterm(signum, _frame):
        stopped_by["signal"] = signum
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(128 + int(stopped_by["signal"]))
    except expected as err:
        print(f"{script}: error: {err}", file=sys.stderr, flush=True)
        sys.exit(1)
    except RuntimeError as err:
        message = unsupported_device_message(err)
        if message is None:
            raise
        print(f"{script}: error: {message}", file=sys.stderr, flush=True)
        sys.exit(1)
    finally:
        signal.signal(signal.SIGTERM, previous)

"""A device target this MindSpore build cannot use, as one line naming it and the targets it can.

MindSpore refuses such a target with a ``RuntimeError`` (``Unsupported device target GPU. This process only
supports one of the ['CPU']. ...`` and a page of load messages) from deep inside ``set_context``/``set_device``.
train.py, eval.py and export.py turn exactly that error into ``<script>: error: <line>`` (exit status 1).
"""
from __future__ import annotations

import ast
import os
import re
import signal
import sys
import threading
from typing import Callable, Optional, Tuple, Type

__all__ = ["unsupported_device_message", "run_script", "STOP_GRACE"]

# seconds a SIGTERM may wait for the main thread before the process ends without it (see run_script)
STOP_GRACE = 10.0

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


def _stop_watch(script: str, grace: float) -> Callable[[], None]:
    """Start the watch behind :func:`run_script`'s SIGTERM: Python runs a signal handler only when the main thread
    is back in the interpreter, and a main thread blocked inside MindSpore (a collective waiting for a rank that is
    gone: up to ``MS_CPU_COMM_OP_TIMEOUT``, 120 s under the launchers) defers it that long. The signal's number is
    written to a pipe at once (``signal.set_wakeup_fd``); a thread reading it ends the process with status 143 when
    it is still alive ``grace`` seconds later. Returns the function that stops the watch and puts things back."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    done = threading.Event()

    def watch() -> None:
        with os.fdopen(read_end, "rb", buffering=0) as pipe:
            while True:
                received = pipe.read(64)
                if not received or done.is_set():  # the write end closed: run_script returned
                    return
                if signal.SIGTERM in received and not done.wait(grace):
                    print(f"{script}: SIGTERM: the main thread did not stop within {grace:g} s (blocked inside "
                          f"MindSpore, e.g. a collective waiting for a rank that is gone); exiting now (status 143). "
                          f"Checkpoints are written to a temporary name and renamed, so those on disk are complete.",
                          file=sys.stderr, flush=True)
                    os._exit(128 + signal.SIGTERM)

    threading.Thread(target=watch, name=f"{script} stop watch", daemon=True).start()

    def stop() -> None:
        done.set()
        signal.set_wakeup_fd(previous)
        os.close(write_end)

    return stop


def run_script(main: Callable[[], object], script: str,
               expected: Tuple[Type[BaseException], ...] = (ValueError,), stop_grace: Optional[float] = None) -> None:
    """Run a zoo script's ``main``: an ``expected`` error, or MindSpore's "unsupported device target", becomes
    ``<script>: error: <message>`` on stderr and exit status 1 instead of a traceback; Ctrl-C (SIGINT) and
    SIGTERM end it with status 130 / 143 and no traceback (``main`` sees a ``KeyboardInterrupt`` for both, so
    it can say how to resume); anything else is raised. Once MindSpore has run a graph its own SIGINT handler
    turns a Ctrl-C into a SIGTERM to this process, so a Ctrl-C during training exits 143 (docs/model_zoo.md).
    A SIGTERM the main thread cannot take within ``stop_grace`` seconds (default :data:`STOP_GRACE`; blocked inside
    MindSpore) ends the process with status 143 all the same (:func:`_stop_watch`)."""
    stopped_by = {"signal": signal.SIGINT}

    def on_sigterm(signum, _frame):
        stopped_by["signal"] = signum
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    stop_watch = _stop_watch(script, STOP_GRACE if stop_grace is None else stop_grace)
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
        stop_watch()
        signal.signal(signal.SIGTERM, previous)

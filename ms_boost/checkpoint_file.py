"""Reading a checkpoint file with an error that names the file and what is wrong with it.

``mindspore.load_checkpoint`` reports an empty file (0 bytes), a file holding no parameter, and a filter that
kept nothing all alike -- "The loaded parameter dict is empty after filter or specify" -- without the file's
name; a truncated or foreign file gives "Failed to read the checkpoint file". :func:`read_checkpoint` is the one
place ms_boost reads a checkpoint (DimReduce's ``weight_load_dir``), and the model zoo loads its checkpoints
(``--pretrained``, ``--resume``, ``eval.py``, ``export.py``) through it too. Each failure is a ``ValueError``
whose message starts with ``checkpoint '<path>'`` and says which of these it is:

* the path does not exist or is not a file;
* the file is empty (0 bytes: a write that never finished, or a copy that failed);
* the file cannot be parsed (truncated, or not a MindSpore checkpoint of that format), with its size;
* the file holds no parameter (no tensor; at most appended strings such as the zoo's run manifest);
* the file holds parameters, but none that ``choice_func`` asked for (the first names it holds are listed).
"""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, Optional, Union

__all__ = ["CHECKPOINT_FORMATS", "checkpoint_format", "read_checkpoint"]

#: file-name endings -> the ``format`` argument of ``mindspore.load_checkpoint``
CHECKPOINT_FORMATS = {".ckpt": "ckpt", ".safetensors": "safetensors"}


def checkpoint_format(path: Union[str, os.PathLike]) -> str:
    """``"safetensors"`` for a ``.safetensors`` file, else ``"ckpt"`` (MindSpore's default)."""
    return "safetensors" if str(path).endswith(".safetensors") else "ckpt"


def _size_text(size: int) -> str:
    return f"{size} byte{'' if size == 1 else 's'}"


_EXPORTED = {".mindir": "a MINDIR file runs with nn.GraphCell(mindspore.load(path))",
             ".onnx": "an ONNX file runs in onnxruntime",
             ".air": "an AIR file runs on Ascend (ATC / the inference toolkit)"}


def read_checkpoint(path: Union[str, os.PathLike], choice_func: Optional[Callable[[str], bool]] = None,
                    what: str = "checkpoint") -> Dict[str, Any]:
    """``mindspore.load_checkpoint(path, choice_func=...)``, with errors naming the file and its fault.

    Args:
        path: the checkpoint file (``.ckpt``, or ``.safetensors``).
        choice_func: keep only the entries whose name it accepts (None: all).
        what: how the message calls the file (``"checkpoint"``, ``"resume checkpoint"``, ...).

    Returns:
        ``{name: Parameter or str}`` as ``mindspore.load_checkpoint`` returns it, holding at least one Parameter.

    Raises:
        ValueError: the path is not a file, the file is empty, cannot be parsed, holds no parameter (tensor), or
            holds none that ``choice_func`` accepts.
    """
    import mindspore as ms

    name = os.fspath(path)
    if not os.path.isfile(name):
        reason = "is a folder, not a file" if os.path.isdir(name) else "does not exist"
        raise ValueError(f"{what} {name!r} {reason}.")
    size = os.path.getsize(name)
    if size == 0:
        raise ValueError(f"{what} {name!r} is empty (0 bytes): its write never finished or its copy failed; "
                         f"use another checkpoint or write it again.")
    fmt = checkpoint_format(name)
    try:
        entries = ms.load_checkpoint(name, choice_func=choice_func, format=fmt)
    except Exception as exc:  # noqa: BLE001 - MindSpore raises ValueError/RuntimeError/TypeError alike
        exported = os.path.splitext(name)[1].lower()
        if exported in _EXPORTED:
            raise ValueError(f"{what} {name!r} is an exported model ({exported} file), not a checkpoint: give the "
                             f".ckpt it was exported from; {_EXPORTED[exported]}.") from exc
        raise _diagnose(name, size, fmt, choice_func, exc, what) from exc
    if not entries:  # not raised by MindSpore 2.10, kept in case a version returns an empty dict
        raise _diagnose(name, size, fmt, choice_func, None, what)
    if not _holds_tensor(entries):
        raise _no_parameter(name, size, entries, what)
    return entries


def _holds_tensor(entries: Dict[str, Any]) -> bool:
    import mindspore as ms

    return any(isinstance(value, ms.Tensor) for value in entries.values())


def _no_parameter(name: str, size: int, entries: Dict[str, Any], what: str) -> ValueError:
    only = f"; only the non-tensor entries {sorted(entries)[:5]}" if entries else ""
    return ValueError(f"{what} {name!r} holds no parameter ({_size_text(size)}{only}): it was saved from an empty "
                      f"list of parameters; use a checkpoint saved from the network.")


def _diagnose(name: str, size: int, fmt: str, choice_func, exc: Optional[BaseException], what: str) -> ValueError:
    """The error for a load that failed: reload without the filter to tell "no parameter" from "none wanted"."""
    import mindspore as ms

    first = str(exc).strip().splitlines()[0] if exc is not None and str(exc).strip() else ""
    if exc is not None and "empty after filter" not in first:
        return ValueError(f"{what} {name!r} cannot be read ({_size_text(size)}; truncated, corrupt, or not a "
                          f"MindSpore {fmt} file): {first}")
    held = {}
    if choice_func is not None:
        try:
            held = ms.load_checkpoint(name, format=fmt)
        except Exception:  # noqa: BLE001 - the file itself holds nothing: said below
            held = {}
    if not _holds_tensor(held):
        return _no_parameter(name, size, held, what)
    names = sorted(held)
    return ValueError(f"{what} {name!r} holds {len(names)} entries but none of the parameters asked for (it holds "
                      f"e.g. {names[:5]}); was it saved from another network?")

"""Whether MindSpore's GPU kernels carry machine code for the GPU a run uses, read from the library's fat binaries.

A CUDA library keeps its device code in ELF sections named ``.nv_fatbin``: containers (magic ``0xBA55ED50``) of
entries, each machine code (SASS) for one architecture or PTX (portable assembly) for one virtual architecture.
The driver runs SASS built for ``sm_XY`` on a GPU of the same major ``X`` and minor >= ``Y``; otherwise it compiles
the newest PTX not above the GPU's compute capability when the code is first loaded (the "JIT"), or cannot run it.

MindSpore 2.10's GPU kernels (``mindspore/lib/plugin/gpu/libcuda_ops.so.11``, 819 MB, 407 fat binaries) carry SASS
for sm_60-sm_80 and PTX 6.0/8.6 only, and link the CUDA 11.6 runtime statically (before lazy loading, 11.7): on a
Hopper GPU (9.0) all of them are compiled from PTX at the first GPU operation. Seen on an H200
(docs/compatibility.md, "First run on a GPU"): more than 8.8 minutes, the JIT cache past 319 MB, the GPU idle --
a run that looks hung. ``Model.train`` says so once per process (:func:`warn_if_compiled_from_ptx`), as PyTorch
does for a GPU its build has no code for; ``scripts/gpu_check.sh`` reads the same through
``scripts/fatbin_archs.py`` (which loads this file alone: it imports nothing from ms_boost).

Only the section headers and the entries' headers are read (the file is memory-mapped): 0.1 s on that library.
No MindSpore import here beyond finding its folder; the compute capability comes from the driver (``libcuda``).
"""
from __future__ import annotations

import ctypes
import mmap
import os
import struct
import warnings
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

FATBIN_MAGIC = 0xBA55ED50
FATBIN_SECTIONS = (".nv_fatbin", "__nv_relfatbin")
KIND_PTX, KIND_SASS = 1, 2
#: the driver's attribute numbers for a device's compute capability (CUDA's ``CUdevice_attribute``)
_MAJOR, _MINOR = 75, 76

__all__ = ["NotElfError", "fatbin_entries", "archs", "verdict", "describe", "plugin_kernels", "compute_capability",
           "ptx_note", "warn_if_compiled_from_ptx"]


class NotElfError(ValueError):
    """The file is not a 64-bit little-endian ELF object."""


def _sections(data) -> Iterator[Tuple[str, int, int]]:
    """``(name, offset, size)`` of every section of a 64-bit little-endian ELF image."""
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise NotElfError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names_offset = headers[shstrndx][4]
    for name_at, _type, _flags, _addr, offset, size in headers:
        start = names_offset + name_at
        yield bytes(data[start:data.find(b"\0", start)]).decode("ascii", "replace"), offset, size


def fatbin_entries(data, offset: int, size: int) -> Iterator[Tuple[int, int, int]]:
    """``(kind, arch, payload_bytes)`` of each entry of the fat-binary containers in ``data[offset:offset+size]``.

    ``kind`` is 1 for PTX, 2 for SASS; ``arch`` as the toolkit writes it (``86`` for sm_86 / compute_86).
    Containers are 8-byte aligned; the bytes between them (padding) are skipped.
    """
    position, end = offset, offset + size
    while position + 16 <= end:
        magic, _version, header_size, body_size = struct.unpack_from("<IHHQ", data, position)
        if magic != FATBIN_MAGIC:
            position += 8
            continue
        entry, body_end = position + header_size, position + header_size + body_size
        while entry < body_end:
            kind, _unused, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)
            arch, = struct.unpack_from("<I", data, entry + 28)
            yield kind, arch, payload
            entry += entry_header + payload
        position = body_end


def archs(path) -> Dict[str, List[int]]:
    """``{"sass": [...], "ptx": [...]}``: the architectures a library's device code is built for, sorted.

    Raises :class:`NotElfError` for a file that is not a 64-bit ELF (an empty one included), ``OSError`` when it
    cannot be read.
    """
    found: Dict[str, set] = {"sass": set(), "ptx": set()}
    with open(path, "rb") as handle:
        if os.fstat(handle.fileno()).st_size == 0:
            raise NotElfError("empty file, not an ELF file")
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            for name, offset, size in _sections(data):
                if name in FATBIN_SECTIONS:
                    for kind, arch, _payload in fatbin_entries(data, offset, size):
                        if kind == KIND_SASS:
                            found["sass"].add(arch)
                        elif kind == KIND_PTX:
                            found["ptx"].add(arch)
    return {kind: sorted(values) for kind, values in found.items()}


def verdict(found: Dict[str, List[int]], capability: str) -> str:
    """How a GPU of compute ``capability`` ("9.0") runs the code.

    ``native`` (SASS of its major, minor not above its own), ``jit compute_XY`` (the newest PTX not above it,
    compiled when first loaded) or ``none``.
    """
    major, minor = (int(part) for part in capability.split("."))
    gpu = major * 10 + minor
    if any(arch // 10 == major and arch <= gpu for arch in found["sass"]):
        return "native"
    ptx = [arch for arch in found["ptx"] if arch <= gpu]
    return f"jit compute_{max(ptx)}" if ptx else "none"


def describe(found: Dict[str, List[int]]) -> str:
    """``sass sm_60 sm_80; ptx compute_86`` (``-`` for a kind with no entry)."""
    sass = " ".join(f"sm_{arch}" for arch in found["sass"]) or "-"
    ptx = " ".join(f"compute_{arch}" for arch in found["ptx"]) or "-"
    return f"sass {sass}; ptx {ptx}"


def plugin_kernels() -> Path:
    """MindSpore's library of GPU kernels (it exists in the wheel whether or not a GPU is used)."""
    import mindspore  # noqa: PLC0415 -- only its folder; mindspore is imported by then anyway

    return Path(mindspore.__file__).parent / "lib" / "plugin" / "gpu" / "libcuda_ops.so.11"


def compute_capability(device_id: int = 0) -> Optional[str]:
    """The compute capability of CUDA device ``device_id`` as the driver reports it ("9.0").

    None without a driver or device (``libcuda.so.1`` missing, ``cuInit`` failing, no such device).
    """
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    device, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    if (cuda.cuInit(0) != 0 or cuda.cuDeviceGet(ctypes.byref(device), int(device_id)) != 0
            or cuda.cuDeviceGetAttribute(ctypes.byref(major), _MAJOR, device) != 0
            or cuda.cuDeviceGetAttribute(ctypes.byref(minor), _MINOR, device) != 0):
        return None
    return f"{major.value}.{minor.value}"


def ptx_note(capability: Optional[str], library=None) -> Optional[str]:
    """What a user should know when MindSpore's GPU kernels have no machine code for a GPU of ``capability``.

    A sentence, or None when they do (or when either cannot be read: nothing is claimed then).
    """
    if capability is None:
        return None
    library = plugin_kernels() if library is None else Path(library)
    try:
        found = archs(library)
    except (OSError, NotElfError):
        return None
    how = verdict(found, capability)
    if how == "native":
        return None
    built = f"{library.name}: {describe(found)}"
    if how == "none":
        return (f"MindSpore's GPU kernels ({built}) have no code a GPU of compute capability {capability} can run: "
                f"GPU operations will fail ('no kernel image is available'). Use a GPU of compute capability 6.0 "
                f"or more, or a MindSpore build for this one.")
    return (f"MindSpore's GPU kernels ({built}) have no machine code for compute capability {capability}: the driver "
            f"compiles all of them from PTX ({how.split()[1]}) at the first GPU operation, once per machine if its "
            f"cache may hold them (CUDA_CACHE_MAXSIZE=4294967296; the compiled code passed 319 MB) -- more than "
            f"8.8 minutes on an H200 with the GPU idle: the run is not hung (ms_boost's docs/compatibility.md, "
            f"'First run on a GPU').")


_warned: List[str] = []  # the notes given in this process (one per device and capability)


def warn_if_compiled_from_ptx(device_target: str, device_id: int = 0) -> Optional[str]:
    """On GPU, warn once per process and device when MindSpore's kernels will be compiled from PTX (or cannot run).

    Returns the note (None when there is nothing to say). Nothing is read on another device target.
    """
    if device_target != "GPU":
        return None
    key = f"GPU:{device_id}"
    if key in _warned:
        return None
    _warned.append(key)
    note = ptx_note(compute_capability(device_id))
    if note is not None:
        warnings.warn(f"ms_boost: {note}", UserWarning, stacklevel=3)
    return note

"""Which GPU architectures a shared library's CUDA code is built for, and what that means on a given GPU.

    python scripts/fatbin_archs.py LIBRARY                          # e.g. sass sm_60 sm_80; ptx compute_86
    python scripts/fatbin_archs.py LIBRARY --compute-capability 9.0 # ... then: native | jit compute_86 | none

A CUDA library keeps its device code in ELF sections named ``.nv_fatbin``: containers (magic ``0xBA55ED50``) of
entries, each machine code (SASS) for one architecture or PTX (portable assembly) for one virtual architecture.
The driver runs SASS built for ``sm_XY`` on a GPU of the same major ``X`` and minor >= ``Y``; otherwise it compiles
the newest PTX not above the GPU's compute capability, at first use (the "JIT"), or cannot run the kernel at all.
``scripts/gpu_check.sh`` reads MindSpore's CUDA plugin with this before its first GPU operation: MindSpore 2.10's
``libcuda_ops.so.11`` carries SASS for sm_60-sm_80 and PTX 6.0/8.6 only, so on a Hopper GPU (9.0) every one of its
kernels is compiled from PTX on first use.

Reads the file's section headers and the entries' headers only (the file is memory-mapped), so an 800 MB library
takes well under a second. Exit status 0; 2 on a file that is not a 64-bit little-endian ELF.
"""
from __future__ import annotations

import argparse
import mmap
import struct
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

FATBIN_MAGIC = 0xBA55ED50
FATBIN_SECTIONS = (".nv_fatbin", "__nv_relfatbin")
KIND_PTX, KIND_SASS = 1, 2


class NotElfError(ValueError):
    """The file is not a 64-bit little-endian ELF object."""


def _sections(data) -> Iterator[Tuple[str, int, int]]:
    """``(name, offset, size)`` of every section of a 64-bit little-endian ELF image."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise NotElfError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names_offset = headers[shstrndx][4]
    for name_at, _type, _flags, _addr, offset, size in headers:
        start = names_offset + name_at
        name = bytes(data[start:data.find(b"\0", start)]).decode("ascii", "replace")
        yield name, offset, size


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
    """``{"sass": [...], "ptx": [...]}``: the architectures a library's device code is built for, sorted."""
    found: Dict[str, set] = {"sass": set(), "ptx": set()}
    with open(path, "rb") as handle:
        if Path(path).stat().st_size == 0:
            raise NotElfError("empty file")
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            for name, offset, size in _sections(data):
                if name in FATBIN_SECTIONS:
                    for kind, arch, _payload in fatbin_entries(data, offset, size):
                        if kind == KIND_SASS:
                            found["sass"].add(arch)
                        elif kind == KIND_PTX:
                            found["ptx"].add(arch)
    return {kind: sorted(values) for kind, values in found.items()}


def verdict(found: Dict[str, List[int]], compute_capability: str) -> str:
    """How a GPU of ``compute_capability`` ("9.0") runs the code: ``native`` (SASS of its major, minor not above
    its own), ``jit compute_XY`` (the newest PTX not above it, compiled at first use) or ``none``."""
    major, minor = (int(part) for part in compute_capability.split("."))
    gpu = major * 10 + minor
    if any(arch // 10 == major and arch <= gpu for arch in found["sass"]):
        return "native"
    ptx = [arch for arch in found["ptx"] if arch <= gpu]
    return f"jit compute_{max(ptx)}" if ptx else "none"


def describe(found: Dict[str, List[int]]) -> str:
    sass = " ".join(f"sm_{arch}" for arch in found["sass"]) or "-"
    ptx = " ".join(f"compute_{arch}" for arch in found["ptx"]) or "-"
    return f"sass {sass}; ptx {ptx}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("library", help="a shared library (.so) with CUDA device code")
    parser.add_argument("--compute-capability", help="a GPU's compute capability, e.g. 9.0 (nvidia-smi "
                                                     "--query-gpu=compute_cap): print how it runs the code")
    args = parser.parse_args(argv)
    if args.compute_capability is not None:
        parts = args.compute_capability.split(".")
        if len(parts) != 2 or not all(part.isdigit() for part in parts):
            parser.error(f"--compute-capability must look like 9.0, got {args.compute_capability!r}")
    try:
        found = archs(args.library)
    except (OSError, NotElfError) as error:
        print(f"fatbin_archs: {args.library}: {error}", file=sys.stderr)
        return 2
    print(describe(found))
    if args.compute_capability is not None:
        print(verdict(found, args.compute_capability))
    return 0


if __name__ == "__main__":
    sys.exit(main())

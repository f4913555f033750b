"""Which GPU architectures a shared library's CUDA code is built for, and what that means on a given GPU.

    python scripts/fatbin_archs.py LIBRARY                          # e.g. sass sm_60 sm_80; ptx compute_86
    python scripts/fatbin_archs.py LIBRARY --compute-capability 9.0 # ... then: native | jit compute_86 | none

The reading and the driver's rules are ``ms_boost/gpu_code.py`` (its docstring explains fat binaries), loaded here
as a file of its own so that nothing else of ms_boost (or MindSpore) is imported: ``scripts/gpu_check.sh`` runs
this before anything is installed. Exit status 0; 2 on a file that is not a 64-bit little-endian ELF or cannot be
read, or on a malformed compute capability.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location("ms_boost_gpu_code",
                                               Path(__file__).resolve().parents[1] / "ms_boost" / "gpu_code.py")
gpu_code = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(gpu_code)


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
        found = gpu_code.archs(args.library)
    except (OSError, gpu_code.NotElfError) as error:
        print(f"fatbin_archs: {args.library}: {error}", file=sys.stderr)
        return 2
    print(gpu_code.describe(found))
    if args.compute_capability is not None:
        print(gpu_code.verdict(found, args.compute_capability))
    return 0


if __name__ == "__main__":
    sys.exit(main())

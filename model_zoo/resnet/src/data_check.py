"""Check that every image of a split folder decodes, before MindSpore's decoder meets a broken one.

MindSpore's JPEG decoder can end the process (SIGFPE on a truncated JPEG) without a message. Pillow
decodes each file fully here (``Image.load``, which raises on a truncated file; ``LOAD_TRUNCATED_IMAGES``
is forced off) and the bad files are listed in one error. A successful check is remembered by a stamp
keyed by the folder's file list (relative paths, sizes, modification times), so the check runs on the
first use of a folder and again only when its files change (``check_data: auto``).
"""
from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import List, Optional, Sequence, Tuple, Union

__all__ = ["CHECK_MODES", "image_files", "folder_stamp", "find_bad_images", "check_images", "stamp_dir"]

CHECK_MODES = ("auto", "always", "never")
_EXTENSIONS = {".jpeg", ".jpg", ".png"}
_LISTED = 20


def image_files(folder: Union[str, Path]) -> List[Path]:
    """Image files (``.jpeg``/``.jpg``/``.png``, any case) under ``folder``, sorted."""
    root = Path(folder)
    return sorted(p for p in root.rglob("*") if p.suffix.lower() in _EXTENSIONS and p.is_file())


def folder_stamp(folder: Union[str, Path], files: Sequence[Path]) -> str:
    """SHA-256 over the folder path and every file's relative path, size and modification time (ns)."""
    root = Path(folder).resolve()
    digest = hashlib.sha256(str(root).encode("utf-8", "surrogateescape"))
    for path in files:
        info = path.stat()
        rel = str(path.relative_to(folder)).encode("utf-8", "surrogateescape")
        digest.update(rel + b"\0" + str(info.st_size).encode() + b"\0" + str(info.st_mtime_ns).encode() + b"\n")
    return digest.hexdigest()


def _check_one(path: str) -> Optional[str]:
    from PIL import Image, ImageFile

    ImageFile.LOAD_TRUNCATED_IMAGES = False  # a truncated file must fail, not decode grey
    try:
        with Image.open(path) as image:
            image.load()
            if image.width < 1 or image.height < 1:
                return "empty image"
    except Exception as err:  # noqa: BLE001 - any decoder failure marks the file bad
        return f"{type(err).__name__}: {str(err)[:120]}"
    return None


def find_bad_images(files: Sequence[Path], workers: int = 1) -> List[Tuple[Path, str]]:
    """``(path, reason)`` for every file Pillow cannot fully decode (``workers`` threads: Pillow's decoders
    release the GIL, and threads are safe beside MindSpore's runtime where forking is not)."""
    names = [str(p) for p in files]
    if workers > 1 and len(names) > 256:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            reasons = list(pool.map(_check_one, names))
    else:
        reasons = [_check_one(name) for name in names]
    return [(Path(name), reason) for name, reason in zip(names, reasons) if reason is not None]


def stamp_dir() -> Path:
    """Where successful checks are remembered: ``$MS_BOOST_CACHE/data_check`` or ``~/.cache/ms_boost/data_check``."""
    base = os.environ.get("MS_BOOST_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "ms_boost")
    return Path(base) / "data_check"


def check_images(folder: Union[str, Path], mode: str = "auto", workers: int = 1,
                 verbose: bool = True) -> Optional[int]:
    """Verify the images of ``folder`` per ``mode`` (``auto``: unless a stamp says this file list passed).

    Returns:
        the number of images checked (``None`` when skipped: ``never``, or ``auto`` with a valid stamp).

    Raises:
        ValueError: ``mode`` is not allowed, or some images do not decode (all listed up to 20, with reasons).
    """
    if mode not in CHECK_MODES:
        raise ValueError(f"check_data={mode!r} is not allowed; allowed: {', '.join(CHECK_MODES)}.")
    if mode == "never":
        return None
    files = image_files(folder)
    stamp = folder_stamp(folder, files)
    marker = stamp_dir() / f"{stamp}.ok"
    if mode == "auto" and marker.is_file():
        return None
    if verbose:
        print(f"checking {len(files)} images of {str(folder)!r} with Pillow (once per file list; "
              f"check_data: never skips it) ...", flush=True)
    bad = find_bad_images(files, workers)
    if bad:
        listed = "\n".join(f"  {path}: {reason}" for path, reason in bad[:_LISTED])
        more = f"\n  ... and {len(bad) - _LISTED} more" if len(bad) > _LISTED else ""
        raise ValueError(f"{len(bad)} of {len(files)} images under {str(folder)!r} cannot be decoded; remove or "
                         f"replace them before training:\n{listed}{more}")
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        tmp = marker.with_name(f".{marker.name}.{os.getpid()}")
        tmp.write_text(f"{folder}\n{len(files)} images\n", encoding="utf-8")
        os.replace(tmp, marker)
    except OSError as err:  # a read-only cache only means the check runs again next time
        if verbose:
            print(f"note: cannot remember the data check in {str(marker.parent)!r} ({err}); it will run again.",
                  flush=True)
    return len(files)

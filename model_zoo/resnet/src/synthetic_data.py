"""Built-in image-classification data set: small labelled JPEGs in ImageNet's ``train/`` + ``val/`` layout.

Every class has its own shape or texture *and* its own hue, drawn at a random position, size and
jitter on a noisy background, so a ResNet learns it in a few hundred steps while accuracy starts at
chance. The set is rendered deterministically from a seed into a cache folder, once; the folder name
holds every generation parameter, so different settings never collide. The result is read through
exactly the same ``ImageFolderDataset`` pipeline as ImageNet (see :mod:`.dataset`).

Command line::

    python -m model_zoo.resnet.src.synthetic_data [--cache_dir DIR] [--num_classes 10] [--image_size 32]
"""
from __future__ import annotations

import argparse
import colorsys
import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional, Union

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

__all__ = ["PATTERNS", "default_cache_dir", "dataset_folder_name", "render_image", "generate", "ensure_dataset"]

FORMAT_VERSION = 1
PATTERNS = ("disc", "square", "triangle", "cross", "ring", "h_stripes", "v_stripes", "checker", "diagonal",
            "dots", "diamond", "frame")
_SUPERSAMPLE = 4


def default_cache_dir() -> Path:
    """``$MS_BOOST_CACHE/synthetic_imagenet`` if set, else ``~/.cache/ms_boost/synthetic_imagenet``."""
    base = os.environ.get("MS_BOOST_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "ms_boost")
    return Path(base) / "synthetic_imagenet"


def dataset_folder_name(num_classes: int, image_size: int, train_per_class: int, val_per_class: int,
                        seed: int) -> str:
    """Name of the folder holding one parameter set (all generation parameters are part of it)."""
    return (f"v{FORMAT_VERSION}_c{num_classes}_s{image_size}_train{train_per_class}_val{val_per_class}"
            f"_seed{seed}")


def _check_int(name: str, value, low: int, high: Optional[int] = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}={value!r} must be an int.")
    if value < low or (high is not None and value > high):
        raise ValueError(f"{name}={value} must be in [{low}, {high if high is not None else 'inf'}].")
    return int(value)


def _class_colour(class_index: int, num_classes: int, rng: np.random.Generator) -> tuple:
    """RGB of the class hue ``class_index / num_classes`` with a little hue, saturation and value jitter."""
    hue = (class_index / num_classes + rng.uniform(-0.25, 0.25) / num_classes) % 1.0
    red, green, blue = colorsys.hsv_to_rgb(hue, rng.uniform(0.65, 1.0), rng.uniform(0.7, 1.0))
    return int(red * 255), int(green * 255), int(blue * 255)


def _draw_pattern(draw: ImageDraw.ImageDraw, pattern: str, box: tuple, colour: tuple,
                  rng: np.random.Generator) -> None:
    """Draw ``pattern`` filling ``box = (x0, y0, x1, y1)`` in ``colour``."""
    x0, y0, x1, y1 = box
    size = x1 - x0
    line = max(2, size // 8)
    if pattern == "disc":
        draw.ellipse(box, fill=colour)
    elif pattern == "square":
        draw.rectangle(box, fill=colour)
    elif pattern == "triangle":
        draw.polygon([(x0 + size // 2, y0), (x1, y1), (x0, y1)], fill=colour)
    elif pattern == "cross":
        mid_x, mid_y = (x0 + x1) // 2, (y0 + y1) // 2
        draw.rectangle((mid_x - line, y0, mid_x + line, y1), fill=colour)
        draw.rectangle((x0, mid_y - line, x1, mid_y + line), fill=colour)
    elif pattern == "ring":
        draw.ellipse(box, outline=colour, width=line)
    elif pattern == "frame":
        draw.rectangle(box, outline=colour, width=line)
    elif pattern == "diamond":
        mid_x, mid_y = (x0 + x1) // 2, (y0 + y1) // 2
        draw.polygon([(mid_x, y0), (x1, mid_y), (mid_x, y1), (x0, mid_y)], fill=colour)
    elif pattern in ("h_stripes", "v_stripes", "diagonal"):
        period = max(4, size // int(rng.integers(3, 5)))
        for offset in range(-size, 2 * size, period):
            if pattern == "h_stripes":
                draw.rectangle((x0, y0 + offset, x1, y0 + offset + period // 2), fill=colour)
            elif pattern == "v_stripes":
                draw.rectangle((x0 + offset, y0, x0 + offset + period // 2, y1), fill=colour)
            else:
                draw.line((x0 + offset, y0, x0 + offset + size, y1), fill=colour, width=period // 2)
    elif pattern == "checker":
        cell = max(3, size // 4)
        for row in range(0, size, cell):
            for col in range(0, size, cell):
                if (row // cell + col // cell) % 2 == 0:
                    draw.rectangle((x0 + col, y0 + row, x0 + col + cell - 1, y0 + row + cell - 1), fill=colour)
    elif pattern == "dots":
        radius = max(2, size // 10)
        for row in range(radius, size, 3 * radius):
            for col in range(radius, size, 3 * radius):
                draw.ellipse((x0 + col - radius, y0 + row - radius, x0 + col + radius, y0 + row + radius),
                             fill=colour)
    else:
        raise ValueError(f"pattern={pattern!r} is not one of {PATTERNS}.")


def render_image(class_index: int, num_classes: int, image_size: int, rng: np.random.Generator) -> Image.Image:
    """Render one RGB image of class ``class_index``.

    The class fixes the pattern (``PATTERNS[class_index % len(PATTERNS)]``) and the hue; the position,
    size, colour jitter, background and noise come from ``rng``.
    """
    canvas = image_size * _SUPERSAMPLE
    background = rng.uniform(0, 255, size=3) * 0.35 + 40
    base = np.clip(background + rng.normal(0, 18, size=(canvas // 8, canvas // 8, 3)), 0, 255).astype(np.uint8)
    image = Image.fromarray(base).resize((canvas, canvas), Image.BILINEAR)
    draw = ImageDraw.Draw(image)
    size = int(canvas * rng.uniform(0.45, 0.8))
    x0 = int(rng.integers(0, canvas - size + 1))
    y0 = int(rng.integers(0, canvas - size + 1))
    pattern = PATTERNS[class_index % len(PATTERNS)]
    _draw_pattern(draw, pattern, (x0, y0, x0 + size, y0 + size), _class_colour(class_index, num_classes, rng), rng)
    image = image.filter(ImageFilter.GaussianBlur(radius=_SUPERSAMPLE / 2)).resize((image_size, image_size),
                                                                                 Image.LANCZOS)
    pixels = np.asarray(image, dtype=np.float32) + rng.normal(0, 6, size=(image_size, image_size, 3))
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def generate(out_dir: Union[str, Path], num_classes: int = 10, image_size: int = 32, train_per_class: int = 40,
             val_per_class: int = 10, seed: int = 0) -> Path:
    """Render the set into ``out_dir`` (``train/<class>/*.JPEG`` and ``val/<class>/*.JPEG``).

    Image ``j`` of class ``c`` in split ``s`` draws from a generator seeded with ``(seed, s, c, j)``, so
    the content does not depend on generation order. ``out_dir`` must not exist yet.
    """
    out_dir = Path(out_dir)
    for split_index, (split, count) in enumerate((("train", train_per_class), ("val", val_per_class))):
        for class_index in range(num_classes):
            folder = out_dir / split / f"class_{class_index:03d}_{PATTERNS[class_index % len(PATTERNS)]}"
            folder.mkdir(parents=True)
            for image_index in range(count):
                rng = np.random.default_rng([seed, split_index, class_index, image_index])
                image = render_image(class_index, num_classes, image_size, rng)
                image.save(folder / f"{split}_{class_index:03d}_{image_index:05d}.JPEG", format="JPEG", quality=92)
    return out_dir


def ensure_dataset(cache_dir: Union[str, Path, None] = None, num_classes: int = 10, image_size: int = 32,
                   train_per_class: int = 40, val_per_class: int = 10, seed: int = 0, verbose: bool = True) -> Path:
    """Return the folder of the built-in set with these parameters, rendering it first if needed.

    The set is rendered into a temporary sibling folder and renamed into place, so concurrent callers
    (e.g. every rank of a distributed job) never see a half-written set; a caller that loses the race
    discards its copy and uses the winner's.

    Args:
        cache_dir: parent folder of the sets (:func:`default_cache_dir` when empty or ``None``).
        num_classes: classes (2..1000).
        image_size: side of the square images in pixels (16..512).
        train_per_class: training images per class.
        val_per_class: validation images per class.
        seed: generation seed.
        verbose: print a line when rendering.

    Returns:
        the folder holding ``train/`` and ``val/``.
    """
    num_classes = _check_int("num_classes", num_classes, 2, 1000)
    image_size = _check_int("image_size", image_size, 16, 512)
    train_per_class = _check_int("train_per_class", train_per_class, 1)
    val_per_class = _check_int("val_per_class", val_per_class, 1)
    seed = _check_int("seed", seed, 0)
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    target = root / dataset_folder_name(num_classes, image_size, train_per_class, val_per_class, seed)
    if (target / "train").is_dir() and (target / "val").is_dir():
        return target
    root.mkdir(parents=True, exist_ok=True)
    if verbose:
        print(f"Rendering the built-in data set ({num_classes} classes, {image_size}px, "
              f"{num_classes * train_per_class} train / {num_classes * val_per_class} val) into {target}", flush=True)
    return publish_image_folder(target, lambda out: generate(out, num_classes, image_size, train_per_class,
                                                              val_per_class, seed))


def publish_image_folder(target: Path, write) -> Path:
    """Write an image folder atomically: ``write(folder)`` fills a staging folder beside ``target``, which is then
    renamed into place, so a reader never sees half a set. When another process published ``target`` first,
    its folder is kept and the staging copy removed.

    Args:
        target: the folder to publish (its parent must exist).
        write: callable filling the folder it is given with ``train/`` and ``val/``.

    Returns:
        ``target``.
    """
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        write(staging / "data")
        try:
            os.rename(staging / "data", target)
        except OSError:
            if not (target / "train").is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def main(argv=None) -> None:
    """Command line: render (or find) the built-in set and print its folder."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache_dir", default="", help=f"parent folder (default: {default_cache_dir()})")
    parser.add_argument("--num_classes", type=int, default=10)
    parser.add_argument("--image_size", type=int, default=32)
    parser.add_argument("--train_per_class", type=int, default=40)
    parser.add_argument("--val_per_class", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(ensure_dataset(args.cache_dir, args.num_classes, args.image_size, args.train_per_class,
                         args.val_per_class, args.seed))


if __name__ == "__main__":
    main()

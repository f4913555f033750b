"""ImageNet-style input pipeline over ``ImageFolderDataset`` (also used for the built-in data set).

A data root holds ``train/`` and ``val/`` (names configurable), each with one sub-folder per class;
labels are the sorted class-folder indices of the train split: an evaluation split is read with
``class_names`` (the train split's :func:`class_folders`), so a val split lacking a class keeps every other
label (the missing classes are named in a warning), and a val class folder the train split lacks is an
error (:func:`class_indexing`). Training reads a random-resized
crop and a horizontal flip; evaluation resizes the short side to ``image_size / 0.875`` and takes the
centre crop. Both normalise with the ImageNet mean/std, emit CHW ``float32`` images and ``int32``
labels, and batch with ``drop_remainder=True``. With ``rank_size > 1`` every rank reads its own shard.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple, Union

import mindspore as ms
import mindspore.dataset as ds
from mindspore.dataset import transforms, vision

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "IMAGE_EXTENSIONS", "class_folders", "class_indexing", "check_class_count",
           "warn_unread_files", "create_dataset"]

IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)
IMAGE_EXTENSIONS = (".JPEG", ".jpeg", ".jpg", ".JPG", ".png", ".PNG")


def class_folders(dataset_path: Union[str, Path]) -> list:
    """Sorted class sub-folder names of ``dataset_path`` (label ``i`` is the ``i``-th name).

    Raises:
        ValueError: the folder does not exist or holds no class sub-folder.
    """
    path = Path(dataset_path)
    if not path.is_dir():
        raise ValueError(f"dataset_path={str(path)!r} is not a folder; expected one sub-folder of images per class.")
    names = sorted(entry.name for entry in path.iterdir() if entry.is_dir() and not entry.name.startswith("."))
    if not names:
        raise ValueError(f"dataset_path={str(path)!r} holds no class sub-folder.")
    return names


def _listed(names: Sequence[str], limit: int = 10) -> str:
    shown = ", ".join(repr(n) for n in list(names)[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def class_indexing(dataset_path: Union[str, Path], class_names: Sequence[str]) -> Dict[str, int]:
    """Label of each class folder of ``dataset_path`` when label ``i`` is ``class_names[i]`` (the train
    split's sorted class folders), for ``ImageFolderDataset(class_indexing=...)``.

    A folder lacking some of ``class_names`` keeps the others' labels; the missing ones are named in a
    ``UserWarning`` (accuracy then covers the classes present).

    Raises:
        ValueError: ``dataset_path`` holds a class folder that is not in ``class_names`` (its images would
            have no label), or ``class_names`` is empty or repeats a name.
    """
    names = list(class_names)
    if not names or len(set(names)) != len(names):
        raise ValueError(f"class_names={_listed(names)} must be a non-empty list of distinct folder names.")
    present = class_folders(dataset_path)
    extra = [name for name in present if name not in set(names)]
    if extra:
        raise ValueError(f"{str(dataset_path)!r} holds {len(extra)} class folder(s) the train split lacks: "
                         f"{_listed(extra)}; labels follow the train split's {len(names)} sorted class folders "
                         f"({_listed(names, 3)}), so these images would have no label. Remove them or train with "
                         f"them.")
    missing = [name for name in names if name not in set(present)]
    if missing:
        warnings.warn(f"{str(dataset_path)!r} lacks {len(missing)} of the train split's {len(names)} classes: "
                      f"{_listed(missing)}; the other classes keep the train split's labels and accuracy covers "
                      f"only them.", UserWarning, stacklevel=2)
    return {name: names.index(name) for name in present}


def warn_unread_files(dataset_path: Union[str, Path], class_names: Sequence[str]) -> None:
    """Warn about files in the class folders that the pipeline does not read (a suffix other than
    :data:`IMAGE_EXTENSIONS`, e.g. ``.bmp``, ``.webp``, ``.Jpg``), naming how many and a few, and about class folders
    left without any image that way: ``ImageFolderDataset`` skips such files without a word, so a class of BMP
    files would train on nothing and a val split's accuracy would cover fewer images than it holds. Hidden files
    (``.DS_Store``) are not counted."""
    root = Path(dataset_path)
    unread, empty = [], []
    for name in class_names:
        folder = root / name
        if not folder.is_dir():
            continue
        count, skipped = 0, []
        # names only (os.walk lists them without a stat per file: ImageNet's 1.28 M images read in a second or two)
        for path, _, names in os.walk(folder):
            files = [entry for entry in names if not entry.startswith(".")]
            count += len(files)
            skipped.extend(Path(path) / entry for entry in files if not entry.endswith(IMAGE_EXTENSIONS))
        unread.extend(skipped)
        if count and len(skipped) == count:
            empty.append(name)
    if unread:
        shown = ", ".join(repr(str(p.relative_to(root))) for p in unread[:3])
        left = f"; class folder(s) left without an image: {_listed(empty)}" if empty else ""
        warnings.warn(f"{str(root)!r}: {len(unread)} file(s) are not read (only {', '.join(IMAGE_EXTENSIONS)} "
                      f"are), e.g. {shown}{left}. Convert or rename them to be used.", UserWarning, stacklevel=2)


def check_class_count(classes: Sequence[str], class_num: int, dataset_path: Union[str, Path]) -> None:
    """Check the class folders labelled ``0..len(classes)-1`` against the network's ``class_num`` outputs.

    More folders than ``class_num`` is an error (labels past the last output); fewer folders than
    ``class_num - 1`` gives a ``UserWarning`` naming both numbers (one unused output is MindSpore's ImageNet
    convention: 1001 outputs, 1000 folders).

    Raises:
        ValueError: as above, naming the folder and the numbers.
    """
    count = len(classes)
    if count > class_num:
        raise ValueError(f"class_num={class_num} is smaller than the {count} class folders of "
                         f"{str(dataset_path)!r}; labels would run past the network's outputs; raise --class_num "
                         f"to at least {count}.")
    if count < class_num - 1:
        warnings.warn(f"{str(dataset_path)!r} holds {count} class folders but class_num={class_num}; outputs "
                      f"{count}..{class_num - 1} are never a label (lower --class_num to {count} unless the "
                      f"checkpoint needs it).", UserWarning, stacklevel=2)


def _train_transforms(image_size: int, crop_scale: Tuple[float, float], hflip: bool = True) -> list:
    flip = [vision.RandomHorizontalFlip(prob=0.5)] if hflip else []
    return [
        vision.RandomCropDecodeResize(image_size, scale=tuple(crop_scale), ratio=(0.75, 1.333)),
        *flip,
        vision.Normalize(mean=IMAGENET_MEAN, std=IMAGENET_STD),
        vision.HWC2CHW(),
    ]


def _eval_transforms(image_size: int, crop_ratio: float) -> list:
    return [
        vision.Decode(),
        vision.Resize(int(round(image_size / crop_ratio))),
        vision.CenterCrop(image_size),
        vision.Normalize(mean=IMAGENET_MEAN, std=IMAGENET_STD),
        vision.HWC2CHW(),
    ]


def create_dataset(dataset_path: Union[str, Path], do_train: bool, batch_size: int = 32, image_size: int = 224,
                   rank_size: int = 1, rank_id: int = 0, num_parallel_workers: Optional[int] = None,
                   shuffle: Optional[bool] = None, crop_scale: Sequence[float] = (0.08, 1.0),
                   eval_crop_ratio: float = 0.875, drop_remainder: bool = True, num_steps: int = 0,
                   seed: Optional[int] = None, class_names: Optional[Sequence[str]] = None,
                   class_num: Optional[int] = None, hflip: bool = True) -> ds.Dataset:
    """Batched image pipeline over one split folder.

    Args:
        dataset_path: the split folder (e.g. ``imagenet/train``) with one sub-folder per class.
        do_train: training transforms (random crop + flip, shuffled) or evaluation transforms.
        batch_size: images per batch (per rank).
        image_size: side of the square network input.
        rank_size: number of shards (data-parallel ranks).
        rank_id: shard read by this process, in ``[0, rank_size)``.
        num_parallel_workers: map/decoding workers (default 8; capped by the CPUs available).
        shuffle: shuffle the file list (default: ``do_train``).
        crop_scale: area range of the training random-resized crop.
        eval_crop_ratio: evaluation centre-crop / resize ratio (``image_size / eval_crop_ratio`` is resized).
        drop_remainder: drop the last incomplete batch (every rank then runs the same number of steps).
        num_steps: when > 0, keep only the first ``num_steps`` batches (short runs and tests).
        seed: shuffle/augmentation seed of the data engine (``None`` keeps the current one).
        class_names: label ``i`` is the folder ``class_names[i]`` (give the train split's
            :func:`class_folders` for an evaluation split; see :func:`class_indexing`). ``None``: the folder's
            own sorted class folders (right for the train split itself).
        class_num: the network's outputs, checked against the classes (:func:`check_class_count`).
        hflip: random horizontal flips in training (off for sets a mirror would mislabel, e.g. digits).

    Returns:
        a dataset yielding ``(image float32 (N, 3, S, S), label int32 (N,))``.

    Raises:
        ValueError: a missing folder, a bad shard, fewer images than one batch, a class folder not in
            ``class_names``, a training split with a single class, more classes than ``class_num``.
    """
    own = class_folders(dataset_path)
    indexing = None if class_names is None else class_indexing(dataset_path, class_names)
    warn_unread_files(dataset_path, own)
    if do_train and len(own) < 2:
        raise ValueError(f"{str(dataset_path)!r} holds a single class folder ({own[0]!r}); training a classifier "
                         f"needs at least 2 (one sub-folder of images per class).")
    if class_num is not None:
        check_class_count(own if class_names is None else list(class_names), class_num, dataset_path)
    for name, value, low in (("batch_size", batch_size, 1), ("image_size", image_size, 8), ("rank_size", rank_size, 1),
                             ("num_steps", num_steps, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name}={value!r} must be an int >= {low}.")
    if not 0 <= rank_id < rank_size:
        raise ValueError(f"rank_id={rank_id} must be in [0, rank_size={rank_size}).")
    if len(crop_scale) != 2 or not 0.0 < float(crop_scale[0]) <= float(crop_scale[1]) <= 1.0:
        raise ValueError(f"crop_scale={list(crop_scale)} must be (low, high) with 0 < low <= high <= 1.")
    if not 0.0 < eval_crop_ratio <= 1.0:
        raise ValueError(f"eval_crop_ratio={eval_crop_ratio} must be in (0, 1].")
    if seed is not None:
        ds.config.set_seed(int(seed))
    available = os.cpu_count() or 1
    workers = max(1, min(num_parallel_workers or 8, available))
    shard = {"num_shards": rank_size, "shard_id": rank_id} if rank_size > 1 else {}
    data = ds.ImageFolderDataset(str(dataset_path), num_parallel_workers=workers,
                                 shuffle=do_train if shuffle is None else shuffle,
                                 extensions=list(IMAGE_EXTENSIONS), class_indexing=indexing, **shard)
    if data.get_dataset_size() < batch_size and drop_remainder:
        raise ValueError(f"batch_size={batch_size} is larger than the {data.get_dataset_size()} images of "
                         f"{str(dataset_path)!r} on rank {rank_id}/{rank_size}; no full batch can be formed.")
    image_ops = (_train_transforms(image_size, crop_scale, hflip) if do_train
                 else _eval_transforms(image_size, eval_crop_ratio))
    data = data.map(operations=image_ops, input_columns="image", num_parallel_workers=workers)
    data = data.map(operations=transforms.TypeCast(ms.int32), input_columns="label", num_parallel_workers=workers)
    data = data.batch(batch_size, drop_remainder=drop_remainder)
    if num_steps:
        data = data.take(num_steps)
    return data

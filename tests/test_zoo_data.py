"""Built-in data set (rendering, caching, learnability) and the ImageFolder pipeline (transforms, shards)."""
from __future__ import annotations

import hashlib
import multiprocessing
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from model_zoo.resnet.src.dataset import IMAGENET_MEAN, IMAGENET_STD, class_folders, create_dataset
from model_zoo.resnet.src.synthetic_data import PATTERNS, dataset_folder_name, ensure_dataset, main


def tree_digest(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def dataset_root(tmp_path_factory) -> Path:
    return ensure_dataset(tmp_path_factory.mktemp("cache"), num_classes=10, image_size=32, train_per_class=12,
                          val_per_class=6, seed=0, verbose=False)


def test_layout_classes_and_jpeg_files(dataset_root):
    for split, count in (("train", 12), ("val", 6)):
        classes = class_folders(dataset_root / split)
        assert len(classes) == 10
        assert [c.split("_", 2)[2] for c in classes] == list(PATTERNS[:10])
        for name in classes:
            files = sorted((dataset_root / split / name).iterdir())
            assert len(files) == count and all(f.suffix == ".JPEG" for f in files)
        with Image.open(next((dataset_root / split / classes[3]).iterdir())) as image:
            assert image.format == "JPEG" and image.size == (32, 32) and image.mode == "RGB"
    assert dataset_root.name == dataset_folder_name(10, 32, 12, 6, 0)


def test_rendering_is_deterministic_and_seeded(tmp_path, dataset_root):
    again = ensure_dataset(tmp_path / "a", 10, 32, 12, 6, seed=0, verbose=False)
    assert tree_digest(again) == tree_digest(dataset_root)
    other = ensure_dataset(tmp_path / "b", 10, 32, 12, 6, seed=1, verbose=False)
    assert set(tree_digest(other).values()).isdisjoint(tree_digest(dataset_root).values())


def test_cached_set_is_reused_not_rendered_again(tmp_path, capsys):
    first = ensure_dataset(tmp_path, 12, 16, 2, 1, seed=0)
    assert "Rendering the built-in data set (12 classes" in capsys.readouterr().out
    stamp = {p: p.stat().st_mtime_ns for p in first.rglob("*.JPEG")}
    assert ensure_dataset(tmp_path, 12, 16, 2, 1, seed=0) == first
    assert capsys.readouterr().out == ""
    assert {p: p.stat().st_mtime_ns for p in first.rglob("*.JPEG")} == stamp
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no staging folder left behind


def _render(args):
    root, seed = args
    return str(ensure_dataset(root, 10, 16, 3, 1, seed=seed, verbose=False))


def test_concurrent_renders_end_with_one_complete_set(tmp_path):
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        results = pool.map(_render, [(str(tmp_path), 5)] * 2)
    assert results[0] == results[1]
    root = Path(results[0])
    assert len(list(root.rglob("*.JPEG"))) == 10 * 4
    assert [p.name for p in tmp_path.iterdir()] == [root.name]
    reference = ensure_dataset(tmp_path / "ref", 10, 16, 3, 1, seed=5, verbose=False)
    assert tree_digest(root) == tree_digest(reference)


def test_bad_generation_arguments():
    with pytest.raises(ValueError, match="num_classes=1 "):
        ensure_dataset("/nonexistent", num_classes=1)
    with pytest.raises(ValueError, match="image_size=8 "):
        ensure_dataset("/nonexistent", image_size=8)
    with pytest.raises(TypeError, match="seed=0.5"):
        ensure_dataset("/nonexistent", seed=0.5)


def test_command_line_prints_the_folder(tmp_path, capsys):
    main(["--cache_dir", str(tmp_path), "--num_classes", "10", "--image_size", "16", "--train_per_class", "1",
          "--val_per_class", "1"])
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    assert Path(printed).is_dir() and (Path(printed) / "val").is_dir()


def test_set_is_learnable_nearest_centroid_beats_chance(dataset_root):
    """An independent numpy classifier is far above chance: nearest centroid on the mean hue of each image,
    weighted towards its vivid pixels (weight (saturation * value)^8, hue as a unit vector)."""
    def features(split):
        xs, ys = [], []
        for label, name in enumerate(class_folders(dataset_root / split)):
            for path in sorted((dataset_root / split / name).iterdir()):
                hsv = np.asarray(Image.open(path).convert("HSV"), dtype=np.float64).reshape(-1, 3) / 255.0
                angle = hsv[:, 0] * 2 * np.pi * 255.0 / 256.0
                weight = (hsv[:, 1] * hsv[:, 2]) ** 8
                xs.append([np.sum(weight * np.cos(angle)), np.sum(weight * np.sin(angle))] / weight.sum())
                ys.append(label)
        return np.array(xs), np.array(ys)

    train_x, train_y = features("train")
    val_x, val_y = features("val")
    centroids = np.stack([train_x[train_y == c].mean(axis=0) for c in range(10)])
    predicted = np.argmin(((val_x[:, None, :] - centroids[None]) ** 2).sum(axis=2), axis=1)
    assert (predicted == val_y).mean() >= 0.8  # chance is 0.1


# ---------------------------------------------------------------------------------------------------------------
# pipeline
# ---------------------------------------------------------------------------------------------------------------
def test_train_pipeline_shapes_types_and_drop_remainder(dataset_root):
    data = create_dataset(dataset_root / "train", do_train=True, batch_size=16, image_size=24, seed=1,
                          num_parallel_workers=1)
    assert data.get_dataset_size() == 120 // 16  # 7 full batches, the remainder dropped
    batches = list(data.create_tuple_iterator(num_epochs=1, output_numpy=True))
    assert len(batches) == 7
    images, labels = batches[0]
    assert images.shape == (16, 3, 24, 24) and images.dtype == np.float32
    assert labels.shape == (16,) and labels.dtype == np.int32 and labels.min() >= 0 and labels.max() <= 9
    assert len(np.unique(np.concatenate([b[1] for b in batches]))) == 10  # shuffled over all classes
    capped = create_dataset(dataset_root / "train", do_train=True, batch_size=16, image_size=24, num_steps=3,
                            num_parallel_workers=1)
    assert capped.get_dataset_size() == 3


def test_eval_pipeline_is_resize_center_crop_normalize(dataset_root):
    data = create_dataset(dataset_root / "val", do_train=False, batch_size=60, image_size=28, drop_remainder=False,
                          num_parallel_workers=1)
    images, labels = next(data.create_tuple_iterator(num_epochs=1, output_numpy=True))
    assert images.shape == (60, 3, 28, 28)
    np.testing.assert_array_equal(labels, np.repeat(np.arange(10), 6))  # unshuffled, labels = sorted folders
    # reference for the first image: resize the short side to round(28 / 0.875) = 32, centre crop 28, normalise
    first = sorted((dataset_root / "val" / class_folders(dataset_root / "val")[0]).iterdir())[0]
    pixels = np.asarray(Image.open(first).convert("RGB"), dtype=np.float64)[2:30, 2:30]
    reference = ((pixels - np.array(IMAGENET_MEAN)) / np.array(IMAGENET_STD)).transpose(2, 0, 1)
    np.testing.assert_allclose(images[0], reference, atol=1e-4)


def test_shards_are_disjoint_and_cover_the_split(dataset_root):
    def digests(rank_size, rank_id):
        data = create_dataset(dataset_root / "val", do_train=False, batch_size=1, image_size=32, rank_size=rank_size,
                              rank_id=rank_id, drop_remainder=False, num_parallel_workers=1)
        return [hashlib.sha256(img.tobytes()).hexdigest()
                for img, _ in data.create_tuple_iterator(num_epochs=1, output_numpy=True)]

    everything = digests(1, 0)
    shard0, shard1 = digests(2, 0), digests(2, 1)
    assert len(shard0) == len(shard1) == 30
    assert set(shard0).isdisjoint(shard1)
    assert sorted(shard0 + shard1) == sorted(everything)


def test_pipeline_rejects_bad_arguments(dataset_root, tmp_path):
    with pytest.raises(ValueError, match="is not a folder"):
        create_dataset(tmp_path / "missing", do_train=True)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no class sub-folder"):
        create_dataset(tmp_path / "empty", do_train=True)
    with pytest.raises(ValueError, match="rank_id=2"):
        create_dataset(dataset_root / "train", do_train=True, rank_size=2, rank_id=2)
    with pytest.raises(ValueError, match="batch_size=1000 is larger than the 120 images"):
        create_dataset(dataset_root / "train", do_train=True, batch_size=1000)
    with pytest.raises(ValueError, match="crop_scale"):
        create_dataset(dataset_root / "train", do_train=True, crop_scale=(0.9, 0.1))
    assert os.path.isdir(dataset_root)


def test_eval_split_takes_the_train_splits_labels(dataset_root, tmp_path):
    import shutil

    train = class_folders(dataset_root / "train")
    val = tmp_path / "val"
    for name in train[:3] + train[4:]:  # class 3 missing
        shutil.copytree(dataset_root / "val" / name, val / name)
    with pytest.warns(UserWarning, match=f"lacks 1 of the train split's 10 classes: '{train[3]}'"):
        data = create_dataset(val, do_train=False, batch_size=6, image_size=32, shuffle=False, class_names=train,
                              class_num=10)
    labels = np.concatenate([label for _, label in data.create_tuple_iterator(output_numpy=True)])
    assert sorted(set(labels.tolist())) == [0, 1, 2, 4, 5, 6, 7, 8, 9]  # not shifted to 0..8
    assert (labels == 9).sum() == 6
    (val / "digit_extra").mkdir()
    shutil.copy(next((val / train[0]).iterdir()), val / "digit_extra" / "x.JPEG")
    with pytest.raises(ValueError, match=r"holds 1 class folder\(s\) the train split lacks: 'digit_extra'"):
        create_dataset(val, do_train=False, batch_size=6, image_size=32, class_names=train)


def test_class_folders_against_class_num(dataset_root, tmp_path):
    import shutil

    with pytest.raises(ValueError, match=r"class_num=5 is smaller than the 10 class folders of .*raise --class_num"):
        create_dataset(dataset_root / "train", do_train=True, batch_size=8, image_size=32, class_num=5)
    with pytest.warns(UserWarning, match=r"holds 10 class folders but class_num=20; outputs 10..19 are never"):
        create_dataset(dataset_root / "train", do_train=True, batch_size=8, image_size=32, class_num=20)
    one = class_folders(dataset_root / "train")[0]
    shutil.copytree(dataset_root / "train" / one, tmp_path / "train" / one)
    with pytest.raises(ValueError, match=f"holds a single class folder \\('{one}'\\); training a classifier needs"):
        create_dataset(tmp_path / "train", do_train=True, batch_size=8, image_size=32)


def test_eval_py_takes_the_classes_from_the_train_split(dataset_root, tmp_path):
    from model_zoo.resnet.eval import train_classes
    from model_zoo.resnet.src.config import parse_config

    recipe = Path(__file__).resolve().parents[1] / "model_zoo/resnet/configs/resnet50_imagenet_momentum.yaml"
    cfg = parse_config(["--data_path", str(dataset_root), "--class_num", "10"], recipe)
    assert train_classes(cfg) == class_folders(dataset_root / "train")
    (tmp_path / "val" / "a").mkdir(parents=True)  # no train split here, no checkpoint naming one
    cfg = cfg.replace(data_path=str(tmp_path), checkpoint_file_path=str(tmp_path / "none.ckpt"))
    with pytest.warns(UserWarning, match=r"no train split at hand .*labels are the 1 sorted class folders of"):
        assert train_classes(cfg) is None


def test_train_py_evaluation_labels_the_val_split_by_the_train_splits_classes(dataset_root, tmp_path):
    """The evaluation train.py runs (trainer.eval_dataset) reads a val split lacking a class with the train split's
    labels, as eval.py does: the labels of the classes after the missing one are not shifted down."""
    import shutil

    from model_zoo.resnet.src.config import parse_config
    from model_zoo.resnet.src.trainer import eval_dataset

    train = class_folders(dataset_root / "train")
    shutil.copytree(dataset_root / "train", tmp_path / "train")
    for name in train[:3] + train[4:]:  # class 3 missing from val
        shutil.copytree(dataset_root / "val" / name, tmp_path / "val" / name)
    recipe = Path(__file__).resolve().parents[1] / "model_zoo/resnet/configs/resnet50_imagenet_momentum.yaml"
    cfg = parse_config(["--data_path", str(tmp_path), "--class_num", "10", "--eval_image_size", "32",
                        "--eval_batch_size", "6", "--num_parallel_workers", "1"], recipe)
    with pytest.warns(UserWarning, match=f"lacks 1 of the train split's 10 classes: '{train[3]}'"):
        data = eval_dataset(cfg)
    labels = np.concatenate([label for _, label in data.create_tuple_iterator(output_numpy=True)])
    assert sorted(set(labels.tolist())) == [0, 1, 2, 4, 5, 6, 7, 8, 9]


def test_accuracy_of_a_network_with_fewer_than_5_classes(tmp_path):
    """A 3-class data set: MindSpore's 'top_5_accuracy' asked numpy for 5 of 3 outputs and training ended at its
    evaluation with "operands could not be broadcast together with shapes (4,3) (4,5)". The zoo's metrics count the
    top min(5, class_num) outputs; both accuracies against numpy (10 classes: the true top-5)."""
    import mindspore.dataset as ds
    from mindspore import nn
    from mindspore.train import Model

    from model_zoo.resnet.src.trainer import eval_metrics

    class Logits(nn.Cell):
        def construct(self, x):
            return x * 1.0

    rng = np.random.default_rng(0)
    for classes in (3, 10):
        logits = rng.normal(size=(7, classes)).astype(np.float32)
        labels = rng.integers(0, classes, 7).astype(np.int32)
        data = ds.NumpySlicesDataset({"x": logits, "y": labels}, shuffle=False).batch(4)
        result = Model(Logits(), loss_fn=nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                       metrics=eval_metrics(classes)).eval(data, dataset_sink_mode=False)
        order = np.argsort(-logits, axis=1)
        assert result["top_1_accuracy"] == pytest.approx(np.mean(order[:, 0] == labels))
        assert result["top_5_accuracy"] == pytest.approx(np.mean((order[:, :5] == labels[:, None]).any(axis=1)))
    with pytest.raises(ValueError, match=r"class_num=0 must be an int >= 1"):
        eval_metrics(0)


def test_pipeline_reads_grey_alpha_palette_cmyk_and_odd_sized_images(tmp_path):
    """Images a user's folder may hold besides RGB JPEGs: grey, grey+alpha, RGBA, palette and 1-bit PNGs, a CMYK
    JPEG, 1x1, 500x3 and 3x40 pixels, and a non-image file (left out). Every batch is (N, 3, S, S) float32."""
    rng = np.random.default_rng(0)
    modes, sizes = ["L", "LA", "RGBA", "P", "1", "RGB"], [(1, 1), (500, 3), (3, 40), (17, 23), (16, 16), (64, 64)]
    for c in range(2):
        for i, (mode, size) in enumerate(zip(modes, sizes)):
            folder = tmp_path / f"c{c}"
            folder.mkdir(exist_ok=True)
            image = Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), np.uint8)).convert(mode)
            image.save(folder / f"{i}_{mode}.png")
        Image.fromarray(rng.integers(0, 255, (20, 20, 3), np.uint8)).convert("CMYK").save(tmp_path / f"c{c}" / "k.jpg")
    (tmp_path / "c1" / "notes.txt").write_text("not an image")
    for train in (True, False):
        with pytest.warns(UserWarning, match=r"1 file\(s\) are not read .*'c1/notes.txt'"):
            data = create_dataset(tmp_path, do_train=train, batch_size=7, image_size=16, num_parallel_workers=1,
                                  drop_remainder=False)
        batches = [(b["image"], b["label"]) for b in data.create_dict_iterator(output_numpy=True)]
        assert [(x.shape, x.dtype) for x, _ in batches] == [((7, 3, 16, 16), np.float32)] * 2
        assert sorted(np.concatenate([y for _, y in batches]).tolist()) == [0] * 7 + [1] * 7


def test_files_the_pipeline_does_not_read_are_named(tmp_path):
    """``ImageFolderDataset`` reads only the listed suffixes and skipped the rest without a word: a class folder
    of BMP files trained on nothing (its label never seen), a val split's accuracy covered fewer images than it
    holds. A warning names the count, a few files and the class folders left without an image; hidden files are
    not counted, and a folder of readable images gives no warning."""
    import warnings

    for c in ("a", "b"):
        (tmp_path / c).mkdir()
        Image.new("RGB", (8, 8)).save(tmp_path / c / "0.jpg")
    Image.new("RGB", (8, 8)).save(tmp_path / "a" / ".hidden.bmp")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        create_dataset(tmp_path, do_train=True, batch_size=1, image_size=8, num_parallel_workers=1)
    (tmp_path / "c").mkdir()
    for i in range(2):
        Image.new("RGB", (8, 8)).save(tmp_path / "c" / f"{i}.bmp")
    Image.new("RGB", (8, 8)).save(tmp_path / "a" / "1.webp")
    with pytest.warns(UserWarning, match=r"3 file\(s\) are not read \(only \.JPEG, .*\.PNG are\), e\.g\. 'a/1\.webp', "
                                         r"'c/0\.bmp', 'c/1\.bmp'; class folder\(s\) left without an image: 'c'\."):
        data = create_dataset(tmp_path, do_train=True, batch_size=1, image_size=8, num_parallel_workers=1)
    assert data.get_dataset_size() == 2

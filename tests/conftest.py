"""Shared fixtures: execution mode, seeds, tiny networks and data."""
from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest

ms.set_device("CPU")

MODES = {"pynative": ms.PYNATIVE_MODE, "graph": ms.GRAPH_MODE}


@pytest.fixture(params=sorted(MODES))
def mode(request):
    """Run the test once in PyNative and once in Graph mode; restores PyNative afterwards."""
    ms.set_context(mode=MODES[request.param])
    yield request.param
    ms.set_context(mode=ms.PYNATIVE_MODE)


@pytest.fixture(autouse=True)
def _seed():
    ms.set_seed(0)
    np.random.seed(0)
    yield


TUTORIAL_CLASSES = 6


@pytest.fixture(scope="module")
def data_path(tmp_path_factory) -> str:
    """A tiny ImageNet-layout folder (train/ + val/, 6 classes of 32x32 JPEGs) for the tutorial tests."""
    from model_zoo.resnet.src.synthetic_data import ensure_dataset

    root = tmp_path_factory.mktemp("tutorial_data")
    return str(ensure_dataset(root, num_classes=TUTORIAL_CLASSES, image_size=32, train_per_class=16,
                              val_per_class=4, seed=0, verbose=False))

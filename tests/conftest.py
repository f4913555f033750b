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

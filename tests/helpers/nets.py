"""Tiny networks and data sets shared by the tests."""
from __future__ import annotations

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import Tensor, nn, ops


class SmallConvNet(nn.Cell):
    """conv-BN-ReLU x2 + dense: a small net with BatchNorm, for 3x8x8 inputs."""

    def __init__(self, num_classes: int = 4, width: int = 8):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, pad_mode="same", has_bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=2, pad_mode="same", has_bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(width * 4 * 4, num_classes)

    def construct(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.relu(self.bn2(self.conv2(x)))
        return self.fc(self.flatten(x))


def make_net(seed: int = 3, **kwargs) -> SmallConvNet:
    """A SmallConvNet with deterministic initial weights."""
    ms.set_seed(seed)
    return SmallConvNet(**kwargs)


def learnable_data(n: int = 64, num_classes: int = 4, seed: int = 0, size: int = 8):
    """Images whose class is a bright quadrant/channel pattern plus noise: learnable in a few epochs."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, num_classes, n).astype(np.int32)
    x = rng.normal(0.0, 0.5, size=(n, 3, size, size)).astype(np.float32)
    half = size // 2
    for i, c in enumerate(y):
        r, q = divmod(int(c) % 4, 2)
        x[i, int(c) % 3, r * half:(r + 1) * half, q * half:(q + 1) * half] += 2.0
    return x, y


def dataset(x, y, batch_size: int = 16, shuffle: bool = False):
    return ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=shuffle).batch(batch_size, drop_remainder=True)


def weights(net) -> list:
    return [p.asnumpy().copy() for p in net.trainable_params()]


def all_params(cell) -> dict:
    return {p.name: p.asnumpy().copy() for p in cell.get_parameters()}


class MLP(nn.Cell):
    """Two Dense layers with tanh between, from given ``(w1, b1, w2, b2)`` (THOR's numpy-reference tests)."""

    def __init__(self, w1, b1, w2, b2):
        super().__init__()
        self.fc1 = nn.Dense(w1.shape[1], w1.shape[0], weight_init=Tensor(w1), bias_init=Tensor(b1))
        self.fc2 = nn.Dense(w2.shape[1], w2.shape[0], weight_init=Tensor(w2), bias_init=Tensor(b2))

    def construct(self, x):
        return self.fc2(ops.tanh(self.fc1(x)))

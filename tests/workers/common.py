"""Pieces shared by worker scripts and the tests that check them."""
import mindspore as ms
from mindspore import nn


class PlainConvNet(nn.Cell):
    """Conv + ReLU + Dense without BatchNorm: data-parallel training equals one big batch exactly."""

    def __init__(self, num_classes: int = 4):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, stride=2, pad_mode="same", has_bias=True)
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(6 * 4 * 4, num_classes)

    def construct(self, x):
        return self.fc(self.flatten(self.relu(self.conv(x))))


def make_plain_net(seed: int = 5) -> PlainConvNet:
    ms.set_seed(seed)
    return PlainConvNet()

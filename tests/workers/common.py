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


class InfOnNegativeLabel(nn.Cell):
    """Loss network whose loss is inf when the batch's first label is negative (an injected overflow)."""

    def __init__(self, net):
        super().__init__()
        self.net = net
        self.ce = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def construct(self, x, y):
        factor = ms.ops.select(y[0] < 0, ms.Tensor(float("inf"), ms.float32), ms.Tensor(1.0, ms.float32))
        return self.ce(self.net(x), ms.ops.abs(y)) * factor

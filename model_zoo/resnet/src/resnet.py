"""ResNet v1.5 (18/34/50/101/152) chosen by name, weight initialisation and optimizer parameter groups.

ResNet v1.5 differs from the original v1 only in the bottleneck block: the stride of a down-sampling
block sits on the 3x3 convolution instead of the first 1x1 convolution (He et al., 2016; the variant
used by MLPerf and by MindSpore's THOR results). The stem is a 7x7/2 convolution followed by a 3x3/2
max-pool; the head is a global average pool and one fully connected layer.

Networks are registered by name (``resnet18`` ... ``resnet152``); :func:`create_model` builds one and
rejects an unknown name with the list of the known ones. ``base_width`` (64 in the paper) scales every
stage's width, which gives small, fast networks with the real topology for tests and CPU demos.
``conv_impl`` picks the convolution: MindSpore's ``nn.Conv2d`` (``native``) or the same layer computed as
im2col + GEMM (``gemm``, :mod:`model_zoo.resnet.src.conv`; a ResNet-18 training step 7-15x faster in
Graph mode and 2x in PyNative on CPU, bench/results/conv.md); ``auto`` (default)
takes ``gemm`` on CPU and ``native`` on Ascend/GPU. Parameters and checkpoints are identical either way.
"""
from __future__ import annotations

import math
from typing import Callable, Dict, List, Sequence, Type

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from model_zoo.resnet.src.conv import GemmConv2d, resolve_conv_impl
from ms_boost.cpu_gemm_conv import restore_convolutions

__all__ = [
    "BasicBlock", "Bottleneck", "StemMaxPool", "onnx_exportable", "ResNet", "register_model", "list_models",
    "create_model",
    "resnet10", "resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "init_weight", "init_group_params",
    "CONV_INITS", "DENSE_INITS",
]

_MODELS: Dict[str, Callable[..., ResNet]] = {}


def register_model(builder: Callable[..., ResNet]) -> Callable[..., ResNet]:
    """Register ``builder`` under its function name so :func:`create_model` can find it."""
    _MODELS[builder.__name__] = builder
    return builder


def list_models() -> List[str]:
    """Names accepted by :func:`create_model`, sorted."""
    return sorted(_MODELS, key=lambda name: (len(name), name))


def create_model(name: str, **kwargs) -> ResNet:
    """Build the network registered as ``name``.

    Args:
        name: one of :func:`list_models` (e.g. ``"resnet50"``).
        **kwargs: forwarded to :class:`ResNet` (``class_num``, ``base_width``, ``zero_init_residual``, ``conv_impl``).

    Raises:
        ValueError: ``name`` is not registered; the message lists the known names.
    """
    if not isinstance(name, str) or name not in _MODELS:
        raise ValueError(f"net_name={name!r} is not a known network; known: {', '.join(list_models())}.")
    return _MODELS[name](**kwargs)


def _conv(in_channels: int, out_channels: int, kernel_size: int, stride: int = 1,
          conv_impl: str = "native") -> nn.Conv2d:
    """Bias-free convolution with explicit symmetric padding ``kernel_size // 2`` (``conv_impl``: native/gemm)."""
    padding = kernel_size // 2
    layer = GemmConv2d if conv_impl == "gemm" else nn.Conv2d
    return layer(in_channels, out_channels, kernel_size, stride=stride, pad_mode="pad" if padding else "valid",
                     padding=padding, has_bias=False, weight_init="HeNormal")


def _bn(channels: int, zero_gamma: bool = False) -> nn.BatchNorm2d:
    """Batch norm with the momentum/epsilon of the reference recipes; ``zero_gamma`` starts it at 0."""
    return nn.BatchNorm2d(channels, eps=1e-5, momentum=0.9, gamma_init="zeros" if zero_gamma else "ones")


class BasicBlock(nn.Cell):
    """Two 3x3 convolutions with an identity (or 1x1 projection) shortcut: ResNet-18/34.

    Args:
        in_channels: input channels.
        channels: channels of the block (output = ``channels * expansion``).
        stride: stride of the first 3x3 convolution and of the projection shortcut.
        zero_init_residual: start the last batch norm's scale at 0 so the block begins as the identity.
        conv_impl: ``"native"`` (``nn.Conv2d``) or ``"gemm"`` (:class:`GemmConv2d`).
    """

    expansion = 1

    def __init__(self, in_channels: int, channels: int, stride: int = 1, zero_init_residual: bool = True,
                 conv_impl: str = "native"):
        super().__init__()
        out_channels = channels * self.expansion
        self.conv1 = _conv(in_channels, channels, 3, stride, conv_impl)
        self.bn1 = _bn(channels)
        self.conv2 = _conv(channels, out_channels, 3, conv_impl=conv_impl)
        self.bn2 = _bn(out_channels, zero_init_residual)
        self.relu = nn.ReLU()
        self.shortcut = _shortcut(in_channels, out_channels, stride, conv_impl)

    def construct(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class Bottleneck(nn.Cell):
    """1x1 reduce, 3x3 (carrying the stride: v1.5), 1x1 expand by 4, plus shortcut: ResNet-50/101/152.

    Args:
        in_channels: input channels.
        channels: width of the 3x3 convolution (output = ``4 * channels``).
        stride: stride of the 3x3 convolution and of the projection shortcut.
        zero_init_residual: start the last batch norm's scale at 0 so the block begins as the identity.
        conv_impl: ``"native"`` (``nn.Conv2d``) or ``"gemm"`` (:class:`GemmConv2d`).
    """

    expansion = 4

    def __init__(self, in_channels: int, channels: int, stride: int = 1, zero_init_residual: bool = True,
                 conv_impl: str = "native"):
        super().__init__()
        out_channels = channels * self.expansion
        self.conv1 = _conv(in_channels, channels, 1, conv_impl=conv_impl)
        self.bn1 = _bn(channels)
        self.conv2 = _conv(channels, channels, 3, stride, conv_impl)
        self.bn2 = _bn(channels)
        self.conv3 = _conv(channels, out_channels, 1, conv_impl=conv_impl)
        self.bn3 = _bn(out_channels, zero_init_residual)
        self.relu = nn.ReLU()
        self.shortcut = _shortcut(in_channels, out_channels, stride, conv_impl)

    def construct(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + self.shortcut(x))


def _shortcut(in_channels: int, out_channels: int, stride: int, conv_impl: str = "native") -> nn.Cell:
    """Identity when shapes match, otherwise a strided 1x1 projection followed by batch norm."""
    if stride == 1 and in_channels == out_channels:
        return nn.Identity()
    return nn.SequentialCell([_conv(in_channels, out_channels, 1, stride, conv_impl), _bn(out_channels)])


class StemMaxPool(nn.Cell):
    """The stem's 3x3 stride-2 max pool with padding 1, for non-negative input (it follows a ReLU).

    Written as a zero ``Pad`` then a ``'valid'`` ``MaxPool2d``: every 3x3 window holds at least one real
    value, and with values >= 0 a zero border never exceeds the window's maximum, so the output equals
    ``nn.MaxPool2d(3, 2, pad_mode="pad", padding=1)`` (an implicit ``-inf`` border) exactly. Unlike that
    layer (``MaxPool3DWithArgmax`` inside, which MindSpore cannot export to ONNX) both operators export to
    MINDIR, AIR and ONNX. No parameters: checkpoints are unaffected. Used for export only
    (:func:`onnx_exportable`): in training the two layers' backward passes break ties between equal window
    values differently, which changes a trained network slightly (measured on the THOR tutorial's run).
    """

    def __init__(self):
        super().__init__()
        self.pad = ops.Pad(((0, 0), (0, 0), (1, 1), (1, 1)))
        self.pool = nn.MaxPool2d(kernel_size=3, stride=2, pad_mode="valid")

    def construct(self, x):
        return self.pool(self.pad(x))


def onnx_exportable(net: nn.Cell) -> nn.Cell:
    """``net`` with its ResNet stems' padded max pool replaced (in place) by :class:`StemMaxPool`, which MindSpore
    can export to ONNX; the inference output is unchanged (the pool follows a ReLU). Convolutions that the
    ``cpu_gemm_conv`` rewrite computes as im2col + GEMM (an ``Im2Col`` operator ONNX cannot hold) become plain
    ``nn.Conv2d`` again (same Parameters, same outputs)."""
    restore_convolutions(net)
    for _, cell in net.cells_and_names():
        if isinstance(cell, ResNet) and isinstance(cell.maxpool, nn.MaxPool2d):
            cell.maxpool = StemMaxPool()
    return net


class ResNet(nn.Cell):
    """ResNet backbone plus classifier.

    Args:
        block: :class:`BasicBlock` or :class:`Bottleneck`.
        layer_nums: number of blocks in each of the four stages.
        class_num: number of output classes (1001 for MindSpore's ImageNet labels, 1000 for torchvision's).
        base_width: width of the stem and of the first stage (64 in the paper); stage ``i`` has
            ``base_width * 2**i`` channels before expansion.
        zero_init_residual: zero-initialise the last batch norm of each residual block.
        conv_impl: ``"auto"`` (GEMM convolutions on CPU, ``nn.Conv2d`` elsewhere), ``"native"`` or ``"gemm"``;
            see :mod:`model_zoo.resnet.src.conv`.

    Inputs:
        x: ``float32`` images, shape ``(N, 3, H, W)``.

    Outputs:
        logits, shape ``(N, class_num)``.
    """

    def __init__(self, block: Type[nn.Cell], layer_nums: Sequence[int], class_num: int = 1001,
                 base_width: int = 64, zero_init_residual: bool = True, conv_impl: str = "auto"):
        super().__init__()
        _check_positive_int("class_num", class_num)
        _check_positive_int("base_width", base_width)
        conv_impl = resolve_conv_impl(conv_impl)
        self.conv_impl = conv_impl
        if len(layer_nums) != 4 or any(int(n) < 1 for n in layer_nums):
            raise ValueError(f"layer_nums={list(layer_nums)} must be four positive block counts.")
        self.conv1 = _conv(3, base_width, 7, stride=2, conv_impl=conv_impl)
        self.bn1 = _bn(base_width)
        self.relu = nn.ReLU()
        # training keeps MindSpore's padded pool (its backward breaks ties as before); export_for_onnx swaps in
        # StemMaxPool, whose forward is identical after the ReLU
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, pad_mode="pad", padding=1)
        stages = []
        in_channels = base_width
        for index, blocks in enumerate(layer_nums):
            channels = base_width * 2 ** index
            stride = 1 if index == 0 else 2
            cells = []
            for position in range(int(blocks)):
                cells.append(block(in_channels, channels, stride if position == 0 else 1, zero_init_residual,
                                   conv_impl))
                in_channels = channels * block.expansion
            stages.append(nn.SequentialCell(cells))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.mean = ops.ReduceMean(keep_dims=False)
        self.fc = nn.Dense(in_channels, class_num, has_bias=True)
        self.feature_dim = in_channels

    def construct(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = self.mean(x, (2, 3))
        return self.fc(x)


def _check_positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}={value!r} must be an int.")
    if value < 1:
        raise ValueError(f"{name}={value} must be >= 1.")


@register_model
def resnet10(class_num: int = 1001, **kwargs) -> ResNet:
    """ResNet-10: basic blocks (1, 1, 1, 1), the smallest of the family (every stage, shortcut and stride of
    ResNet-18 with one block each); cheap to compile, for smoke runs and CPU tests."""
    return ResNet(BasicBlock, (1, 1, 1, 1), class_num, **kwargs)


@register_model
def resnet18(class_num: int = 1001, **kwargs) -> ResNet:
    """ResNet-18: basic blocks (2, 2, 2, 2)."""
    return ResNet(BasicBlock, (2, 2, 2, 2), class_num, **kwargs)


@register_model
def resnet34(class_num: int = 1001, **kwargs) -> ResNet:
    """ResNet-34: basic blocks (3, 4, 6, 3)."""
    return ResNet(BasicBlock, (3, 4, 6, 3), class_num, **kwargs)


@register_model
def resnet50(class_num: int = 1001, **kwargs) -> ResNet:
    """ResNet-50 v1.5: bottlenecks (3, 4, 6, 3); 54 convolution/dense layers (THOR's ``split_indices=[26, 53]``)."""
    return ResNet(Bottleneck, (3, 4, 6, 3), class_num, **kwargs)


@register_model
def resnet101(class_num: int = 1001, **kwargs) -> ResNet:
    """ResNet-101 v1.5: bottlenecks (3, 4, 23, 3)."""
    return ResNet(Bottleneck, (3, 4, 23, 3), class_num, **kwargs)


@register_model
def resnet152(class_num: int = 1001, **kwargs) -> ResNet:
    """ResNet-152 v1.5: bottlenecks (3, 8, 36, 3)."""
    return ResNet(Bottleneck, (3, 8, 36, 3), class_num, **kwargs)


# ----------------------------------------------------------------------------------------------------------------
# weight initialisation
# ----------------------------------------------------------------------------------------------------------------
def _fans(shape: Sequence[int]) -> tuple:
    """``(fan_in, fan_out)`` of a dense ``(out, in)`` or convolution ``(out, in, kh, kw)`` weight."""
    receptive = int(np.prod(shape[2:])) if len(shape) > 2 else 1
    return shape[1] * receptive, shape[0] * receptive


def _truncated_normal(rng: np.random.Generator, shape: Sequence[int], std: float) -> np.ndarray:
    """Normal(0, std^2) samples conditioned on ``|x| <= 2 std`` (rejected draws are redrawn)."""
    out = rng.normal(0.0, std, size=shape)
    bad = np.abs(out) > 2 * std
    while bad.any():
        out[bad] = rng.normal(0.0, std, size=int(bad.sum()))
        bad = np.abs(out) > 2 * std
    return out


def xavier_uniform(rng: np.random.Generator, shape: Sequence[int]) -> np.ndarray:
    r"""Glorot uniform: :math:`U(-b, b)`, :math:`b = \sqrt{6 / (\text{fan}_{in} + \text{fan}_{out})}`."""
    fan_in, fan_out = _fans(shape)
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-bound, bound, size=shape)


def he_truncated_normal(rng: np.random.Generator, shape: Sequence[int]) -> np.ndarray:
    r"""He/Kaiming for ReLU, fan-out mode: truncated :math:`N(0, \sigma^2)`, :math:`\sigma = \sqrt{2/\text{fan}_{out}}`
    divided by 0.8796 (the standard deviation of a unit normal truncated at two sigma)."""
    _, fan_out = _fans(shape)
    return _truncated_normal(rng, shape, math.sqrt(2.0 / fan_out) / 0.87962566103423978)


def dense_truncated_normal(rng: np.random.Generator, shape: Sequence[int]) -> np.ndarray:
    r"""Classifier init: truncated :math:`N(0, 0.01^2)` (cut at two sigma)."""
    return _truncated_normal(rng, shape, 0.01)


def dense_random_normal(rng: np.random.Generator, shape: Sequence[int]) -> np.ndarray:
    r"""Classifier init: :math:`N(0, 0.01^2)`."""
    return rng.normal(0.0, 0.01, size=shape)


CONV_INITS = {"XavierUniform": xavier_uniform, "TruncatedNormal": he_truncated_normal}
DENSE_INITS = {"TruncatedNormal": dense_truncated_normal, "RandomNormal": dense_random_normal,
               "XavierUniform": xavier_uniform}


def init_weight(net: nn.Cell, conv_init: str = "XavierUniform", dense_init: str = "TruncatedNormal",
                seed: int = 1) -> nn.Cell:
    """Initialise every convolution and dense weight of ``net`` as the recipes ask (biases to zero).

    The model zoo's ImageNet recipes use ``conv_init="XavierUniform"``/``dense_init="TruncatedNormal"``;
    THOR's uses ``"TruncatedNormal"``/``"RandomNormal"``. Draws come from one numpy generator seeded
    with ``seed`` in the network's cell order, so the result depends on ``seed`` only.

    Args:
        net: network to initialise (its parameters are replaced, the cells are not changed).
        conv_init: one of :data:`CONV_INITS`.
        dense_init: one of :data:`DENSE_INITS`.
        seed: seed of the generator.

    Returns:
        ``net``.

    Raises:
        ValueError: unknown ``conv_init`` or ``dense_init``.
    """
    if conv_init not in CONV_INITS:
        raise ValueError(f"conv_init={conv_init!r} is not known; known: {', '.join(CONV_INITS)}.")
    if dense_init not in DENSE_INITS:
        raise ValueError(f"dense_init={dense_init!r} is not known; known: {', '.join(DENSE_INITS)}.")
    rng = np.random.default_rng(seed)
    for _, cell in net.cells_and_names():
        if isinstance(cell, nn.Conv2d):
            sampler = CONV_INITS[conv_init]
        elif isinstance(cell, nn.Dense):
            sampler = DENSE_INITS[dense_init]
        else:
            continue
        weight = cell.weight
        weight.set_data(ms.Tensor(sampler(rng, weight.shape).astype(np.float32), weight.dtype))
        bias = getattr(cell, "bias", None)
        if bias is not None:
            bias.set_data(ms.Tensor(np.zeros(bias.shape, np.float32), bias.dtype))
    return net


def init_group_params(net: nn.Cell, weight_decay: float = 1e-4) -> list:
    """Optimizer parameter groups: weight decay on weights, none on batch-norm scales/shifts and biases.

    Returns:
        ``[{"params": decayed, "weight_decay": weight_decay}, {"params": others}, {"order_params": all}]``.
    """
    decayed, others = [], []
    for param in net.trainable_params():
        leaf = param.name.rsplit(".", 1)[-1]
        (others if leaf in ("beta", "gamma", "bias") else decayed).append(param)
    return [{"params": decayed, "weight_decay": float(weight_decay)}, {"params": others},
            {"order_params": net.trainable_params()}]

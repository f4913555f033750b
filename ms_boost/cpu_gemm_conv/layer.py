"""The in-place swap of ``nn.Conv2d`` layers for their im2col + GEMM form (see the package docstring)."""
from __future__ import annotations

import logging
from typing import Dict, List, Sequence, Tuple

import mindspore as ms
from mindspore import nn
from mindspore.ops.primitive import constexpr

from ms_boost.gemm_conv import conv2d_gemm
from ms_boost.thor import math as thor_math
from ms_boost.thor.convert import register_convertible

__all__ = ["GemmConv2dSwap", "swap_convolutions", "restore_convolutions", "swap_report"]

logger = logging.getLogger("ms_boost")

_conv_pads = constexpr(thor_math.conv_pads)


class GemmConv2dSwap(nn.Conv2d):
    """An ``nn.Conv2d`` whose ``construct`` is :func:`~ms_boost.gemm_conv.conv2d_gemm`.

    Never built directly: :func:`swap_convolutions` turns existing ``nn.Conv2d`` objects into it (their class is
    changed, nothing else), so every Parameter, name and attribute is the original's.
    """

    # MindSpore's amp "O1" rewrite regenerates a cell's source in a new module, where this construct's module helpers
    # (_conv_pads, conv2d_gemm's own) are missing (NameError): ms_boost.model has it call this cell as it is, in
    # float32 (on CPU the GEMM is the fast path in float32 too)
    amp_rewrite_leaf = True

    def construct(self, x):
        """The convolution of ``x`` as im2col + GEMM (same result as ``nn.Conv2d``)."""
        pads = self._gemm_pads if self._gemm_pads is not None else _conv_pads(
            self.pad_mode, self.padding, x.shape[2:], self._gemm_kernel, self._gemm_stride, self._gemm_dilation)
        out = conv2d_gemm(x, self.weight, self._gemm_kernel, self._gemm_stride, pads, self._gemm_dilation,
                          pynative=self._gemm_pynative)
        if self.has_bias:
            out = out + self.bias.reshape(1, -1, 1, 1)
        return out


register_convertible(GemmConv2dSwap, nn.Conv2d)  # THOR converts it as the nn.Conv2d it is


def _pair(value) -> Tuple[int, int]:
    value = tuple(int(v) for v in (value if isinstance(value, (tuple, list)) else (value, value)))
    return (value[0], value[-1]) if len(value) in (2, 4) else (value[0], value[0])


def _why_not(name: str, cell: nn.Cell, skip: Sequence[str]) -> str:
    """Why ``cell`` is left alone ("" when it is swapped)."""
    if name in skip:
        return "named in cpu_gemm_conv.skip"
    if type(cell) is not nn.Conv2d:  # noqa: E721 -- exact type: a subclass may compute something else
        return f"a subclass of nn.Conv2d ({type(cell).__name__})"
    if cell.group != 1:
        return f"group={cell.group}"
    if cell.data_format != "NCHW":
        return f"data_format={cell.data_format!r}"
    return ""


def swap_convolutions(network: nn.Cell, skip: Sequence[str] = ()) -> Dict[str, List]:
    """Turn every swappable ``nn.Conv2d`` of ``network`` into a :class:`GemmConv2dSwap` in place.

    Args:
        network: the network (its cells are changed in place; Parameters are untouched).
        skip: names (as in ``network.cells_and_names()``) of layers to leave alone.

    Returns:
        ``{"swapped": [names], "left": [(name, reason)]}`` (also kept as :func:`swap_report`).
    """
    pynative = ms.get_context("mode") == ms.PYNATIVE_MODE
    swapped, left = [], []
    for name, cell in network.cells_and_names():
        if isinstance(cell, GemmConv2dSwap):
            swapped.append(name)
            continue
        if not isinstance(cell, nn.Conv2d):
            continue
        reason = _why_not(name, cell, skip)
        if reason:
            left.append((name, reason))
            continue
        kernel, stride, dilation = _pair(cell.kernel_size), _pair(cell.stride), _pair(cell.dilation)
        fixed = cell.pad_mode != "same" or (stride == (1, 1) and all((k - 1) * d % 2 == 0
                                                                      for k, d in zip(kernel, dilation)))
        cell._gemm_kernel, cell._gemm_stride, cell._gemm_dilation = kernel, stride, dilation
        # padding known now unless "same" with a stride (it then depends on the input size: computed per call)
        cell._gemm_pads = thor_math.conv_pads(cell.pad_mode, cell.padding, (0, 0), kernel, stride, dilation) \
            if fixed else None
        cell._gemm_pynative = pynative
        cell.__class__ = GemmConv2dSwap
        swapped.append(name)
    report = {"swapped": swapped, "left": left}
    network._cpu_gemm_conv_report = report
    logger.info("cpu_gemm_conv: %d nn.Conv2d layer(s) computed as im2col + GEMM; left as nn.Conv2d: %s",
                len(swapped), _left_text(left))
    return report


def _left_text(left: Sequence[Tuple[str, str]], shown: int = 3) -> str:
    """The layers left alone, grouped by reason, ``shown`` names per reason (all of them: :func:`swap_report`)."""
    by_reason: Dict[str, List[str]] = {}
    for name, reason in left:
        by_reason.setdefault(reason, []).append(name)
    parts = []
    for reason, names in by_reason.items():
        more = f" and {len(names) - shown} more" if len(names) > shown else ""
        parts.append(f"{len(names)} x {reason}: {', '.join(names[:shown])}{more}")
    return "; ".join(parts) + (" (swap_report lists them all)" if len(left) > shown else "") if parts else "none"


def restore_convolutions(network: nn.Cell) -> List[str]:
    """Undo :func:`swap_convolutions`: every :class:`GemmConv2dSwap` of ``network`` is an ``nn.Conv2d`` again."""
    restored = []
    for name, cell in network.cells_and_names():
        if type(cell) is GemmConv2dSwap:  # noqa: E721
            cell.__class__ = nn.Conv2d
            restored.append(name)
    return restored


def swap_report(network: nn.Cell) -> Dict[str, List]:
    """The report of the last :func:`swap_convolutions` on ``network`` (empty lists when none ran)."""
    return getattr(network, "_cpu_gemm_conv_report", {"swapped": [], "left": []})

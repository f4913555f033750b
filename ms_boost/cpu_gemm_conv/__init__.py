"""``cpu_gemm_conv``: the user's ``nn.Conv2d`` layers computed as im2col + GEMM on CPU (a layout rewrite).

On CPU, MindSpore 2.10's ``Conv2D`` runs a slow oneDNN kernel for the plain NCHW layout; the same convolution
as one matrix product (:func:`ms_boost.gemm_conv.conv2d_gemm`) trains ResNet-18 7.4-15.5x faster in Graph mode
(``bench/results/conv.md``). This algorithm gives that to any network built of ``nn.Conv2d``: at O1/O2 on CPU
(or when switched on) every layer of exact type ``nn.Conv2d`` with ``group == 1`` and the NCHW layout becomes a
:class:`GemmConv2dSwap` **in place** -- the same object, the same Parameters, names and checkpoints; only its
``construct`` changes. Pad modes ``pad``, ``valid`` and ``same`` (the padding of ``same`` computed from the input
size like ``Conv2D``, asymmetric included), strides and dilations are handled. Layers it leaves alone (groups,
NHWC, subclasses of ``nn.Conv2d``, names in ``cpu_gemm_conv.skip``) are named in the log line of the rewrite and
in :func:`swap_report`. On other devices the rewrite changes nothing.
"""
from ms_boost.cpu_gemm_conv.layer import GemmConv2dSwap, restore_convolutions, swap_convolutions, swap_report
from ms_boost.cpu_gemm_conv.spec import SPEC, CpuGemmConvConfig

__all__ = ["GemmConv2dSwap", "swap_convolutions", "restore_convolutions", "swap_report", "CpuGemmConvConfig",
           "SPEC"]

r"""THOR layers: Dense, Conv2d and Embedding that capture their Kronecker-factor statistics.

Each layer computes exactly what its MindSpore counterpart computes and, on *capture steps*, also
records the statistics of :mod:`ms_boost.thor.math`:

* in the forward pass, the input factor :math:`A` (dense: inputs; convolution: im2col patches honouring
  pad mode, padding, stride, dilation, groups, non-square kernels; bias as an extra constant-1 input;
  embedding: token frequencies) into ``matrix_a_batch``;
* in the backward pass, through ``ops.InsertGradientOf`` on the pre-activation output, the output factor
  :math:`G` (divided by the loss scale the backward started from) into ``matrix_g_batch``.

These two ``*_batch`` Parameters are scratch buffers: only the THOR optimizer folds them into the
factors (``matrix_a``/``matrix_g`` when a running average is kept, ``factor_decay > 0``) and inverts
them, so a step whose update is skipped (loss-scale overflow) changes nothing that persists.

Whether a step captures is the boolean Parameter ``thor_capture`` of each layer, written by the
optimizer at the end of every step (True before every ``frequency``-th step), so the statistics cost
nothing on the other steps. Nothing is captured when the layer is not in training mode.

The capture code sits in two small child cells (an ``InsertGradientOf`` body must be a Cell to hold
control flow and Parameters in Graph mode); both only read the layer's Parameters.
"""
from __future__ import annotations

from typing import Tuple, Union

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common.initializer import initializer
from mindspore.nn.layer.activation import get_activation
from mindspore.ops.primitive import constexpr

from ms_boost.gemm_conv import conv2d_gemm
from ms_boost.thor.assignment import DEFAULT_BLOCK_SIZE, factor_shape
from ms_boost.thor.math import (
    append_ones,
    block_input_factor,
    block_output_factor,
    conv_pads,
    im2col,
    last_replaced,
    leading_one,
    leading_samples,
    split_groups,
    stat_sample_count,
    token_frequencies,
)

__all__ = ["CaptureGate", "DenseThor", "Conv2dThor", "EmbeddingThor", "ThorLayer"]

_stat_count = constexpr(stat_sample_count)


@constexpr
def _conv_pads(pad_mode, padding, shape: tuple, kernel_size, stride, dilation) -> tuple:
    """:func:`~ms_boost.thor.math.conv_pads` for an ``(N, C, H, W)`` input of static ``shape``."""
    return conv_pads(pad_mode, padding, tuple(shape[2:]), kernel_size, stride, dilation)


def _pair(value, name: str, cls: str) -> tuple:
    """An int or a pair of positive ints -> a pair (kernel size, stride, dilation)."""
    pair = (value, value) if isinstance(value, int) and not isinstance(value, bool) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in pair):
        raise ValueError(f"{cls}: {name}={value!r} must be a positive int or a pair of positive ints.")
    return pair


def _positive_int(value, name: str, cls: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{cls}: {name}={value!r} must be a positive int.")
    return value


def _check_decay(value, cls: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"{cls}: factor_decay={value!r} must be a float in [0, 1).")
    return float(value)


def _zeros(shape) -> Tensor:
    return Tensor(np.zeros(shape, np.float32))


class CaptureGate:
    """Host-side view of a set of capture flags, read once per step in PyNative mode.

    In PyNative mode ``if flag:`` on a device Parameter waits for every operation queued before it, so
    testing each layer's flag would stall the step once per layer and direction. The THOR optimizer
    owns one gate over its layers' flags: the first capture cell asking in a step reads all the flags
    (one wait, at the start of the forward pass where little is queued) and the others reuse those
    values; the optimizer clears them after each of its steps (the only writer of the flags during
    training), :meth:`clear` is also called by ``THOR.request_capture``. Flags changed between steps
    (``set_data``, a loaded checkpoint) are read afresh whenever the gate was cleared by a step.
    Graph mode never uses the gate: there the capture cells test their flag on the device.

    Args:
        flags: the capture flag Parameters.
    """

    def __init__(self, flags):
        self.flags = tuple(flags)
        self.values = None

    def clear(self) -> None:
        """Forget the cached values (the flags may have changed on the device)."""
        self.values = None

    def is_on(self, flag) -> bool:
        """The host value of ``flag`` (one of :attr:`flags`) for the current step."""
        if self.values is None:
            self.values = {id(f): bool(f.asnumpy()) for f in self.flags}
        value = self.values.get(id(flag))
        return bool(flag.asnumpy()) if value is None else value


def _pynative() -> bool:
    return ms.get_context("mode") == ms.PYNATIVE_MODE


def _input_statistic(spec: tuple, x):
    """The input factor statistic of a layer described by ``spec`` (:attr:`ThorLayer.capture_spec`).

    Stored as :func:`~ms_boost.thor.assignment.factor_shape` says: whole, or only its diagonal blocks. Computed on
    the first samples the spec's statistics fraction (its last entry) keeps, except an embedding's token frequencies
    (always the whole batch: see :class:`EmbeddingThor`).
    """
    kind, block, fraction = spec[0], spec[-2], spec[-1]
    if kind == "embedding":
        return token_frequencies(x, spec[1])
    x = leading_samples(x, _stat_count(x.shape[0], fraction))
    if kind == "dense":
        rows = ops.cast(x.reshape(-1, x.shape[-1]), ms.float32)  # ops.cast: compiles faster than astype
        if spec[1]:
            rows = append_ones(rows)
        return block_input_factor(rows.reshape(leading_one(rows.shape)), block)
    _, pad_mode, padding, kernel_size, stride, dilation, group, bias, _, _ = spec  # conv
    pads = _conv_pads(pad_mode, padding, x.shape, kernel_size, stride, dilation)
    rows = im2col(ops.cast(x, ms.float32), kernel_size, stride, dilation, pads)
    rows = split_groups(rows, group)
    if bias:
        rows = append_ones(rows)
    return block_input_factor(rows, block)


def _output_statistic(spec: tuple, dout, loss_scale):
    """The output-gradient factor statistic of a layer described by ``spec`` (:attr:`ThorLayer.capture_spec`).

    On the first samples the spec's statistics fraction keeps, normalised as :func:`block_output_factor` says.
    """
    n_samples = dout.shape[0]
    count = _stat_count(n_samples, spec[-1])
    dout = leading_samples(dout, count)
    if spec[0] == "conv":
        rows = dout.transpose(0, 2, 3, 1).reshape(-1, dout.shape[1])
        return block_output_factor(split_groups(rows, spec[6]), n_samples, loss_scale, spec[-2], count)
    rows = dout.reshape(1, -1, dout.shape[-1])  # dense, embedding
    return block_output_factor(rows, n_samples, loss_scale, spec[-2], count)


# PyNative capture statistics, compiled once per (spec, dtype, input shapes) and shared by every layer and
# network of the process. No Parameter is an argument: MindSpore 2.10 compiles a function again for every new
# Parameter object it is given, so the scratch buffer is assigned outside (one more operation per capture).
# Before, a compiled method per capture cell compiled once per layer instance (26 compiles for a ResNet-10)
# and again for every new network.
@ms.jit
def _input_statistic_compiled(spec, dtype, x):
    """:math:`A(x)` cast to ``dtype`` (under amp O2/O3 the statistic of a float16 input is float16)."""
    return ops.cast(_input_statistic(spec, ops.stop_gradient(x)), dtype)


@ms.jit
def _output_statistic_compiled(spec, dtype, dout, loss_scale):
    """:math:`G` of ``dout`` divided by ``loss_scale``, cast to ``dtype``."""
    return ops.cast(_output_statistic(spec, dout, loss_scale), dtype)


def _write_input_statistic(spec, scratch, x):
    return ops.assign(scratch, _input_statistic_compiled(spec, scratch.dtype, x))


def _write_output_statistic(spec, scratch, dout, loss_scale):
    return ops.assign(scratch, _output_statistic_compiled(spec, scratch.dtype, dout, loss_scale))


class _CaptureCell(nn.Cell):
    """Base of the two capture cells.

    In PyNative mode with a :class:`CaptureGate` they run as plain Python (the flag from the gate, no
    device-side branch); otherwise as an ordinary Cell (Graph mode: the flag is tested on the device inside the
    compiled step, unless :attr:`static` fixes it while a step variant is compiled).

    Attributes:
        static: None: test the flag on the device; True / False: always / never capture (a compile-time
            constant, set by :class:`~ms_boost.thor.variants.ThorStepVariants` while it compiles a step variant).
    """

    def __init__(self, layer: ThorLayer):
        super().__init__(auto_prefix=False)
        self.flag = layer.thor_capture
        self.gate = None
        self.static = None

    def __call__(self, *args, **kwargs):
        if self.gate is not None and _pynative():
            if self.gate.is_on(self.flag):
                self.capture(*args)
            return args[0]
        return super().__call__(*args, **kwargs)

    def capture(self, *args):
        raise NotImplementedError


class _InputCapture(_CaptureCell):
    """Forward identity that, on capture steps, writes the layer's input statistic into its scratch buffer.

    Args:
        layer: the owning THOR layer; its ``input_statistic(x)`` gives the statistic.
    """

    def __init__(self, layer: ThorLayer):
        super().__init__(layer)
        self.scratch = layer.matrix_a_batch
        self.statistic = layer.input_statistic
        self.spec = layer.capture_spec

    def capture(self, x):
        _write_input_statistic(self.spec, self.scratch, x)

    def construct(self, x):
        # the statistic of x with its gradient stopped: only the scratch buffer reads it, and without the stop the
        # train step's autodiff expands the backward of every capture's im2col and products (compiled, then found
        # unused); measured: the capturing variant compiles faster and its step runs faster (docs/thor.md)
        if self.static is None:
            if self.flag:
                ops.assign(self.scratch, self.statistic(ops.stop_gradient(x)))
        elif self.static:  # no branch to keep the write: tie it to the output
            x = ops.depend(x, ops.assign(self.scratch, self.statistic(ops.stop_gradient(x))))
        return x


class _OutputGradientCapture(_CaptureCell):
    """``InsertGradientOf`` body: on capture steps writes the output-gradient factor into the scratch buffer.

    The gradient passes through unchanged. ``loss_scale`` is a scalar Tensor or a Parameter (bound by the
    optimizer, see :meth:`ThorLayer.bind_loss_scale`) read during the backward pass, i.e. before any loss
    scale manager updates it for the next step.

    This body tests the layer's flag (on the device in Graph mode, through the gate in PyNative mode). The capturing
    step variant hooks :class:`_OutputGradientWrite` instead: a hook body does not follow :attr:`static` (MindSpore
    2.10 kept the flag-tested branch in the variant's graph after ``static`` was set: found by making the static
    branch write something else, which never showed), so the variant needs a body that has no branch at all.
    """

    def __init__(self, layer: ThorLayer):
        super().__init__(layer)
        self.scratch = layer.matrix_g_batch
        self.statistic = layer.output_statistic
        self.spec = layer.capture_spec
        self.loss_scale = Tensor(1.0, ms.float32)

    def capture(self, dout):
        _write_output_statistic(self.spec, self.scratch, dout, self.loss_scale)

    def construct(self, dout):
        if self.flag:
            ops.assign(self.scratch, self.statistic(dout, self.loss_scale))
        return dout


class _OutputGradientWrite(nn.Cell):
    """``InsertGradientOf`` body of the capturing step variant: writes the output-gradient factor, no branch.

    Shares the layer's scratch buffer and loss scale with :class:`_OutputGradientCapture` (see there why the variant
    needs its own body).
    """

    def __init__(self, layer: ThorLayer):
        super().__init__(auto_prefix=False)
        self.scratch = layer.matrix_g_batch
        self.statistic = layer.output_statistic
        self.loss_scale = Tensor(1.0, ms.float32)

    def construct(self, dout):
        return ops.depend(dout, ops.assign(self.scratch, self.statistic(dout, self.loss_scale)))


class ThorLayer(nn.Cell):
    """Base of the THOR layers: capture flag, scratch buffers, factors and the two capture cells.

    Attributes read by the optimizer (static once the optimizer set the layout, :meth:`set_factor_layout`):
        kind: ``"kronecker"`` (dense, convolution) or ``"embedding"`` (diagonal input factor).
        groups: number of independent channel groups (factors are stacked along axis 0).
        a_shape, g_shape: stored shapes of the input and output factors: ``(groups, d, d)``, only the diagonal
            blocks ``(groups, n_b, b, b)`` of a factor wider than the block size, or ``(vocab,)``.
        a_dim, g_dim: the dimensions of the factors (A's without the bias column when ``a_bias`` is False).
        block_size: the largest diagonal block the factors are captured for.
        bias_in_factor: the layer has a bias, which A can hold as the constant-1 column (last row/column).
        a_bias: A is captured with that column (False when the optimizer does not train the bias).
        factor_decay: running-average decay of the factors (0: use each capture as is).
        stat_fraction: the statistics use the first ``ceil(stat_fraction * N)`` samples of a batch of ``N``
            (:meth:`set_stat_fraction`; 1: all of them).
        capture_spec: static tuple describing the statistics (kind and the shape-relevant settings, then the block
            size and the statistics fraction), the key of the compiled PyNative capture writers shared by all layers
            alike.
    """

    kind = "kronecker"
    # MindSpore's amp "O1" rewrite regenerates a cell's source in a new module, without the helpers of this module
    # (NameError '_write_input_statistic'): ms_boost.model has it call THOR layers as they are
    amp_rewrite_leaf = True

    def _init_thor(self, a_dim: int, g_dim: int, groups: int, bias_in_factor: bool, factor_decay: float) -> None:
        """THOR state of a layer; its factors take the default layout until the optimizer sets its own.

        ``a_dim`` is the width of A with the bias column (an embedding: its vocabulary), ``g_dim`` that of G.
        """
        self.groups = groups
        self.a_full_dim = a_dim
        self.g_dim = g_dim
        self.bias_in_factor = bias_in_factor
        self.factor_decay = _check_decay(factor_decay, self.cls_name)
        self.stat_fraction = 1.0
        self._set_layout(DEFAULT_BLOCK_SIZE, bias_in_factor)
        a_shape, g_shape = self.a_shape, self.g_shape
        self.thor_capture = Parameter(Tensor(True, ms.bool_), name="thor_capture", requires_grad=False)
        self.matrix_a_batch = Parameter(_zeros(a_shape), name="matrix_a_batch", requires_grad=False)
        self.matrix_g_batch = Parameter(_zeros(g_shape), name="matrix_g_batch", requires_grad=False)
        if self.factor_decay > 0.0:
            self.matrix_a = Parameter(_zeros(a_shape), name="matrix_a", requires_grad=False)
            self.matrix_g = Parameter(_zeros(g_shape), name="matrix_g", requires_grad=False)
        # insert_child_to_cell: children must not rename the Parameters they share with this layer
        # False only while the plain step variant compiles: then no capture cell or gradient hook is in the graph
        self.capturing = True
        self.insert_child_to_cell("a_capture", _InputCapture(self))
        self.insert_child_to_cell("g_capture", _OutputGradientCapture(self))
        self.g_hook = ops.InsertGradientOf(self.g_capture)
        self.insert_child_to_cell("g_write", _OutputGradientWrite(self))
        self.g_hook_always = ops.InsertGradientOf(self.g_write)

    def _spec(self, a_bias: bool, block_size: int) -> tuple:
        """The layer's :attr:`capture_spec` for this layout (each layer class says its own)."""
        raise NotImplementedError

    def _a_dim(self, a_bias: bool) -> int:
        """The dimension of A as captured: without the bias column unless ``a_bias`` (an embedding: its vocabulary)."""
        if self.kind == "embedding":
            return self.a_full_dim
        return self.a_full_dim - int(self.bias_in_factor and not a_bias)

    def _set_layout(self, block_size: int, a_bias: bool) -> None:
        """Set the layout attributes for ``block_size`` and ``a_bias``; the buffers follow in :meth:`set_factor_layout`.

        ``block_size``, ``a_bias``, ``a_dim``, ``a_shape``, ``g_shape`` and ``capture_spec``.
        """
        self.block_size = block_size
        self.a_bias = bool(a_bias)
        self.a_dim = self._a_dim(a_bias)
        a_shape: Tuple[int, ...]
        if self.kind == "embedding":
            a_shape = (self.a_full_dim,)
        else:
            a_shape = factor_shape(self.groups, self.a_dim, block_size)
        self.a_shape, self.g_shape = a_shape, factor_shape(self.groups, self.g_dim, block_size)
        self.capture_spec = self._spec(a_bias, block_size) + (self.stat_fraction,)

    def set_factor_layout(self, block_size: int, a_bias: bool) -> None:
        """Capture the factors as the THOR optimizer inverts them (it calls this before anything is compiled).

        A factor wider than ``block_size`` is captured as its diagonal blocks only
        (:func:`~ms_boost.thor.assignment.factor_shape`), the only part the block-diagonal inverse uses; ``a_bias``
        False leaves the constant-1 bias column out of A (a bias that is not trained with the weight). The scratch
        buffers and running averages take the new shape (zeroed) when it changes.

        Args:
            block_size: largest diagonal block (``thor(..., block_size=)``).
            a_bias: A holds the bias column; only for a layer with a bias in its factor.
        """
        if a_bias and not self.bias_in_factor:
            raise ValueError(f"{self.cls_name}.set_factor_layout: a_bias=True but the layer has no bias in its "
                             "input factor.")
        self._set_layout(block_size, a_bias)
        self.a_capture.spec = self.capture_spec
        self.g_capture.spec = self.capture_spec
        for name, shape in (("matrix_a_batch", self.a_shape), ("matrix_g_batch", self.g_shape),
                            ("matrix_a", self.a_shape), ("matrix_g", self.g_shape)):
            param = getattr(self, name, None)
            if param is not None and tuple(param.shape) != tuple(shape):
                param.set_data(_zeros(shape))

    def set_stat_fraction(self, fraction: float) -> None:
        """Compute the factor statistics on the first ``ceil(fraction * N)`` samples of each batch of ``N``.

        The THOR optimizer sets it (``thor(..., stat_fraction=)``, checked there) before anything is compiled; 1
        (the default) is the whole batch. An embedding's token frequencies always use the whole batch.
        """
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 < fraction <= 1.0:
            raise ValueError(f"{self.cls_name}.set_stat_fraction: fraction={fraction!r} must be a float in (0, 1].")
        self.stat_fraction = float(fraction)
        self.capture_spec = self.capture_spec[:-1] + (self.stat_fraction,)
        self.a_capture.spec = self.capture_spec
        self.g_capture.spec = self.capture_spec

    def thor_parameters(self) -> dict:
        """The THOR state Parameters of this layer by local name (capture flag, scratch, factors)."""
        names = ["thor_capture", "matrix_a_batch", "matrix_g_batch"]
        if self.factor_decay > 0.0:
            names += ["matrix_a", "matrix_g"]
        return {name: getattr(self, name) for name in names}

    def bind_loss_scale(self, loss_scale) -> None:
        """Read the loss scale that divides the captured output gradients from ``loss_scale`` (Tensor or Parameter)."""
        if not isinstance(loss_scale, Tensor):
            raise TypeError(f"{self.cls_name}.bind_loss_scale: loss_scale must be a Tensor or Parameter, "
                            f"got {type(loss_scale).__name__}.")
        self.g_capture.loss_scale = loss_scale
        self.g_write.loss_scale = loss_scale

    def set_capture_gate(self, gate) -> None:
        """Let PyNative steps read this layer's capture flag through ``gate``.

        ``gate`` is a :class:`CaptureGate` holding :attr:`thor_capture`; None: test the flag on every call. The
        THOR optimizer sets it.
        """
        if gate is not None and not any(f is self.thor_capture for f in gate.flags):
            raise ValueError(f"{self.cls_name}.set_capture_gate: the gate does not hold this layer's thor_capture.")
        self.a_capture.gate = gate
        self.g_capture.gate = gate

    def set_static_capture(self, value) -> None:
        """Compile this layer's capture as always (True), never (False) or flag-tested on the device (None).

        Never: the capture cells and the output-gradient hook are left out of the graph altogether.
        """
        # plain attributes, set around every Graph-mode step: written past Cell.__setattr__ (which ends in the same
        # object.__setattr__ for a bool or None after testing for Parameters, Cells and buffers)
        object.__setattr__(self, "capturing", value is not False)
        object.__setattr__(self.a_capture, "static", value)
        object.__setattr__(self.g_capture, "static", value)

    def hook_output(self, y):
        """``y`` with the output-gradient capture hooked on: flag-tested, or unconditional in the capturing variant."""
        if self.g_capture.static:
            return self.g_hook_always(y)
        return self.g_hook(y)

    def input_statistic(self, x):
        """The input factor statistic :math:`A` of one batch (see the layer's formula)."""
        return _input_statistic(self.capture_spec, x)

    def output_statistic(self, dout, loss_scale):
        """The output-gradient factor statistic :math:`G` of one batch, divided by ``loss_scale``."""
        return _output_statistic(self.capture_spec, dout, loss_scale)


class DenseThor(ThorLayer):
    r"""Dense layer :math:`y = \mathrm{act}(x W^{\top} + b)` that captures THOR's factors.

    :math:`A = \frac{1}{R}\sum_r \tilde x_r \tilde x_r^{\top}` over the :math:`R` input rows (all leading
    axes flattened, :math:`\tilde x = [x; 1]` with a bias), :math:`G = N \sum_r \delta_r\delta_r^{\top}`
    over the pre-activation output gradients, :math:`N` the size of the first axis.

    Args:
        in_channels, out_channels: sizes of the input and output features.
        weight_init, bias_init: initializers (or Tensors) of the ``(out, in)`` weight and ``(out,)`` bias.
        has_bias: add a bias.
        activation: activation name, Cell or Primitive applied after the capture point (or None).
        factor_decay: running-average decay of the factors in [0, 1); 0 keeps the latest capture only.
    """

    def __init__(self, in_channels: int, out_channels: int, weight_init="normal", bias_init="zeros",
                 has_bias: bool = True, activation=None, *, factor_decay: float = 0.0):
        super().__init__()
        cls = self.cls_name
        self.in_channels = _positive_int(in_channels, "in_channels", cls)
        self.out_channels = _positive_int(out_channels, "out_channels", cls)
        if not isinstance(has_bias, bool):
            raise TypeError(f"{cls}: has_bias={has_bias!r} must be a bool.")
        self.has_bias = has_bias
        if isinstance(weight_init, Tensor) and tuple(weight_init.shape) != (out_channels, in_channels):
            raise ValueError(f"{cls}: weight_init shape {tuple(weight_init.shape)} must be "
                             f"(out_channels, in_channels) = {(out_channels, in_channels)}.")
        self.weight = Parameter(initializer(weight_init, [out_channels, in_channels]), name="weight")
        self.bias = None
        if has_bias:
            if isinstance(bias_init, Tensor) and tuple(bias_init.shape) != (out_channels,):
                raise ValueError(f"{cls}: bias_init shape {tuple(bias_init.shape)} must be ({out_channels},).")
            self.bias = Parameter(initializer(bias_init, [out_channels]), name="bias")
        self.bias_add = ops.BiasAdd()
        self.matmul = ops.MatMul(transpose_b=True)
        self.activation = get_activation(activation) if isinstance(activation, str) else activation
        if activation is not None and not isinstance(self.activation, (nn.Cell, ops.Primitive)):
            raise TypeError(f"{cls}: activation={activation!r} must be a name, a Cell or a Primitive.")
        self.activation_flag = self.activation is not None
        self._init_thor(in_channels + int(has_bias), out_channels, 1, has_bias, factor_decay)

    def _spec(self, a_bias: bool, block_size: int) -> tuple:
        return ("dense", a_bias, block_size)

    def construct(self, x):
        """The layer's output; in training, with its capture on, it records A (forward) and G (backward)."""
        if self.training and self.capturing:
            x = self.a_capture(x)
        x_shape = x.shape
        if len(x_shape) != 2:
            x = x.reshape(-1, x_shape[-1])
        y = self.matmul(x, self.weight)
        if self.has_bias:
            y = self.bias_add(y, self.bias)
        if len(x_shape) != 2:
            y = y.reshape(last_replaced(x_shape, self.out_channels))
        if self.training and self.capturing:
            y = self.hook_output(y)
        if self.activation_flag:
            y = self.activation(y)
        return y

    def extend_repr(self):
        """The layer's settings, as ``print(layer)`` shows them."""
        return (f"input_channels={self.in_channels}, output_channels={self.out_channels}, "
                f"has_bias={self.has_bias}, activation={self.activation}, factor_decay={self.factor_decay}")


class Conv2dThor(ThorLayer):
    r"""2-D convolution (NCHW) that captures THOR's factors.

    :math:`A = \frac{1}{N T}\sum_{n,t} \tilde a_{n,t}\tilde a_{n,t}^{\top}` over the im2col patches of every
    sample :math:`n` and output position :math:`t` (padding exactly as the convolution pads, stride,
    dilation and non-square kernels honoured, constant 1 appended with a bias), one factor per channel
    group; :math:`G = N \sum_{n,t} \delta_{n,t}\delta_{n,t}^{\top}` per group.

    On CPU a group-1 convolution with pad mode ``"pad"`` (symmetric) or ``"valid"`` (any dilation) is computed as
    im2col + matrix product (:func:`ms_boost.gemm_conv.conv2d_gemm`; attribute ``gemm``); ``"same"``, asymmetric
    padding, groups and other devices use ``ops.Conv2D``.

    Args:
        in_channels, out_channels, kernel_size, stride, pad_mode, padding, dilation, group, has_bias,
            weight_init, bias_init: as :class:`mindspore.nn.Conv2d`.
        factor_decay: running-average decay of the factors in [0, 1).
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, pad_mode: str = "same",
                 padding=0, dilation=1, group: int = 1, has_bias: bool = False, weight_init="normal",
                 bias_init="zeros", *, factor_decay: float = 0.0):
        super().__init__()
        cls = self.cls_name
        self.in_channels = _positive_int(in_channels, "in_channels", cls)
        self.out_channels = _positive_int(out_channels, "out_channels", cls)
        self.kernel_size = _pair(kernel_size, "kernel_size", cls)
        self.stride = _pair(stride, "stride", cls)
        self.dilation = _pair(dilation, "dilation", cls)
        self.group = _positive_int(group, "group", cls)
        if in_channels % group or out_channels % group:
            raise ValueError(f"{cls}: group={group} must divide in_channels={in_channels} and "
                             f"out_channels={out_channels}.")
        if not isinstance(pad_mode, str) or pad_mode.lower() not in ("same", "valid", "pad"):
            raise ValueError(f"{cls}: pad_mode={pad_mode!r} must be one of 'same', 'valid', 'pad'.")
        self.pad_mode = pad_mode.lower()
        self.padding: Union[int, Tuple[int, ...]]
        if isinstance(padding, int) and not isinstance(padding, bool) and padding >= 0:
            self.padding = padding
        elif isinstance(padding, tuple) and len(padding) == 4 and all(
                isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in padding):
            self.padding = padding
        else:
            raise ValueError(f"{cls}: padding={padding!r} must be a non-negative int or a 4-tuple of them.")
        if self.pad_mode != "pad" and padding not in (0, (0, 0, 0, 0)):
            raise ValueError(f"{cls}: padding={padding!r} must be 0 when pad_mode={pad_mode!r}.")
        if not isinstance(has_bias, bool):
            raise TypeError(f"{cls}: has_bias={has_bias!r} must be a bool.")
        self.has_bias = has_bias
        shape = [out_channels, in_channels // group, *self.kernel_size]
        if isinstance(weight_init, Tensor) and list(weight_init.shape) != shape:
            raise ValueError(f"{cls}: weight_init shape {tuple(weight_init.shape)} must be {tuple(shape)}.")
        self.weight = Parameter(initializer(weight_init, shape), name="weight")
        self.bias = None
        if has_bias:
            self.bias = Parameter(initializer(bias_init, [out_channels]), name="bias")
        self.conv2d = ops.Conv2D(out_channel=out_channels, kernel_size=self.kernel_size, mode=1,
                                 pad_mode=self.pad_mode, pad=self.padding, stride=self.stride,
                                 dilation=self.dilation, group=group)
        self.bias_add = ops.BiasAdd()
        # On CPU the convolution runs as im2col + GEMM (ms_boost.gemm_conv): MindSpore's CPU Conv2D is oneDNN's
        # slow plain-layout kernel. A Python constant, so Graph mode compiles only the chosen branch. Only with
        # symmetric explicit padding: with pad_mode "same" (and asymmetric pads, an explicit Pad before Im2Col) a
        # Graph-mode dataset-sink run hung in a CPU kernel (tests/test_thor_model.py), so those keep Conv2D.
        self._pads = None if self.pad_mode == "same" else conv_pads(
            self.pad_mode, self.padding, (0, 0), self.kernel_size, self.stride, self.dilation)
        symmetric = self._pads is not None and self._pads[0] == self._pads[1] and self._pads[2] == self._pads[3]
        self.gemm = ms.get_context("device_target") == "CPU" and group == 1 and symmetric
        self._pynative_mode = _pynative()
        a_dim = in_channels // group * self.kernel_size[0] * self.kernel_size[1] + int(has_bias)
        self._init_thor(a_dim, out_channels // group, group, has_bias, factor_decay)

    def _spec(self, a_bias: bool, block_size: int) -> tuple:
        return ("conv", self.pad_mode, self.padding, self.kernel_size, self.stride, self.dilation, self.group, a_bias,
                block_size)

    def construct(self, x):
        """The layer's output; in training, with its capture on, it records A (forward) and G (backward)."""
        if self.training and self.capturing:
            x = self.a_capture(x)
        if self.gemm:
            y = conv2d_gemm(x, self.weight, self.kernel_size, self.stride, self._pads, self.dilation,
                            self._pynative_mode)
        else:
            y = self.conv2d(x, self.weight)
        if self.has_bias:
            y = self.bias_add(y, self.bias)
        if self.training and self.capturing:
            y = self.hook_output(y)
        return y

    def extend_repr(self):
        """The layer's settings, as ``print(layer)`` shows them."""
        return (f"input_channels={self.in_channels}, output_channels={self.out_channels}, "
                f"kernel_size={self.kernel_size}, stride={self.stride}, pad_mode={self.pad_mode}, "
                f"padding={self.padding}, dilation={self.dilation}, group={self.group}, has_bias={self.has_bias}, "
                f"factor_decay={self.factor_decay}")


class EmbeddingThor(ThorLayer):
    r"""Embedding lookup that captures THOR's factors.

    The lookup is a dense layer on one-hot inputs, so its input factor is diagonal: the token frequencies
    :math:`A_{vv} = \#\{t: \mathrm{id}_t = v\}/T` over the :math:`T` ids of the batch, stored as a
    ``(vocab_size,)`` vector; :math:`G = N \sum_t \delta_t\delta_t^{\top}` over the looked-up vectors'
    gradients, :math:`N` the size of the first axis of the ids.

    With a statistics fraction below 1 (:meth:`~ThorLayer.set_stat_fraction`) only :math:`G` is computed on the first
    samples (the ids' first axis); the token frequencies always count the whole batch: they cost one segment sum, and
    a token the batch's gradient touches but a sub-batch missed would get :math:`A_{vv} = 0`, i.e. its gradient row
    multiplied by :math:`1/\sqrt\lambda`.

    Args:
        vocab_size, embedding_size, use_one_hot, embedding_table, dtype, padding_idx: as
            :class:`mindspore.nn.Embedding` (``padding_idx`` zeroes that row of the initial table).
        factor_decay: running-average decay of the factors in [0, 1).
    """

    kind = "embedding"

    def __init__(self, vocab_size: int, embedding_size: int, use_one_hot: bool = False, embedding_table="normal",
                 dtype=ms.float32, padding_idx=None, *, factor_decay: float = 0.0):
        super().__init__()
        cls = self.cls_name
        self.vocab_size = _positive_int(vocab_size, "vocab_size", cls)
        self.embedding_size = _positive_int(embedding_size, "embedding_size", cls)
        if not isinstance(use_one_hot, bool):
            raise TypeError(f"{cls}: use_one_hot={use_one_hot!r} must be a bool.")
        self.use_one_hot = use_one_hot
        self.dtype = dtype
        self.padding_idx = padding_idx
        table = initializer(embedding_table, [vocab_size, embedding_size])
        if padding_idx is not None:
            if not isinstance(padding_idx, int) or not 0 <= padding_idx < vocab_size:
                raise ValueError(f"{cls}: padding_idx={padding_idx!r} must be an int in [0, {vocab_size}).")
            values = table.init_data().asnumpy() if isinstance(table, Tensor) else np.asarray(table)
            values = values.copy()
            values[padding_idx] = 0
            table = Tensor(values)
        self.embedding_table = Parameter(table, name="embedding_table")
        self.gather = ops.Gather()
        self.one_hot = ops.OneHot()
        self.on_value = Tensor(1.0, dtype)
        self.off_value = Tensor(0.0, dtype)
        self._init_thor(vocab_size, embedding_size, 1, False, factor_decay)

    def _spec(self, a_bias: bool, block_size: int) -> tuple:
        return ("embedding", self.vocab_size, block_size)

    def construct(self, ids):
        """The embedding lookup; in training, with its capture on, it records A (forward) and G (backward)."""
        if self.training and self.capturing:
            ids = self.a_capture(ids)
        out_shape = ids.shape + (self.embedding_size,)
        flat = ids.reshape(-1)
        if self.use_one_hot:
            rows = ops.matmul(self.one_hot(flat, self.vocab_size, self.on_value, self.off_value), self.embedding_table)
        else:
            rows = self.gather(self.embedding_table, flat, 0)
        out = rows.reshape(out_shape)
        if self.training and self.capturing:
            out = self.hook_output(out)
        return out

    def extend_repr(self):
        """The layer's settings, as ``print(layer)`` shows them."""
        return (f"vocab_size={self.vocab_size}, embedding_size={self.embedding_size}, "
                f"use_one_hot={self.use_one_hot}, padding_idx={self.padding_idx}, factor_decay={self.factor_decay}")


def thor_state_parameters(network: nn.Cell) -> list:
    """THOR bookkeeping Parameters of ``network``'s THOR layers (capture flags, scratch statistics, factors).

    They are not model buffers: a skipped (overflow) step may leave new statistics in the scratch buffers
    without effect, so they need no snapshot/restore.
    """
    found, seen = [], set()
    for _, cell in network.cells_and_names():
        if isinstance(cell, ThorLayer):
            for param in cell.thor_parameters().values():
                if id(param) not in seen:
                    seen.add(id(param))
                    found.append(param)
    return found

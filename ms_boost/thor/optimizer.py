r"""THOR optimizer: K-FAC preconditioned momentum with factors refreshed every ``frequency`` steps.

One step, given the gradients of the trainable parameters (unscaled by ``loss_scale`` first, as every
MindSpore optimizer does):

1. *Refresh* (the first step, then every ``frequency``-th step; the layers captured statistics in this
   step's forward/backward): fold each layer's scratch statistics into its factors (optionally a running
   average), mean-all-reduce the factors across data-parallel ranks (fused in the groups of
   ``split_indices``), invert :math:`A + \sqrt\lambda I` and :math:`G + \sqrt\lambda I` block-wise through
   Cholesky -- each factor on one rank, chosen to balance the work, then broadcast from it (as KAISA does)
   -- and store the inverses. Other steps reuse the stored inverses.
2. *Precondition* every THOR layer's gradient, weight and bias together:
   :math:`[\nabla W | \nabla b] \leftarrow G^{-1} [\nabla W | \nabla b] A^{-1}` (embeddings:
   :math:`A^{-1}\nabla E\, G^{-1}` with a diagonal :math:`A`); other parameters (BatchNorm, LayerNorm, ...)
   keep their gradient.
3. Weight decay :math:`g \leftarrow g + \mu w` on the parameters ``decay_filter`` selects, optional
   per-tensor clipping to norm 1, then momentum (or Nesterov): :math:`v \leftarrow m v + g`,
   :math:`w \leftarrow w - \eta v` (Nesterov: :math:`w \leftarrow w - \eta (g + m v)`).
4. The step counter advances and every layer's ``thor_capture`` flag is set for the next step.

Every piece of state is a Parameter (inverses, moments, step, flags), so it is saved in checkpoints,
and everything happens inside ``construct``: Graph or PyNative, with or without dataset sink. A step
whose update is skipped (loss-scale overflow: the optimizer is not called) changes nothing persistent.

The optimizer receives gradients already averaged across ranks; because the factors are averaged too
and every inverse comes from one rank, all ranks apply bit-identical updates.
"""
from __future__ import annotations

import logging
import numbers
import warnings
import weakref
from typing import Callable, Optional, Tuple

import mindspore as ms
import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops
from mindspore import log as logger
from mindspore.nn.learning_rate_schedule import LearningRateSchedule

from ms_boost import comm
from ms_boost.flat_buffers import flatten_tensors
from ms_boost.thor import kernels
from ms_boost.thor import math as thor_math
from ms_boost.thor.assignment import DEFAULT_BLOCK_SIZE, LayerFactors, inverse_layout, plan_inversions
from ms_boost.thor.guard import ThorGuard, ThorNonFiniteError
from ms_boost.thor.layers import CaptureGate, ThorLayer, thor_state_parameters
from ms_boost.thor.rules import check as _rule
from ms_boost.thor.variants import ThorStepVariants
from ms_boost.topology import Topology
from ms_boost.validation import check_bool, check_int

_log = logging.getLogger("ms_boost")
_REDUCE_ANY = ops.ReduceAny(keep_dims=False)
_REDUCE_MIN = ops.ReduceMin(keep_dims=False)
_REDUCE_ALL = ops.ReduceAll(keep_dims=False)
_INF = float("inf")

__all__ = ["THOR", "ThorGuard", "ThorNonFiniteError", "DEFAULT_KL_CLIP"]


#: Default trust-region bound :math:`c` of :func:`ms_boost.thor.math.trust_region_scale` (see docs/thor.md for
#: the measurement behind it).
DEFAULT_KL_CLIP = 1e-3
#: Default number of consecutive non-finite losses / skipped steps after which training stops.
DEFAULT_MAX_NONFINITE_STEPS = 10


def _identity_blocks(shape) -> np.ndarray:
    """Identity blocks of ``(groups, n_b, b, b)`` (or ones for a diagonal ``(d,)`` inverse)."""
    if len(shape) == 1:
        return np.ones(shape, np.float32)
    return np.broadcast_to(np.eye(shape[-1], dtype=np.float32), shape).copy()


def written_out_inverse(blocks: np.ndarray, dim: int) -> np.ndarray:
    """Host copy of :func:`ms_boost.thor.math.dense_block_diagonal`: ``(g, n_b, b, b)`` blocks -> ``(g, dim, dim)``.

    The blocks placed on the diagonal, zeros elsewhere, the identity padding of the last block cut off: the same
    values the refresh writes on the device (exact, no arithmetic).
    """
    groups, n_blocks, block = blocks.shape[0], blocks.shape[1], blocks.shape[2]
    full = np.zeros((groups, n_blocks * block, n_blocks * block), np.float32)
    for i in range(n_blocks):
        full[:, i * block:(i + 1) * block, i * block:(i + 1) * block] = blocks[:, i]
    return np.ascontiguousarray(full[:, :dim, :dim])


def _block_owners(groups: Tuple[int, ...], blocks: Tuple[int, ...]) -> np.ndarray:
    """``(jobs, blocks)`` float32 0/1: row ``i`` marks the consecutive blocks of a batch's ``i``-th factor."""
    counts = [g * b for g, b in zip(groups, blocks)]
    out = np.zeros((len(counts), sum(counts)), np.float32)
    start = 0
    for i, count in enumerate(counts):
        out[i, start:start + count] = 1.0
        start += count
    return out


def _default_decay_filter(param) -> bool:
    """Upstream's default: weight decay on every parameter."""
    return True


_LR_ALLOWED = ("a float >= 0, a per-step array (a non-empty list, numpy array or 1-D Tensor of floats) or a "
               "LearningRateSchedule")


def _check_learning_rate(learning_rate) -> None:
    """Refuse a learning rate MindSpore's optimizer would take apart with a bare error.

    A str is iterated character by character: "could not convert string to float: '.'"; an empty array failed at the
    first step ("For 'Gather', the 'input_indices' should be in the range [0, 0)"), a nested list with "The object is
    not callable".
    """
    if isinstance(learning_rate, LearningRateSchedule):
        return
    if isinstance(learning_rate, bool) or isinstance(learning_rate, (str, bytes)):
        bad = True
    elif isinstance(learning_rate, numbers.Real):
        bad = False
    elif isinstance(learning_rate, Tensor):  # MindSpore refuses more than one dimension itself, not an empty one
        bad = len(learning_rate.shape) == 1 and learning_rate.shape[0] == 0
    else:
        try:
            values = np.asarray(learning_rate)
            kind = values.dtype.kind
        except (TypeError, ValueError):
            values, kind = None, "O"
        bad = kind not in "fiu" or values is None or values.ndim > 1 or values.size == 0
    if bad:
        raise TypeError(f"thor: learning_rate={learning_rate!r} ({type(learning_rate).__name__}) is not allowed; "
                        f"allowed: {_LR_ALLOWED}.")


def _per_step_lr_last(learning_rate) -> Optional[int]:
    """The last index of a per-step learning-rate array as MindSpore's optimizer holds it.

    MindSpore holds such an array as a schedule over one 1-D Parameter of values; None for a float or a user's
    LearningRateSchedule.
    """
    values = getattr(learning_rate, "learning_rate", None)
    if type(learning_rate).__name__ == "_IteratorLearningRate" and isinstance(values, Parameter) \
            and len(values.shape) == 1:
        return int(values.shape[0]) - 1
    return None


class _DampingSchedule(nn.Cell):
    r"""Damping :math:`\lambda_t` of step ``t``: constant, per-step array (last value after its end) or schedule.

    Args:
        damping: float > 0; a sequence / numpy array / 1-D Tensor of floats > 0, one per step; or a
            :class:`mindspore.nn.LearningRateSchedule` called with the step.
    """

    def __init__(self, damping):
        super().__init__()
        self.schedule = None
        if isinstance(damping, LearningRateSchedule):
            self.schedule = damping
            self.values = Tensor(np.zeros(1, np.float32))
            self.last = 0
            return
        if isinstance(damping, (Tensor, np.ndarray)):
            values = (damping.asnumpy() if isinstance(damping, Tensor) else np.asarray(damping))
            values = values.astype(np.float32).reshape(-1)
            bad = np.flatnonzero(~(np.isfinite(values) & (values > 0)))
            if values.size == 0:
                _rule("damping", [])
            if bad.size:  # the first bad value, said by the thor.damping rule
                _rule("damping", float(values[bad[0]]), f"thor.damping[{bad[0]}]")
        else:
            values = np.array(_rule("damping", damping), np.float32).reshape(-1)
        self.values = Parameter(Tensor(values), name="thor_damping_values", requires_grad=False)
        self.last = values.size - 1

    def adjustable_values(self) -> Optional[Tuple[Parameter, ...]]:
        """The Parameter of per-step values (a constant is one value), to be scaled in place; None for a schedule."""
        return None if self.schedule is not None else (self.values,)

    def construct(self, step):
        if self.schedule is not None:
            return self.schedule(step).reshape(()).astype(ms.float32)
        index = ops.minimum(step.reshape(()), self.last)
        return ops.gather(self.values, index, 0)


class THOR(nn.Optimizer, ThorStepVariants):
    r"""Second-order optimizer THOR over the THOR layers of ``net`` (see the module docstring for the step).

    Build it with :func:`thor`, which converts the network first. ``net`` must already contain
    :class:`~ms_boost.thor.DenseThor` / :class:`~ms_boost.thor.Conv2dThor` /
    :class:`~ms_boost.thor.EmbeddingThor` layers; the network to train is :attr:`thor_network`.

    Args:
        net: network holding the THOR layers.
        learning_rate: float, per-step array / 1-D Tensor, or LearningRateSchedule (as any MindSpore optimizer).
        damping: :math:`\lambda`: float > 0, per-step array, or LearningRateSchedule; :math:`\sqrt{\lambda}` is
            added to both factors at each refresh.
        momentum: momentum :math:`m \ge 0`.
        weight_decay: :math:`\mu \ge 0`, added to the preconditioned gradient of the parameters for which
            ``decay_filter(param)`` is True.
        loss_scale: gradients and captured output gradients arrive multiplied by this (the
            ``FixedLossScaleManager(loss_scale, drop_overflow_update=False)`` pattern); divided out. For a
            dynamic loss scale call :meth:`bind_loss_scale` with its Parameter.
        batch_size: accepted for upstream compatibility; statistics use each batch's real sample count.
        use_nesterov: Nesterov momentum.
        decay_filter: ``param -> bool``; default every parameter (upstream). Pass e.g.
            ``lambda p: p.ndim > 1`` to exclude BatchNorm and biases.
        split_indices: layer indices closing each group of factors all-reduced together (upstream's
            fusion hint, e.g. ``[26, 53]`` for ResNet-50); None: one group.
        enable_clip_grad: clip each preconditioned gradient to norm 1.
        frequency: refresh the factors and inverses every ``frequency`` (>= 1) steps.
        params: parameters to optimize (default: the trainable parameters of ``net``).
        block_size: factors larger than this are split into diagonal blocks of this size; the layers capture only
            those blocks (the optimizer sets their layout, :meth:`~ms_boost.thor.layers.ThorLayer.set_factor_layout`).
        distribute_inverses: on several ranks, invert each factor on one rank and broadcast (else every
            rank inverts everything).
        source_network: the network ``net`` was converted from (:func:`thor` passes it), for :meth:`built_from`.
        refresh_threshold: adaptive per-layer refresh :math:`\omega` (the THOR paper's trace rule): at a refresh
            a layer is inverted again only when the trace of its A or G moved by more than this fraction since
            its last inversion; the others keep their inverses (see docs/thor.md "Adaptive refresh"). None or 0:
            every layer at every refresh.
        kl_clip: trust region :math:`c`: every preconditioned update is scaled by
            :math:`\nu = \min(1, \sqrt{c / (\eta^2 \sum_l \langle F_l^{-1} g_l, g_l\rangle)})`
            (:func:`~ms_boost.thor.math.trust_region_scale`); None or 0 switch it off.
        stat_fraction: the layers compute the factor statistics on the first :math:`\lceil fN \rceil` samples of
            each batch of :math:`N` (Martens & Grosse's sub-batch statistics; :math:`G` keeps the per-sample
            normalisation, see :mod:`ms_boost.thor.math`), in (0, 1]; 1: the whole batch. An embedding's token
            frequencies always use the whole batch (its output-gradient factor the sub-batch).
        pi_damping: split the damping between :math:`A` and :math:`G` by their traces
            (:func:`~ms_boost.thor.math.pi_damping`) instead of :math:`\sqrt\lambda` on each.
        max_nonfinite_steps: :class:`ThorGuard` stops training after this many consecutive steps with a
            non-finite loss or a skipped update (0: never).
    """

    #: whether :meth:`_warn_if_no_layer_ran` has warned (once per optimizer)
    _warned_no_layer: bool = False

    #: A Kronecker factor of 2 up to this many blocks also keeps its block-diagonal inverse written out,
    #: ``(groups, d, d)`` (Parameters ``thor_a_dense.<layer>``, ``thor_g_dense.<layer>``, rebuilt from the blocks at
    #: every refresh): the step multiplies by it in one product instead of padding, tiling and slicing the gradient
    #: around a batched product of the blocks (docs/thor.md "Eighth round"; 5, not 4, since the ninth). Only where
    #: the blocks cost more than their product: a factor applied from the right (A; an embedding's G), or from the left
    #: (G) when its last block is padded. 0 or 1: never.
    dense_inverse_blocks = 5

    def __init__(self, net: nn.Cell, learning_rate, damping, momentum, weight_decay=0.0, loss_scale=1.0,
                 batch_size: int = 32, use_nesterov: bool = False, decay_filter: Optional[Callable] = None,
                 split_indices=None, enable_clip_grad: bool = False, frequency: int = 100, *,
                 params=None, block_size: int = DEFAULT_BLOCK_SIZE, distribute_inverses: bool = True,
                 kl_clip: Optional[float] = DEFAULT_KL_CLIP, pi_damping: bool = False,
                 max_nonfinite_steps: int = DEFAULT_MAX_NONFINITE_STEPS, refresh_threshold: Optional[float] = None,
                 stat_fraction: float = 1.0, source_network: Optional[nn.Cell] = None):
        if not isinstance(net, nn.Cell):
            raise TypeError(f"thor: net must be a mindspore.nn.Cell, got {type(net).__name__}.")
        if momentum is None:
            raise TypeError("thor: momentum=None: THOR built directly needs a number (only the boost config's "
                            "thor.momentum=None means: take the user's optimizer's).")
        # one rule, one message: the values the thor section holds are checked by its rules
        momentum = _rule("momentum", momentum)
        weight_decay = 0.0 if weight_decay is None else _rule("weight_decay", weight_decay)
        loss_scale = _rule("loss_scale", loss_scale)
        checked = {
            "frequency": _rule("frequency", frequency), "batch_size": _rule("batch_size", batch_size),
            "use_nesterov": _rule("use_nesterov", use_nesterov),
            "enable_clip_grad": _rule("enable_clip_grad", enable_clip_grad),
            "kl_clip": _rule("kl_clip", kl_clip) or 0.0,  # None or 0: trust region off
            "refresh_threshold": _rule("refresh_threshold", refresh_threshold) or 0.0,  # None or 0: every layer
            "block_size": _rule("block_size", block_size),
            "stat_fraction": _rule("stat_fraction", stat_fraction),
            # arguments the section does not hold, checked by the same checkers under the same names
            "pi_damping": check_bool("thor.pi_damping", pi_damping),
            "max_nonfinite_steps": check_int("thor.max_nonfinite_steps", max_nonfinite_steps, low=0),
        }
        split_indices = _rule("split_indices", split_indices)
        check_bool("thor.distribute_inverses", distribute_inverses)
        decay_filter = _default_decay_filter if decay_filter is None else decay_filter
        if not callable(decay_filter):
            raise TypeError(f"thor: decay_filter={decay_filter!r} must be callable.")
        if params is None:
            params = [p for p in net.get_parameters() if p.requires_grad]
        params = list(params)
        _check_learning_rate(learning_rate)
        super().__init__(learning_rate, params, 0.0, loss_scale)
        #: a per-step learning rate keeps its last value after its end, as the damping does
        self._lr_last = _per_step_lr_last(self.learning_rate) if self.dynamic_lr and not self.is_group_lr else None
        for name, value in checked.items():
            setattr(self, name, value)
        self.weight_decay = weight_decay
        self.decay_flags = tuple(bool(decay_filter(p)) for p in self._parameters)
        self.momentum = Parameter(Tensor(momentum, ms.float32), name="momentum", requires_grad=False)
        self.moments = self._parameters.clone(prefix="moments", init="zeros")
        self.apply_momentum = ops.ApplyMomentum()
        self.damping = _DampingSchedule(damping)
        object.__setattr__(self, "_thor_network", net)
        # the network ``net`` was converted from (weakly: it is the user's, not part of the optimizer)
        object.__setattr__(self, "_source_network", None if source_network is None else weakref.ref(source_network))

        self._collect_layers(net)
        _ensure_call_depth(self.n_layers)
        self.factor_loss_scale = Parameter(Tensor(float(loss_scale), ms.float32), name="thor_factor_loss_scale",
                                           requires_grad=False)
        self.bind_loss_scale(self.factor_loss_scale)
        self.thor_initialised = Parameter(Tensor(False, ms.bool_), name="thor_initialised", requires_grad=False)
        self.refresh_next = Parameter(Tensor(False, ms.bool_), name="thor_refresh_next", requires_grad=False)
        # health counters: [blocks inverted by the eigen fallback, inverses rejected as non-finite,
        # per layer: refreshes that kept the previous inverses (non-finite factors)]
        self.refresh_health = Parameter(Tensor(np.zeros(2 + self.n_layers, np.float32)), name="thor_refresh_health",
                                        requires_grad=False)
        # [skipped steps, trust-region factor nu of the last step, first layer with a non-finite update in the
        #  last skipped step (-1: none), consecutive skipped steps]
        self.step_health = Parameter(Tensor(np.array([0.0, 1.0, -1.0, 0.0], np.float32)), name="thor_step_health",
                                     requires_grad=False)
        if self.refresh_threshold > 0.0:  # adaptive refresh: traces at each factor's last inversion, stable counts
            self.inverted_traces = Parameter(Tensor(np.zeros(2 * self.n_layers, np.float32)),
                                             name="thor_inverted_traces", requires_grad=False)
            self.stable_refreshes = Parameter(Tensor(np.zeros(self.n_layers, np.float32)),
                                              name="thor_stable_refreshes", requires_grad=False)
        # per parameter: the index of the THOR layer it belongs to; n_layers for the others (never blamed)
        self._param_layer_numbers = Tensor(np.array([float(self.n_layers) if layer < 0 else float(layer)
                                                     for layer in self.param_layer], np.float32))
        # the parameters outside THOR layers: their updates are checked for inf/NaN directly (the THOR layers'
        # through their per-parameter summaries)
        self.other_positions = tuple(i for i, layer in enumerate(self.param_layer) if layer < 0)
        # a Python float, not float(n_layers) in the step: the builtin costs a call to compile in Graph mode
        self._n_layers_float = float(self.n_layers)
        # weight decay per parameter as the step applies it (none at all when weight_decay is 0)
        self.step_decay_flags = self.decay_flags if self.weight_decay > 0.0 else (False,) * len(self.decay_flags)
        self._keep_on_success = Tensor(np.array([1.0, 0.0, 1.0, 0.0], np.float32))
        self._keep_on_skip = Tensor(np.array([1.0, 0.0, 0.0, 1.0], np.float32))
        self._setup_distribution(split_indices, distribute_inverses)
        self.compile_pynative_step = not self.distributed or comm.collectives_compile()
        self._step_state = tuple(_unique(list(self.get_parameters()) + list(self._parameters)))
        self._compiled_key = None
        # None: the refresh is decided on the device; False: compiled out (the plain step variant, see
        # ms_boost.thor.variants: the host knows whether a step refreshes)
        self.static_refresh = None
        # True while a step compiles (or runs op by op) that the host prepared with sync_dense_inverses: a step
        # variant chosen on the host, THOR called from Python (PyNative). Only there do the products use the
        # written-out inverses; a graph no host call precedes (MindSpore's train cell in Graph mode, a sink graph)
        # multiplies by the blocks, which a loaded checkpoint cannot leave out of step with themselves
        self.use_dense_inverses = False
        self._blocks_only = tuple((-1, -1) for _ in self.layer_dense)
        # the memory of every block inverse with a written-out copy and of the copies, as last checked: loading a
        # checkpoint (set_data) replaces it. The buffers are held (pinned), so no later one can take their address
        object.__setattr__(self, "_dense_watched", tuple(p for k in range(len(self.dense_layer))
                                                        for p in (self._dense_source(k), self.dense_inverses[k])))
        object.__setattr__(self, "_dense_key", tuple(p.data_ptr() for p in self._dense_watched))
        object.__setattr__(self, "_dense_pins", tuple(Tensor(p) for p in self._dense_watched))

    # ------------------------------------------------------------------ build time
    def _collect_layers(self, net: nn.Cell) -> None:
        """Find the THOR layers whose weight is optimized and build the static index maps."""
        index_of = {id(p): i for i, p in enumerate(self._parameters)}
        layers, paths, seen = [], [], set()
        for path, cell in net.cells_and_names():
            if isinstance(cell, ThorLayer) and id(cell) not in seen:
                seen.add(id(cell))
                weight = cell.embedding_table if cell.kind == "embedding" else cell.weight
                if id(weight) in index_of:
                    layers.append(cell)
                    paths.append(path or cell.cls_name)
        if not layers:
            logger.warning("thor: the network has no THOR layer with a trainable weight; THOR reduces to Momentum.")
        source = [(-1, -1)] * len(self._parameters)
        kinds, w_index, b_index, a_dims, groups_of, g_dims, decays, slots = [], [], [], [], [], [], [], []
        a_inv: list = []
        g_inv: list = []
        flags: list = []
        a_batch: list = []
        g_batch: list = []
        a_fac: list = []
        g_fac: list = []
        factors: list = []
        dense: list = []  # written-out block-diagonal inverses of the factors of a few blocks
        dense_records: list = []  # per written-out inverse: (layer, slot, dim)
        layer_dense: list = []  # per layer: (index of A's, of G's) in dense, -1 for none
        for li, (layer, path) in enumerate(zip(layers, paths)):
            weight = layer.embedding_table if layer.kind == "embedding" else layer.weight
            source[index_of[id(weight)]] = (li, 0)
            bias = getattr(layer, "bias", None)
            joint = bool(layer.bias_in_factor and bias is not None and id(bias) in index_of)
            if joint:
                source[index_of[id(bias)]] = (li, 1)
            # the layer captures its factors as they are inverted: only the diagonal blocks of a factor wider than
            # block_size, and A without the bias column when the bias is not trained with the weight
            if (layer.block_size, layer.a_bias) != (self.block_size, joint):
                layer.set_factor_layout(self.block_size, joint)
            if layer.stat_fraction != self.stat_fraction:  # the statistics on the first samples of each batch
                layer.set_stat_fraction(self.stat_fraction)
            factors.append(LayerFactors(layer.kind == "embedding", tuple(layer.a_shape), tuple(layer.g_shape),
                                        layer.groups))
            a_inv_shape, g_inv_shape = inverse_layout(factors[-1:], self.block_size)[0]
            groups = layer.groups
            kinds.append(layer.kind)
            w_index.append(index_of[id(weight)])
            b_index.append(index_of[id(bias)] if joint else -1)
            a_dims.append(layer.a_dim)
            groups_of.append(groups)
            g_dims.append(layer.g_dim)
            decays.append(layer.factor_decay)
            # identity until the first good refresh (a layer whose first factors are non-finite gets its gradient)
            a_inv.append(Parameter(Tensor(_identity_blocks(a_inv_shape)), name=f"thor_a_inverse.{path}",
                                   requires_grad=False))
            g_inv.append(Parameter(Tensor(_identity_blocks(g_inv_shape)),
                                   name=f"thor_g_inverse.{path}", requires_grad=False))
            indices = []
            for slot, (shape, dim) in enumerate(((a_inv_shape, layer.a_dim), (g_inv_shape, layer.g_dim))):
                # a factor applied from the right (A; an embedding's G) is tiled by two transposes around the blocks'
                # product, one applied from the left only padded and cut when its blocks overhang
                right = slot == 0 or layer.kind == "embedding"
                if (len(shape) == 4 and 1 < shape[1] <= self.dense_inverse_blocks
                        and (right or dim % self.block_size)):
                    indices.append(len(dense))
                    dense_records.append((li, slot, dim))
                    dense.append(Parameter(Tensor(np.broadcast_to(np.eye(dim, dtype=np.float32), (groups, dim, dim))),
                                           name=f"thor_{'ag'[slot]}_dense.{path}", requires_grad=False))
                else:
                    indices.append(-1)
            layer_dense.append(tuple(indices))
            state = layer.thor_parameters()
            flags.append(state["thor_capture"])
            a_batch.append(state["matrix_a_batch"])
            g_batch.append(state["matrix_g_batch"])
            if layer.factor_decay > 0.0:
                slots.append(len(a_fac))
                a_fac.append(state["matrix_a"])
                g_fac.append(state["matrix_g"])
            else:
                slots.append(-1)
        object.__setattr__(self, "_thor_layers", tuple(layers))
        self.n_layers = len(layers)
        self.layer_paths = tuple(paths)
        # per parameter: its THOR layer (-1: none) and slot (0 weight, 1 bias), and its position
        self.param_layer = tuple(layer for layer, _ in source)
        self.param_slot = tuple(slot for _, slot in source)
        self.param_position = tuple(range(len(source)))
        self.layer_kind = tuple(kinds)
        self.weight_index = tuple(w_index)
        self.bias_index = tuple(b_index)  # -1: the bias (if any) is not preconditioned with the weight
        self.layer_groups = tuple(groups_of)
        self.a_dims = tuple(a_dims)  # the factors' dimensions (the stored blocks may be padded)
        self.g_dims = tuple(g_dims)
        self.job_dims = tuple(d for pair in zip(a_dims, g_dims) for d in pair)
        self.factor_decay = tuple(decays)
        self.factor_slot = tuple(slots)  # index into a_factors / g_factors, -1 without running average
        self.layer_factors = tuple(factors)
        self.a_inverses = ParameterTuple(a_inv)
        self.g_inverses = ParameterTuple(g_inv)
        self.dense_inverses = ParameterTuple(dense)
        self.layer_dense = tuple(layer_dense)
        self.dense_layer = tuple(r[0] for r in dense_records)
        self.dense_slot = tuple(r[1] for r in dense_records)
        self.dense_dims = tuple(r[2] for r in dense_records)
        self.capture_flags = ParameterTuple(_unique(flags))
        self.a_batches = ParameterTuple(a_batch)
        self.g_batches = ParameterTuple(g_batch)
        self.a_factors = ParameterTuple(a_fac)
        self.g_factors = ParameterTuple(g_fac)
        gate = CaptureGate(self.capture_flags)
        object.__setattr__(self, "_capture_gate", gate)
        object.__setattr__(self, "_warned_no_layer", False)
        for layer in layers:
            layer.set_capture_gate(gate)

    def _setup_distribution(self, split_indices, distribute_inverses: bool) -> None:
        """Static layout of the factor all-reduces, inverse broadcasts and batched inversions on this rank.

        The layout is :func:`~ms_boost.thor.assignment.plan_inversions`'s (job ``2i``: the input factor of
        layer ``i``, ``2i+1``: its output factor); here it becomes the collectives and per-record tuples the
        compiled step maps over.
        """
        self.split_indices = split_indices
        self.distributed = bool(Topology.current().data_parallel)
        self.rank = comm.get_rank() if self.distributed else 0
        size = comm.get_size() if self.distributed else 1
        plan = plan_inversions(self.layer_factors, self.block_size, self.rank, size, self.distributed,
                               split_indices, distribute_inverses)
        self.factor_shapes = tuple(s for f in self.layer_factors for s in (f.a_shape, f.g_shape))
        self.inverse_costs = plan.costs
        self.factor_sizes = plan.factor_sizes
        self.inverse_shapes = plan.inverse_shapes
        self.inverse_sizes = plan.inverse_sizes
        # all-reduce of the factors (not of the inverses), one fused buffer per group
        self.reduce_jobs = plan.reduce_jobs
        self.reduce_slot = plan.reduce_slot
        self.factor_reducers = nn.CellList([comm.AllReduce("mean") for _ in plan.reduce_jobs])
        # inversion split across ranks, results broadcast from their owner (one fused buffer per owner)
        self.inverse_owner = plan.owner
        self.broadcast_ranks = plan.broadcast_ranks
        self.broadcast_jobs = plan.broadcast_jobs
        self.broadcast_sizes = plan.broadcast_sizes
        self.broadcast_slot = plan.broadcast_slot
        self.broadcasters = nn.CellList([comm.Broadcast(root=r) for r in plan.broadcast_ranks])
        # this rank's Kronecker jobs batched by block size: all (b, b) blocks of one size inverted by one call
        self.inverse_batches = plan.batches
        self.batch_block_layer = tuple(Tensor(np.array(layers, np.int32)) for layers in plan.batch_block_layer)
        self.batch_job_groups = plan.batch_job_groups
        self.batch_job_blocks = plan.batch_job_blocks
        # per batch: its factors' layers and slots, and which blocks each owns ((jobs, blocks) 0/1 and its transpose)
        self.batch_job_layers = tuple(tuple(j // 2 for j in jobs) for jobs in plan.batches)
        self.batch_job_slots = tuple(tuple(j % 2 for j in jobs) for jobs in plan.batches)
        owners = [_block_owners(groups, blocks) for groups, blocks in zip(plan.batch_job_groups, plan.batch_job_blocks)]
        self.batch_job_matrix = tuple(Tensor(m) for m in owners)
        self.batch_block_matrix = tuple(Tensor(np.ascontiguousarray(m.T)) for m in owners)
        # per job: (mode, layer, slot, batch, first block, block count, whole batch, inverse shape); the refresh
        # maps over these instead of unrolling loops
        self.job_specs = plan.job_specs
        self.diagonal_specs = tuple(spec for spec in plan.job_specs if spec[0] == 1)  # this rank's embeddings' A
        # per job: its index in diagonal_specs (-1: not a diagonal factor this rank inverts)
        self.job_diagonal = tuple(self.diagonal_specs.index(spec) if spec[0] == 1 else -1 for spec in plan.job_specs)
        self.job_layer = tuple(j // 2 for j in range(2 * self.n_layers))
        self._a_jobs = tuple(range(0, 2 * self.n_layers, 2))  # the input factors' jobs, the output factors'
        self._g_jobs = tuple(range(1, 2 * self.n_layers, 2))
        self.job_slot = tuple(j % 2 for j in range(2 * self.n_layers))
        self.layer_embedding = tuple(kind == "embedding" for kind in self.layer_kind)
        # the new inverses are assigned inside the per-job map unless they first travel through a broadcast
        self.assign_in_map = not self.broadcast_ranks

    def __getattr__(self, name):
        if name == "init_params":  # read by the wrappers' @opt_init_args_register (nn.LARS): say why, not just "no"
            raise AttributeError(
                "THOR has no 'init_params': it cannot be wrapped by an optimizer wrapper such as nn.LARS(thor(...)) "
                "(the wrapper would rescale each layer's gradient by its own trust ratio before THOR preconditions "
                "it with its curvature factors, and train THOR's step through the wrapper, which ms_boost's Model "
                "does not do). Give the THOR optimizer itself to Model, or wrap a first-order optimizer "
                "(nn.LARS(nn.Momentum(...))).")
        return super().__getattr__(name)

    # ------------------------------------------------------------------ public helpers
    @property
    def thor_network(self) -> nn.Cell:
        """The network holding the THOR layers (the one to train)."""
        return self._thor_network

    def built_from(self, network: nn.Cell) -> bool:
        """Whether :attr:`thor_network` is the conversion of ``network`` (the net given to :func:`thor`)."""
        source = self._source_network() if self._source_network is not None else None
        return source is not None and source is network

    @property
    def thor_layers(self) -> tuple:
        """The THOR layers this optimizer preconditions, in network order."""
        return self._thor_layers

    def get_lr(self):
        """This step's learning rate; a per-step array keeps its last value after its end.

        MindSpore's optimizers index past the end and stop with a Gather error.
        """
        if self._lr_last is None:
            return super().get_lr()
        index = ops.minimum(self.global_step.reshape(()), self._lr_last)
        return self.learning_rate(index).reshape(())

    def damping_parameters(self) -> Optional[Tuple[Parameter, ...]]:
        """The Parameter holding the damping values, which a divergence rollback scales in place.

        One value for a constant damping, one per step for an array; None for a ``LearningRateSchedule`` damping.
        """
        return self.damping.adjustable_values()

    def get_frequency(self) -> int:
        """Refresh interval of factors and inverses (upstream API)."""
        return self.frequency

    def transient_parameters(self) -> list:
        """THOR's capture flags, scratch statistics and factors.

        They are folded in only by the optimizer step, so an overflow step (whose update is skipped) needs no
        snapshot/restore of them.
        """
        return thor_state_parameters(self._thor_network)

    def bind_loss_scale(self, loss_scale) -> None:
        """Divide captured output gradients by ``loss_scale``.

        ``loss_scale`` is a Parameter read during the backward pass (e.g. a dynamic loss scale cell's
        ``scale_sense``) or a number. Call before the network is compiled.
        """
        if isinstance(loss_scale, numbers.Real) and not isinstance(loss_scale, bool):
            if not np.isfinite(float(loss_scale)) or loss_scale <= 0:
                raise ValueError(f"thor: bind_loss_scale({loss_scale!r}) needs a finite number > 0.")
            ops.assign(self.factor_loss_scale, Tensor(float(loss_scale), ms.float32))
            loss_scale = self.factor_loss_scale
        for layer in self._thor_layers:
            layer.bind_loss_scale(loss_scale)

    # ------------------------------------------------------------------ step
    def _refresh(self, damping, gradients):
        """Fold the captured statistics, average them across ranks, invert, store; returns a dependency token.

        Every collective takes a data dependency on the previous one (the first on the gradients, which
        left the data-parallel reduction), so all ranks issue them in the same order. A layer whose
        factors hold inf/NaN keeps its previous inverses (counted per layer in ``refresh_health``); every
        block goes through Cholesky when all of this rank's blocks are :func:`~ms_boost.thor.math.cholesky_safe`,
        else through the clamped eigen-inverse (the number of unsafe blocks is counted).

        Per-layer, per-job and per-batch work is mapped (``ops.Map``) over static tuples (``job_specs``, ...):
        Python loops accumulating tuples unroll into graphs that compile about twice as slowly.
        """
        token = ops.zeros((), ms.float32)
        if self.n_layers == 0:
            return self._finish_refresh(token, token, token, ops.zeros((0,), ms.bool_))
        hyper_map = kernels.MAP  # not HyperMap: it would map into the tuples these records are
        a_source, g_source = self.a_batches, self.g_batches
        last = gradients
        if self.distributed:
            factors = ()
            for i in range(self.n_layers):
                factors += (self.a_batches[i], self.g_batches[i])
            flats = ()
            for k in range(len(self.reduce_jobs)):
                parts = ()
                for j in self.reduce_jobs[k]:
                    parts += (factors[j].reshape(-1),)
                last = self.factor_reducers[k](ops.depend(ops.concat(parts), last))
                flats += (last,)
            reduced = ()
            for j in range(2 * self.n_layers):
                k, offset = self.reduce_slot[j]
                reduced += (thor_math.narrow(flats[k], 0, offset, self.factor_sizes[j]).reshape(self.factor_shapes[j]),)
            a_source = hyper_map(ops.partial(kernels.pick, reduced), self._a_jobs)
            g_source = hyper_map(ops.partial(kernels.pick, reduced), self._g_jobs)
        folds = hyper_map(ops.partial(kernels.fold_layer, self.thor_initialised, self.a_factors, self.g_factors),
                          self.factor_slot, self.factor_decay, a_source, g_source)
        token = ops.depend(token, folds)  # the running averages' writes
        layer_ok = hyper_map(kernels.field_2, folds)
        ok_vector = ops.stack(layer_ok)
        use_vector, use = ok_vector, layer_ok  # the layers inverted now
        if self.refresh_threshold > 0.0:  # adaptive: only the layers whose factors changed enough
            use_vector = self._changed_layers(folds, ok_vector)
            token = ops.depend(token, use_vector)
            use = ops.unstack(use_vector)
        root = ops.sqrt(ops.cast(damping, ms.float32))
        shifts = ()
        if self.pi_damping:
            layer_shifts = hyper_map(ops.partial(kernels.pi_shifts, root), self.layer_groups, self.a_dims, self.g_dims,
                                     folds)
            shifts = hyper_map(ops.partial(kernels.job_field, layer_shifts), self.job_layer, self.job_slot)
        # this rank's Kronecker blocks, batched by block size; one Cholesky-or-eigen decision for all of them
        raw = ()
        unsafe = ops.zeros((), ms.float32)
        bad_inverses = ops.zeros((), ms.float32)
        if self.inverse_batches:
            prepared = hyper_map(ops.partial(kernels.prepare_batch, folds, shifts, use_vector, root, self.pi_damping),
                                 self.inverse_batches, self.batch_job_layers, self.batch_job_slots,
                                 self.batch_job_groups, self.batch_job_blocks, self.batch_block_layer)
            batch_blocks = hyper_map(kernels.field_0, prepared)
            batch_shifts = hyper_map(kernels.field_1, prepared)
            batch_ok = hyper_map(kernels.field_2, prepared)
            unsafe = ops.addn(hyper_map(kernels.field_3, prepared))
            if self.refresh_threshold > 0.0:  # a batch whose layers all keep their inverses is not inverted
                for k in range(len(self.inverse_batches)):
                    if thor_math.any_true(batch_ok[k]):
                        inverse = self._invert_batch(batch_blocks[k], batch_shifts[k], unsafe)
                    else:
                        inverse = batch_blocks[k]  # identity stand-ins, discarded
                    raw += (inverse,)
            elif unsafe > 0.5:
                raw = hyper_map(kernels.eigen_inverse, batch_blocks, batch_shifts)
            else:
                raw = hyper_map(kernels.cholesky_inverse, batch_blocks, batch_shifts)
            # a block is bad when its layer's factors or its inverse are non-finite; a factor with a bad block keeps
            # its previous inverse, decided per batch (one where over its blocks, not one per factor)
            block_bad = hyper_map(kernels.blocks_bad, batch_ok, raw)
            kept = hyper_map(ops.partial(kernels.keep_or_replace, self.a_inverses, self.g_inverses), raw, block_bad,
                             batch_ok, self.batch_job_layers, self.batch_job_slots, self.batch_job_matrix,
                             self.batch_block_matrix)
            raw = hyper_map(kernels.field_0, kept)
            bad_inverses = ops.addn(hyper_map(kernels.field_1, kept))
        # the embeddings' diagonal inverses, each computed once: (inverse to store, rejected)
        diagonals = ()
        if self.diagonal_specs:
            diagonals = hyper_map(ops.partial(kernels.diagonal_inverse, folds, shifts, use, self.a_inverses, root,
                                              self.pi_damping), self.diagonal_specs)
            for k in range(len(self.diagonal_specs)):  # a few at most (one per embedding)
                bad_inverses = bad_inverses + diagonals[k][1]
        jobs = hyper_map(ops.partial(kernels.job_inverse, diagonals, raw, self.a_inverses, self.g_inverses,
                                     self.assign_in_map), self.job_specs, self.job_diagonal)
        if self.assign_in_map:
            token = ops.depend(token, jobs)
        else:
            inverses = jobs
            received = ()
            for k in range(len(self.broadcast_ranks)):
                if self.broadcast_ranks[k] == self.rank:
                    parts = ()
                    for j in self.broadcast_jobs[k]:
                        parts += (inverses[j].reshape(-1),)
                    flat = ops.concat(parts)
                else:
                    flat = ops.zeros((self.broadcast_sizes[k],), ms.float32)
                last = self.broadcasters[k](ops.depend(flat, last))
                received += (last,)
            for j in range(2 * self.n_layers):
                k, offset = self.broadcast_slot[j]
                if k < 0:
                    value = inverses[j]
                else:
                    value = thor_math.narrow(received[k], 0, offset, self.inverse_sizes[j]).reshape(
                        self.inverse_shapes[j])
                token = ops.depend(token, ops.assign(self._inverse_param(j), value))
        if self.dense_layer:  # the written-out inverses follow the stored blocks (replaced, kept or received)
            token = ops.depend(token, hyper_map(ops.partial(kernels.dense_inverse, self.a_inverses, self.g_inverses,
                                                            token), self.dense_inverses, self.dense_layer,
                                                self.dense_slot, self.dense_dims))
        return self._finish_refresh(token, unsafe, bad_inverses, ok_vector)

    def _changed_layers(self, folds, ok_vector):
        r"""Adaptive refresh (the THOR paper's trace rule): which layers to invert now -> ``(n_layers,)`` bool.

        A layer is inverted when its factors are finite and the trace of its A or its G moved by more than
        ``refresh_threshold`` relative to the trace at its last inversion,
        :math:`|\operatorname{tr} F / \operatorname{tr} F_{last} - 1| > \omega` (always at its first); the
        others keep their inverses (counted per layer in ``stable_refreshes``). Records the traces of the layers
        inverted now.
        """
        traces = ops.stack(kernels.MAP(ops.partial(kernels.trace, folds), self.job_layer, self.job_slot, self.job_dims))
        last = self.inverted_traces
        never = last <= 0.0
        change = ops.abs(traces / ops.where(never, ops.ones_like(last), last) - 1.0)
        change = ops.where(never, ops.ones_like(change) * _INF, change)
        moved = _REDUCE_ANY(change.reshape(self.n_layers, 2) > self.refresh_threshold, 1)
        use = ops.logical_and(ok_vector, moved)
        stable = ops.cast(ops.logical_and(ok_vector, ops.logical_not(moved)), ms.float32)
        per_job = ops.BroadcastTo((self.n_layers, 2))(use.reshape(-1, 1)).reshape(-1)
        token = ops.assign(self.inverted_traces, ops.where(per_job, traces, last))
        token = ops.depend(token, ops.assign(self.stable_refreshes, self.stable_refreshes + stable))
        return ops.depend(use, token)

    @staticmethod
    def _invert_batch(blocks, shifts, unsafe):
        """One batch's inverses: Cholesky, or the clamped eigen-inverse when any block of the step is unsafe."""
        if unsafe > 0.5:
            return thor_math.clamped_eigen_block_inverse(blocks, shifts)
        return thor_math.cholesky_block_inverse(blocks, shifts)

    def _finish_refresh(self, token, unsafe, bad_inverses, ok_vector):
        """Count the refresh's health events and mark the refresh done; returns the dependency token."""
        rejected = ops.cast(ops.logical_not(ok_vector), ms.float32)
        health = self.refresh_health + ops.concat((ops.stack([unsafe, bad_inverses]), rejected))
        token = ops.depend(token, ops.assign(self.refresh_health, ops.cast(health, ms.float32)))
        token = ops.depend(token, ops.assign(self.refresh_next, Tensor(False, ms.bool_)))
        return ops.depend(token, ops.assign(self.thor_initialised, Tensor(True, ms.bool_)))

    def _inverse_param(self, job: int):
        return self.a_inverses[job // 2] if job % 2 == 0 else self.g_inverses[job // 2]

    def construct(self, gradients):
        """One THOR step over ``gradients`` (see the module docstring); returns whether the update was applied."""
        params = self._parameters
        moments = self.moments
        gradients = self.scale_grad(gradients)
        step = self.global_step
        # decided on the device unless compiled out (the plain step variant, see ms_boost.thor.variants). Also
        # with the host's answer known the refresh stays a device condition: the branch orders its reads of the
        # captured statistics after the backward pass that writes them (without it, a compiled refresh read
        # the output-gradient statistics of the previous capture).
        if self.static_refresh is None:
            refresh = ops.logical_or(ops.logical_or(ops.logical_not(self.thor_initialised), self.refresh_next),
                                     _REDUCE_ALL((step % self.frequency) == 0, ()))
            if refresh:
                gradients = ops.depend(gradients, self._refresh(self.damping(step), gradients))
        lr = self.get_lr()
        # Per-parameter work is mapped with HyperMap over tuples: a Python loop over ResNet-50's 161
        # parameters unrolls into nested calls deeper than Graph mode's call-depth limit.
        directions = self.directions(gradients)
        nu = ops.ones((), ms.float32)
        new_grads = directions  # before the trust region: a NaN nu would blame every layer
        # per parameter a scalar that is non-finite when its preconditioned direction is (0 for other parameters):
        # <F^-1 g, g> with the trust region, else the direction's sum; it names the first bad layer of a skipped step
        if self.kl_clip > 0.0 and self.n_layers > 0:
            summaries = self.hyper_map(kernels.preconditioned_dot, self.param_layer, directions, gradients)
            vg_sum = ops.addn(summaries)
            nu = thor_math.trust_region_scale(vg_sum, lr, self.kl_clip)
        else:
            summaries = self.hyper_map(kernels.direction_sum, self.param_layer, directions)
        scale = self.kl_clip > 0.0 and self.n_layers > 0
        if self.enable_clip_grad and (scale or self.weight_decay > 0.0):  # trust-region scaling and decay in one map
            new_grads = self.hyper_map(ops.partial(kernels.scale_and_decay, scale, nu, self.weight_decay),
                                       self.param_layer, self.step_decay_flags, params, directions)
        if self.enable_clip_grad:
            new_grads = self.hyper_map(kernels.clip_to_unit_norm, new_grads)
        # a non-finite update (gradient, preconditioned direction or nu) skips the whole step. The THOR layers'
        # parameters are judged by their scalar summaries (non-finite when the direction or the gradient is), the
        # others by one check over them concatenated (their gradients, or with clipping their updates; a non-finite
        # weight makes the forward pass and so every gradient non-finite): an isfinite over every update cost 0.035x
        # a Momentum step (docs/thor.md "What the plain step's pieces cost")
        summary_finite = ops.isfinite(ops.stack(summaries))
        finite = ops.logical_and(_REDUCE_ALL(summary_finite, ()), ops.isfinite(nu))
        if self.other_positions:
            others = kernels.MAP(ops.partial(kernels.pick, new_grads), self.other_positions)
            finite = ops.logical_and(finite, thor_math.all_finite(flatten_tensors(others)))
        # No branch on ``finite`` (a device switch cost about 0.2x a Momentum step): a skipped step runs the same
        # update with learning rate 0, momentum 1 and zero gradients, which leaves every weight and moment bit
        # for bit as it was (v = 1 v + 0, w = w - 0 v); the step counter, flags and health follow ``finite``.
        lr = ops.where(finite, lr, ops.zeros_like(lr))
        momentum = ops.where(finite, self.momentum, ops.ones_like(self.momentum))
        if not self.enable_clip_grad:
            # the zeroing folded into the scaling: MulNoNan by nu or 1, both 0 on a skipped step (and the decay 0),
            # one kernel per parameter fewer than a where per update (docs/thor.md "Ninth round")
            keep = ops.cast(finite, ms.float32)
            kept_nu = ops.where(finite, nu, ops.zeros_like(nu))
            update = ops.partial(kernels.masked_update, scale, kept_nu, keep, keep * self.weight_decay)
            new_grads = self.hyper_map(update, self.param_layer, self.step_decay_flags, params, directions)
            if self.use_nesterov:  # ApplyMomentum ignores use_nesterov on CPU: the formula, written out
                success = self.hyper_map(ops.partial(kernels.nesterov_apply, lr, momentum), params, moments,
                                         new_grads)
            else:
                success = self.hyper_map(ops.partial(kernels.momentum_apply, self.apply_momentum, lr, momentum),
                                         params, moments, new_grads)
        elif self.use_nesterov:  # clipped updates: zeroed (where not finite) inside each parameter's momentum call
            success = self.hyper_map(ops.partial(kernels.nesterov_step, lr, momentum, finite), params, moments,
                                     new_grads)
        else:
            success = self.hyper_map(ops.partial(kernels.momentum_step, self.apply_momentum, lr, momentum, finite),
                                     params, moments, new_grads)
        skipped = ops.logical_not(finite)
        # the next step captures on schedule; after a skipped one it captures statistics again (they show where
        # inf/NaN appear) and refreshes the inverses (a corrupted inverse would otherwise be reused)
        capture = ops.logical_or(skipped, _REDUCE_ALL(((step + 1) % self.frequency) == 0, ()))
        success = ops.depend(success, self.hyper_map(ops.partial(kernels.set_flag, capture), self.capture_flags))
        success = ops.depend(success, self.assignadd(self.global_step,
                                                     self.global_step_increase_tensor * ops.cast(finite, ms.int32)))
        success = ops.depend(success, ops.assign(self.refresh_next, ops.logical_or(self.refresh_next, skipped)))
        bad = self._first_bad_layer(summary_finite).reshape(1)
        # where, not a product with the mask: a NaN nu of a skipped step times 0 stays NaN
        keep = ops.where(finite, self._keep_on_success, self._keep_on_skip)
        kept = ops.where(keep > 0.5, self.step_health, 0.0)
        new = ops.concat((ops.cast(skipped, ms.float32).reshape(1), nu.reshape(1).astype(ms.float32),
                          ops.where(finite, ops.zeros((1,), ms.float32), bad),
                          ops.cast(skipped, ms.float32).reshape(1)))
        done = ops.depend(finite, success)
        return ops.depend(done, ops.assign(self.step_health, (kept + new).astype(ms.float32)))

    def directions(self, gradients):
        """Per parameter: its THOR-preconditioned direction (parameters of THOR layers) or its gradient.

        The products take a factor's written-out inverse only where the host checked it against its blocks before
        the step (``use_dense_inverses``), else the blocks.
        """
        layer_dense = self.layer_dense if self.use_dense_inverses else self._blocks_only
        preconditioned = kernels.MAP(ops.partial(kernels.precondition, gradients, self.dense_inverses),
                                     self.layer_embedding, self.weight_index, self.bias_index, self.layer_groups,
                                     self.g_dims, layer_dense, self.a_inverses, self.g_inverses)
        return self.hyper_map(ops.partial(kernels.pick_direction, preconditioned, gradients), self.param_layer,
                              self.param_slot, self.param_position)

    def _first_bad_layer(self, summary_finite):
        """Index (float) of the first THOR layer whose update holds inf/NaN; -1 if none does.

        ``summary_finite``: per parameter whether its scalar summary is finite (the summary is non-finite when the
        preconditioned direction is): one reduction, not a finite test per layer.
        """
        if self.n_layers == 0:
            return ops.zeros((), ms.float32) - 1.0
        index = ops.where(summary_finite, self._n_layers_float, self._param_layer_numbers)
        first = _REDUCE_MIN(index, ())
        return ops.where(first >= self._n_layers_float, ops.zeros((), ms.float32) - 1.0, first)

    def _dense_source(self, k: int) -> Parameter:
        """The block inverse written out by ``dense_inverses[k]``."""
        layer = self.dense_layer[k]
        return self.a_inverses[layer] if self.dense_slot[k] == 0 else self.g_inverses[layer]

    def sync_dense_inverses(self) -> bool:
        """Before a step the host prepares: rewrite the written-out inverses from their blocks if either was replaced.

        The refresh rewrites them on the device after the blocks; what else replaces a block inverse is a checkpoint
        loaded by ``set_data`` (``mindspore.load_param_into_net``), which leaves the copies as they were when the
        checkpoint predates them. A replaced Parameter has new memory, so the check compares addresses (no device
        read: about 0.4 us per Parameter); on a change every copy is written again from its block inverse on the host
        (:func:`written_out_inverse`, exact), in place. A false alarm costs that rewrite and nothing else.

        Returns:
            Whether the copies were rewritten.
        """
        if not self._dense_watched:
            return False
        key = tuple(p.data_ptr() for p in self._dense_watched)
        if key == self._dense_key:
            return False
        for k, dense in enumerate(self.dense_inverses):
            ops.assign(dense, Tensor(written_out_inverse(self._dense_source(k).asnumpy(), self.dense_dims[k])))
        object.__setattr__(self, "_dense_key", tuple(p.data_ptr() for p in self._dense_watched))
        object.__setattr__(self, "_dense_pins", tuple(Tensor(p) for p in self._dense_watched))
        _log.info("thor: block inverses replaced since the last step (a loaded checkpoint?): their %d written-out "
                  "copies rewritten from them", len(self.dense_inverses))
        return True

    # ------------------------------------------------------------------ health
    def health(self) -> dict:
        """THOR's robustness counters (host copies): see docs/thor.md "Robustness".

        Returns:
            dict with ``eigen_fallback_blocks``, ``rejected_inverses``, ``rejected_refreshes`` (per layer path),
            ``skipped_steps``, ``last_nu``, ``last_bad_layer`` (path or None), ``consecutive_skips``; with the
            adaptive refresh also ``stable_refreshes`` (per layer path: refreshes that kept its inverses).
        """
        refresh = self.refresh_health.asnumpy()
        step = self.step_health.asnumpy()
        bad = int(step[2])
        out = {"eigen_fallback_blocks": int(refresh[0]), "rejected_inverses": int(refresh[1]),
               "rejected_refreshes": {p: int(c) for p, c in zip(self.layer_paths, refresh[2:])},
               "skipped_steps": int(step[0]), "last_nu": float(step[1]),
               "last_bad_layer": self.layer_paths[bad] if 0 <= bad < self.n_layers else None,
               "consecutive_skips": int(step[3])}
        if self.refresh_threshold > 0.0:
            out["stable_refreshes"] = {p: int(c) for p, c in zip(self.layer_paths, self.stable_refreshes.asnumpy())}
        return out

    def request_capture(self) -> None:
        """Make every THOR layer capture its statistics at the next step (diagnostics; changes no update).

        The flags are written in place (``set_data`` would give them new memory, and the compiled PyNative step
        would be compiled again at the next step).
        """
        for flag in self.capture_flags:
            ops.assign(flag, Tensor(True, ms.bool_))
        self._capture_gate.clear()

    def __call__(self, *args, **kwargs):
        """Run the step; in PyNative mode as one compiled graph.

        PyNative: the step is called in Graph mode, the mode restored afterwards, instead of hundreds of small
        per-layer operations, and without host round-trips (the refresh and skip decisions are taken on the
        device). A compiled graph keeps writing to the memory
        its Parameters had when it was compiled, so it is compiled again when a Parameter's data was replaced
        (``set_data``, e.g. a loaded checkpoint). Not when the collectives of a multi-rank run come from a
        stand-in backend (``comm.use_backend``, a test's loopback world), which runs only op by op. Either way
        the step rewrites the capture flags, so the layers' :class:`~ms_boost.thor.layers.CaptureGate` reads
        them again at the next forward pass. Before the step the written-out inverses are checked against their
        blocks (:meth:`sync_dense_inverses`), so this step may multiply by them.
        """
        self._warn_if_no_layer_ran()
        self.sync_dense_inverses()
        checked = self.use_dense_inverses
        self.use_dense_inverses = True
        try:
            if (self.compile_pynative_step and len(args) == 1 and not kwargs
                    and ms.get_context("mode") == ms.PYNATIVE_MODE):
                key = tuple(p.data_ptr() for p in self._step_state)
                if key != self._compiled_key:
                    object.__setattr__(self, "_compiled", _CompiledStep(self))
                    self._compiled_key = key
                ms.set_context(mode=ms.GRAPH_MODE)
                try:
                    # the gradients as separate inputs: a tuple input of a Graph-mode Cell is a constant,
                    # compiled anew for every new value
                    return self._compiled(*args[0])
                finally:
                    ms.set_context(mode=ms.PYNATIVE_MODE)
            return super().__call__(*args, **kwargs)
        finally:
            self.use_dense_inverses = checked
            self._capture_gate.clear()

    def _warn_if_no_layer_ran(self) -> None:
        """Warn, once, when a PyNative step comes without a forward pass through this optimizer's THOR layers.

        In PyNative mode every THOR layer asks the capture gate for its flag in each forward pass (capturing or not),
        and each step clears the gate: a gate not asked since the last step means the gradients came from a network
        that does not call the THOR layers -- the functional loop of MindSpore's tutorials over the user's ``net``
        (``thor(net)`` converts a copy, :attr:`thor_network`). THOR would then precondition with factors that never
        change. Not an error: a forward pass compiled with ``ms.jit`` runs the layers without asking the gate (they
        test their flag on the device). Graph mode never uses the gate, so nothing can be told there.
        """
        if (self._warned_no_layer or self.n_layers == 0 or self._capture_gate.values is not None
                or ms.get_context("mode") != ms.PYNATIVE_MODE):
            return
        self._warned_no_layer = True
        warnings.warn(
            "ms_boost: THOR step without a forward pass through its THOR layers: no layer captured a statistic, so "
            "this step (and every later one) preconditions with factors that never change. thor(net, ...) converts a "
            "copy of net (optimizer.thor_network, sharing net's Parameters); compute the loss and gradients with it "
            "(e.g. ms.value_and_grad over a forward function that calls optimizer.thor_network), or train with "
            "ms_boost.Model. (A forward pass compiled with ms.jit runs the layers without this check: then ignore "
            "this.)", UserWarning, stacklevel=3)

    def training_guard(self):
        """A new :class:`ThorGuard` callback for this optimizer (``ms_boost.Model.train`` adds it)."""
        return ThorGuard(self)


class _CompiledStep(nn.Cell):
    """A THOR step as a top-level Graph-mode Cell (PyNative mode calls it, see ``THOR.__call__``)."""

    def __init__(self, optimizer: THOR):
        super().__init__(auto_prefix=False)
        self.optimizer = optimizer

    def construct(self, *gradients):
        return self.optimizer(gradients)


_CALL_DEPTH = {"raised_to": 0}


def _ensure_call_depth(n_layers: int) -> None:
    """Raise MindSpore's graph call-depth limit for THOR's layers.

    ``mindspore.set_recursion_limit`` (default 1000): THOR's per-layer refresh and preconditioning unroll into
    nested calls in Graph mode (about 10 levels per layer). Only ever raised, never lowered below a value
    ms_boost set before; logged once per change.
    """
    needed = 1000 + 40 * max(0, n_layers - 12)  # the guarded refresh unrolls more per-layer loops
    if needed > max(1000, _CALL_DEPTH["raised_to"]):
        ms.set_recursion_limit(needed)
        _CALL_DEPTH["raised_to"] = needed
        logger.info(f"thor: {n_layers} THOR layers; graph call-depth limit raised to {needed} "
                    "(mindspore.set_recursion_limit).")


def _unique(params: list) -> list:
    seen, out = set(), []
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out

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
from typing import Callable, Optional, Sequence

import mindspore as ms
import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops
from mindspore import log as logger
from mindspore.nn.learning_rate_schedule import LearningRateSchedule
from mindspore.train.callback import Callback

from ms_boost import comm
from ms_boost.flat_buffers import flatten_tensors
from ms_boost.thor import math as thor_math
from ms_boost.thor.layers import CaptureGate, ThorLayer, thor_state_parameters
from ms_boost.topology import Topology
from ms_boost.update import StageHooks

_log = logging.getLogger("ms_boost")

__all__ = ["THOR", "ThorGuard", "ThorNonFiniteError", "DEFAULT_KL_CLIP"]


#: Default trust-region bound :math:`c` of :func:`ms_boost.thor.math.trust_region_scale` (see docs/thor.md for
#: the measurement behind it).
DEFAULT_KL_CLIP = 1e-3
#: Default number of consecutive non-finite losses / skipped steps after which training stops.
DEFAULT_MAX_NONFINITE_STEPS = 10


class ThorNonFiniteError(RuntimeError):
    """Training stopped: the loss (or THOR's update) stayed non-finite for too many consecutive steps."""


def _check_kl_clip(value) -> float:
    """``kl_clip``: None or 0 switch the trust region off (returned as 0.0); else a finite float > 0."""
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not np.isfinite(value) or value < 0:
        raise ValueError(f"thor: kl_clip={value!r} must be None, 0 (trust region off) or a finite float > 0.")
    return float(value)


def _identity_blocks(shape) -> np.ndarray:
    """Identity blocks of ``(groups, n_b, b, b)`` (or ones for a diagonal ``(d,)`` inverse)."""
    if len(shape) == 1:
        return np.ones(shape, np.float32)
    return np.broadcast_to(np.eye(shape[-1], dtype=np.float32), shape).copy()


def _default_decay_filter(param) -> bool:
    """Upstream's default: weight decay on every parameter."""
    return True


class _DampingSchedule(nn.Cell):
    """Damping :math:`\\lambda_t` of step ``t``: constant, per-step array (last value after its end) or schedule.

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
        if isinstance(damping, bool):
            raise TypeError(f"thor: damping={damping!r} must be a float, a per-step array or a LearningRateSchedule.")
        if isinstance(damping, numbers.Real):
            values = np.array([float(damping)], np.float32)
        elif isinstance(damping, (Tensor, np.ndarray, list, tuple)):
            values = (damping.asnumpy() if isinstance(damping, Tensor) else np.asarray(damping)).astype(np.float32)
            values = values.reshape(-1)
        else:
            raise TypeError(f"thor: damping of type {type(damping).__name__} must be a float, a per-step array "
                            f"or a LearningRateSchedule.")
        if values.size == 0 or not np.all(np.isfinite(values)) or np.any(values <= 0):
            raise ValueError(f"thor: damping={damping!r} must hold finite values > 0.")
        self.values = Parameter(Tensor(values), name="thor_damping_values", requires_grad=False)
        self.last = values.size - 1

    def construct(self, step):
        if self.schedule is not None:
            return self.schedule(step).reshape(()).astype(ms.float32)
        index = ops.minimum(step.reshape(()), self.last)
        return ops.gather(self.values, index, 0)


def _check_number(name: str, value, low: float, low_inclusive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"thor: {name}={value!r} must be a float.")
    ok = value >= low if low_inclusive else value > low
    if not ok or not np.isfinite(value):
        raise ValueError(f"thor: {name}={value!r} must be {'>=' if low_inclusive else '>'} {low}.")
    return float(value)


def _check_bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"thor: {name}={value!r} must be a bool.")
    return value


def _split_groups(split_indices, n_layers: int) -> list:
    """Layer groups whose factors are all-reduced together: boundaries after each index of ``split_indices``.

    Indices at or past the last layer end the last group (the upstream ResNet-50 value ``[26, 53]`` works
    for smaller nets too).
    """
    if split_indices is None:
        return [list(range(n_layers))] if n_layers else []
    if isinstance(split_indices, (str, bytes)) or not isinstance(split_indices, Sequence):
        raise TypeError(f"thor: split_indices={split_indices!r} must be a list of ints or None.")
    bounds = []
    for index in split_indices:
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ValueError(f"thor: split_indices={list(split_indices)!r} must hold non-negative ints.")
        if bounds and index <= bounds[-1]:
            raise ValueError(f"thor: split_indices={list(split_indices)!r} must be strictly increasing.")
        bounds.append(index)
    groups, start = [], 0
    for bound in bounds:
        end = min(bound, n_layers - 1)
        if end >= start:
            groups.append(list(range(start, end + 1)))
            start = end + 1
    if start < n_layers:
        groups.append(list(range(start, n_layers)))
    return groups


def _balance(costs: Sequence[float], size: int) -> list:
    """Owner rank of each job: largest job first to the least loaded rank (ties: lowest rank)."""
    load = [0.0] * size
    owner = [0] * len(costs)
    for job in sorted(range(len(costs)), key=lambda j: (-costs[j], j)):
        rank = min(range(size), key=lambda r: (load[r], r))
        owner[job] = rank
        load[rank] += costs[job]
    return owner


class THOR(nn.Optimizer, StageHooks):
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
        block_size: factors larger than this are split into diagonal blocks of this size.
        distribute_inverses: on several ranks, invert each factor on one rank and broadcast (else every
            rank inverts everything).
        kl_clip: trust region :math:`c`: every preconditioned update is scaled by
            :math:`\nu = \min(1, \sqrt{c / (\eta^2 \sum_l \langle F_l^{-1} g_l, g_l\rangle)})`
            (:func:`~ms_boost.thor.math.trust_region_scale`); None or 0 switch it off.
        pi_damping: split the damping between :math:`A` and :math:`G` by their traces
            (:func:`~ms_boost.thor.math.pi_damping`) instead of :math:`\sqrt\lambda` on each.
        max_nonfinite_steps: :class:`ThorGuard` stops training after this many consecutive steps with a
            non-finite loss or a skipped update (0: never).
    """

    def __init__(self, net: nn.Cell, learning_rate, damping, momentum, weight_decay=0.0, loss_scale=1.0,
                 batch_size: int = 32, use_nesterov: bool = False, decay_filter: Optional[Callable] = None,
                 split_indices=None, enable_clip_grad: bool = False, frequency: int = 100, *,
                 params=None, block_size: int = 128, distribute_inverses: bool = True,
                 kl_clip: Optional[float] = DEFAULT_KL_CLIP, pi_damping: bool = False,
                 max_nonfinite_steps: int = DEFAULT_MAX_NONFINITE_STEPS):
        if not isinstance(net, nn.Cell):
            raise TypeError(f"thor: net must be a mindspore.nn.Cell, got {type(net).__name__}.")
        if params is None:
            params = [p for p in net.get_parameters() if p.requires_grad]
        params = list(params)
        super().__init__(learning_rate, params, 0.0, loss_scale)
        momentum = _check_number("momentum", momentum, 0.0)
        weight_decay = _check_number("weight_decay", weight_decay, 0.0)
        if isinstance(frequency, bool) or not isinstance(frequency, int) or frequency < 1:
            raise ValueError(f"thor: frequency={frequency!r} must be an int >= 1.")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"thor: batch_size={batch_size!r} must be a positive int.")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"thor: block_size={block_size!r} must be a positive int.")
        decay_filter = _default_decay_filter if decay_filter is None else decay_filter
        if not callable(decay_filter):
            raise TypeError(f"thor: decay_filter={decay_filter!r} must be callable.")
        self.kl_clip = _check_kl_clip(kl_clip)
        self.pi_damping = _check_bool("pi_damping", pi_damping)
        if isinstance(max_nonfinite_steps, bool) or not isinstance(max_nonfinite_steps, int) or max_nonfinite_steps < 0:
            raise ValueError(f"thor: max_nonfinite_steps={max_nonfinite_steps!r} must be an int >= 0 (0: never stop).")
        self.max_nonfinite_steps = max_nonfinite_steps
        self.use_nesterov = _check_bool("use_nesterov", use_nesterov)
        self.enable_clip_grad = _check_bool("enable_clip_grad", enable_clip_grad)
        self.frequency = frequency
        self.batch_size = batch_size
        self.block_size = block_size
        self.weight_decay = weight_decay
        self.decay_flags = tuple(bool(decay_filter(p)) for p in self._parameters)
        self.momentum = Parameter(Tensor(momentum, ms.float32), name="momentum", requires_grad=False)
        self.moments = self._parameters.clone(prefix="moments", init="zeros")
        self.apply_momentum = ops.ApplyMomentum()
        self.damping = _DampingSchedule(damping)
        object.__setattr__(self, "_thor_network", net)

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
        self._keep_on_success = Tensor(np.array([1.0, 0.0, 1.0, 0.0], np.float32))
        self._keep_on_skip = Tensor(np.array([1.0, 0.0, 0.0, 1.0], np.float32))
        self._setup_distribution(split_indices, distribute_inverses)
        self.compile_pynative_step = not self.distributed or not comm.uses_stand_in_backend()
        self._step_state = tuple(_unique(list(self.get_parameters()) + list(self._parameters)))
        self._compiled_key = None

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
        kinds, w_index, b_index, trims, groups_of, g_dims, decays, slots = [], [], [], [], [], [], [], []
        a_inv, g_inv, flags, a_batch, g_batch, a_fac, g_fac, costs = [], [], [], [], [], [], [], []
        for li, (layer, path) in enumerate(zip(layers, paths)):
            weight = layer.embedding_table if layer.kind == "embedding" else layer.weight
            source[index_of[id(weight)]] = (li, 0)
            bias = getattr(layer, "bias", None)
            joint = bool(layer.bias_in_factor and bias is not None and id(bias) in index_of)
            if joint:
                source[index_of[id(bias)]] = (li, 1)
            # a bias captured in A but not trained: its row/column is dropped from A before inverting
            trim_a = bool(layer.bias_in_factor and not joint)
            groups = layer.groups
            if layer.kind == "embedding":
                a_inv_shape = layer.a_shape
                costs.append(float(layer.a_shape[0]))
            else:
                nb, b = thor_math.block_layout(layer.a_shape[-1] - int(trim_a), self.block_size)
                a_inv_shape = (groups, nb, b, b)
                costs.append(float(groups * nb * b ** 3))
            nb, b = thor_math.block_layout(layer.g_shape[-1], self.block_size)
            costs.append(float(groups * nb * b ** 3))
            kinds.append(layer.kind)
            w_index.append(index_of[id(weight)])
            b_index.append(index_of[id(bias)] if joint else -1)
            trims.append(trim_a)
            groups_of.append(groups)
            g_dims.append(layer.g_shape[-1])
            decays.append(layer.factor_decay)
            # identity until the first good refresh (a layer whose first factors are non-finite gets its gradient)
            a_inv.append(Parameter(Tensor(_identity_blocks(a_inv_shape)), name=f"thor_a_inverse.{path}",
                                   requires_grad=False))
            g_inv.append(Parameter(Tensor(_identity_blocks((groups, nb, b, b))),
                                   name=f"thor_g_inverse.{path}", requires_grad=False))
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
        self.trim_a = tuple(trims)
        self.layer_groups = tuple(groups_of)
        self.g_dims = tuple(g_dims)
        self.factor_decay = tuple(decays)
        self.factor_slot = tuple(slots)  # index into a_factors / g_factors, -1 without running average
        self.inverse_costs = tuple(costs)  # job 2i: A of layer i, 2i+1: G of layer i
        self.a_inverses = ParameterTuple(a_inv)
        self.g_inverses = ParameterTuple(g_inv)
        self.capture_flags = ParameterTuple(_unique(flags))
        self.a_batches = ParameterTuple(a_batch)
        self.g_batches = ParameterTuple(g_batch)
        self.a_factors = ParameterTuple(a_fac)
        self.g_factors = ParameterTuple(g_fac)
        gate = CaptureGate(self.capture_flags)
        object.__setattr__(self, "_capture_gate", gate)
        for layer in layers:
            layer.set_capture_gate(gate)

    def _setup_distribution(self, split_indices, distribute_inverses: bool) -> None:
        """Static layout of the factor all-reduces (fused per ``split_indices`` group) and inverse broadcasts.

        Factor job ``2i`` is the input factor of layer ``i``, ``2i+1`` its output factor.
        """
        self.split_indices = split_indices
        groups = _split_groups(split_indices, self.n_layers)
        _check_bool("distribute_inverses", distribute_inverses)
        reduce = Topology.current().data_parallel
        self.distributed = bool(reduce)
        self.rank = comm.get_rank() if self.distributed else 0
        size = comm.get_size() if self.distributed else 1
        shapes, inv_shapes = [], []
        for i, layer in enumerate(self._thor_layers):
            shapes += [layer.a_shape, layer.g_shape]
            inv_shapes += [tuple(self.a_inverses[i].shape), tuple(self.g_inverses[i].shape)]
        costs = self.inverse_costs
        self.factor_shapes = tuple(shapes)
        self.factor_sizes = tuple(int(np.prod(s)) for s in shapes)
        self.inverse_shapes = tuple(inv_shapes)
        self.inverse_sizes = tuple(int(np.prod(s)) for s in inv_shapes)
        n_jobs = len(shapes)
        # all-reduce of the factors (not of the inverses), one fused buffer per group
        reduce_jobs, reduce_slot = [], [(-1, 0)] * n_jobs
        if self.distributed:
            for k, group in enumerate(groups):
                jobs, offset = [], 0
                for i in group:
                    for j in (2 * i, 2 * i + 1):
                        jobs.append(j)
                        reduce_slot[j] = (k, offset)
                        offset += self.factor_sizes[j]
                reduce_jobs.append(tuple(jobs))
        self.reduce_jobs = tuple(reduce_jobs)
        self.reduce_slot = tuple(reduce_slot)
        self.factor_reducers = nn.CellList([comm.AllReduce("mean") for _ in reduce_jobs])
        # inversion split across ranks, results broadcast from their owner (one fused buffer per owner)
        spread = self.distributed and distribute_inverses and size > 1
        owner = _balance(costs, size) if spread else [self.rank] * n_jobs
        self.inverse_owner = tuple(owner)
        broadcast_ranks = sorted(set(owner)) if spread else []
        broadcast_jobs, broadcast_sizes, broadcast_slot = [], [], [(-1, 0)] * n_jobs
        for k, root in enumerate(broadcast_ranks):
            jobs = tuple(j for j in range(n_jobs) if owner[j] == root)
            offset = 0
            for j in jobs:
                broadcast_slot[j] = (k, offset)
                offset += self.inverse_sizes[j]
            broadcast_jobs.append(jobs)
            broadcast_sizes.append(offset)
        self.broadcast_ranks = tuple(broadcast_ranks)
        self.broadcast_jobs = tuple(broadcast_jobs)
        self.broadcast_sizes = tuple(broadcast_sizes)
        self.broadcast_slot = tuple(broadcast_slot)
        self.broadcasters = nn.CellList([comm.Broadcast(root=r) for r in broadcast_ranks])
        self._setup_inverse_batches()

    def _setup_inverse_batches(self) -> None:
        """Static layout of the batched inversion: this rank's Kronecker jobs grouped by block size.

        All ``(b, b)`` blocks of every job of one size are inverted by one batched call (Cholesky or the
        eigen fallback) instead of one call per factor; per batch ``k``: its jobs and the layer of each block
        (to gather the layers' finiteness); per job: its record in :attr:`job_specs`, which holds its slot
        ``(k, first block, block count)`` in the batch.
        """
        by_size = {}
        for j in range(2 * self.n_layers):
            if self.inverse_owner[j] == self.rank and not self._is_diagonal(j):
                by_size.setdefault(self.inverse_shapes[j][-1], []).append(j)
        batches, slots, block_layer = [], [(-1, 0, 0)] * (2 * self.n_layers), []
        for k, size in enumerate(sorted(by_size)):
            jobs = tuple(by_size[size])
            offset, layer_of_block = 0, []
            for j in jobs:
                count = self.inverse_shapes[j][0] * self.inverse_shapes[j][1]
                slots[j] = (k, offset, count)
                layer_of_block += [j // 2] * count
                offset += count
            batches.append(jobs)
            block_layer.append(Tensor(np.array(layer_of_block, np.int32)))
        self.inverse_batches = tuple(batches)
        self.batch_block_layer = tuple(block_layer)
        self.batch_job_groups = tuple(tuple(self.layer_groups[j // 2] for j in jobs) for jobs in batches)
        self.batch_job_blocks = tuple(tuple(slots[j][2] // self.layer_groups[j // 2] for j in jobs) for jobs in batches)
        # per job: (mode: 0 another rank's / 1 diagonal / 2 Kronecker, layer, slot 0 A / 1 G, batch, first block,
        # block count, whole batch, inverse shape); the refresh maps over these instead of unrolling loops
        specs = []
        for j in range(2 * self.n_layers):
            k, first, count = slots[j]
            mode = 0 if self.inverse_owner[j] != self.rank else (1 if self._is_diagonal(j) else 2)
            whole = k >= 0 and len(batches[k]) == 1
            specs.append((mode, j // 2, j % 2, k, first, count, whole, tuple(self.inverse_shapes[j])))
        self.job_specs = tuple(specs)
        self.job_layer = tuple(j // 2 for j in range(2 * self.n_layers))
        self.job_slot = tuple(j % 2 for j in range(2 * self.n_layers))
        self.layer_embedding = tuple(kind == "embedding" for kind in self.layer_kind)
        # the new inverses are assigned inside the per-job map unless they first travel through a broadcast
        self.assign_in_map = not self.broadcast_ranks

    # ------------------------------------------------------------------ public helpers
    @property
    def thor_network(self) -> nn.Cell:
        """The network holding the THOR layers (the one to train)."""
        return self._thor_network

    @property
    def thor_layers(self) -> tuple:
        """The THOR layers this optimizer preconditions, in network order."""
        return self._thor_layers

    def get_frequency(self) -> int:
        """Refresh interval of factors and inverses (upstream API)."""
        return self.frequency

    def transient_parameters(self) -> list:
        """THOR's capture flags, scratch statistics and factors: folded in only by the optimizer step, so an
        overflow step (whose update is skipped) needs no snapshot/restore of them."""
        return thor_state_parameters(self._thor_network)

    def bind_loss_scale(self, loss_scale) -> None:
        """Divide captured output gradients by ``loss_scale`` (a Parameter read during the backward pass, e.g. a
        dynamic loss scale cell's ``scale_sense``, or a number). Call before the network is compiled."""
        if isinstance(loss_scale, numbers.Real) and not isinstance(loss_scale, bool):
            if not np.isfinite(loss_scale) or loss_scale <= 0:
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
        hyper_map = _MAP  # not HyperMap: it would map into the tuples these records are
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
            a_source = hyper_map(ops.partial(_pick, reduced), tuple(range(0, 2 * self.n_layers, 2)))
            g_source = hyper_map(ops.partial(_pick, reduced), tuple(range(1, 2 * self.n_layers, 2)))
        folds = hyper_map(ops.partial(_fold_layer, self.thor_initialised, self.a_factors, self.g_factors),
                          self.factor_slot, self.factor_decay, self.trim_a, a_source, g_source)
        token = ops.depend(token, hyper_map(_field_3, folds))
        layer_ok = hyper_map(_field_2, folds)
        ok_vector = ops.stack(layer_ok)
        folded = hyper_map(ops.partial(_job_field, folds), self.job_layer, self.job_slot)  # per job
        root = ops.sqrt(ops.cast(damping, ms.float32))
        shifts = ()
        if self.pi_damping:
            layer_shifts = hyper_map(ops.partial(_pi_shifts, root), self.layer_groups, folds)
            shifts = hyper_map(ops.partial(_job_field, layer_shifts), self.job_layer, self.job_slot)
        # this rank's Kronecker blocks, batched by block size; one Cholesky-or-eigen decision for all of them
        raw, block_bad = (), ()
        unsafe = ops.zeros((), ms.float32)
        if self.inverse_batches:
            prepared = hyper_map(ops.partial(_prepare_batch, folded, shifts, ok_vector, root, self.block_size,
                                             self.pi_damping),
                                 self.inverse_batches, self.batch_job_groups, self.batch_job_blocks,
                                 self.batch_block_layer)
            batch_blocks = hyper_map(_field_0, prepared)
            batch_shifts = hyper_map(_field_1, prepared)
            batch_ok = hyper_map(_field_2, prepared)
            unsafe = ops.addn(hyper_map(_field_3, prepared))
            if unsafe > 0.5:
                raw = hyper_map(_eigen_inverse, batch_blocks, batch_shifts)
            else:
                raw = hyper_map(_cholesky_inverse, batch_blocks, batch_shifts)
            # a block is bad when its layer's factors or its inverse are non-finite
            block_bad = hyper_map(_blocks_bad, batch_ok, raw)
        jobs = hyper_map(ops.partial(_job_inverse, folded, shifts, layer_ok, raw, block_bad, self.a_inverses,
                                     self.g_inverses, root, self.pi_damping, self.assign_in_map), self.job_specs)
        bad_inverses = ops.addn(hyper_map(_field_1, jobs))
        token = ops.depend(token, hyper_map(_field_2, jobs))
        if not self.assign_in_map:
            inverses = hyper_map(_field_0, jobs)
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
        return self._finish_refresh(token, unsafe, bad_inverses, ok_vector)

    def _finish_refresh(self, token, unsafe, bad_inverses, ok_vector):
        """Count the refresh's health events and mark the refresh done; returns the dependency token."""
        rejected = ops.cast(ops.logical_not(ok_vector), ms.float32)
        health = self.refresh_health + ops.concat((ops.stack([unsafe, bad_inverses]), rejected))
        token = ops.depend(token, ops.assign(self.refresh_health, ops.cast(health, ms.float32)))
        token = ops.depend(token, ops.assign(self.refresh_next, Tensor(False, ms.bool_)))
        return ops.depend(token, ops.assign(self.thor_initialised, Tensor(True, ms.bool_)))

    def _is_diagonal(self, job: int) -> bool:
        return job % 2 == 0 and self.layer_kind[job // 2] == "embedding"

    def _inverse_param(self, job: int):
        return self.a_inverses[job // 2] if job % 2 == 0 else self.g_inverses[job // 2]

    def construct(self, gradients):
        params = self._parameters
        moments = self.moments
        gradients = self.scale_grad(gradients)
        step = self.global_step
        refresh = ops.logical_or(ops.logical_or(ops.logical_not(self.thor_initialised), self.refresh_next),
                                 (step % self.frequency) == 0).all()
        if refresh:
            damping = self.damping(step)
            token = self._refresh(damping, gradients)
            gradients = ops.depend(gradients, token)
        lr = self.get_lr()
        # Per-parameter work is mapped with HyperMap over tuples: a Python loop over ResNet-50's 161
        # parameters unrolls into nested calls deeper than Graph mode's call-depth limit.
        preconditioned = _MAP(ops.partial(_precondition, gradients), self.layer_embedding,
                                        self.weight_index, self.bias_index, self.layer_groups, self.g_dims,
                                        self.a_inverses, self.g_inverses)
        # per parameter: its preconditioned direction (THOR layers) or its gradient, picked by a static map
        directions = self.hyper_map(ops.partial(_pick_direction, preconditioned, gradients), self.param_layer,
                                    self.param_slot, self.param_position)
        nu = ops.ones((), ms.float32)
        new_grads = directions  # before the trust region: a NaN nu would blame every layer
        if self.kl_clip > 0.0 and self.n_layers > 0:
            vg_sum = ops.addn(self.hyper_map(_preconditioned_dot, self.param_layer, directions, gradients))
            nu = thor_math.trust_region_scale(vg_sum, lr, self.kl_clip)
            new_grads = self.hyper_map(ops.partial(_scale_preconditioned, nu), self.param_layer, directions)
        if self.weight_decay > 0.0:
            new_grads = self.hyper_map(ops.partial(_decay, self.weight_decay), self.decay_flags, params, new_grads)
        if self.enable_clip_grad:
            new_grads = self.hyper_map(_clip_to_unit_norm, new_grads)
        # a non-finite update (gradient, preconditioned direction or nu) skips the whole step; one check
        # over all parameters at once (a per-parameter check costs four kernel launches per parameter)
        finite = thor_math.all_finite(flatten_tensors(new_grads))
        if finite:
            if self.use_nesterov:  # ApplyMomentum ignores use_nesterov on CPU: the formula, written out
                success = self.hyper_map(ops.partial(_nesterov_step, lr, self.momentum), params, moments, new_grads)
            else:
                success = self.hyper_map(ops.partial(_momentum_step, self.apply_momentum, lr, self.momentum),
                                         params, moments, new_grads)
            next_step = step + 1
            capture = ((next_step % self.frequency) == 0).all()
            success = ops.depend(success, self.hyper_map(ops.partial(_set_flag, capture), self.capture_flags))
            success = ops.depend(success, self.assignadd(self.global_step, self.global_step_increase_tensor))
            done = ops.depend(ops.ones((), ms.bool_), success)
            # where, not a product with the mask: a NaN nu of a skipped step times 0 stays NaN
            health = ops.where(self._keep_on_success > 0.5, self.step_health, 0.0) + ops.concat(
                (ops.zeros((1,), ms.float32), nu.reshape(1).astype(ms.float32), ops.zeros((2,), ms.float32)))
        else:
            # nothing moves; the next step captures statistics again (they show where inf/NaN appear) and
            # refreshes the inverses (a corrupted inverse would otherwise be reused until the next refresh)
            done = ops.depend(ops.zeros((), ms.bool_),
                              self.hyper_map(ops.partial(_set_flag, Tensor(True, ms.bool_)), self.capture_flags))
            done = ops.depend(done, ops.assign(self.refresh_next, Tensor(True, ms.bool_)))
            bad = self._first_bad_layer(directions).reshape(1)
            health = ops.where(self._keep_on_skip > 0.5, self.step_health, 0.0) + ops.concat(
                (ops.ones((1,), ms.float32), nu.reshape(1).astype(ms.float32), bad, ops.ones((1,), ms.float32)))
        return ops.depend(done, ops.assign(self.step_health, health.astype(ms.float32)))

    def _first_bad_layer(self, new_grads):
        """Index (float) of the first THOR layer whose update holds inf/NaN; -1 if none does."""
        first = ops.zeros((), ms.float32) - 1.0
        for i in range(self.n_layers - 1, -1, -1):
            bad = ops.logical_not(thor_math.all_finite(new_grads[self.weight_index[i]]))
            if self.bias_index[i] >= 0:
                bad = ops.logical_or(bad, ops.logical_not(thor_math.all_finite(new_grads[self.bias_index[i]])))
            first = ops.where(bad, ops.zeros((), ms.float32) + float(i), first)
        return first

    # ------------------------------------------------------------------ health
    def health(self) -> dict:
        """THOR's robustness counters (host copies): see docs/thor.md "Robustness".

        Returns:
            dict with ``eigen_fallback_blocks``, ``rejected_inverses``, ``rejected_refreshes`` (per layer path),
            ``skipped_steps``, ``last_nu``, ``last_bad_layer`` (path or None), ``consecutive_skips``.
        """
        refresh = self.refresh_health.asnumpy()
        step = self.step_health.asnumpy()
        bad = int(step[2])
        return {"eigen_fallback_blocks": int(refresh[0]), "rejected_inverses": int(refresh[1]),
                "rejected_refreshes": {p: int(c) for p, c in zip(self.layer_paths, refresh[2:])},
                "skipped_steps": int(step[0]), "last_nu": float(step[1]),
                "last_bad_layer": self.layer_paths[bad] if 0 <= bad < self.n_layers else None,
                "consecutive_skips": int(step[3])}

    def request_capture(self) -> None:
        """Make every THOR layer capture its statistics at the next step (diagnostics; changes no update).

        The flags are written in place (``set_data`` would give them new memory, and the compiled PyNative step
        would be compiled again at the next step)."""
        for flag in self.capture_flags:
            ops.assign(flag, Tensor(True, ms.bool_))
        self._capture_gate.clear()

    def __call__(self, *args, **kwargs):
        """PyNative: the whole step runs as one compiled graph -- the step called in Graph mode, the mode
        restored afterwards -- instead of hundreds of small per-layer operations, and without host round-trips
        (the refresh and skip decisions are taken on the device). A compiled graph keeps writing to the memory
        its Parameters had when it was compiled, so it is compiled again when a Parameter's data was replaced
        (``set_data``, e.g. a loaded checkpoint). Not when the collectives of a multi-rank run come from a
        stand-in backend (``comm.use_backend``, a test's loopback world), which runs only op by op. Either way
        the step rewrites the capture flags, so the layers' :class:`~ms_boost.thor.layers.CaptureGate` reads
        them again at the next forward pass."""
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
            self._capture_gate.clear()

    def training_guard(self):
        """A new :class:`ThorGuard` callback for this optimizer (``ms_boost.Model.train`` adds it)."""
        return ThorGuard(self)


class ThorGuard(Callback):
    """Watches a THOR run: logs rejected refreshes and eigen fallbacks; stops a run that stays non-finite.

    ``ms_boost.Model.train`` adds one automatically when the optimizer is THOR (so the tutorial's
    ``convert_to_thor_model(...).train(...)`` is guarded). After every step (every sink in sink mode):

    * a layer whose refresh kept the previous inverses (factors with inf/NaN) is logged once, by name;
      blocks inverted through the clamped eigendecomposition are logged too;
    * a step is *non-finite* when its loss holds inf/NaN or THOR skipped its update; the next step then
      captures statistics (they show where inf/NaN first appear);
    * after ``optimizer.max_nonfinite_steps`` consecutive non-finite steps (0: never) it raises
      :class:`ThorNonFiniteError` naming the step and the first layer (network order) whose weights,
      input statistics or output-gradient statistics hold inf/NaN.

    Args:
        optimizer: the :class:`THOR` optimizer.
    """

    def __init__(self, optimizer: THOR):
        super().__init__()
        self.optimizer = optimizer
        self.streak = 0
        self.first_step = None
        self._seen = None

    def on_train_begin(self, run_context):
        """Start from the optimizer's counters as they are: earlier skips or rejections are not this run's."""
        self._seen = self.optimizer.health()

    def on_train_step_end(self, run_context):
        args = run_context.original_args()
        step = int(getattr(args, "cur_step_num", 0))
        outputs = args.net_outputs
        loss = outputs[0] if isinstance(outputs, (tuple, list)) else outputs
        finite_loss = bool(np.isfinite(loss.asnumpy()).all()) if isinstance(loss, Tensor) else True
        health = self.optimizer.health()
        seen = self._seen or {"eigen_fallback_blocks": 0, "rejected_inverses": 0, "skipped_steps": 0,
                              "rejected_refreshes": dict.fromkeys(health["rejected_refreshes"], 0)}
        for path, count in health["rejected_refreshes"].items():
            if count > seen["rejected_refreshes"].get(path, 0):
                _log.warning("thor: step %d: layer %s: factors hold inf/NaN; its previous inverses are kept.",
                             step, path)
        if health["eigen_fallback_blocks"] > seen["eigen_fallback_blocks"]:
            _log.info("thor: step %d: %d factor blocks inverted through the clamped eigendecomposition "
                      "(damping small for their scale; %d so far).", step,
                      health["eigen_fallback_blocks"] - seen["eigen_fallback_blocks"], health["eigen_fallback_blocks"])
        if health["rejected_inverses"] > seen["rejected_inverses"]:
            _log.warning("thor: step %d: %d non-finite inverses discarded (previous ones kept).", step,
                         health["rejected_inverses"] - seen["rejected_inverses"])
        skipped = health["skipped_steps"] > seen["skipped_steps"]
        self._seen = health
        if finite_loss and not skipped:
            self.streak, self.first_step = 0, None
            return
        if skipped:
            _log.warning("thor: step %d: non-finite update (first layer: %s); step skipped.", step,
                         health["last_bad_layer"])
        self.streak += 1
        self.first_step = step if self.first_step is None else self.first_step
        self.optimizer.request_capture()
        limit = self.optimizer.max_nonfinite_steps
        if limit and self.streak >= limit:
            run_context.request_stop()
            what = "loss" if not finite_loss else "THOR update"
            raise ThorNonFiniteError(
                f"thor: the {what} was non-finite for {self.streak} consecutive steps (steps {self.first_step}.."
                f"{step}); training stopped at step {step}. First layer with non-finite values: "
                f"{self.locate()}. Lower the learning rate, raise the damping or check the data.")

    def locate(self) -> str:
        """The first THOR layer (network order) whose weights or captured statistics hold inf/NaN, described."""
        opt = self.optimizer
        for path, layer in zip(opt.layer_paths, opt.thor_layers):
            checks = [("weight", layer.embedding_table if layer.kind == "embedding" else layer.weight)]
            if getattr(layer, "bias", None) is not None:
                checks.append(("bias", layer.bias))
            checks += [("input statistics (its forward input)", layer.matrix_a_batch),
                       ("output-gradient statistics (its backward input)", layer.matrix_g_batch)]
            for what, param in checks:
                if not np.isfinite(param.asnumpy()).all():
                    return f"{path} ({what})"
        bad = opt.health()["last_bad_layer"]
        if bad is not None:
            return f"{bad} (preconditioned update)"
        return "none of the THOR layers' weights or statistics (the loss itself is non-finite: check the inputs)"


class _CompiledStep(nn.Cell):
    """A THOR step as a top-level Graph-mode Cell (PyNative mode calls it, see ``THOR.__call__``)."""

    def __init__(self, optimizer: THOR):
        super().__init__(auto_prefix=False)
        self.optimizer = optimizer

    def construct(self, *gradients):
        return self.optimizer(gradients)


_CALL_DEPTH = {"raised_to": 0}


def _ensure_call_depth(n_layers: int) -> None:
    """Raise MindSpore's graph call-depth limit (``mindspore.set_recursion_limit``, default 1000) for THOR's
    per-layer refresh and preconditioning, which Graph mode unrolls into nested calls (about 10 levels per
    layer). Only ever raised, never lowered below a value ms_boost set before; logged once per change."""
    needed = 1000 + 40 * max(0, n_layers - 12)  # the guarded refresh unrolls more per-layer loops
    if needed > max(1000, _CALL_DEPTH["raised_to"]):
        ms.set_recursion_limit(needed)
        _CALL_DEPTH["raised_to"] = needed
        logger.info(f"thor: {n_layers} THOR layers; graph call-depth limit raised to {needed} "
                    "(mindspore.set_recursion_limit).")


def _dot(x, y):
    """``sum(x * y)`` as one ``(1, n) @ (n, 1)`` product (float32), shaped ``(1, 1)``."""
    # unconditional casts (a no-op cast is removed when compiling): an ``if dtype`` per parameter cost a branch each
    x = ops.cast(x, ms.float32)
    y = ops.cast(y, ms.float32)
    return ops.matmul(x.reshape(1, -1), y.reshape(-1, 1))


_REDUCE_SUM = ops.ReduceSum(keep_dims=False)
_decay = ops.MultitypeFuncGraph("thor_decay")
_clip_to_unit_norm = ops.MultitypeFuncGraph("thor_clip")
_momentum_step = ops.MultitypeFuncGraph("thor_momentum")
_nesterov_step = ops.MultitypeFuncGraph("thor_nesterov")
_set_flag = ops.MultitypeFuncGraph("thor_set_flag")
_pick_direction = ops.MultitypeFuncGraph("thor_pick_direction")
_preconditioned_dot = ops.MultitypeFuncGraph("thor_preconditioned_dot")
_scale_preconditioned = ops.MultitypeFuncGraph("thor_scale_preconditioned")


_pick = ops.MultitypeFuncGraph("thor_pick")
_field_0 = ops.MultitypeFuncGraph("thor_field_0")
_field_1 = ops.MultitypeFuncGraph("thor_field_1")
_field_2 = ops.MultitypeFuncGraph("thor_field_2")
_field_3 = ops.MultitypeFuncGraph("thor_field_3")
_job_field = ops.MultitypeFuncGraph("thor_job_field")
_fold_layer = ops.MultitypeFuncGraph("thor_fold_layer")
_pi_shifts = ops.MultitypeFuncGraph("thor_pi_shifts")
_job_tiles = ops.MultitypeFuncGraph("thor_job_tiles")
_job_shift = ops.MultitypeFuncGraph("thor_job_shift")
_prepare_batch = ops.MultitypeFuncGraph("thor_prepare_batch")
_cholesky_inverse = ops.MultitypeFuncGraph("thor_cholesky_inverse")
_eigen_inverse = ops.MultitypeFuncGraph("thor_eigen_inverse")
_blocks_bad = ops.MultitypeFuncGraph("thor_blocks_bad")
_job_inverse = ops.MultitypeFuncGraph("thor_job_inverse")
_precondition = ops.MultitypeFuncGraph("thor_precondition")
_MAP = ops.Map()
_CONCAT = ops.Concat(0)


@_pick.register("Tuple", "Number")
def _pick_tuple(values, index):
    """``values[index]`` (mapped over indices)."""
    return values[index]


# One extractor per field, not ``ops.partial(field, index)``: mapping such a partial over a tuple of records gave
# wrong values in MindSpore 2.10 Graph mode.
@_field_0.register("Tuple")
def _field_0_tuple(record):
    return record[0]


@_field_1.register("Tuple")
def _field_1_tuple(record):
    return record[1]


@_field_2.register("Tuple")
def _field_2_tuple(record):
    return record[2]


@_field_3.register("Tuple")
def _field_3_tuple(record):
    return record[3]


@_job_field.register("Tuple", "Number", "Number")
def _job_field_tuple(per_layer, layer, slot):
    """Field ``slot`` (0: input factor A, 1: output factor G) of layer ``layer``'s record."""
    return per_layer[layer][slot]


@_fold_layer.register("Tensor", "Tuple", "Tuple", "Number", "Number", "Bool", "Tensor", "Tensor")
def _fold_layer_tensor(initialised, a_factors, g_factors, slot, decay, trim, a, g):
    """One layer's captured factors made ready to invert -> ``(A, G, finite, token)``.

    Folds them into the running averages (``slot >= 0``; a non-finite capture leaves the averages as they
    were), replaces a non-finite diagonal A by ones (a finite stand-in whose inverse is discarded) and drops
    the row/column of a bias captured in A but not trained (``trim``).
    """
    token = ops.zeros((), ms.float32)
    if slot >= 0:
        a = thor_math.running_average(a_factors[slot], a, decay, initialised)
        g = thor_math.running_average(g_factors[slot], g, decay, initialised)
    ok = ops.logical_and(thor_math.all_finite(a), thor_math.all_finite(g))
    if slot >= 0:  # a non-finite capture must not poison the running average
        token = ops.depend(token, ops.assign(a_factors[slot], ops.where(ok, a, a_factors[slot])))
        token = ops.depend(token, ops.assign(g_factors[slot], ops.where(ok, g, g_factors[slot])))
    if a.ndim == 1:
        a = ops.where(ok, a, ops.ones_like(a))
    elif trim:
        size = a.shape[-1] - 1
        a = thor_math.narrow(thor_math.narrow(a, 1, 0, size), 2, 0, size)
    return a, g, ok, token


@_pi_shifts.register("Tensor", "Number", "Tuple")
def _pi_shifts_tuple(root, groups, fold):
    r"""``(groups,)`` shifts :math:`(\pi\sqrt\lambda, \sqrt\lambda/\pi)` of one layer's A and G (pi = 1 if rejected)."""
    pi = ops.where(fold[2], thor_math.pi_damping(fold[0], fold[1]), 1.0)
    pi = ops.BroadcastTo((groups,))(pi.reshape(-1))
    return root * pi, root / pi


@_job_tiles.register("Tuple", "Number", "Number")
def _job_tiles_tuple(folded, block_size, job):
    """The diagonal blocks of job ``job``'s factor as ``(groups * n_b, b, b)`` (not yet symmetrised)."""
    tiles = thor_math.diagonal_tiles(ops.cast(folded[job], ms.float32), block_size)
    return tiles.reshape(-1, tiles.shape[-1], tiles.shape[-1])


@_job_shift.register("Tuple", "Number", "Number", "Number")
def _job_shift_tuple(shifts, job, groups, blocks):
    """Job ``job``'s ``(groups,)`` shift repeated for each of its ``blocks`` blocks per group."""
    return ops.BroadcastTo((groups, blocks))(shifts[job].reshape(-1, 1)).reshape(-1)


@_prepare_batch.register("Tuple", "Tuple", "Tensor", "Tensor", "Number", "Bool", "Tuple", "Tuple", "Tuple",
                         "Tensor")
def _prepare_batch_tuple(folded, shifts, ok_vector, root, block_size, use_pi, jobs, groups, blocks, block_layer):
    """One batch of same-size blocks -> ``(blocks, shifts, block finite, unsafe count)``.

    The blocks of the batch's jobs, symmetrised; identity stand-ins for the blocks of rejected layers keep
    the inversion finite (their inverses are discarded).
    """
    parts = _MAP(ops.partial(_job_tiles, folded, block_size), jobs)
    batch = thor_math.symmetrise(parts[0] if len(parts) == 1 else _CONCAT(parts))
    block_ok = ops.gather(ok_vector, block_layer, 0)
    size = batch.shape[-1]
    eye = ops.BroadcastTo(batch.shape)(ops.Eye()(size, size, ms.float32))
    batch = ops.where(block_ok.reshape(-1, 1, 1), batch, eye)
    if use_pi:
        shift_parts = _MAP(ops.partial(_job_shift, shifts), jobs, groups, blocks)
        shift = shift_parts[0] if len(shift_parts) == 1 else _CONCAT(shift_parts)
    else:
        shift = ops.BroadcastTo((batch.shape[0],))(root.reshape(1))
    unsafe = _REDUCE_SUM(ops.cast(ops.logical_not(thor_math.cholesky_safe(batch, shift)), ms.float32), ())
    return batch, shift, block_ok, unsafe


@_cholesky_inverse.register("Tensor", "Tensor")
def _cholesky_inverse_tensor(blocks, shift):
    return thor_math.cholesky_block_inverse(blocks, shift)


@_eigen_inverse.register("Tensor", "Tensor")
def _eigen_inverse_tensor(blocks, shift):
    return thor_math.clamped_eigen_block_inverse(blocks, shift)


@_blocks_bad.register("Tensor", "Tensor")
def _blocks_bad_tensor(block_ok, inverse):
    """Per block: its layer's factors or its inverse are non-finite."""
    return ops.logical_not(ops.logical_and(block_ok, thor_math.blocks_finite(inverse)))


@_job_inverse.register("Tuple", "Tuple", "Tuple", "Tuple", "Tuple", "Tuple", "Tuple", "Tensor", "Bool", "Bool",
                       "Tuple")
def _job_inverse_tuple(folded, shifts, layer_ok, raw, block_bad, a_inverses, g_inverses, root, use_pi, assign, spec):
    """One job's new inverse -> ``(inverse, 1.0 if rejected as non-finite else 0.0, token)``.

    A factor keeps its previous inverse when its layer was rejected or any of its blocks is bad (sliced per
    factor from its batch: constant index Tensors used after the Cholesky/eigen branch crash MindSpore 2.10's
    parameter_eliminate). With ``assign`` the inverse Parameter is written here.
    """
    mode, layer, slot, batch, first, count, whole, shape = spec
    old = a_inverses[layer] if slot == 0 else g_inverses[layer]
    none = ops.zeros((), ms.float32)
    if mode == 0:  # another rank inverts this factor; the broadcast brings it
        return old, none, none
    job = 2 * layer + slot
    ok = layer_ok[layer]
    if mode == 1:  # diagonal input factor (embedding)
        shift = shifts[job][0] if use_pi else root
        inv = thor_math.damped_diagonal_inverse(folded[job], shift * shift)
        good = ops.logical_and(ok, thor_math.all_finite(inv))
        rejected = ops.cast(ops.logical_and(ok, ops.logical_not(good)), ms.float32)
        value = ops.where(good, inv, old)
    else:
        if whole:
            inv, bad = raw[batch], thor_math.any_true(block_bad[batch])
        else:
            inv = thor_math.narrow(raw[batch], 0, first, count)
            bad = thor_math.any_true(thor_math.narrow(block_bad[batch], 0, first, count))
        rejected = ops.cast(ops.logical_and(ok, bad), ms.float32)
        value = ops.where(bad, old, inv.reshape(shape))
    if assign:
        return value, rejected, ops.depend(none, ops.assign(old, value))
    return value, rejected, none


@_precondition.register("Tuple", "Bool", "Number", "Number", "Number", "Number", "Tensor", "Tensor")
def _precondition_tensor(gradients, embedding, weight_index, bias_index, groups, g_dim, a_inverse, g_inverse):
    """``(weight direction, bias direction or None)`` of one THOR layer after THOR preconditioning."""
    grad = gradients[weight_index]
    if embedding:
        return thor_math.embedding_precondition(grad, a_inverse, g_inverse), None
    shape = grad.shape
    matrix = grad.reshape(groups, g_dim, -1)
    if bias_index < 0:
        return thor_math.kronecker_precondition(matrix, g_inverse, a_inverse).reshape(shape), None
    bias_grad = gradients[bias_index]
    matrix = ops.concat((matrix, bias_grad.reshape(groups, g_dim, 1)), axis=-1)
    out = thor_math.kronecker_precondition(matrix, g_inverse, a_inverse)
    width = out.shape[-1] - 1
    return (thor_math.narrow(out, 2, 0, width).reshape(shape),
            thor_math.narrow(out, 2, width, 1).reshape(bias_grad.shape))


@_pick_direction.register("Tuple", "Tuple", "Number", "Number", "Number")
def _pick_direction_tensor(preconditioned, gradients, layer, slot, position):
    """The preconditioned weight (slot 0) or bias (slot 1) of THOR layer ``layer``; else the gradient."""
    if layer < 0:
        return gradients[position]
    return preconditioned[layer][slot]


@_preconditioned_dot.register("Number", "Tensor", "Tensor")
def _preconditioned_dot_tensor(layer, direction, grad):
    r""":math:`\langle F^{-1} g, g\rangle` of a parameter preconditioned by THOR layer ``layer`` (0 when -1)."""
    if layer >= 0:
        return _dot(direction, grad).reshape(())
    return ops.zeros((), ms.float32)


@_scale_preconditioned.register("Tensor", "Number", "Tensor")
def _scale_preconditioned_tensor(nu, layer, direction):
    if layer >= 0:
        return direction * nu
    return direction


@_decay.register("Number", "Bool", "Tensor", "Tensor")
def _decay_tensor(weight_decay, flag, weight, grad):
    """``grad + weight_decay * weight`` where ``decay_filter`` selected the parameter."""
    if flag:
        return grad + weight * weight_decay
    return grad


@_clip_to_unit_norm.register("Tensor")
def _clip_tensor(grad):
    return thor_math.clip_by_norm(grad, 1.0)


@_momentum_step.register("Function", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor")
def _momentum_tensor(apply_momentum, lr, momentum, weight, moment, grad):
    return apply_momentum(weight, moment, lr, grad, momentum)


@_nesterov_step.register("Tensor", "Tensor", "Tensor", "Tensor", "Tensor")
def _nesterov_tensor(lr, momentum, weight, moment, grad):
    new_weight, new_moment = thor_math.momentum_step(weight, moment, grad, lr, momentum, True)
    return ops.depend(ops.assign(moment, new_moment), ops.assign(weight, new_weight))


@_set_flag.register("Tensor", "Tensor")
def _set_flag_tensor(value, flag):
    return ops.assign(flag, value)


def _unique(params: list) -> list:
    seen, out = set(), []
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out

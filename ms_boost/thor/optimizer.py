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

import numbers
from typing import Callable, Optional, Sequence

import mindspore as ms
import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops
from mindspore import log as logger
from mindspore.nn.learning_rate_schedule import LearningRateSchedule

from ms_boost import comm
from ms_boost.thor import math as thor_math
from ms_boost.thor.layers import ThorLayer, thor_state_parameters
from ms_boost.topology import Topology
from ms_boost.update import StageHooks

__all__ = ["THOR"]


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
        self.values = Tensor(values)
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
    """

    def __init__(self, net: nn.Cell, learning_rate, damping, momentum, weight_decay=0.0, loss_scale=1.0,
                 batch_size: int = 32, use_nesterov: bool = False, decay_filter: Optional[Callable] = None,
                 split_indices=None, enable_clip_grad: bool = False, frequency: int = 100, *,
                 params=None, block_size: int = 128, distribute_inverses: bool = True):
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
        self._setup_distribution(split_indices, distribute_inverses)

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
            a_inv.append(Parameter(Tensor(np.zeros(a_inv_shape, np.float32)), name=f"thor_a_inverse.{path}",
                                   requires_grad=False))
            g_inv.append(Parameter(Tensor(np.zeros((groups, nb, b, b), np.float32)),
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
        self.param_source = tuple(source)  # per parameter: (layer, 0 weight | 1 bias) or (-1, -1)
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
    def _kronecker_inverse(self, job: int, factor, damping):
        """Damped inverse of factor ``job`` (2i: A of layer i, 2i+1: G of layer i)."""
        if job % 2 == 0:
            if self.layer_kind[job // 2] == "embedding":
                return thor_math.damped_diagonal_inverse(factor, damping)
            if self.trim_a[job // 2]:
                factor = factor[:, :-1, :-1]
        return thor_math.damped_block_inverse(factor, damping, self.block_size)

    def _refresh(self, damping, gradients):
        """Fold the captured statistics, average them across ranks, invert, store; returns a dependency token.

        Every collective takes a data dependency on the previous one (the first on the gradients, which
        left the data-parallel reduction), so all ranks issue them in the same order.
        """
        factors = ()
        for i in range(self.n_layers):
            factors += (self.a_batches[i], self.g_batches[i])
        last = gradients
        if self.distributed:
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
                reduced += (flats[k][offset:offset + self.factor_sizes[j]].reshape(self.factor_shapes[j]),)
            factors = reduced
        token = ops.zeros((), ms.float32)
        folded = ()
        for i in range(self.n_layers):
            a, g = factors[2 * i], factors[2 * i + 1]
            slot = self.factor_slot[i]
            if slot >= 0:
                decay = self.factor_decay[i]
                a = thor_math.running_average(self.a_factors[slot], a, decay, self.thor_initialised)
                g = thor_math.running_average(self.g_factors[slot], g, decay, self.thor_initialised)
                token = ops.depend(token, ops.assign(self.a_factors[slot], a))
                token = ops.depend(token, ops.assign(self.g_factors[slot], g))
            folded += (a, g)
        inverses = ()
        for j in range(2 * self.n_layers):
            if self.inverse_owner[j] == self.rank:
                inverses += (self._kronecker_inverse(j, folded[j], damping),)
            else:
                inverses += (None,)
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
                value = received[k][offset:offset + self.inverse_sizes[j]].reshape(self.inverse_shapes[j])
            token = ops.depend(token, ops.assign(self._inverse_param(j), value))
        return ops.depend(token, ops.assign(self.thor_initialised, Tensor(True, ms.bool_)))

    def _inverse_param(self, job: int):
        return self.a_inverses[job // 2] if job % 2 == 0 else self.g_inverses[job // 2]

    def _precondition_layer(self, i: int, gradients):
        """``(weight_grad, bias_grad_or_None)`` of layer ``i`` after THOR preconditioning."""
        grad = gradients[self.weight_index[i]]
        groups, g_dim, bias_idx = self.layer_groups[i], self.g_dims[i], self.bias_index[i]
        if self.layer_kind[i] == "embedding":
            return thor_math.embedding_precondition(grad, self.a_inverses[i], self.g_inverses[i]), None
        shape = grad.shape
        matrix = grad.reshape(groups, g_dim, -1)
        if bias_idx < 0:
            return thor_math.kronecker_precondition(matrix, self.g_inverses[i], self.a_inverses[i]).reshape(shape), None
        bias_grad = gradients[bias_idx]
        matrix = ops.concat((matrix, bias_grad.reshape(groups, g_dim, 1)), axis=-1)
        out = thor_math.kronecker_precondition(matrix, self.g_inverses[i], self.a_inverses[i])
        return out[:, :, :-1].reshape(shape), out[:, :, -1].reshape(bias_grad.shape)

    def construct(self, gradients):
        params = self._parameters
        moments = self.moments
        gradients = self.scale_grad(gradients)
        step = self.global_step
        refresh = ops.logical_or(ops.logical_not(self.thor_initialised), (step % self.frequency) == 0).all()
        if refresh:
            damping = self.damping(step)
            token = self._refresh(damping, gradients)
            gradients = ops.depend(gradients, token)
        # Per-parameter work is mapped with HyperMap over tuples: a Python loop over ResNet-50's 161
        # parameters unrolls into nested calls deeper than Graph mode's call-depth limit.
        new_grads = list(gradients)
        for i in range(self.n_layers):
            weight_grad, bias_grad = self._precondition_layer(i, gradients)
            new_grads[self.weight_index[i]] = weight_grad
            if self.bias_index[i] >= 0:
                new_grads[self.bias_index[i]] = bias_grad
        new_grads = tuple(new_grads)
        if self.weight_decay > 0.0:
            new_grads = self.hyper_map(ops.partial(_decay, self.weight_decay), self.decay_flags, params, new_grads)
        if self.enable_clip_grad:
            new_grads = self.hyper_map(_clip_to_unit_norm, new_grads)
        lr = self.get_lr()
        if self.use_nesterov:  # ApplyMomentum ignores use_nesterov on CPU: the formula, written out
            success = self.hyper_map(ops.partial(_nesterov_step, lr, self.momentum), params, moments, new_grads)
        else:
            success = self.hyper_map(ops.partial(_momentum_step, self.apply_momentum, lr, self.momentum),
                                     params, moments, new_grads)
        next_step = step + 1
        capture = ((next_step % self.frequency) == 0).all()
        success = ops.depend(success, self.hyper_map(ops.partial(_set_flag, capture), self.capture_flags))
        success = ops.depend(success, self.assignadd(self.global_step, self.global_step_increase_tensor))
        return success


_CALL_DEPTH = {"raised_to": 0}


def _ensure_call_depth(n_layers: int) -> None:
    """Raise MindSpore's graph call-depth limit (``mindspore.set_recursion_limit``, default 1000) for THOR's
    per-layer refresh and preconditioning, which Graph mode unrolls into nested calls (about 10 levels per
    layer). Only ever raised, never lowered below a value ms_boost set before; logged once per change."""
    needed = 1000 + 12 * max(0, n_layers - 40)
    if needed > max(1000, _CALL_DEPTH["raised_to"]):
        ms.set_recursion_limit(needed)
        _CALL_DEPTH["raised_to"] = needed
        logger.info(f"thor: {n_layers} THOR layers; graph call-depth limit raised to {needed} "
                    "(mindspore.set_recursion_limit).")


_decay = ops.MultitypeFuncGraph("thor_decay")
_clip_to_unit_norm = ops.MultitypeFuncGraph("thor_clip")
_momentum_step = ops.MultitypeFuncGraph("thor_momentum")
_nesterov_step = ops.MultitypeFuncGraph("thor_nesterov")
_set_flag = ops.MultitypeFuncGraph("thor_set_flag")


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

r"""The DimReduce update stage (stage 2 of dimension-reduce training) and its PCA-matrix preparation.

One step, given the loss :math:`L` and the rank-averaged gradient :math:`\nabla` at weights :math:`w`
(formulas of :mod:`ms_boost.dim_reduce.math`)::

    g      = P grad                          one AllGather of every rank's row block (+ its loss)
    H      = BFGS(H, s_last, g - g_last)     skipped before the first accepted step / without curvature
    d      = -H g
    [P^T d ; P^T g]                          one AllReduce (sum of the ranks' blocks), both at once
    for t in rho^0, rho^1, ..., rho^(max_search_time-1):       (stop at the first success)
        w_trial = w + t P^T d ; L_trial = mean over ranks of L(w_trial)
        accept if L_trial < L + sigma t g^T d ;  restore w (and BatchNorm statistics) exactly
    t = the accepted step, or 0 if none
    mu     = gamma mu + grad - P^T g         residual momentum
    w      = w + t P^T d - alpha mu
    (H, g_last, s_last) <- (H, g, t d) only when a step was accepted

The stage writes the weights itself with ``ops.assign``; the optimizer that ``Model`` holds (upstream
replaces it with ``SGD(lr=1)``) is not called. Every piece of state -- ``H``, ``g_last``, ``s_last``,
the "has a BFGS pair" flag and the residual momentum -- is a ``Parameter`` (``requires_grad=False``),
so checkpoints capture it. ``dim_reduce.step_size`` records the step length the last line search
accepted (0 when none), for monitoring.

Distribution: the ``k`` rows of :math:`P` are split in blocks of :math:`\lceil k/R\rceil` rows over the
``R`` ranks (zero-padded; any ``k`` and ``R``). Gradients are the same on every rank (the train cell
averages them before this stage), so every rank computes the same ``g``, ``H``, ``d``, the same
line-search decision (losses are averaged in floating point) and the same new weights.
"""
from __future__ import annotations

import logging
from typing import Optional, Sequence

import mindspore as ms
import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

from ms_boost import comm
from ms_boost.dim_reduce.handshake import local_pca_rows, prepare_pca_matrix
from ms_boost.dim_reduce.math import (
    armijo_accepts,
    back_project,
    bfgs_inverse_update,
    local_row_block,
    project,
    quasi_newton_direction,
    residual_momentum,
)
from ms_boost.dim_reduce.pca import parameter_specs
from ms_boost.dim_reduce.section import STEP_RULES
from ms_boost.flat_buffers import assign_all, flat_layout, flatten_tensors, split_flat
from ms_boost.spec import check_fields

logger = logging.getLogger("ms_boost")

__all__ = ["DimReduceUpdate", "DimReduce", "build_dim_reduce_update", "STEP_RULES"]




class _CompiledForward(nn.Cell):
    """The loss network's forward pass as one compiled graph (``ms.jit``).

    in PyNative mode a line-search trial is one launch and records no gradient tape (the train cell marks the network
    ``set_grad``); inside a Graph-mode construct it is inlined.
    """

    def __init__(self, network: nn.Cell):
        super().__init__(auto_prefix=False)
        self.network = network

    @ms.jit
    def construct(self, *inputs):
        return self.network(*inputs)


class DimReduceUpdate(nn.Cell):
    r"""Update stage: projected BFGS step with Armijo line search plus residual momentum.

    Args:
        network: the loss network (returns the scalar loss from ``*inputs``); re-evaluated in the line search.
        weights: the trainable parameters, in gradient order.
        pca_mat: the PCA matrix, either the full ``(k, M)`` matrix or this rank's padded block of
            ``ceil(k / rank_size)`` rows (numpy array or Tensor; float32 is used).
        n_components: ``k``.
        rho: line-search shrink factor in (0, 1); trial steps are :math:`\rho^m`.
        gamma: residual-momentum decay in [0, 1).
        alpha: residual-momentum learning rate, >= 0.
        sigma: Armijo constant in (0, 1).
        max_search_time: number of trial steps (upstream: 2).
        rank: this rank (default: :func:`ms_boost.comm.get_rank`).
        rank_size: number of ranks sharing the rows of ``P`` (default: :func:`ms_boost.comm.get_size`).
        curvature_eps: the BFGS update is skipped when :math:`y^\top s \le` this.
        carry_search: off (default): every line search tries :math:`\rho^0, \rho^1, \dots` as upstream does,
            so after a search that accepts nothing the next step (same :math:`H`, no new BFGS pair) usually
            proposes a step of the same length and fails again. On: the trial steps are
            :math:`c\rho^m` with a scale :math:`c` (``dim_reduce.search_scale``) that a failed search
            multiplies by :math:`\rho^{\text{max\_search\_time}}` (the next search starts where this one
            stopped) and an accepted step :math:`t` sets to :math:`\min(1, t/\rho)` (the next search starts one
            notch above the step just accepted).

    Inputs:
        ``(loss, grads, *inputs)``: the step's loss, the rank-averaged gradients (tuple matching
        ``weights``) and the network inputs.

    Outputs:
        The loss (depending on every update, for ``ops.depend``).

    Raises:
        ValueError: a hyper-parameter out of range, or ``pca_mat`` of a shape that does not fit the
            network, ``n_components`` and ``rank_size``.
    """

    def __init__(self, network: nn.Cell, weights: Sequence[Parameter], pca_mat, n_components: int,
                 rho: float = 0.55, gamma: float = 0.9, alpha: float = 0.001, sigma: float = 0.4,
                 max_search_time: int = 2, rank: Optional[int] = None, rank_size: Optional[int] = None,
                 curvature_eps: float = 1e-20, carry_search: bool = False):
        super().__init__(auto_prefix=False)
        cfg = check_fields("dim_reduce", STEP_RULES, rho=rho, gamma=gamma, alpha=alpha, sigma=sigma,
                           n_components=n_components, max_search_time=max_search_time, carry_search=carry_search)
        self.carry_search = cfg["carry_search"]
        self.rho, self.gamma, self.sigma, self.alpha = cfg["rho"], cfg["gamma"], cfg["sigma"], cfg["alpha"]
        self.curvature_eps = float(curvature_eps)
        self.network = network
        self.trial_forward = _CompiledForward(network)
        weights = tuple(weights)
        if not weights:
            raise ValueError("DimReduceUpdate: weights is empty; the network has no trainable parameter.")
        self.weights = ParameterTuple(weights)
        self.shapes = tuple(tuple(int(d) for d in w.shape) for w in weights)
        num_weights = int(sum(int(np.prod(s, dtype=np.int64)) for s in self.shapes))
        self.num_weights = num_weights
        self.n_components = int(n_components)
        self.rank = comm.get_rank() if rank is None else int(rank)
        self.rank_size = comm.get_size() if rank_size is None else int(rank_size)
        start, stop, height = local_row_block(self.n_components, self.rank, self.rank_size)
        self.height = height
        mat = pca_mat.asnumpy() if isinstance(pca_mat, Tensor) else pca_mat
        shape = tuple(getattr(mat, "shape", ()))
        if len(shape) != 2 or shape[1] != num_weights or shape[0] not in (height, self.n_components):
            raise ValueError(
                f"pca_mat of shape {shape} does not fit: expected the full matrix ({self.n_components}, "
                f"{num_weights}) = (n_components, number of trainable weights) or this rank's block "
                f"({height}, {num_weights}) of ceil(n_components / rank_size={self.rank_size}) rows.")
        if shape[0] == self.n_components:  # the full matrix (for k == 1 both readings give the same block)
            rows = local_pca_rows(mat, self.n_components, self.rank, self.rank_size)
        else:
            rows = np.ascontiguousarray(mat, dtype=np.float32)
        if not np.all(np.isfinite(rows)):
            raise ValueError("pca_mat holds NaN or infinite values.")
        self.pca_rows = Tensor(rows)
        self.pad = self.rank_size * height - self.n_components
        self.block_start = self.rank * height
        self.gather = comm.AllGather()
        self.sum_ranks = comm.AllReduce("sum")
        self.mean_ranks = comm.AllReduce("mean")
        self.trial_steps = tuple(Tensor(float(self.rho) ** m, ms.float32) for m in range(max_search_time))
        self.max_search_time = int(max_search_time)
        if carry_search:
            # the line search's scale, carried from step to step: a search that accepts nothing makes the next
            # one start where it stopped (scale * rho^max_search_time); an accepted step t sets it to min(1, t / rho)
            self.search_scale = Parameter(Tensor(1.0, ms.float32), name="dim_reduce.search_scale",
                                          requires_grad=False)
            self.shrink = Tensor(float(self.rho) ** self.max_search_time, ms.float32)
            self.grow = Tensor(1.0 / float(self.rho), ms.float32)
            self.one = Tensor(1.0, ms.float32)
        self.zero = Tensor(0.0, ms.float32)
        self.false = Tensor(False)
        k = self.n_components
        self.inv_hessian = Parameter(Tensor(np.eye(k, dtype=np.float32)), name="dim_reduce.inv_hessian",
                                     requires_grad=False)
        self.grad_last = Parameter(Tensor(np.zeros(k, np.float32)), name="dim_reduce.grad_last",
                                   requires_grad=False)
        self.step_last = Parameter(Tensor(np.zeros(k, np.float32)), name="dim_reduce.step_last",
                                   requires_grad=False)
        self.has_pair = Parameter(Tensor(False), name="dim_reduce.has_pair", requires_grad=False)
        # diagnostics: the step length the last line search accepted (rho^m), 0 when it accepted none
        self.step_size = Parameter(Tensor(0.0, ms.float32), name="dim_reduce.step_size", requires_grad=False)
        self.momentum = ParameterTuple(
            Parameter(Tensor(np.zeros(s, np.float32)), name=f"dim_reduce.momentum.{w.name}", requires_grad=False)
            for w, s in zip(weights, self.shapes))
        ids = {id(w) for w in weights}
        # State the forward pass may change (BatchNorm statistics): restored after the line search.
        self.net_state = ParameterTuple(p for p in network.get_parameters() if id(p) not in ids
                                        and not p.requires_grad)
        # float32 state is snapshot as one flat buffer; other dtypes (exact copies) one by one
        self.flat_state = ParameterTuple(p for p in self.net_state if p.dtype == ms.float32)
        self.other_state = ParameterTuple(p for p in self.net_state if p.dtype != ms.float32)
        self.layout = flat_layout(self.shapes)  # (starts, sizes, shapes) of the flat buffers
        self.state_layout = flat_layout([p.shape for p in self.flat_state])

    def construct(self, loss, grads, *inputs):
        """One DimReduce step on the reduced gradients; returns the loss."""
        return self._step(loss, grads, *inputs)

    def _step(self, loss, grads, *inputs):
        """One DimReduce step (shared with the upstream-signature :class:`DimReduce`).

        Weights, their saved copy, the residual momentum and the BatchNorm snapshot are handled as flat
        float32 buffers by a few compiled functions (``_flat``, ``_write``, ...): one concatenation, one
        split and one assignment per parameter for each write, instead of per-parameter arithmetic. The
        trials write ``w0 + t P^T d`` directly (no restore in between), the final write puts
        ``w0 + t P^T d - alpha mu``, and the network state is restored once after the line search.
        """
        flat_grad = _flat(*grads)
        g_local = project(self.pca_rows, flat_grad)
        packed = ops.concat((g_local, ops.reshape(ops.cast(loss, ms.float32), (1,))))
        gathered = ops.reshape(self.gather(packed), (self.rank_size, self.height + 1))
        g = ops.reshape(gathered[:, :self.height], (-1,))[:self.n_components]
        old_loss = ops.reduce_sum(gathered[:, self.height]) / self.rank_size

        h, d, slope = _direction(self.inv_hessian, self.step_last, self.grad_last, g, self.has_pair,
                                 self.curvature_eps)
        d_padded = ops.concat((d, ops.zeros(self.pad, ms.float32))) if self.pad else d
        d_local = d_padded[self.block_start:self.block_start + self.height]
        back = self.sum_ranks(back_project(self.pca_rows, ops.stack((d_local, g_local))))
        # rows by Slice on the flat buffer: indexing back[0] / back[1] compiles to CPU StridedSlice kernels
        # that copy ~35 M values/s (measured ~20 ms each per step for 0.7 M weights) against memcpy speed here
        back = ops.reshape(back, (-1,))
        direction = ops.slice(back, (0,), (self.num_weights,))
        grad_in_subspace = ops.slice(back, (self.num_weights,), (self.num_weights,))

        saved = _flat(*self.weights)
        saved_state = _flat(*self.flat_state)
        saved_other = ()
        for p in self.other_state:
            saved_other += (ops.deepcopy(p),)

        # the first trial always runs (no control flow); later ones only while nothing was accepted
        scale = self.search_scale if self.carry_search else None
        t = self.trial_steps[0] * scale if self.carry_search else self.trial_steps[0]
        accepted = self._trial(saved, direction, t, old_loss, slope, *inputs)
        step = ops.where(accepted, t, self.zero)
        for i in range(1, self.max_search_time):
            if not accepted:
                t = self.trial_steps[i] * scale if self.carry_search else self.trial_steps[i]
                ok = self._trial(saved, direction, t, old_loss, slope, *inputs)
                step = ops.where(ok, t, step)
                accepted = ok
        if self.carry_search:
            new_scale = ops.where(accepted, ops.minimum(step * self.grow, self.one), scale * self.shrink)
            step = ops.depend(step, ops.assign(self.search_scale, new_scale))

        done = ops.assign(self.inv_hessian, ops.where(accepted, h, self.inv_hessian))
        done = ops.depend(done, ops.assign(self.grad_last, ops.where(accepted, g, self.grad_last)))
        done = ops.depend(done, ops.assign(self.step_last, ops.where(accepted, step * d, self.step_last)))
        done = ops.depend(done, ops.assign(self.has_pair, self.has_pair | accepted))
        done = ops.depend(done, ops.assign(self.step_size, step))
        mu = _momentum_step(self.layout, self.gamma, flat_grad, grad_in_subspace, *self.momentum)
        done = ops.depend(done, _write(self.layout, saved + step * direction - self.alpha * mu, *self.weights))
        done = ops.depend(done, self._restore_state(saved_state, saved_other, accepted))
        return ops.depend(loss, done)

    def _trial(self, saved, direction, t, old_loss, slope, *inputs):
        """Armijo test of the step ``t``: write ``w0 + t P^T d``, average the loss over ranks."""
        trial = _write(self.layout, saved + t * direction, *self.weights)
        new_loss = self.mean_ranks(ops.cast(self.trial_forward(*inputs), ms.float32))
        new_loss = ops.depend(new_loss, trial)
        return armijo_accepts(new_loss, old_loss, t, slope, self.sigma)

    def _restore_state(self, saved_state, saved_other, after):
        """Put back the network state (BatchNorm statistics) saved before the line search."""
        done = _write(self.state_layout, ops.depend(saved_state, after), *self.flat_state)
        for p, value in zip(self.other_state, saved_other):
            done = ops.depend(done, ops.assign(p, ops.depend(value, after)))
        return done


# Compiled pieces of the step (``ms.jit``): in PyNative mode each runs as one graph instead of dozens of
# small operations; inside a Graph-mode construct they are inlined. Layouts are Python constants; every
# Tensor is a separate argument (a tuple of Tensors would be frozen into the graph as a constant).
@ms.jit
def _flat(*tensors):
    """All tensors flattened, cast to float32 and concatenated (:func:`flatten_tensors`)."""
    if not tensors:
        return ops.zeros((0,), ms.float32)
    return flatten_tensors(tensors)


@ms.jit
def _write(layout, flat, *params):
    """Assign consecutive pieces of ``flat`` (a :func:`flat_layout`) to ``params``, cast to their dtypes."""
    return assign_all(params, split_flat(flat, layout))


@ms.jit
def _momentum_step(layout, gamma, flat_grad, grad_in_subspace, *momentum):
    r"""Residual momentum :math:`\mu \leftarrow \gamma\mu + (\nabla - P^\top g)` on the flat buffer; returns it."""
    mu = residual_momentum(flatten_tensors(momentum), flat_grad, grad_in_subspace, gamma)
    return ops.depend(mu, _write(layout, mu, *momentum))


@ms.jit
def _direction(inv_hessian, step_last, grad_last, g, has_pair, eps):
    r"""BFGS-updated :math:`H` (when a pair exists), :math:`d = -Hg` and the slope :math:`g^\top d`."""
    h = ops.where(has_pair, bfgs_inverse_update(inv_hessian, step_last, g - grad_last, eps), inv_hessian)
    d = quasi_newton_direction(h, g)
    return h, d, ops.reduce_sum(g * d)


class DimReduce(DimReduceUpdate):
    r"""Upstream-compatible DimReduce (``mindspore.boost.DimReduce`` signature) on top of :class:`DimReduceUpdate`.

    Differences from upstream, on purpose: ``optimizer`` is accepted but not called (the stage writes the
    weights itself, exactly :math:`w + t P^\top d - \alpha\mu`); ``pca_mat_local`` may be the full matrix or
    this rank's padded block of ``ceil(n_components / rank_size)`` rows; ``weight`` and ``weight_clone``
    in ``construct`` are not needed (the weights saved for the line search are internal copies).

    Inputs:
        ``(loss, old_grad, loss_scale, weight, weight_clone, *inputs)`` as upstream; ``old_grad`` is
        divided by ``loss_scale`` first.
    """

    def __init__(self, network, optimizer, weight, pca_mat_local, n_components, rho, gamma, alpha, sigma, rank,
                 rank_size):
        del optimizer  # the stage computes and writes the update itself
        super().__init__(network, weight, pca_mat_local, n_components, rho=rho, gamma=gamma, alpha=alpha,
                         sigma=sigma, rank=rank, rank_size=rank_size)

    def construct(self, loss, old_grad, loss_scale, weight, weight_clone, *inputs):
        """Upstream's inputs: ``old_grad`` divided by ``loss_scale``, then one DimReduce step."""
        grads = ()
        for grad in old_grad:
            grads += (ops.cast(grad, ms.float32) / ops.cast(loss_scale, ms.float32),)
        return self._step(loss, grads, *inputs)


def build_dim_reduce_update(network: nn.Cell, weights, dim_cfg, common_cfg=None) -> DimReduceUpdate:
    """Build the DimReduce stage from the ``dim_reduce`` and ``common`` configuration sections.

    Args:
        network: the loss network.
        weights: trainable parameters in gradient order.
        dim_cfg: the ``dim_reduce`` section (:class:`~ms_boost.dim_reduce.spec.DimReduceConfig`).
        common_cfg: object with ``device_number`` (ranks per server), or None for one server.
    """
    weights = tuple(weights)
    specs = parameter_specs(weights)
    device_number = None if common_cfg is None else common_cfg.device_number
    rows = prepare_pca_matrix(specs, dim_cfg.n_components, dim_cfg.pca_mat_path, dim_cfg.weight_load_dir,
                              dim_cfg.timeout, device_number)
    return DimReduceUpdate(network, weights, rows, dim_cfg.n_components, rho=dim_cfg.rho, gamma=dim_cfg.gamma,
                           alpha=dim_cfg.alpha, sigma=dim_cfg.sigma,
                           max_search_time=dim_cfg.max_search_time,
                           carry_search=dim_cfg.carry_search)

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
so checkpoints capture it.

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
from ms_boost.dim_reduce.handshake import (  # noqa: F401 -- re-exported: the handshake lived here
    DEFAULT_PCA_FILE_NAME,
    _devices_per_server,
    _PeerFailed,
    _root_prepare,
    _StatusExchange,
    local_pca_rows,
    prepare_pca_matrix,
)
from ms_boost.dim_reduce.math import (
    armijo_accepts,
    back_project,
    bfgs_inverse_update,
    flatten_tensors,
    local_row_block,
    project,
    quasi_newton_direction,
    residual_momentum,
    split_flat,
)
from ms_boost.dim_reduce.pca import parameter_specs
from ms_boost.sections import DimReduceConfig

logger = logging.getLogger("ms_boost")

__all__ = ["DimReduceUpdate", "DimReduce", "prepare_pca_matrix", "build_dim_reduce_update", "local_pca_rows"]


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
                 curvature_eps: float = 1e-20):
        super().__init__(auto_prefix=False)
        cfg = DimReduceConfig(rho=rho, gamma=gamma, alpha=alpha, sigma=sigma, n_components=n_components,
                              max_search_time=max_search_time)  # the one rule for each value
        self.rho, self.gamma, self.sigma, self.alpha = cfg.rho, cfg.gamma, cfg.sigma, cfg.alpha
        self.curvature_eps = float(curvature_eps)
        self.network = network
        weights = tuple(weights)
        if not weights:
            raise ValueError("DimReduceUpdate: weights is empty; the network has no trainable parameter.")
        self.weights = ParameterTuple(weights)
        self.shapes = tuple(tuple(int(d) for d in w.shape) for w in weights)
        num_weights = int(sum(int(np.prod(s, dtype=np.int64)) for s in self.shapes))
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
        self.momentum = ParameterTuple(
            Parameter(Tensor(np.zeros(s, np.float32)), name=f"dim_reduce.momentum.{w.name}", requires_grad=False)
            for w, s in zip(weights, self.shapes))
        ids = {id(w) for w in weights}
        # State the forward pass may change (BatchNorm statistics): restored after every trial.
        self.net_state = ParameterTuple(p for p in network.get_parameters() if id(p) not in ids
                                        and not p.requires_grad)

    def construct(self, loss, grads, *inputs):
        return self._step(loss, grads, *inputs)

    def _step(self, loss, grads, *inputs):
        """One DimReduce step (shared with the upstream-signature :class:`DimReduce`)."""
        flat_grad = flatten_tensors(grads)
        g_local = project(self.pca_rows, flat_grad)
        packed = ops.concat((g_local, ops.reshape(ops.cast(loss, ms.float32), (1,))))
        gathered = ops.reshape(self.gather(packed), (self.rank_size, self.height + 1))
        g = ops.reshape(gathered[:, :self.height], (-1,))[:self.n_components]
        old_loss = ops.reduce_sum(gathered[:, self.height]) / self.rank_size

        h = ops.where(self.has_pair,
                      bfgs_inverse_update(self.inv_hessian, self.step_last, g - self.grad_last, self.curvature_eps),
                      self.inv_hessian)
        d = quasi_newton_direction(h, g)
        slope = ops.reduce_sum(g * d)
        d_padded = ops.concat((d, ops.zeros(self.pad, ms.float32))) if self.pad else d
        d_local = d_padded[self.block_start:self.block_start + self.height]
        back = self.sum_ranks(back_project(self.pca_rows, ops.stack((d_local, g_local))))
        direction = split_flat(back[0], self.shapes)
        grad_in_subspace = split_flat(back[1], self.shapes)

        saved = ()
        for w in self.weights:
            saved += (ops.deepcopy(w),)
        saved_state = ()
        for p in self.net_state:
            saved_state += (ops.deepcopy(p),)

        # the first trial always runs (no control flow); later ones only while nothing was accepted
        accepted = self._trial(saved, saved_state, direction, self.trial_steps[0], old_loss, slope, *inputs)
        step = ops.where(accepted, self.trial_steps[0], self.zero)
        for i in range(1, self.max_search_time):
            if not accepted:
                ok = self._trial(saved, saved_state, direction, self.trial_steps[i], old_loss, slope, *inputs)
                step = ops.where(ok, self.trial_steps[i], step)
                accepted = ok

        done = ops.assign(self.inv_hessian, ops.where(accepted, h, self.inv_hessian))
        done = ops.depend(done, ops.assign(self.grad_last, ops.where(accepted, g, self.grad_last)))
        done = ops.depend(done, ops.assign(self.step_last, ops.where(accepted, step * d, self.step_last)))
        done = ops.depend(done, ops.assign(self.has_pair, self.has_pair | accepted))
        new_momentum = ()
        for m, grad, sub in zip(self.momentum, grads, grad_in_subspace):
            mu = residual_momentum(m, ops.cast(grad, ms.float32), sub, self.gamma)
            new_momentum += (mu,)
            done = ops.depend(done, ops.assign(m, mu))
        done = ops.depend(done, self._assign_weights(saved, direction, step, new_momentum))
        return ops.depend(loss, done)

    def _trial(self, saved, saved_state, direction, t, old_loss, slope, *inputs):
        """Armijo test of the step ``t``: write the trial weights, average the loss over ranks, restore."""
        trial = self._assign_weights(saved, direction, t, None)
        new_loss = self.mean_ranks(ops.cast(self.network(*inputs), ms.float32))
        new_loss = ops.depend(new_loss, trial)
        ok = armijo_accepts(new_loss, old_loss, t, slope, self.sigma)
        return ops.depend(ok, self._restore(saved, saved_state, ok))

    def _assign_weights(self, base, direction, step, momentum):
        r""":math:`w \leftarrow w_0 + t\,P^\top d\,[-\,\alpha\mu]` for every weight."""
        done = self.zero
        for i in range(len(self.shapes)):
            value = ops.cast(base[i], ms.float32) + step * direction[i]
            if momentum is not None:
                value = value - self.alpha * momentum[i]
            w = self.weights[i]
            done = ops.depend(done, ops.assign(w, ops.cast(value, w.dtype)))
        return done

    def _restore(self, saved, saved_state, after):
        """Put back the weights and the network state saved before the line search."""
        done = self.zero
        for w, value in zip(self.weights, saved):
            done = ops.depend(done, ops.assign(w, ops.depend(value, after)))
        for p, value in zip(self.net_state, saved_state):
            done = ops.depend(done, ops.assign(p, ops.depend(value, after)))
        return done


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
        grads = ()
        for grad in old_grad:
            grads += (ops.cast(grad, ms.float32) / ops.cast(loss_scale, ms.float32),)
        return self._step(loss, grads, *inputs)


def build_dim_reduce_update(network: nn.Cell, weights, dim_cfg, common_cfg=None) -> DimReduceUpdate:
    """Build the DimReduce stage from the ``dim_reduce`` and ``common`` configuration sections.

    Args:
        network: the loss network.
        weights: trainable parameters in gradient order.
        dim_cfg: the ``dim_reduce`` section (:class:`~ms_boost.sections.DimReduceConfig`).
        common_cfg: object with ``device_number`` (ranks per server), or None for one server.
    """
    weights = tuple(weights)
    specs = parameter_specs(weights)
    device_number = None if common_cfg is None else common_cfg.device_number
    rows = prepare_pca_matrix(specs, dim_cfg.n_components, dim_cfg.pca_mat_path, dim_cfg.weight_load_dir,
                              dim_cfg.timeout, device_number)
    return DimReduceUpdate(network, weights, rows, dim_cfg.n_components, rho=dim_cfg.rho, gamma=dim_cfg.gamma,
                           alpha=dim_cfg.alpha, sigma=dim_cfg.sigma,
                           max_search_time=dim_cfg.max_search_time)

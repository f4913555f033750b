"""THOR's step kernels: the per-parameter, per-layer, per-job and per-batch functions the optimizer maps.

Graph mode pays for every Python-level call it traces and unrolls Python loops growing tuples, so the
optimizer's step maps these ``MultitypeFuncGraph`` functions (``ops.Map`` / ``HyperMap``) over static tuples
(records of :class:`~ms_boost.thor.assignment.InversionPlan` and per-layer tuples). The math itself lives in
:mod:`ms_boost.thor.math`; here it is only arranged per record.
"""
from __future__ import annotations

import mindspore as ms
from mindspore import ops

from ms_boost.thor import math as thor_math

__all__ = [
    "dot", "REDUCE_SUM", "scale_and_decay", "clip_to_unit_norm", "momentum_step", "nesterov_step", "set_flag",
    "masked_update", "momentum_apply", "nesterov_apply",
    "pick_direction", "preconditioned_dot", "pick", "field_0", "field_1", "field_2",
    "field_3", "job_field", "fold_layer", "pi_shifts", "job_tiles", "job_shift", "prepare_batch",
    "cholesky_inverse", "eigen_inverse", "blocks_bad", "old_blocks", "keep_or_replace", "job_inverse", "precondition",
    "diagonal_inverse", "dense_inverse",
    "trace",
    "direction_sum", "MAP", "CONCAT",
]

def dot(x, y):
    """``sum(x * y)`` as one ``(1, n) @ (n, 1)`` product (float32), shaped ``(1, 1)``."""
    # unconditional casts (a no-op cast is removed when compiling): an ``if dtype`` per parameter cost a branch each
    x = ops.cast(x, ms.float32)
    y = ops.cast(y, ms.float32)
    return ops.matmul(x.reshape(1, -1), y.reshape(-1, 1))


REDUCE_SUM = ops.ReduceSum(keep_dims=False)
scale_and_decay = ops.MultitypeFuncGraph("thor_scale_and_decay")
clip_to_unit_norm = ops.MultitypeFuncGraph("thor_clip")
momentum_step = ops.MultitypeFuncGraph("thor_momentum")
nesterov_step = ops.MultitypeFuncGraph("thor_nesterov")
set_flag = ops.MultitypeFuncGraph("thor_set_flag")
masked_update = ops.MultitypeFuncGraph("thor_masked_update")
momentum_apply = ops.MultitypeFuncGraph("thor_momentum_apply")
nesterov_apply = ops.MultitypeFuncGraph("thor_nesterov_apply")
MUL_NO_NAN = ops.MulNoNan()
pick_direction = ops.MultitypeFuncGraph("thor_pick_direction")
preconditioned_dot = ops.MultitypeFuncGraph("thor_preconditioned_dot")


pick = ops.MultitypeFuncGraph("thor_pick")
field_0 = ops.MultitypeFuncGraph("thor_field_0")
field_1 = ops.MultitypeFuncGraph("thor_field_1")
field_2 = ops.MultitypeFuncGraph("thor_field_2")
field_3 = ops.MultitypeFuncGraph("thor_field_3")
job_field = ops.MultitypeFuncGraph("thor_job_field")
fold_layer = ops.MultitypeFuncGraph("thor_fold_layer")
pi_shifts = ops.MultitypeFuncGraph("thor_pi_shifts")
job_tiles = ops.MultitypeFuncGraph("thor_job_tiles")
job_shift = ops.MultitypeFuncGraph("thor_job_shift")
prepare_batch = ops.MultitypeFuncGraph("thor_prepare_batch")
cholesky_inverse = ops.MultitypeFuncGraph("thor_cholesky_inverse")
eigen_inverse = ops.MultitypeFuncGraph("thor_eigen_inverse")
blocks_bad = ops.MultitypeFuncGraph("thor_blocks_bad")
old_blocks = ops.MultitypeFuncGraph("thor_old_blocks")
keep_or_replace = ops.MultitypeFuncGraph("thor_keep_or_replace")
job_inverse = ops.MultitypeFuncGraph("thor_job_inverse")
diagonal_inverse = ops.MultitypeFuncGraph("thor_diagonal_inverse")
precondition = ops.MultitypeFuncGraph("thor_precondition")
dense_inverse = ops.MultitypeFuncGraph("thor_dense_inverse")
trace = ops.MultitypeFuncGraph("thor_trace")
direction_sum = ops.MultitypeFuncGraph("thor_direction_sum")
MAP = ops.Map()
CONCAT = ops.Concat(0)


@pick.register("Tuple", "Number")
def _pick_tuple(values, index):
    """``values[index]`` (mapped over indices)."""
    return values[index]


# One extractor per field, not ``ops.partial(field, index)``: mapping such a partial over a tuple of records gave
# wrong values in MindSpore 2.10 Graph mode.
@field_0.register("Tuple")
def _field_0_tuple(record):
    return record[0]


@field_1.register("Tuple")
def _field_1_tuple(record):
    return record[1]


@field_2.register("Tuple")
def _field_2_tuple(record):
    return record[2]


@field_3.register("Tuple")
def _field_3_tuple(record):
    return record[3]


@job_field.register("Tuple", "Number", "Number")
def _job_field_tuple(per_layer, layer, slot):
    """Field ``slot`` (0: input factor A, 1: output factor G) of layer ``layer``'s record."""
    return per_layer[layer][slot]


@fold_layer.register("Tensor", "Tuple", "Tuple", "Number", "Number", "Tensor", "Tensor")
def _fold_layer_tensor(initialised, a_factors, g_factors, slot, decay, a, g):
    """One layer's captured factors made ready to invert -> ``(A, G, finite, token)``.

    Folds them into the running averages (``slot >= 0``; a non-finite capture leaves the averages as they
    were) and replaces a non-finite diagonal A by ones (a finite stand-in whose inverse is discarded). The
    factors arrive as the layer stores them: whole, or only their diagonal blocks.
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
    return a, g, ok, token


@pi_shifts.register("Tensor", "Number", "Number", "Number", "Tuple")
def _pi_shifts_tuple(root, groups, a_dim, g_dim, fold):
    r"""``(groups,)`` shifts :math:`(\pi\sqrt\lambda, \sqrt\lambda/\pi)` of one layer's A and G (pi = 1 if rejected)."""
    pi = ops.where(fold[2], thor_math.pi_damping(fold[0], fold[1], a_dim=a_dim, g_dim=g_dim), 1.0)
    pi = ops.BroadcastTo((groups,))(pi.reshape(-1))
    return root * pi, root / pi


@job_tiles.register("Tuple", "Number", "Number")
def _job_tiles_tuple(folds, layer, slot):
    """The diagonal blocks of layer ``layer``'s folded factor ``slot`` as ``(groups * n_b, b, b)`` (not symmetrised)."""
    tiles = ops.cast(folds[layer][slot], ms.float32)
    return tiles.reshape(-1, tiles.shape[-1], tiles.shape[-1])


@job_shift.register("Tuple", "Number", "Number", "Number")
def _job_shift_tuple(shifts, job, groups, blocks):
    """Job ``job``'s ``(groups,)`` shift repeated for each of its ``blocks`` blocks per group."""
    return ops.BroadcastTo((groups, blocks))(shifts[job].reshape(-1, 1)).reshape(-1)


@prepare_batch.register("Tuple", "Tuple", "Tensor", "Tensor", "Bool", "Tuple", "Tuple", "Tuple", "Tuple", "Tuple",
                        "Tensor")
def _prepare_batch_tuple(folds, shifts, ok_vector, root, use_pi, jobs, layers, slots, groups, blocks, block_layer):
    """One batch of same-size blocks -> ``(blocks, shifts, block finite, unsafe count)``.

    The blocks of the batch's jobs, symmetrised; identity stand-ins for the blocks of rejected layers keep
    the inversion finite (their inverses are discarded).
    """
    parts = MAP(ops.partial(job_tiles, folds), layers, slots)
    batch = thor_math.symmetrise(parts[0] if len(parts) == 1 else CONCAT(parts))
    block_ok = ops.gather(ok_vector, block_layer, 0)
    size = batch.shape[-1]
    eye = ops.BroadcastTo(batch.shape)(ops.Eye()(size, size, ms.float32))
    batch = ops.where(block_ok.reshape(-1, 1, 1), batch, eye)
    if use_pi:
        shift_parts = MAP(ops.partial(job_shift, shifts), jobs, groups, blocks)
        shift = shift_parts[0] if len(shift_parts) == 1 else CONCAT(shift_parts)
    else:
        shift = ops.BroadcastTo((batch.shape[0],))(root.reshape(1))
    unsafe = REDUCE_SUM(ops.cast(ops.logical_not(thor_math.cholesky_safe(batch, shift)), ms.float32), ())
    return batch, shift, block_ok, unsafe


@cholesky_inverse.register("Tensor", "Tensor")
def _cholesky_inverse_tensor(blocks, shift):
    return thor_math.cholesky_block_inverse(blocks, shift)


@eigen_inverse.register("Tensor", "Tensor")
def _eigen_inverse_tensor(blocks, shift):
    return thor_math.clamped_eigen_block_inverse(blocks, shift)


@blocks_bad.register("Tensor", "Tensor")
def _blocks_bad_tensor(block_ok, inverse):
    """Per block: its layer's factors or its inverse are non-finite."""
    return ops.logical_not(ops.logical_and(block_ok, thor_math.blocks_finite(inverse)))


@old_blocks.register("Tuple", "Tuple", "Number", "Number")
def _old_blocks_tuple(a_inverses, g_inverses, layer, slot):
    """The stored inverse of layer ``layer``'s factor ``slot`` (0: A, 1: G) as ``(groups * n_b, b, b)`` blocks."""
    old = a_inverses[layer] if slot == 0 else g_inverses[layer]
    return old.reshape(-1, old.shape[-1], old.shape[-1])


@keep_or_replace.register("Tuple", "Tuple", "Tensor", "Tensor", "Tensor", "Tuple", "Tuple", "Tensor", "Tensor")
def _keep_or_replace_tensor(a_inverses, g_inverses, raw, block_bad, block_ok, layers, slots, job_blocks, block_jobs):
    """One batch's inverse blocks to store -> ``(blocks, inverses rejected as non-finite)``.

    A factor keeps every one of its previous blocks when its layer was not inverted now or any of its new blocks is
    non-finite (``block_bad``); decided for the whole batch at once: ``job_blocks`` ``(jobs, blocks)`` and
    ``block_jobs`` (its transpose) are the 0/1 matrices of which blocks each factor of the batch owns, so the
    per-factor "any block bad" and its spread back over the blocks are two products (no index Tensor after the
    inversion's branch). ``block_ok``: per block, its layer is inverted now (its factors were finite).
    """
    parts = MAP(ops.partial(old_blocks, a_inverses, g_inverses), layers, slots)
    old = parts[0] if len(parts) == 1 else CONCAT(parts)
    job_bad = ops.matmul(job_blocks, ops.cast(block_bad, ms.float32).reshape(-1, 1)) > 0.5
    keep_old = ops.matmul(block_jobs, ops.cast(job_bad, ms.float32)) > 0.5
    job_ok = ops.matmul(job_blocks, ops.cast(block_ok, ms.float32).reshape(-1, 1)) > 0.5
    rejected = REDUCE_SUM(ops.cast(ops.logical_and(job_ok, job_bad), ms.float32), ())
    return ops.where(keep_old.reshape(-1, 1, 1), old, raw), rejected


def _diagonal_inverse(folds, shifts, layer_ok, old, root, use_pi, layer):
    """A diagonal input factor's (embedding) new inverse -> ``(inverse, 1.0 if rejected as non-finite else 0.0)``."""
    ok = layer_ok[layer]
    shift = shifts[2 * layer][0] if use_pi else root
    inv = thor_math.damped_diagonal_inverse(folds[layer][0], shift * shift)
    good = ops.logical_and(ok, thor_math.all_finite(inv))
    rejected = ops.cast(ops.logical_and(ok, ops.logical_not(good)), ms.float32)
    return ops.where(good, inv, old), rejected


@diagonal_inverse.register("Tuple", "Tuple", "Tuple", "Tuple", "Tensor", "Bool", "Tuple")
def _diagonal_inverse_tuple(folds, shifts, layer_ok, a_inverses, root, use_pi, spec):
    """A diagonal input factor's (embedding) inverse to store -> ``(inverse, 1.0 if rejected as non-finite else 0.0)``.

    Computed once: :func:`job_inverse` takes the inverse from this record, the refresh counts the rejection.
    """
    layer = spec[1]
    return _diagonal_inverse(folds, shifts, layer_ok, a_inverses[layer], root, use_pi, layer)


@job_inverse.register("Tuple", "Tuple", "Tuple", "Tuple", "Bool", "Tuple", "Number")
def _job_inverse_tuple(diagonals, kept, a_inverses, g_inverses, assign, spec, diagonal):
    """One job's new inverse; with ``assign`` the inverse Parameter is written here and the assignment returned.

    One Tensor per job (no per-job tuple to take apart again: a map per field cost a call per job to compile). A
    Kronecker factor's inverse is sliced from its batch's blocks (``kept``: :func:`keep_or_replace` already chose
    between new and previous blocks and counted the rejections; constant index Tensors used after the
    Cholesky/eigen branch crash MindSpore 2.10's parameter_eliminate, hence a static slice); a diagonal one
    (embedding) is record ``diagonal`` of ``diagonals`` (:func:`diagonal_inverse`'s, which inverted it).
    """
    mode, layer, slot, batch, first, count, whole, shape = spec
    old = a_inverses[layer] if slot == 0 else g_inverses[layer]
    if mode == 0:  # another rank inverts this factor; the broadcast brings it
        return old
    if mode == 1:
        value = diagonals[diagonal][0]
    else:
        value = (kept[batch] if whole else thor_math.narrow(kept[batch], 0, first, count)).reshape(shape)
    if assign:
        return ops.assign(old, value)
    return value


@dense_inverse.register("Tuple", "Tuple", "Tensor", "Tensor", "Number", "Number", "Number")
def _dense_inverse_tensor(a_inverses, g_inverses, token, dense, layer, slot, dim):
    """Write layer ``layer``'s stored block inverse ``slot`` (0: A, 1: G) out into ``dense``, ``(g, dim, dim)``.

    Run at the end of a refresh, after ``token`` (the blocks' assignments): the written-out matrix follows the
    blocks whether they were replaced, kept or received from their owner rank.
    """
    blocks = ops.depend(a_inverses[layer] if slot == 0 else g_inverses[layer], token)
    return ops.assign(dense, thor_math.dense_block_diagonal(blocks, dim))


@precondition.register("Tuple", "Tuple", "Bool", "Number", "Number", "Number", "Number", "Tuple", "Tensor", "Tensor")
def _precondition_tensor(gradients, dense_inverses, embedding, weight_index, bias_index, groups, g_dim, dense,
                         a_inverse, g_inverse):
    """``(weight direction, bias direction or None)`` of one THOR layer after THOR preconditioning.

    ``dense``: per factor (A, G) the index of its written-out block-diagonal inverse in ``dense_inverses`` (one
    product instead of the blocks' pad, tiling and slicing), -1 to use the stored blocks.
    """
    if dense[0] >= 0:
        a_inverse = dense_inverses[dense[0]]
    if dense[1] >= 0:
        g_inverse = dense_inverses[dense[1]]
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


@pick_direction.register("Tuple", "Tuple", "Number", "Number", "Number")
def _pick_direction_tensor(preconditioned, gradients, layer, slot, position):
    """The preconditioned weight (slot 0) or bias (slot 1) of THOR layer ``layer``; else the gradient."""
    if layer < 0:
        return gradients[position]
    return preconditioned[layer][slot]


@preconditioned_dot.register("Number", "Tensor", "Tensor")
def _preconditioned_dot_tensor(layer, direction, grad):
    r""":math:`\langle F^{-1} g, g\rangle` of a parameter preconditioned by THOR layer ``layer`` (0 when -1)."""
    if layer >= 0:
        return dot(direction, grad).reshape(())
    return ops.zeros((), ms.float32)


@scale_and_decay.register("Bool", "Tensor", "Number", "Number", "Bool", "Tensor", "Tensor")
def _scale_and_decay_tensor(scale, nu, weight_decay, layer, flag, weight, direction):
    """A parameter's update before the momentum step: its direction, scaled and decayed.

    Times the trust-region factor ``nu`` where ``scale`` and the parameter belongs to a THOR layer, plus
    ``weight_decay * weight`` where ``flag`` (``decay_filter`` selected it): one call per parameter, not two.
    """
    if scale and layer >= 0:
        direction = direction * nu
    if flag:
        return direction + weight * weight_decay
    return direction


@masked_update.register("Bool", "Tensor", "Tensor", "Tensor", "Number", "Bool", "Tensor", "Tensor")
def _masked_update_tensor(scale, nu, keep, decay, layer, flag, weight, direction):
    r"""A parameter's update before the momentum step, already zero when the step is skipped (no ``where``).

    ``MulNoNan`` gives 0 wherever its factor is 0, whatever the other operand holds (inf, NaN): the direction times
    ``nu`` (where ``scale`` and the parameter belongs to a THOR layer; the trust region) or times ``keep`` (1.0), both
    0 on a skipped step, plus ``decay * weight`` where ``flag`` (``decay`` also 0 on a skipped step, by ``MulNoNan``
    too, so a non-finite weight adds no NaN). On a step that is applied this is :func:`scale_and_decay`'s value bit
    for bit (a product by a nonzero factor, by 1.0, the same sum); on a skipped one every element is an exact zero,
    so the momentum call (lr 0, momentum 1) leaves weight and moment as they were. One kernel per parameter fewer
    than zeroing with ``where``.
    """
    factor = nu if scale and layer >= 0 else keep
    direction = MUL_NO_NAN(direction, ops.cast(factor, direction.dtype))
    if flag:  # MulNoNan here too: a weight already non-finite (a loaded checkpoint) leaves the moment untouched
        return direction + MUL_NO_NAN(weight, ops.cast(decay, weight.dtype))
    return direction


@momentum_apply.register("Function", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor")
def _momentum_apply_tensor(apply_momentum, lr, momentum, weight, moment, grad):
    """The momentum update of one parameter whose update is already zero on a skipped step (:func:`masked_update`)."""
    return apply_momentum(weight, moment, lr, grad, momentum)


@nesterov_apply.register("Tensor", "Tensor", "Tensor", "Tensor", "Tensor")
def _nesterov_apply_tensor(lr, momentum, weight, moment, grad):
    new_weight, new_moment = thor_math.momentum_step(weight, moment, grad, lr, momentum, True)
    return ops.depend(ops.assign(moment, new_moment), ops.assign(weight, new_weight))


@clip_to_unit_norm.register("Tensor")
def _clip_tensor(grad):
    return thor_math.clip_by_norm(grad, 1.0)


@momentum_step.register("Function", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor")
def _momentum_tensor(apply_momentum, lr, momentum, finite, weight, moment, grad):
    """The momentum update of one parameter; zero gradient unless ``finite`` (a skipped step moves nothing)."""
    return apply_momentum(weight, moment, lr, ops.where(finite, grad, ops.zeros_like(grad)), momentum)


@nesterov_step.register("Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor")
def _nesterov_tensor(lr, momentum, finite, weight, moment, grad):
    return _nesterov_apply_tensor(lr, momentum, weight, moment, ops.where(finite, grad, ops.zeros_like(grad)))


@set_flag.register("Tensor", "Tensor")
def _set_flag_tensor(value, flag):
    return ops.assign(flag, value)


@trace.register("Tuple", "Number", "Number", "Number")
def _trace_tuple(folds, layer, slot, dim):
    """Trace of layer ``layer``'s folded ``dim``-wide factor ``slot`` (float32 scalar).

    Summed over groups (and blocks); a diagonal's sum.
    """
    return REDUCE_SUM(thor_math.factor_trace(ops.cast(folds[layer][slot], ms.float32), dim), ())


@direction_sum.register("Number", "Tensor")
def _direction_sum_tensor(layer, direction):
    """Sum of a THOR layer's direction (float32 scalar; inf/NaN in it make it non-finite); 0 for other parameters."""
    if layer >= 0:
        return REDUCE_SUM(ops.cast(direction, ms.float32), ())
    return ops.zeros((), ms.float32)

r"""Group loss scaling: one dynamic loss scale per group of layers (:class:`GroupLossScaleManager`).

Upstream's documented usage, which works unchanged here::

    class Net(nn.Cell):
        def __init__(self, amp):
            ...
            self.amp = amp
        def construct(self, x):
            x = self.amp(x, 0, 1)          # start of layer group 0
            x = self.convs(x)
            x = self.amp(x, 1, 2)          # group 0 -> group 1
            x = self.dense_layers(x)
            x = self.amp(x, 2, 3)          # end of the last group (n = 2 groups)
            return x

    manager = GroupLossScaleManager(4096, [])
    net = Net(manager)
    manager.loss_scale_groups = [conv_params, dense_params]
    model = ms_boost.Model(net, loss_fn, optimizer, loss_scale_manager=manager,
                           boost_config_dict={"boost": {"mode": "manual", "loss_scale_group": True}})

Scales ``S_0 = 1, S_1 .. S_n, S_{n+1} = 1`` (``S_i`` belongs to ``loss_scale_groups[i-1]``). The marker
``amp(x, i, j)`` is the identity forward; backward it multiplies the incoming gradient by ``S_i / S_j``.
Backpropagating from the loss through ``amp(x, n, n+1)`` ... ``amp(x, 0, 1)``, the products telescope:
the gradients of the layers between ``amp(x, i-1, i)`` and ``amp(x, i, i+1)`` -- group ``i`` -- are
scaled by exactly ``S_i``, and the gradient leaving the network's input side is unscaled. The train
step computes gradients with ``sens = 1`` and calls :meth:`GroupLossScaleManager.unscale_and_update`:

.. math::

    g_p \leftarrow g_p / S_{\gamma(p)}, \qquad
    o_i = [\exists p \in \text{group } i: g_p \notin \mathbb{R}] \text{ (any rank)}, \qquad
    S_i \leftarrow \operatorname{clip}\left(\begin{cases} S_i \beta & o_i \\
                                   S_i \alpha & \text{otherwise} \end{cases}, S_{\min}, S_{\max}\right)

with ``alpha = 2**(1/1000)`` (the scale doubles over 1000 clean steps) and ``beta = 2**(-1/2)``, as
upstream. The step is skipped when any group overflowed. Unlike upstream, gradients are divided by the
scale that produced them (upstream divides by the already updated one) and the scales are bounded, so
a float32 network cannot drive a scale to infinity.

The marker uses ordinary operators and a custom backward, so this works on CPU and GPU as well
(upstream's ``_DynamicLossScale`` primitive is Ascend-only).
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Union

import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common import dtype as mstype

from ms_boost import comm
from ms_boost.validation import BoostConfigError

_REDUCE_ALL = ops.ReduceAll(keep_dims=False)  # the primitive: cheaper to compile than Tensor.all()

__all__ = [
    "GroupLossScaleManager", "is_group_manager", "require_group_manager", "group_scale_update",
]


def group_scale_update(scales: Tensor, overflow: Tensor, growth: float, backoff: float, min_scale: float,
                       max_scale: float) -> Tensor:
    r"""New per-group loss scales.

    .. math::

        S_i' = \operatorname{clip}\left(\begin{cases} S_i \beta & o_i \\ S_i \alpha & \text{else} \end{cases},
        S_{\min}, S_{\max}\right)

    Args:
        scales: float32 vector of the group scales :math:`S_i`.
        overflow: bool vector, :math:`o_i` (same length).
        growth: :math:`\alpha > 1`.
        backoff: :math:`0 < \beta < 1`.
        min_scale, max_scale: bounds :math:`S_{\min}, S_{\max}`.
    """
    updated = ops.select(overflow, scales * backoff, scales * growth)
    return ops.clamp(updated, min_scale, max_scale)


class _GradScaleMarker(nn.Cell):
    """Identity forward; backward multiplies the gradient by ``ratio`` (which gets no gradient)."""

    def construct(self, x, ratio):
        return x

    def bprop(self, x, ratio, out, dout):
        return dout * ratio.astype(dout.dtype), ops.zeros_like(ratio)


def _check_scale(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise TypeError(f"GroupLossScaleManager: {name} must be a positive number, got {value!r}.")
    if not np.isfinite(value) or value <= 0:
        raise ValueError(f"GroupLossScaleManager: {name}={value!r} must be a finite number > 0.")
    return float(value)


class GroupLossScaleManager(nn.Cell):
    """Per-layer-group dynamic loss scales (upstream ``mindspore.boost.GroupLossScaleManager``).

    Args:
        init_loss_scale: initial scale of every group (a number), or one number per group (a list).
        loss_scale_groups: list of parameter lists, one per layer group in forward order; may be ``[]`` at
            construction and assigned later through the attribute (the documented usage).
        growth_factor: multiplier of a group's scale after a step without overflow (upstream: 2**(1/1000)).
        backoff_factor: multiplier of a group's scale after an overflow in that group (upstream: 2**-0.5).
        min_loss_scale, max_loss_scale: bounds of every scale.

    Inputs (as a marker inside the network):
        - **x** (Tensor) - the activation.
        - **layer1** (int) - the group ending here (0 at the network's input).
        - **layer2** (int) - the group starting here (``layer1 + 1``; ``n + 1`` at the output).

    Outputs:
        ``x`` unchanged; its gradient is multiplied by ``S_layer1 / S_layer2``.

    Raises:
        TypeError, ValueError: bad scales, factors, or groups (not lists of Parameters, or a parameter in
            two groups).
    """

    def __init__(self, init_loss_scale, loss_scale_groups, growth_factor: float = 2.0 ** (1.0 / 1000.0),
                 backoff_factor: float = 2.0 ** -0.5, min_loss_scale: float = 1.0, max_loss_scale: float = 2.0 ** 24):
        super().__init__(auto_prefix=False)
        self._init_scales: Union[float, List[float]]
        if isinstance(init_loss_scale, (list, tuple)):
            self._init_scales = [_check_scale(f"init_loss_scale[{i}]", v) for i, v in enumerate(init_loss_scale)]
        else:
            self._init_scales = _check_scale("init_loss_scale", init_loss_scale)
        self._loss_scale = init_loss_scale
        self.growth_factor = _check_scale("growth_factor", growth_factor)
        self.backoff_factor = _check_scale("backoff_factor", backoff_factor)
        if self.growth_factor < 1.0 or self.backoff_factor > 1.0:
            raise ValueError(f"GroupLossScaleManager: need growth_factor >= 1 and backoff_factor <= 1, got "
                             f"{growth_factor} and {backoff_factor}.")
        self.min_loss_scale = _check_scale("min_loss_scale", min_loss_scale)
        self.max_loss_scale = _check_scale("max_loss_scale", max_loss_scale)
        if self.min_loss_scale > self.max_loss_scale:
            raise ValueError(f"GroupLossScaleManager: min_loss_scale={min_loss_scale} > max_loss_scale="
                             f"{max_loss_scale}.")
        self.marker = _GradScaleMarker()
        self._groups: List[Any] = []
        self.loss_scale_number = 0
        self.scales = Parameter(Tensor(np.ones(2, np.float32)), name="group_loss_scales", requires_grad=False)
        self.loss_scale_groups = loss_scale_groups
        self._weight_group = None
        self._group_members = ()
        self._edge = None
        self._all_reduce_max: Optional[comm.AllReduce] = None
        self.steps_seen = 0
        self.overflow_steps = 0

    def __setattr__(self, name, value):
        if name == "loss_scale_groups":  # through the property, never registered as cell parameters
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    # -- groups ----------------------------------------------------------------------------------
    @property
    def loss_scale_groups(self):
        """The parameter groups; assigning them resets every group's scale to ``init_loss_scale``."""
        return self._groups

    @loss_scale_groups.setter
    def loss_scale_groups(self, groups):
        if not isinstance(groups, (list, tuple)):
            raise TypeError(f"GroupLossScaleManager: loss_scale_groups must be a list of parameter lists, got "
                            f"{type(groups).__name__}.")
        seen = {}
        checked = []
        for i, group in enumerate(groups):
            if not isinstance(group, (list, tuple)) or not all(isinstance(p, Parameter) for p in group):
                raise TypeError(f"GroupLossScaleManager: loss_scale_groups[{i}] must be a list of Parameters.")
            for param in group:
                if id(param) in seen:
                    raise ValueError(f"GroupLossScaleManager: parameter '{param.name}' is in loss_scale_groups"
                                     f"[{seen[id(param)]}] and loss_scale_groups[{i}]; a parameter belongs to one "
                                     f"group.")
                seen[id(param)] = i
            checked.append(list(group))
        object.__setattr__(self, "_groups", checked)
        self.set_loss_scale_status(len(checked), self._init_scales)

    def set_loss_scale_status(self, loss_scale_number: int, init_loss_scale) -> None:
        """(Re)create the scales: ``S_0 = S_{n+1} = 1`` and ``S_1..S_n`` from ``init_loss_scale``.

        Args:
            loss_scale_number: number of groups ``n``.
            init_loss_scale: one number for all groups, or a list of ``n`` numbers.
        """
        if isinstance(init_loss_scale, (list, tuple)):
            if len(init_loss_scale) != loss_scale_number and loss_scale_number:
                raise ValueError(f"GroupLossScaleManager: init_loss_scale has {len(init_loss_scale)} values for "
                                 f"{loss_scale_number} loss scale groups.")
            inner = [float(v) for v in init_loss_scale][:loss_scale_number]
        else:
            inner = [float(init_loss_scale)] * loss_scale_number
        self.loss_scale_number = int(loss_scale_number)
        self.scales.set_data(Tensor(np.array([1.0, *inner, 1.0], np.float32)))

    def bind(self, weights: Sequence[Parameter], reduce_overflow: bool = True) -> GroupLossScaleManager:
        """Tell the manager the order of the gradients it will receive (the train cell's weights).

        Called once by the train cell when it is built (after communication is initialised). A weight
        in no group is taken as unscaled (it must lie outside the marked region, before ``amp(x, 0, 1)``
        or after ``amp(x, n, n+1)``).

        Args:
            weights: the train cell's weights, in gradient order.
            reduce_overflow: agree on overflow across the ranks (data parallel); False: this rank decides alone.

        Returns:
            ``self``.
        """
        group_of = {id(p): i + 1 for i, group in enumerate(self._groups) for p in group}
        weight_group = tuple(group_of.get(id(w), 0) for w in weights)
        members = tuple(tuple(k for k, g in enumerate(weight_group) if g == i + 1)
                        for i in range(self.loss_scale_number))
        object.__setattr__(self, "_weight_group", weight_group)
        object.__setattr__(self, "_group_members", members)
        self._edge = Tensor(np.array([True] + [False] * self.loss_scale_number + [True]))
        self._all_reduce_max = comm.AllReduce("max", enabled=reduce_overflow)  # the data-parallel ranks agree
        return self

    # -- network side ------------------------------------------------------------------------------
    def construct(self, x, layer1, layer2):
        """Identity forward; backward scales the incoming gradient by ``S_layer1 / S_layer2``."""
        return self.marker(x, self.scales[layer1] / self.scales[layer2])

    # -- train-step side -------------------------------------------------------------------------
    def unscale_and_update(self, grads, forward_bad=None):
        """Unscale each gradient by its group's scale, detect overflow per group, update the scales.

        Args:
            grads: gradients computed with ``sens = 1`` (the markers scaled them), in :meth:`bind` order.
            forward_bad: optional float32 scalar, > 0 when the forward pass wrote a non-finite value outside
                the gradients (the loss, BatchNorm statistics): the step overflows, counted with the ungrouped
                weights (no group's scale backs off for it).

        Returns:
            ``(unscaled_grads, overflow)``: the gradients divided by the scale that produced them, and a
            bool scalar Tensor, True when some group overflowed on some rank (skip the step).
        """
        if self._weight_group is None:
            raise RuntimeError("GroupLossScaleManager.unscale_and_update: call bind(weights) first (the train "
                               "cell does it when it is built).")
        used = self.scales * 1.0
        unscaled = ()
        nonfinite = ()
        for k in range(len(grads)):
            grad = grads[k]
            unscaled = unscaled + (grad / used[self._weight_group[k]].astype(grad.dtype),)  # not * (1 / s): subnormal
            nonfinite = nonfinite + (ops.logical_not(_REDUCE_ALL(ops.isfinite(grad), ())).astype(mstype.float32),)
        flags = ()
        for i in range(self.loss_scale_number):
            flag = ops.zeros((), mstype.float32)
            for k in self._group_members[i]:
                flag = ops.maximum(flag, nonfinite[k])
            flags = flags + (flag,)
        ungrouped = ops.zeros((), mstype.float32)
        for k in range(len(grads)):
            if self._weight_group[k] == 0:
                ungrouped = ops.maximum(ungrouped, nonfinite[k])
        if forward_bad is not None:
            ungrouped = ops.maximum(ungrouped, ops.minimum(forward_bad, 1.0))
        # [o_1 .. o_n, o_ungrouped], reduced over ranks; prefixed with S_0's (never) flag it lines up with
        # the scales vector, whose ends are reset to 1 by the edge mask
        flags = self._all_reduce_max(ops.stack(flags + (ungrouped,))) > 0.5
        per_scale = ops.concat((ops.zeros(1, mstype.bool_), flags))
        new_scales = group_scale_update(used, per_scale, self.growth_factor, self.backoff_factor,
                                        self.min_loss_scale, self.max_loss_scale)
        new_scales = ops.select(self._edge, ops.ones_like(new_scales), new_scales)
        overflow = flags.any()
        overflow = ops.depend(overflow, ops.assign(self.scales, new_scales))
        return unscaled, overflow

    def update_loss_scale_status(self, layer: int, update_ratio):
        """Upstream API: multiply the scale of group ``layer`` (0-based) by ``update_ratio``; returns it."""
        index = layer + 1
        new = self.scales[index] * update_ratio
        hit = ops.arange(self.loss_scale_number + 2) == index
        ops.assign(self.scales, ops.select(hit, ops.ones_like(self.scales) * new, self.scales))
        return new

    # -- LossScaleManager API ----------------------------------------------------------------------
    def get_loss_scale(self):
        """The ``init_loss_scale`` given at construction (upstream API)."""
        return self._loss_scale

    def get_update_cell(self):
        """The manager itself (upstream API: it is its own update cell)."""
        return self

    def get_drop_overflow_update(self) -> bool:
        """True: a step where some group overflowed does not update the weights."""
        return True

    def update_loss_scale(self, overflow: bool) -> None:
        """Host-side hook ``mindspore.train.Model`` calls after every step: it only counts the step.

        The scales themselves are updated inside the train step by :meth:`unscale_and_update`; changing
        them here as well would update them twice per step.

        Args:
            overflow: whether the step overflowed (counted in :attr:`overflow_steps`).
        """
        self.steps_seen += 1
        self.overflow_steps += int(bool(overflow))

    def group_loss_scales(self) -> np.ndarray:
        """The current scales ``S_1..S_n`` (numpy, Python side)."""
        return self.scales.asnumpy()[1:self.loss_scale_number + 1].copy()


def is_group_manager(obj) -> bool:
    """Whether ``obj`` is a :class:`GroupLossScaleManager`."""
    return isinstance(obj, GroupLossScaleManager)


def require_group_manager(manager: Optional[object]) -> GroupLossScaleManager:
    """The manager, if it is a :class:`GroupLossScaleManager`; else the error ``loss_scale_group`` needs.

    Raises:
        BoostConfigError: ``boost.loss_scale_group`` is on but ``manager`` is not a GroupLossScaleManager (the one
            rule and message, also what ``Model`` raises through the spec's ``check_model``).
    """
    if isinstance(manager, GroupLossScaleManager):
        return manager
    got = "None" if manager is None else f"a {type(manager).__name__}"
    raise BoostConfigError(f"boost.loss_scale_group is enabled but loss_scale_manager is {got}; loss_scale_group "
                           f"needs loss_scale_manager=ms_boost.GroupLossScaleManager(init_loss_scale, "
                           f"loss_scale_groups) (also called between the layer groups in the network). Pass one, or "
                           f"turn loss_scale_group off.")

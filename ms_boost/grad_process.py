r"""Optimizer and parameter processing for boost: gradient centralization and parameter groups.

Two upstream-compatible helper classes live here:

* :class:`OptimizerProcess` rebuilds a user's optimizer with new parameter groups and, on request,
  gradient centralization (GC) for the weights GC applies to.
* :class:`ParameterProcess` maps parameter-group settings (``lr``, ``weight_decay`` ...) of an optimizer
  onto a new parameter list, and assigns gradient-split (``comm_fusion``) groups.

Gradient centralization (Yong et al., 2020) replaces the gradient of a weight of rank >= 2 by its
centred version, the mean being taken over every axis except the output-channel axis 0:

.. math::

    \hat g_{o,\cdot} = g_{o,\cdot} - \frac{1}{|I|}\sum_{i \in I} g_{o,i}

where ``I`` runs over all the other axes (input channels and kernel positions of a convolution
``(C_out, C_in, k_h, k_w)``, input features of a dense weight ``(C_out, C_in)``).

Upstream computes this with the Ascend-only ``Centralization`` operator, so the boost levels that turn
GC on fail on CPU and GPU. Here :func:`centralize_gradient` uses ordinary operators, and the optimizer
built by :meth:`OptimizerProcess.generate_new_optimizer` is an instance of a subclass of the user's
optimizer class whose ``gradients_centralization`` method calls it; every MindSpore optimizer calls
that method in its ``construct``, so the update is otherwise exactly the user's optimizer.
"""
from __future__ import annotations

import copy
import inspect
import logging
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np
from mindspore import Parameter, Tensor, nn
from mindspore.ops import composite as C
from mindspore.ops import functional as F

from ms_boost.fn_head import CommonHeadLastFN
from ms_boost.stages import optimizer_hooks

logger = logging.getLogger("ms_boost")

__all__ = [
    "carry_optimizer_state", "plain_decay_groups",
    "centralize_gradient", "gc_applies", "CentralizedGradients", "with_gradient_centralization",
    "optimizer_params", "OptimizerProcess", "ParameterProcess",
]


# --------------------------------------------------------------------------------------------------
# math
# --------------------------------------------------------------------------------------------------
def centralize_gradient(grad: Tensor) -> Tensor:
    r"""Gradient centralization of one weight gradient.

    .. math::

        \hat g = g - \operatorname{mean}_{\text{axes } 1..r-1}(g)

    with the mean kept broadcastable over axis 0 (output channels). A gradient of rank < 2 (a bias,
    a BatchNorm scale) is returned unchanged: GC is defined for weight matrices and kernels only.

    The gradient is seen as a ``(C_out, n)`` matrix and its mean taken over axis 1: one ``ReduceMean`` and one
    ``Sub`` per weight. The same mean taken over axes ``1..r-1`` of the kernel as it is cost 1.5x as much CPU
    time (MindSpore's CPU reduce over several axes; ``bench/results/gc_forms.md``, which also has a fused form
    over all kernels at once, measured slower).

    Args:
        grad: gradient of shape ``(C_out, ...)``.

    Returns:
        The centred gradient, same shape and dtype.
    """
    shape = grad.shape
    if len(shape) < 2:
        return grad
    rows = grad.reshape(shape[0], -1) if len(shape) > 2 else grad
    centred = rows - rows.mean(axis=1, keep_dims=True)
    return centred.reshape(shape) if len(shape) > 2 else centred


_centralize_where_flagged = C.MultitypeFuncGraph("ms_boost_centralize_where_flagged")


@_centralize_where_flagged.register("Bool", "Tensor")
def _centralize_one(flag, grad):
    """Centralize ``grad`` when its parameter's ``grad_centralization`` flag is set."""
    if flag:
        return centralize_gradient(grad)
    return grad


def gc_applies(param: Parameter, owner: Optional[nn.Cell]) -> bool:
    """Whether gradient centralization applies to ``param`` owned by the cell ``owner``.

    GC applies to weights of rank >= 2, except those of grouped (e.g. depthwise) convolutions, whose
    per-group kernels have too few inputs to centre, and that of the feature-normalised head
    (:class:`ms_boost.less_bn.CommonHeadLastFN`), whose rows are normalised anyway -- the same
    exclusions as upstream.

    Args:
        param: the parameter.
        owner: the cell that directly holds ``param`` (None when unknown).
    """
    if len(param.shape) < 2:
        return False
    if isinstance(owner, nn.Conv2d) and owner.group > 1:
        return False
    return not isinstance(owner, CommonHeadLastFN)


# --------------------------------------------------------------------------------------------------
# GC-enabled optimizer classes
# --------------------------------------------------------------------------------------------------
class CentralizedGradients:
    """Mixin putting :func:`centralize_gradient` behind ``Optimizer.gradients_centralization``.

    Placed before a MindSpore optimizer class in the bases (see :func:`with_gradient_centralization`),
    it centralizes the gradients of the parameters whose group has ``grad_centralization: True``,
    using ordinary operators (CPU, GPU and Ascend alike).
    """

    def gradients_centralization(self, gradients):
        """Centralize the flagged gradients (see :func:`centralize_gradient`)."""
        if self.is_group:
            return self.map_(F.partial(_centralize_where_flagged), self.grad_centralization_flags, gradients)
        return gradients


def with_gradient_centralization(opt_class: type) -> type:
    """The subclass of ``opt_class`` whose gradient centralization runs on every device.

    The subclass keeps the class name, constructor and update rule of ``opt_class``; only
    ``gradients_centralization`` differs. A class that already has it is returned unchanged.

    Raises:
        TypeError: ``opt_class`` is not a subclass of :class:`mindspore.nn.Optimizer`.
    """
    if not (isinstance(opt_class, type) and issubclass(opt_class, nn.Optimizer)):
        raise TypeError(f"with_gradient_centralization: expected a mindspore.nn.Optimizer subclass, got "
                        f"{opt_class!r}.")
    if issubclass(opt_class, CentralizedGradients):
        return opt_class
    return type(opt_class.__name__, (CentralizedGradients, opt_class),
                {"__module__": opt_class.__module__, "__doc__": opt_class.__doc__})


# --------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------
def _as_param_list(params, what: str) -> list:
    """A non-empty list of Parameters or of group dicts, else a clear error."""
    if params is None:
        raise ValueError(f"{what}: the optimizer got an empty parameter list.")
    items = list(params)
    if not items:
        raise ValueError(f"{what}: the optimizer got an empty parameter list.")
    if all(isinstance(p, Parameter) for p in items) or all(isinstance(p, dict) for p in items):
        return items
    raise TypeError(f"{what}: parameters must be all Parameter or all dict (parameter groups), got "
                    f"{sorted({type(p).__name__ for p in items})}.")


def _group_settings(group: dict) -> dict:
    """A group's settings without its parameter list (deep-copied so the caller's dict stays intact)."""
    return {k: (v if k in ("lr", "weight_decay") else copy.deepcopy(v))
            for k, v in group.items() if k not in ("params", "order_params")}


def optimizer_params(opt: nn.Optimizer):
    """The parameter argument ``opt`` was built with (list of Parameters or of group dicts).

    Falls back to the optimizer's own parameters when the recorded argument is unusable (an exhausted
    generator) or was never recorded (optimizers without ``@opt_init_args_register``, e.g.
    ``AdamWeightDecay``): as groups rebuilt from its per-parameter settings when it has groups
    (:func:`recovered_groups`), else the plain parameter list.
    """
    raw = getattr(opt, "init_params", {}).get("params")
    if isinstance(raw, (list, tuple)) and raw:
        return list(raw)
    if getattr(opt, "is_group", False):
        return recovered_groups(opt)
    return list(opt.parameters)


def share_learning_rate(old: nn.Optimizer, new: nn.Optimizer) -> bool:
    """Let ``new`` (an optimizer rebuilt from ``old``) train with ``old``'s learning-rate Parameter itself.

    A script keeps its own optimizer object: a callback that assigns ``opt.learning_rate`` then changes the rate that
    trains, and reading it shows that rate, as without boost. Done where both hold one fixed learning rate (a
    scalar Parameter), not per-group or per-step rates, which a rebuild may regroup. The value is the same at this
    point, except where the script changed the rate after building its optimizer, which now counts too.

    Returns:
        whether the Parameter is shared.
    """
    mine, theirs = getattr(old, "learning_rate", None), getattr(new, "learning_rate", None)
    if not (isinstance(mine, Parameter) and isinstance(theirs, Parameter)):
        return False
    if any(getattr(o, flag, False) for o in (old, new) for flag in ("is_group_lr", "dynamic_lr")):
        return False
    if mine.shape != theirs.shape or mine.dtype != theirs.dtype:
        return False
    new.learning_rate = mine
    return True


def _learning_rate_value(lr):
    """A learning rate as a constructor argument: a float (fixed), a Tensor (per-step list) or the schedule Cell."""
    if isinstance(lr, nn.Cell):
        # MindSpore's wrapper of a per-step list or Tensor (a LearningRateSchedule subclass of its own, named as
        # thor/optimizer.py does: the class is private) keeps the rates here; a user's schedule stays the Cell
        values = getattr(lr, "learning_rate", None)
        if type(lr).__name__ == "_IteratorLearningRate" and isinstance(values, Tensor):
            return Tensor(values.asnumpy())
        return lr
    if isinstance(lr, Tensor):
        value = lr.asnumpy()
        return float(value) if value.size == 1 else Tensor(value)
    return lr


def carry_optimizer_state(old: nn.Optimizer, new: nn.Optimizer) -> int:
    """Start ``new`` (rebuilt from ``old`` over some or all of its weights) from ``old``'s state.

    A script that resumes the tutorials' way loads a checkpoint into its network and optimizer, then builds the
    Model; the optimizer a boost plan rebuilds must go on from that state (the step that drives a per-step learning
    rate, the momenta), as MindSpore's Model goes on with the script's optimizer. Each state Parameter of ``new``
    (not a weight, not shared with ``old``) takes the value of ``old``'s of the same name, shape and dtype
    (``moments.fc1.weight``, ``global_step``, ``beta1_power``); the rest keep their initial values.

    A learning-rate Parameter is matched by the weights it drives instead (``get_lr_parameter``): per-group rates
    are named by group index (``learning_rate_group_0``), and a rebuild over some of the weights numbers its groups
    afresh, so by name one group took another's rate (twelfth users' round, fix 39).

    Returns:
        how many Parameters were copied.
    """
    weights = {id(p) for p in old.parameters} | {id(p) for p in new.parameters}
    mine = {p.name: p for p in old.get_parameters() if id(p) not in weights}
    rates = _learning_rate_sources(old, new)
    copied = 0
    for param in new.get_parameters():
        source = rates[id(param)] if id(param) in rates else mine.get(param.name)
        if id(param) in weights or source is None or source is param:
            continue
        if source.shape != param.shape or source.dtype != param.dtype:
            continue
        param.set_data(Tensor(source.asnumpy(), source.dtype))
        copied += 1
    return copied


def _rate_parameters(opt: nn.Optimizer, weight: Parameter) -> list:
    """The Parameters holding ``weight``'s learning rate in ``opt`` (none for a schedule without Parameters)."""
    try:
        rate = opt.get_lr_parameter(weight)
    except (TypeError, ValueError, AttributeError):  # not one of its weights, or no such method
        return []
    if isinstance(rate, Parameter):
        return [rate]
    return list(rate.get_parameters()) if isinstance(rate, nn.Cell) else []


def _learning_rate_sources(old: nn.Optimizer, new: nn.Optimizer) -> dict:
    """``id(new's learning-rate Parameter) -> old's`` for the same weight (None: nothing of old's matches)."""
    old_ids = {id(p) for p in old.parameters}
    out: dict = {}
    for weight in new.parameters:
        if id(weight) not in old_ids:
            continue
        mine, theirs = _rate_parameters(new, weight), _rate_parameters(old, weight)
        for index, param in enumerate(mine):
            source = theirs[index] if len(theirs) == len(mine) else None
            if out.get(id(param), source) is not source:  # one new rate over weights of two old rates: keep its own
                source = None
            out[id(param)] = source
    for weight in new.parameters:  # a rate only over weights old does not hold (an FN head's): its own, not by name
        for param in _rate_parameters(new, weight):
            out.setdefault(id(param), None)
    return out


def plain_decay_groups(opt: nn.Optimizer, params: Sequence[Parameter]):
    """``params`` (a non-group optimizer's parameter list) as groups that keep MindSpore's weight-decay filter.

    An optimizer built on a plain list decays only the parameters its ``decay_flags`` mark (MindSpore's filter: names
    holding neither ``beta`` nor ``gamma``, so BatchNorm and LayerNorm scales and shifts are not decayed, the filter
    read by name where an optimizer keeps no flags); one built on groups decays
    every parameter of a group with a weight decay. A rebuild that turns the list into groups (LessBN's) keeps the
    filter by putting those parameters in a group of their own with ``weight_decay`` 0. Returns ``params``
    unchanged where nothing would differ: a group optimizer, no weight decay, or no such parameter.
    """
    params = list(params)
    if getattr(opt, "is_group", False) or not getattr(opt, "exec_weight_decay", False) or not params \
            or not all(isinstance(p, Parameter) for p in params):
        return params
    flags = getattr(opt, "decay_flags", None)  # the optimizer's own verdict per parameter, when it keeps one
    if flags is not None and len(flags) == len(opt.parameters):
        decays = {id(p): bool(f) for p, f in zip(opt.parameters, flags)}
        exempt = [p for p in params if not decays.get(id(p), True)]
    else:
        exempt = [p for p in params if "beta" in p.name or "gamma" in p.name]
    if not exempt:
        return params
    exempt_ids = {id(p) for p in exempt}
    decayed = [p for p in params if id(p) not in exempt_ids]
    groups: List[dict] = [{"params": decayed}] if decayed else []
    return groups + [{"params": exempt, "weight_decay": 0.0}, {"order_params": params}]


def _default_learning_rate(opt: nn.Optimizer):
    """The optimizer's default learning rate (its constructor's ``learning_rate``) as a constructor argument.

    Read from the instance where the optimizer did not record it (a ``LearningRateSchedule`` argument, or no
    ``@opt_init_args_register``). With per-group rates ``opt.learning_rate`` holds one entry per parameter (a
    ``CellList`` when some are dynamic, which no constructor takes): the default is the entry of a parameter whose
    group set no ``lr``; when every group set its own, the default is unused and the first entry stands in.
    """
    lr = opt.learning_rate
    if not getattr(opt, "is_group_lr", False):
        return _learning_rate_value(lr)
    entries = list(lr)
    raw = getattr(opt, "init_params", {}).get("params")
    own = {id(p) for g in (raw if isinstance(raw, (list, tuple)) else ())
           if isinstance(g, dict) and "lr" in g for p in g.get("params", ())}
    for param, entry in zip(opt.parameters, entries):
        if id(param) not in own:
            return _learning_rate_value(entry)
    return _learning_rate_value(entries[0])


def _scalar(value):
    """A one-element Tensor as a Python number; anything else unchanged."""
    if isinstance(value, Tensor):
        array = value.asnumpy()
        if array.size == 1:
            return array.reshape(-1)[0].item()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _user_weight_decay(value):
    """A weight decay as the optimizer's constructor took it.

    MindSpore wraps a weight-decay schedule (a Cell of the step) as ``_WrappedWeightDecay(schedule, loss_scale)``,
    and a constructor wraps what it is given again, so the rebuild passes the schedule itself (None where the
    wrapper also scales by a loss scale other than 1, which the constructor's own ``loss_scale`` supplies). Any
    other value is returned as it is.
    """
    if isinstance(value, nn.Cell) and type(value).__name__ == "_WrappedWeightDecay":
        inner = getattr(value, "weight_decay", None)
        scale = _scalar(getattr(value, "loss_scale", 1.0))
        return inner if isinstance(inner, nn.Cell) and scale == 1.0 else None
    return value


def recovered_groups(opt: nn.Optimizer) -> List[dict]:
    """Parameter groups of an optimizer that did not record its argument.

    They are rebuilt from its per-parameter ``group_lr``, ``group_weight_decay`` and
    ``group_grad_centralization``: parameters with equal settings share a group, and an ``order_params`` group
    keeps the optimizer's parameter order.
    """
    params = list(opt.parameters)
    lrs = list(opt.learning_rate) if getattr(opt, "is_group_lr", False) else [None] * len(params)
    decays = opt.weight_decay if isinstance(opt.weight_decay, (list, tuple)) else [opt.weight_decay] * len(params)
    centralize = list(getattr(opt, "group_grad_centralization", [False] * len(params)))
    groups: Dict[tuple, dict] = {}
    for param, lr, decay, gc in zip(params, lrs, decays, centralize):
        decay = _user_weight_decay(decay)
        settings = {"weight_decay": decay if isinstance(decay, nn.Cell) else float(_scalar(decay)),
                    "grad_centralization": bool(gc)}
        key = (id(lr), id(decay) if isinstance(decay, nn.Cell) else settings["weight_decay"],
               settings["grad_centralization"])
        if lr is not None:
            settings["lr"] = _learning_rate_value(lr)
        groups.setdefault(key, {**settings, "params": []})["params"].append(param)
    return list(groups.values()) + [{"order_params": params}]


def recovered_init_args(opt: nn.Optimizer) -> dict:
    """Constructor arguments of an optimizer built without ``@opt_init_args_register``, read back from the instance.

    every argument of its class's ``__init__`` (except ``params`` and ``learning_rate``) must be an attribute of the
    same name (one-element Tensors become numbers).

    Raises:
        TypeError: an argument the instance does not keep (its value cannot be known).
    """
    signature = inspect.signature(type(opt).__init__)
    args: Dict[str, Any] = {}
    missing: List[str] = []
    for name, spec in signature.parameters.items():
        if name in ("self", "params", "learning_rate") or spec.kind in (spec.VAR_POSITIONAL, spec.VAR_KEYWORD):
            continue
        value = getattr(opt, name, None)
        if isinstance(value, (list, tuple)) and name == "weight_decay":  # per parameter: the groups carry it
            value = value[0] if value else spec.default
        if name == "weight_decay":
            value = _user_weight_decay(value)
            if isinstance(value, nn.Cell):  # a weight-decay schedule: the constructor takes the Cell
                args[name] = value
                continue
        value = _scalar(value)
        if value is None and spec.default is None:
            args[name] = None
        elif value is None or isinstance(value, (Tensor, nn.Cell)):
            missing.append(name)
        elif isinstance(spec.default, bool):
            args[name] = bool(value)
        elif isinstance(spec.default, float) and isinstance(value, (int, float)):
            args[name] = float(value)
        else:
            args[name] = value
    if missing and not optimizer_hooks(opt).is_first_order():
        raise TypeError(f"OptimizerProcess: {type(opt).__name__} is a second-order optimizer, which the algorithms "
                        f"that rebuild the optimizer (less_bn, grad_freeze: boost_level 'O1' and 'O2') cannot rebuild; "
                        f"train it with boost_level='O0' (the default) or switch less_bn and grad_freeze off.")
    if missing:
        raise TypeError(f"OptimizerProcess: optimizer {type(opt).__name__} does not record its constructor arguments "
                        f"(no @opt_init_args_register) and keeps no readable attribute for {missing}, so it cannot "
                        f"be rebuilt for boost; use an optimizer that records them (e.g. nn.Adam, nn.Momentum) or "
                        f"switch off the algorithms that rebuild it (less_bn, grad_freeze).")
    return args


def _constructor_args(recorded: dict) -> dict:
    """``init_args`` as keyword arguments.

    ``@opt_init_args_register`` records a ``**kwargs`` argument under the key ``kwargs`` (``nn.Adam``) and ``*args``
    under ``args``; they are passed on unpacked.
    """
    args = dict(recorded)
    extra = args.pop("kwargs", None)
    if isinstance(extra, dict):
        args.update(extra)
    elif extra is not None:
        args["kwargs"] = extra
    positional = args.pop("args", None)
    if positional not in (None, ()):
        args["args"] = positional
    return args


# --------------------------------------------------------------------------------------------------
# OptimizerProcess
# --------------------------------------------------------------------------------------------------
class OptimizerProcess:
    """Rebuild an optimizer with new parameter groups and, optionally, gradient centralization.

    Args:
        opt: the user's optimizer (any :class:`mindspore.nn.Optimizer`, or :class:`mindspore.nn.LARS`
            around one). It is not modified; :meth:`generate_new_optimizer` builds a new one of the same
            class with the same hyper-parameters.

    Attributes:
        origin_params: the parameter argument for the new optimizer (list of Parameters or group dicts);
            callers may replace it (e.g. with :meth:`ParameterProcess.generate_group_params`).

    Example:
        >>> process = OptimizerProcess(optimizer)
        >>> process.add_grad_centralization(network)
        >>> optimizer = process.generate_new_optimizer()

    Raises:
        TypeError: ``opt`` is not a MindSpore optimizer.
    """

    def __init__(self, opt: nn.Optimizer):
        if not isinstance(opt, nn.Optimizer):
            raise TypeError(f"OptimizerProcess: 'opt' must be a mindspore.nn.Optimizer, got {type(opt).__name__}.")
        self.is_lars = isinstance(opt, nn.LARS)
        inner = opt.opt if self.is_lars else opt
        self.single_opt = inner
        self.opt_class = type(inner)
        if hasattr(inner, "init_args"):
            self.opt_init_args = _constructor_args(inner.init_args)
            self.learning_rate = getattr(inner, "init_learning_rate", None)
            if self.learning_rate is None:  # MindSpore records no LearningRateSchedule argument
                self.learning_rate = _default_learning_rate(inner)
        else:  # e.g. nn.AdamWeightDecay: read its arguments back from the instance
            self.opt_init_args = recovered_init_args(inner)
            self.learning_rate = _default_learning_rate(inner)
        self.lars_init_args = _constructor_args(opt.init_args) if self.is_lars else {}
        self.origin_params = optimizer_params(inner)

    @staticmethod
    def build_params_dict(network: nn.Cell) -> Dict[int, nn.Cell]:
        """Map ``id(parameter)`` to the cell that directly holds it, for every parameter of ``network``."""
        owners = {}
        for _, cell in network.cells_and_names():
            for param in cell.get_parameters(expand=False):
                owners[id(param)] = cell
        return owners

    @staticmethod
    def build_gc_params_group(params_dict: Dict[int, nn.Cell], parameters: Sequence) -> List[dict]:
        """Split each parameter group into a GC part and a non-GC part.

        Args:
            params_dict: ``id(parameter) -> owner cell`` (from :meth:`build_params_dict`).
            parameters: parameter groups (dicts with ``params``); an ``order_params`` group is kept as is.
                A plain list of Parameters is treated as one group.

        Returns:
            New group dicts: for every input group, one with the parameters GC applies to
            (:func:`gc_applies`) and ``grad_centralization: True``, and one with the others and
            ``grad_centralization: False``; each keeps the input group's other settings. Empty parts are
            left out. The parameter order of the optimizer is kept through an ``order_params`` group.
        """
        groups = _as_param_list(parameters, "build_gc_params_group")
        if isinstance(groups[0], Parameter):
            groups = [{"params": groups}]
        out, order = [], None
        for group in groups:
            if "order_params" in group:
                order = list(group["order_params"])
                continue
            settings = _group_settings(group)
            centred = [p for p in group["params"] if gc_applies(p, params_dict.get(id(p)))]
            centred_ids = {id(p) for p in centred}
            plain = [p for p in group["params"] if id(p) not in centred_ids]
            if centred:
                out.append({**settings, "params": centred, "grad_centralization": True})
            if plain:
                out.append({**settings, "params": plain, "grad_centralization": False})
        if order is None:
            order = [p for group in groups if "params" in group for p in group["params"]]
        out.append({"order_params": order})
        return out

    def add_grad_centralization(self, network: nn.Cell) -> None:
        """Flag the parameters of :attr:`origin_params` that gradient centralization applies to.

        Unlike upstream, a plain parameter list is accepted too (it is one group).
        """
        params_dict = OptimizerProcess.build_params_dict(network)
        self.origin_params = OptimizerProcess.build_gc_params_group(params_dict, self.origin_params)

    def generate_new_optimizer(self) -> nn.Optimizer:
        """A new optimizer of the user's class and hyper-parameters over :attr:`origin_params`.

        When a group asks for ``grad_centralization`` the class is
        :func:`with_gradient_centralization` of the user's class, so GC runs on every device.
        """
        params = _as_param_list(self.origin_params, "generate_new_optimizer")
        wants_gc = any(isinstance(g, dict) and g.get("grad_centralization") for g in params)
        opt_class = with_gradient_centralization(self.opt_class) if wants_gc else self.opt_class
        learning_rate = self.learning_rate if self.learning_rate is not None else self.single_opt.learning_rate
        opt = opt_class(params, learning_rate=learning_rate, **self.opt_init_args)
        carry_optimizer_state(self.single_opt, opt)  # a loaded (resumed) optimizer's state goes on
        if self.is_lars:
            opt = nn.LARS(opt, **self.lars_init_args)
        return opt


# --------------------------------------------------------------------------------------------------
# ParameterProcess
# --------------------------------------------------------------------------------------------------
class ParameterProcess:
    """Parameter groups and gradient-split (``comm_fusion``) groups.

    Example:
        >>> process = ParameterProcess()
        >>> params = process.assign_parameter_group(network.trainable_params(), [50, 100])
        >>> groups = ParameterProcess.generate_group_params(params, optimizer.init_params["params"])
    """

    def __init__(self):
        self._parameter_indices = 1

    def assign_parameter_group(self, parameters: Sequence[Parameter],
                               split_point: Union[int, Sequence[int], None] = None) -> Sequence[Parameter]:
        """Give the parameters gradient all-reduce fusion groups split at ``split_point``.

        Parameters ``[0, s_1)`` get fusion id ``k``, ``[s_1, s_2)`` get ``k + 1`` ... (``k`` continues from
        the previous call on this object, starting at 1), so the gradient all-reduce is fused into one
        communication per group. Split points at or beyond the number of parameters have no effect (the
        upstream default ``[50, 100]`` is sized for ResNet-50). This sets ``comm_fusion`` on the
        parameters, which is what it is for; nothing else is changed.

        Args:
            parameters: the parameters in network order.
            split_point: an int, a list of ints, or None (one split in the middle).

        Returns:
            ``parameters`` (the same objects).

        Raises:
            TypeError: ``split_point`` is not an int, a list/tuple of ints or None.
            ValueError: a split point is negative.
        """
        if not isinstance(parameters, (list, tuple)) or not parameters:
            return parameters
        if split_point is None or (isinstance(split_point, (list, tuple)) and not split_point):
            points = [len(parameters) // 2]
        elif isinstance(split_point, int) and not isinstance(split_point, bool):
            points = [split_point]
        elif isinstance(split_point, (list, tuple)) and all(
                isinstance(p, int) and not isinstance(p, bool) for p in split_point):
            points = list(split_point)
        else:
            raise TypeError(f"assign_parameter_group: split_point must be an int, a list of ints or None, got "
                            f"{split_point!r}.")
        if any(p < 0 for p in points):
            raise ValueError(f"assign_parameter_group: split_point={points} must hold non-negative parameter "
                             f"indices.")
        cuts = set(points)
        for index, param in enumerate(parameters):
            if index in cuts and index > 0:
                self._parameter_indices += 1
            param.comm_fusion = self._parameter_indices
        return parameters

    @staticmethod
    def generate_group_params(parameters: Sequence[Parameter], origin_params: Sequence) -> list:
        """Parameter groups for ``parameters`` carrying the settings of the groups in ``origin_params``.

        A parameter takes the settings (``lr``, ``weight_decay``, ``grad_centralization``) of the origin
        group that holds it (matched by identity, else by name). Parameters no origin group holds (new
        ones, e.g. the feature-normalised head's multiplier) form one more group with the optimizer's
        global settings. Origin groups left without parameters are dropped; an ``order_params`` group is
        rebuilt in the order of ``parameters``.

        Args:
            parameters: the new parameter list (network order).
            origin_params: the optimizer's parameter argument (Parameters or group dicts).

        Returns:
            ``[{"params": parameters}]`` when ``origin_params`` is a plain list, else group dicts.

        Raises:
            ValueError: ``origin_params`` is empty.
            TypeError: ``origin_params`` mixes Parameters and dicts or holds something else.
        """
        origin = _as_param_list(origin_params, "generate_group_params")
        parameters = list(parameters)
        if isinstance(origin[0], Parameter):
            return [{"params": parameters}]
        by_id, by_name = {}, {}
        groups = [g for g in origin if "order_params" not in g]
        has_order = len(groups) != len(origin)
        for index, group in enumerate(groups):
            for param in group["params"]:
                by_id[id(param)] = index
                by_name[param.name] = index
        members: List[list] = [[] for _ in groups]
        new: List[Parameter] = []
        for param in parameters:
            slot = by_id.get(id(param), by_name.get(param.name))
            (new if slot is None else members[slot]).append(param)
        out = [{**_group_settings(group), "params": members[i]} for i, group in enumerate(groups) if members[i]]
        if new:
            out.append({"params": new})
        if has_order:
            out.append({"order_params": parameters})
        return out

"""LessBN's conversion: fewer BatchNorm layers, a feature-normalised head, gradient centralization.

Upstream's LessBN marks the network for a graph pass that, at every residual addition whose main
branch is a chain ``conv -> BN -> ReLU -> conv -> BN -> ReLU -> conv -> BN``, removes the BatchNorm
layers of that chain except the last one before the addition (the shortcut branch keeps its BN).
Optionally (``fn_flag``) it replaces the final fully connected layer by :class:`CommonHeadLastFN`,
and ``AutoBoost`` adds gradient centralization (``gc_flag``) to the optimizer.

This module does the same at the level of the Cell tree, so PyNative and Graph mode train the same
network:

* **BN reduction** -- every cell's ``construct`` is read (its Python source, as MindSpore's graph
  compiler also does) and each residual addition (``a + b``, ``a += b``, ``ops.add``, an ``Add``
  primitive) is traced back along each operand through single-input layers (convolutions,
  activations, pooling, ``SequentialCell`` containers and sub-cells that are themselves such chains).
  On each branch the BatchNorm nearest to the addition is kept; the BatchNorm layers further up the
  same branch are replaced by :class:`mindspore.nn.Identity`. A BatchNorm that is the nearest one of
  some branch is never removed. For ResNet bottleneck blocks this is exactly upstream's result; for
  two-convolution blocks (which upstream's fixed-length pattern does not match) the first BN of the
  block is removed as well. Networks without residual additions keep all their BatchNorm layers.
* **FN head** (``fn_flag``) -- the last :class:`mindspore.nn.Dense` of the tree (definition order) is
  replaced by :class:`CommonHeadLastFN` built on the *same* weight Parameter (bias dropped, as
  upstream), so checkpoints keep the weight's name.
* **Gradient centralization** (``gc_flag``) -- see :mod:`ms_boost.grad_process`; written with ordinary
  operators, so it runs on CPU and GPU too (upstream needs Ascend).

**The network is converted in place** (as upstream does): after ``LessBN(net)`` or
:func:`apply_less_bn`, ``net`` itself has the Identity layers and the FN head, so the trained
parameters, ``save_checkpoint(net, ...)`` and an evaluation network built on ``net`` all see the
trained structure. Conversion is idempotent: converting an already converted network changes nothing.
"""
from __future__ import annotations

import ast
import inspect
import logging
import textwrap
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from mindspore import nn
from mindspore.nn.layer.normalization import _BatchNorm
from mindspore.ops.primitive import Primitive

from ms_boost.fn_head import CommonHeadLastFN, default_fn_scale, l2_normalize
from ms_boost.grad_process import OptimizerProcess, ParameterProcess, plain_decay_groups, share_learning_rate

logger = logging.getLogger("ms_boost")

__all__ = [
    "l2_normalize", "CommonHeadLastFN", "LessBN", "LessBNReport", "convert_less_bn",
    "apply_less_bn", "apply_less_bn_eval",
]


# --------------------------------------------------------------------------------------------------
# finding the BatchNorm layers to remove: data flow of each cell's construct
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Slot:
    """Where a child cell hangs: ``parent._cells[key]``."""

    parent: nn.Cell
    key: str

    def cell(self) -> nn.Cell:
        return self.parent._cells[self.key]


@dataclass(frozen=True)
class _Chain:
    """BatchNorm slots met walking back from a value through single-input layers, nearest first.

    ``source`` is the name of the construct argument the walk ended at, or None when it ended at
    something else (an addition, a multi-input op, code it does not understand).
    """

    bns: Tuple[_Slot, ...] = ()
    source: Optional[str] = None

    def then(self, other: _Chain) -> _Chain:
        return _Chain(self.bns + other.bns, other.source)


_STOP = _Chain()
_ADD_NAMES = frozenset({"add", "tensor_add", "Add", "TensorAdd", "__add__", "AddN"})


def _is_container(cell) -> bool:
    return isinstance(cell, nn.SequentialCell)


def _construct_tree(cell: nn.Cell) -> Optional[ast.FunctionDef]:
    """The parsed ``construct`` of ``cell``'s class, or None if its source is unavailable."""
    try:
        source = textwrap.dedent(inspect.getsource(type(cell).construct))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None
    node = tree.body[0] if tree.body else None
    return node if isinstance(node, ast.FunctionDef) else None


class _FlowAnalysis:
    """Residual additions and single-input chains of a Cell tree (see the module docstring)."""

    def __init__(self):
        self.merges: List[Tuple[_Chain, ...]] = []
        self._transfer: Dict[int, Optional[_Chain]] = {}
        self._visited: set = set()

    # -- cell level ------------------------------------------------------------------------------
    def transfer(self, slot: _Slot) -> Optional[_Chain]:
        """Chain from the output of the cell at ``slot`` back to its first input, or None."""
        cell = slot.cell()
        if isinstance(cell, _BatchNorm):
            return _Chain((slot,), "input")
        if _is_container(cell):
            chain = _Chain((), "input")
            for key in cell._cells:
                inner = self.transfer(_Slot(cell, key))
                if inner is None:
                    return None
                chain = inner.then(chain)
            return chain
        if not cell._cells:
            return _Chain((), "input")  # a leaf layer (conv, activation, pooling ...): passes through
        if id(cell) not in self._transfer:
            self._transfer[id(cell)] = None  # guards recursion
            self._transfer[id(cell)] = self.analyse(cell)
        return self._transfer[id(cell)]

    def analyse(self, cell: nn.Cell) -> Optional[_Chain]:
        """Record the residual additions of ``cell.construct``; return its output-to-input chain."""
        self._visited.add(id(cell))
        func = _construct_tree(cell)
        if func is None:
            return None
        args = [a.arg for a in func.args.args[1:]]
        env: Dict[str, _Chain] = {name: _Chain((), name) for name in args}
        returned = self._block(cell, func.body, env)
        if returned is None or not args or returned.source != args[0]:
            return None
        return _Chain(returned.bns, "input")

    def visit_tree(self, network: nn.Cell) -> None:
        """Analyse every cell of ``network`` that has a construct of its own."""
        for _, cell in network.cells_and_names():
            if id(cell) in self._visited or _is_container(cell) or not cell._cells:
                continue
            if isinstance(cell, (nn.CellList, nn.CellDict)):
                continue
            self.analyse(cell)

    # -- statements ------------------------------------------------------------------------------
    def _block(self, cell, statements, env) -> Optional[_Chain]:
        returned = None
        for stmt in statements:
            if isinstance(stmt, ast.Assign):
                value = self._expr(cell, stmt.value, env)
                for target in stmt.targets:
                    self._bind(target, value, env)
            elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                self._bind(stmt.target, self._expr(cell, stmt.value, env), env)
            elif isinstance(stmt, ast.AugAssign):
                value = self._expr(cell, stmt.value, env)
                if isinstance(stmt.op, ast.Add) and isinstance(stmt.target, ast.Name):
                    self.merges.append((env.get(stmt.target.id, _STOP), value))
                self._bind(stmt.target, _STOP, env)
            elif isinstance(stmt, (ast.If, ast.For, ast.While)):
                branches = [stmt.body, stmt.orelse]
                results = []
                for body in branches:
                    local = dict(env)
                    ret = self._block(cell, body, local)
                    results.append((local, ret))
                for local, _ in results[::-1]:
                    env.update({k: v for k, v in local.items() if env.get(k) != v})
                rets = [r for _, r in results if r is not None]
                if rets and returned is None:
                    returned = rets[0]
            elif isinstance(stmt, ast.Return) and stmt.value is not None:
                value = self._expr(cell, stmt.value, env)
                if returned is None:
                    returned = value
            elif isinstance(stmt, ast.Expr):
                self._expr(cell, stmt.value, env)
        return returned

    @staticmethod
    def _bind(target, value, env) -> None:
        if isinstance(target, ast.Name):
            env[target.id] = value
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                _FlowAnalysis._bind(element, _STOP, env)

    # -- expressions -----------------------------------------------------------------------------
    def _merge(self, cell, operands, env) -> _Chain:
        self.merges.append(tuple(self._expr(cell, op, env) for op in operands))
        return _STOP

    def _expr(self, cell, node, env) -> _Chain:
        if isinstance(node, ast.Name):
            return env.get(node.id, _STOP)
        if isinstance(node, ast.BinOp):
            if isinstance(node.op, ast.Add):
                return self._merge(cell, (node.left, node.right), env)
            self._expr(cell, node.left, env)
            self._expr(cell, node.right, env)
            return _STOP
        if isinstance(node, ast.Call):
            return self._call(cell, node, env)
        for child in ast.iter_child_nodes(node):  # still record additions nested anywhere
            if isinstance(child, ast.expr):
                self._expr(cell, child, env)
        return _STOP

    def _call(self, cell, node: ast.Call, env) -> _Chain:
        func = node.func
        args = list(node.args)
        # self.<child>(x): a sub-cell or a primitive held by the cell
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
            child = cell._cells.get(func.attr)
            if child is not None:
                if len(args) != 1:
                    for arg in args:
                        self._expr(cell, arg, env)
                    return _STOP
                through = self.transfer(_Slot(cell, func.attr))
                upstream = self._expr(cell, args[0], env)
                return _STOP if through is None else through.then(upstream)
            attr = getattr(cell, func.attr, None)
            if isinstance(attr, Primitive):
                return self._function(cell, attr.name, args, env)
            for arg in args:
                self._expr(cell, arg, env)
            return _STOP
        # P.Add()(a, b), ops.relu(x), x.reshape(...), relu(x)
        if isinstance(func, ast.Call):
            inner = func.func
            name = inner.attr if isinstance(inner, ast.Attribute) else getattr(inner, "id", "")
            return self._function(cell, name, args, env)
        if isinstance(func, ast.Attribute):
            if isinstance(func.value, ast.Name) and func.value.id in env:  # method of a tensor variable
                base = self._expr(cell, func.value, env)
                if func.attr in _ADD_NAMES and args:
                    self.merges.append((base, self._expr(cell, args[0], env)))
                    return _STOP
                for arg in args:
                    self._expr(cell, arg, env)
                return base
            return self._function(cell, func.attr, args, env)
        if isinstance(func, ast.Name):
            return self._function(cell, func.id, args, env)
        return _STOP

    def _function(self, cell, name: str, args, env) -> _Chain:
        if name in _ADD_NAMES and len(args) >= 2:
            return self._merge(cell, args[:2], env)
        if name in _ADD_NAMES and len(args) == 1 and isinstance(args[0], (ast.Tuple, ast.List)):
            return self._merge(cell, args[0].elts, env)
        if not args:
            return _STOP
        first = self._expr(cell, args[0], env)
        for arg in args[1:]:
            self._expr(cell, arg, env)
        return first


def _bn_slots_to_remove(network: nn.Cell) -> List[_Slot]:
    """The BatchNorm slots LessBN replaces by Identity (see the module docstring)."""
    flow = _FlowAnalysis()
    flow.visit_tree(network)
    keep: set = set()
    drop: List[_Slot] = []
    for chains in flow.merges:
        for chain in chains:
            if chain.bns:
                keep.add(chain.bns[0])
                drop.extend(chain.bns[1:])
    seen, out = set(), []
    for slot in drop:
        if slot not in keep and slot not in seen:
            seen.add(slot)
            out.append(slot)
    return out


# --------------------------------------------------------------------------------------------------
# conversion
# --------------------------------------------------------------------------------------------------
@dataclass
class LessBNReport:
    """What :func:`convert_less_bn` changed.

    Attributes:
        removed_bn: parameter-name prefixes of the BatchNorm layers replaced by Identity.
        fn_head: prefix of the Dense layer replaced by :class:`CommonHeadLastFN` (None if none).
        notes: anything not converted, and why.
    """

    removed_bn: List[str] = field(default_factory=list)
    fn_head: Optional[str] = None
    notes: List[str] = field(default_factory=list)


def _slots(network: nn.Cell):
    """Every (slot, cell) of the tree, depth first in definition order."""
    for key, child in list(network._cells.items()):
        if child is None:
            continue
        yield _Slot(network, key), child
        yield from _slots(child)


def _replace(slot: _Slot, new: nn.Cell) -> None:
    parent = slot.parent
    if isinstance(parent, nn.SequentialCell):
        parent[list(parent._cells).index(slot.key)] = new
    elif isinstance(parent, nn.CellList):
        parent[int(slot.key)] = new
    else:
        parent.insert_child_to_cell(slot.key, new)


def _prefix(cell: nn.Cell) -> str:
    params = list(cell.get_parameters(expand=False))
    if not params:
        return "?"
    name = params[0].name
    return name.rsplit(".", 1)[0] if "." in name else ""


def _fn_head_slot(network: nn.Cell) -> Tuple[Optional[Tuple[_Slot, nn.Dense]], str]:
    """``((slot, layer), "")``: the last Dense layer the FN head replaces, or ``(None, why not)``."""
    everything = list(_slots(network))
    if any(isinstance(cell, CommonHeadLastFN) for _, cell in everything):
        return None, "the network already has a feature-normalised head"
    dense = [(slot, cell) for slot, cell in everything if isinstance(cell, nn.Dense)]
    if not dense:
        return None, "fn_flag: the network has no Dense layer to replace"
    if dense[-1][1].activation_flag:
        return None, f"fn_flag: the last Dense layer '{_prefix(dense[-1][1])}' has an activation; left unchanged"
    return dense[-1], ""


def preview_less_bn(network: nn.Cell, fn_flag: bool = False) -> Dict[str, int]:
    """What :func:`convert_less_bn` would change in ``network``, which is left unchanged.

    Returns:
        ``{"batchnorm": BatchNorm layers of the network, "removed_bn": those LessBN would replace by Identity,
        "fn_head": 1 if it would add the FN head (``fn_flag`` and a last Dense layer without activation) else 0}``.

    Raises:
        TypeError: ``network`` is not a Cell.
    """
    if not isinstance(network, nn.Cell):
        raise TypeError(f"LessBN: network must be a mindspore.nn.Cell, got {type(network).__name__}.")
    batchnorm = sum(1 for _, cell in network.cells_and_names() if isinstance(cell, _BatchNorm))
    head = _fn_head_slot(network)[0] if fn_flag else None
    return {"batchnorm": batchnorm, "removed_bn": len(_bn_slots_to_remove(network)), "fn_head": int(head is not None)}


def convert_less_bn(network: nn.Cell, fn_flag: bool = False, fn_scale: Optional[float] = None) -> LessBNReport:
    """Convert ``network`` **in place**: remove the redundant BatchNorm layers, optionally add the FN head.

    Args:
        network: any Cell tree (a backbone or a loss network around it).
        fn_flag: replace the last Dense layer by :class:`CommonHeadLastFN` (sharing its weight).
        fn_scale: the new head's starting multiplier; None: :func:`~ms_boost.fn_head.default_fn_scale` of its
            number of classes (upstream starts at 1.0).

    Returns:
        A :class:`LessBNReport`. Converting a converted network again changes nothing.

    Raises:
        TypeError: ``network`` is not a Cell or ``fn_flag`` is not a bool.
    """
    if not isinstance(network, nn.Cell):
        raise TypeError(f"LessBN: network must be a mindspore.nn.Cell, got {type(network).__name__}.")
    if not isinstance(fn_flag, bool):
        raise TypeError(f"LessBN: fn_flag must be a bool, got {fn_flag!r}.")
    if fn_scale is not None and (isinstance(fn_scale, bool) or not isinstance(fn_scale, (int, float))
                                 or not 0 < fn_scale < float("inf")):
        raise ValueError(f"LessBN: fn_scale={fn_scale!r} is not allowed; allowed: None or a number > 0.")
    report = LessBNReport()
    for slot in _bn_slots_to_remove(network):
        report.removed_bn.append(_prefix(slot.cell()))
        _replace(slot, nn.Identity())
    if fn_flag:
        target, note = _fn_head_slot(network)
        if target is None:
            report.notes.append(note)
        else:
            slot, layer = target
            weight_name = layer.weight.name
            scale = default_fn_scale(layer.out_channels) if fn_scale is None else float(fn_scale)
            head = CommonHeadLastFN(layer.in_channels, layer.out_channels, layer.weight, has_bias=False,
                                    multiplier_init=scale)
            _replace(slot, head)
            prefix = weight_name[:-len("weight")] if weight_name.endswith("weight") else weight_name + "."
            head.weight.name = weight_name
            head.multiplier.name = prefix + "multiplier"
            report.fn_head = prefix.rstrip(".")
    if report.removed_bn or report.fn_head:
        logger.info("LessBN: removed BatchNorm %s; FN head at %s", report.removed_bn, report.fn_head)
    for note in report.notes:  # fn_flag asked for a head that was not added: say why
        logger.info("LessBN: %s", note)
    return report


class LessBN(nn.Cell):
    r"""Reduce the BatchNorm layers of a network and optionally give it a feature-normalised head.

    The wrapped ``network`` is **converted in place** (see :func:`convert_less_bn`); the wrapper just
    calls it. Parameter names are unchanged.

    Args:
        network: the network (a backbone or a loss network).
        fn_flag: replace the last Dense layer by :class:`CommonHeadLastFN`.
        fn_scale: its starting multiplier (None: :func:`~ms_boost.fn_head.default_fn_scale`; 1.0 is upstream's).

    Attributes:
        report: the :class:`LessBNReport` of the conversion.

    Inputs:
        - **\*inputs** -- whatever ``network`` takes.
    """

    # a pass-through wrapper: it holds no parameter and computes nothing of its own, so mixed precision cast to its
    # ``network`` is the same computation (ms_boost.model casts that one: MindSpore's amp "O1" rewrite cannot parse
    # ``self.network(*inputs)`` when ``network`` is a SequentialCell)
    forwards_to_network = True

    def __init__(self, network: nn.Cell, fn_flag: bool = False, fn_scale: Optional[float] = None):
        super().__init__(auto_prefix=False)
        self.report = convert_less_bn(network, fn_flag, fn_scale)
        self.network = network

    def construct(self, *inputs):
        """The converted network's output."""
        return self.network(*inputs)


def apply_less_bn(network: nn.Cell, optimizer: nn.Optimizer, less_bn_cfg, common_cfg) -> tuple:
    """The LessBN step of ``AutoBoost.network_auto_process_train``.

    1. convert ``network`` in place (:class:`LessBN`, with ``less_bn_cfg.fn_flag``);
    2. give the trainable parameters gradient all-reduce fusion groups split at
       ``common_cfg.gradient_split_groups`` (:meth:`ParameterProcess.assign_parameter_group`);
    3. rebuild the optimizer over the converted network's parameters that the user's optimizer trained
       (plus those the conversion created), keeping the user's parameter group settings
       (:meth:`ParameterProcess.generate_group_params`), with gradient centralization when
       ``less_bn_cfg.gc_flag``.

    Args:
        network: the loss network.
        optimizer: the user's optimizer (left untouched; a new one is returned).
        less_bn_cfg: object with ``fn_flag`` and ``gc_flag`` (and optionally ``fn_scale``).
        common_cfg: object with ``gradient_split_groups``.

    Returns:
        ``(LessBN(network), new_optimizer)``.
    """
    existing = {id(p) for p in network.trainable_params()}
    wrapped = network if isinstance(network, LessBN) else LessBN(network, fn_flag=less_bn_cfg.fn_flag,
                                                                 fn_scale=getattr(less_bn_cfg, "fn_scale", None))
    process = OptimizerProcess(optimizer)
    # the parameters the user's optimizer trained (minus removed ones) plus those the conversion created
    held = {id(p) for p in optimizer.parameters}
    # the FN heads' multipliers are trained even when the network was converted by an earlier Model (a second
    # Model on the same net and optimizer: they are not new then, and the user's optimizer never held them)
    held |= {id(cell.multiplier) for _, cell in wrapped.cells_and_names() if isinstance(cell, CommonHeadLastFN)}
    trained = [p for p in wrapped.trainable_params() if id(p) in held or id(p) not in existing]
    params = ParameterProcess().assign_parameter_group(trained, list(common_cfg.gradient_split_groups))
    # a non-group optimizer becomes a group one here: its weight-decay filter (no decay of BN's gamma/beta) is kept
    origin = plain_decay_groups(process.single_opt, process.origin_params)
    process.origin_params = ParameterProcess.generate_group_params(params, origin)
    if less_bn_cfg.gc_flag:
        process.add_grad_centralization(wrapped)
    rebuilt = process.generate_new_optimizer()
    share_learning_rate(process.single_opt, rebuilt.opt if isinstance(rebuilt, nn.LARS) else rebuilt)
    return wrapped, rebuilt


def apply_less_bn_eval(network: nn.Cell, less_bn_cfg) -> nn.Cell:
    """The LessBN step of ``AutoBoost.network_auto_process_eval``.

    The evaluation network must have the structure the weights were trained in: the same BatchNorm
    reduction and, with ``fn_flag``, the FN head. On a network already converted for training this
    changes nothing; on a fresh network (e.g. evaluating a LessBN checkpoint in a new process) it
    converts it in place so the checkpoint's ``multiplier`` has a home.

    Returns:
        ``LessBN(network)``.
    """
    if isinstance(network, LessBN):
        return network
    return LessBN(network, fn_flag=less_bn_cfg.fn_flag, fn_scale=getattr(less_bn_cfg, "fn_scale", None))

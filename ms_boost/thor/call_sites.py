"""How many times one forward pass of a network calls each of its cells, read from the source of ``construct``.

THOR's layers hold one call's factor statistics: a layer called twice in a forward pass (one ``nn.Dense`` applied
twice, shared weights) would pair the input statistic of one call with the output-gradient statistic of the other
(PyNative), or not compile at all (Graph mode: both calls write the same buffers). The converter leaves such layers
as they are; this module finds them.

The count is static: for every cell, the call sites ``self.<child>(...)`` in its ``construct`` (and in the methods
``construct`` calls as ``self.<method>(...)``), where a call inside a ``for``/``while`` loop counts as at least two
calls and of two ``if`` branches only the branch with more calls counts. A child whose only uses are reads of its
members (``self.out_proj.weight``: ``nn.MultiheadAttention`` computes with its ``out_proj`` Dense's Parameters and
never calls it) counts no call. A child the source does not call by name otherwise (a ``SequentialCell`` slot, a
``CellList`` entry iterated over, a cell whose class source cannot be read) counts as one call. A cell reached
through several parents, or several names of one parent, adds up its calls along every path, each path multiplied by
the calls of the cells above it. A call made through a local alias (``f = self.fc``) is not seen.
"""
from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Dict, Optional, Set

from mindspore import nn

__all__ = ["forward_calls"]

#: at least this many calls for a call site inside a loop
_LOOP_CALLS = 2

_SITES_CACHE: Dict[type, Optional[Dict[str, int]]] = {}


def _method_tree(cls: type, name: str) -> Optional[ast.FunctionDef]:
    function = getattr(cls, name, None)
    if not inspect.isfunction(function):
        return None
    try:
        source = textwrap.dedent(inspect.getsource(function))
    except (OSError, TypeError):
        return None
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    node = tree.body[0] if tree.body else None
    return node if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None  # type: ignore[return-value]


def _add(total: Dict[str, int], more: Dict[str, int], times: int = 1) -> Dict[str, int]:
    for name, count in more.items():
        total[name] = total.get(name, 0) + times * count
    return total


def _most(first: Dict[str, int], second: Dict[str, int]) -> Dict[str, int]:
    return {name: max(first.get(name, 0), second.get(name, 0)) for name in set(first) | set(second)}


class _Sites:
    """Call sites ``self.<name>(...)`` of one class's ``construct``, methods it calls inlined."""

    def __init__(self, cls: type):
        self.cls = cls
        self.inlining: Set[str] = set()
        self.members: Set[str] = set()  # names read only as `self.<name>.<member>` (unless also in bare or called)
        self.bare: Set[str] = set()

    def method(self, name: str) -> Optional[Dict[str, int]]:
        if name in self.inlining:  # recursion: counted once
            return {}
        tree = _method_tree(self.cls, name)
        if tree is None:
            return None
        self.inlining.add(name)
        try:
            return self.block(tree.body)
        finally:
            self.inlining.discard(name)

    def block(self, statements) -> Dict[str, int]:
        total: Dict[str, int] = {}
        for statement in statements:
            _add(total, self.node(statement))
        return total

    def node(self, node) -> Dict[str, int]:
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            head = self.node(node.iter if isinstance(node, (ast.For, ast.AsyncFor)) else node.test)
            return _add(_add(head, self.block(node.body), _LOOP_CALLS), self.block(node.orelse))
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            inner: Dict[str, int] = {}
            for child in ast.iter_child_nodes(node):
                _add(inner, self.node(child))
            return _add({}, inner, _LOOP_CALLS)
        if isinstance(node, ast.If):
            return _add(self.node(node.test), _most(self.block(node.body), self.block(node.orelse)))
        if isinstance(node, ast.IfExp):
            return _add(self.node(node.test), _most(self.node(node.body), self.node(node.orelse)))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            return {}  # defined, not called here
        total: Dict[str, int] = {}
        if isinstance(node, ast.Attribute):
            if _is_self(node.value):  # `self.<name>` not called here: passed on, stored, ...
                self.bare.add(node.attr)
            elif isinstance(node.value, ast.Attribute) and _is_self(node.value.value):
                self.members.add(node.value.attr)  # `self.<name>.<member>`: e.g. a child's weight read directly
                return total
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Attribute) and _is_self(func.value.value):
                self.bare.add(func.value.attr)  # `self.<name>.<member>(...)`: a call into the child, not counted
            if isinstance(func, ast.Attribute) and _is_self(func.value):
                inlined = self.method(func.attr) if inspect.isfunction(getattr(self.cls, func.attr, None)) else None
                if inlined is not None:
                    _add(total, inlined)
                else:
                    total[func.attr] = total.get(func.attr, 0) + 1
                for child in list(node.args) + [k.value for k in node.keywords]:
                    _add(total, self.node(child))
                return total
        for child in ast.iter_child_nodes(node):
            _add(total, self.node(child))
        return total


def _is_self(node) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def _call_sites(cls: type) -> Optional[Dict[str, int]]:
    """Calls per forward pass of each ``self.<name>`` in ``cls.construct`` (None: the source cannot be read).

    A name whose only uses are reads of its members (``self.out_proj.weight``) counts 0 calls: the parent computes
    with the child's Parameters itself.
    """
    if cls not in _SITES_CACHE:
        sites = _Sites(cls)
        calls = sites.method("construct")
        if calls is not None:
            for name in sites.members - sites.bare - set(calls):
                calls[name] = 0
        _SITES_CACHE[cls] = calls
    return _SITES_CACHE[cls]


def forward_calls(network: nn.Cell) -> Dict[int, int]:
    """How many times one call of ``network`` calls each cell of its tree, by ``id`` of the cell.

    Read from the source as the module docstring says; ``network`` itself counts 1.
    """
    counts: Dict[int, int] = {id(network): 1}
    on_path: Set[int] = set()

    def visit(cell: nn.Cell, times: int) -> None:
        if id(cell) in on_path:
            return
        on_path.add(id(cell))
        sites = _call_sites(type(cell))
        for name, child in cell._cells.items():  # pylint: disable=protected-access
            if child is None:
                continue
            calls = times * (sites or {}).get(name, 1)
            counts[id(child)] = counts.get(id(child), 0) + calls
            visit(child, calls)
        on_path.discard(id(cell))

    visit(network, 1)
    return counts

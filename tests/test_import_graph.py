"""Arrows point one way: no import cycle inside ms_boost, no ms_boost import hidden inside a function,
and the registry, config.py, the pipeline and the layers below them reach no algorithm module, even through
other modules (the built-ins are registered by ms_boost/builtins.py, which the package face imports).

The graph is read from the source with ``ast`` (no module is executed): an edge ``a -> b`` for every
``import ms_boost.b`` / ``from ms_boost.b import ...`` / ``from ms_boost import b`` in ``a``.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ms_boost"
#: packages that are not algorithms: autotune sits beside the face (it resolves plans with AutoBoost and trains
#: trials through comm; it imports no algorithm, checked below); comm is the communication layer at the bottom
NOT_ALGORITHMS = ("autotune", "comm")
#: one package per algorithm, ms_boost/<name>/ (test_every_algorithm_package_registers_its_spec), plus the shared
#: algorithm pieces
ALGORITHMS = tuple(f"ms_boost.{p.name}" for p in sorted(PACKAGE.iterdir())
                   if (p / "__init__.py").is_file() and p.name not in NOT_ALGORITHMS) + (
    "ms_boost.grad_process", "ms_boost.fn_head")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imported(node, known) -> list:
    """ms_boost modules an Import/ImportFrom node imports (``from pkg import sub`` counts sub if a module)."""
    out = []
    if isinstance(node, ast.Import):
        out = [a.name for a in node.names if a.name.startswith("ms_boost")]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("ms_boost"):
        for alias in node.names:
            sub = f"{node.module}.{alias.name}"
            out.append(sub if sub in known else node.module)
    return [m for m in out if m in known]


def graph():
    return _graph(PACKAGE)


@functools.cache
def _graph(package):
    del package  # cache key: the tree parsed
    known = modules()
    edges, hidden = {}, []
    for name, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        edges[name] = set()
        for node in tree.body:  # module level (also inside if/try at module level)
            for sub in ast.walk(node):
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    break
                edges[name].update(imported(sub, known))
        for func in ast.walk(tree):
            if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for sub in ast.walk(func):
                    if imported(sub, known):
                        edges[name].update(imported(sub, known))  # a cycle hidden in a function is a cycle
                        hidden.append(f"{name}.{func.name} imports {imported(sub, known)}")
    # a package's submodule import runs the package's __init__ first: that is not an edge back
    for name in edges:
        edges[name].discard(name)
    return edges, hidden


def find_cycle(edges):
    state, stack = {}, []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def ancestors_of(edges, start):
    seen, todo = set(), [start]
    while todo:
        for nxt in edges.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_no_import_cycle_in_ms_boost():
    edges, _ = graph()
    assert "ms_boost.config" in edges and len(edges) > 30  # the parser sees the package
    cycle = find_cycle(edges)
    assert cycle is None, " -> ".join(cycle)


def test_cycle_detector_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_ms_boost_import_inside_functions():
    _, hidden = graph()
    assert hidden == []


def test_bottom_layers_import_no_algorithm():
    edges, _ = graph()
    for bottom in ("ms_boost.comm", "ms_boost.validation", "ms_boost.topology", "ms_boost.spec", "ms_boost.stages",
                   "ms_boost.update", "ms_boost.registry", "ms_boost.config", "ms_boost.pipeline"):
        reached = ancestors_of(edges, bottom)
        assert not [m for m in reached if m.startswith(ALGORITHMS)], (bottom, sorted(reached))
    # algorithms never reach up to the face or the train cells
    for name in edges:
        if name.startswith(ALGORITHMS):
            up = {"ms_boost.model", "ms_boost.train_cell", "ms_boost.config", "ms_boost.compat", "ms_boost",
                  "ms_boost.builtins", "ms_boost.pipeline"}
            assert not (ancestors_of(edges, name) & up), (name, sorted(ancestors_of(edges, name) & up))


def test_config_imports_only_the_registry_spec_types_topology_and_validation():
    edges, _ = graph()
    assert edges["ms_boost.config"] <= {"ms_boost.registry", "ms_boost.spec", "ms_boost.topology",
                                        "ms_boost.validation"}, sorted(edges["ms_boost.config"])
    assert edges["ms_boost.registry"] <= {"ms_boost.spec"}, sorted(edges["ms_boost.registry"])


def test_every_algorithm_package_registers_its_spec():
    """One home per algorithm: each package ms_boost/<name>/ has a spec.py whose SPEC is named <name>, holds its
    section, and is registered by ms_boost/builtins.py (one line); every built-in lives in such a package."""
    import importlib

    from ms_boost import registry

    packages = sorted(p.name for p in PACKAGE.iterdir()
                      if (p / "__init__.py").is_file() and p.name not in NOT_ALGORITHMS)
    assert len(packages) >= 7, packages
    builtins = {spec.name: spec for spec in registry.builtin_specs()}
    for name in packages:
        assert (PACKAGE / name / "spec.py").is_file(), f"ms_boost/{name}/ has no spec.py"
        module = importlib.import_module(f"ms_boost.{name}.spec")
        spec = module.SPEC
        assert spec.name == name, (name, spec.name)
        assert builtins.get(name) is spec, f"ms_boost/{name}/spec.py's SPEC is not registered in ms_boost/builtins.py"
        # the section lives beside the spec, in section.py with the spec's PLAN (no MindSpore: ms_boost.plans)
        assert spec.section.__module__ == f"ms_boost.{name}.section", (name, spec.section.__module__)
    assert sorted(builtins) == packages, "a built-in algorithm lives outside ms_boost/<name>/"
    edges, _ = graph()
    assert {f"ms_boost.{name}.spec" for name in packages} <= edges["ms_boost.builtins"]


def test_autotune_imports_no_algorithm():
    """The autotuner names candidates as boost plans (switches and sections): it imports no algorithm."""
    edges, _ = graph()
    for name in edges:
        if name.startswith("ms_boost.autotune"):
            assert not [m for m in ancestors_of(edges, name) if m.startswith(ALGORITHMS)], name


def test_the_face_imports_no_algorithm():
    """Model asks optimizers and stages through hook protocols (ms_boost.stages): model.py imports no algorithm."""
    edges, _ = graph()
    assert not [m for m in edges["ms_boost.model"] if m.startswith(ALGORITHMS)], sorted(edges["ms_boost.model"])


def test_comm_is_the_bottom_and_algorithms_use_its_face():
    """The communication layer imports nothing of ms_boost outside itself; its status board sits on its collectives
    (never the reverse); everything else reaches it through the package face ``ms_boost.comm``."""
    edges, _ = graph()
    inside = {m for m in edges if m == "ms_boost.comm" or m.startswith("ms_boost.comm.")}
    assert {"ms_boost.comm.collectives", "ms_boost.comm.status_board"} <= inside, sorted(inside)
    for name in inside:
        assert ancestors_of(edges, name) <= inside, (name, sorted(ancestors_of(edges, name) - inside))
    assert edges["ms_boost.comm.collectives"] == set()
    assert edges["ms_boost.comm.status_board"] == {"ms_boost.comm.collectives"}
    for name in sorted(set(edges) - inside):
        assert not {m for m in edges[name] if m.startswith("ms_boost.comm.")}, name
    assert "ms_boost.comm" in edges["ms_boost.dim_reduce.handshake"]


def test_only_comm_talks_to_mindspore_communication():
    """No module outside ms_boost/comm/ imports MindSpore's communication modules or its TCP store."""
    transports = ("mindspore.communication", "mindspore.mint.distributed")
    found = []
    for name, path in modules().items():
        if name == "ms_boost.comm" or name.startswith("ms_boost.comm."):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            found += [f"{name} imports {t}" for t in targets if t.startswith(transports)]
    assert found == []


#: what a boost plan is checked with: AutoBoost (config.py), the built-ins' sections and PLANs (plans.py) and the
#: autotune options; the launchers' pre-launch check (scripts/check_overrides.py) loads them without MindSpore
PLAN_PIECES = ("ms_boost.plans", "ms_boost.config", "ms_boost.autotune.options")


def module_level_imports(path: Path) -> list:
    """Names a module imports when it loads: its top level, inside if/try, but not under ``if TYPE_CHECKING:`` nor
    in a function or class body."""
    found = []

    def visit(nodes):
        for node in nodes:
            if isinstance(node, ast.Import):
                found.extend(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.append(node.module)
            elif isinstance(node, ast.If):
                if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    return found


def test_the_plan_pieces_load_without_mindspore():
    """The modules a boost plan is checked with, and everything of ms_boost they import, import no MindSpore when
    they load (import it inside the function that builds a cell). The one way out is topology's ``comm`` (its
    queries of the ranks, called in methods only): the check loads the packages without their ``__init__``."""
    edges, _ = graph()
    pieces = set(PLAN_PIECES).union(*(ancestors_of(edges, name) for name in PLAN_PIECES))
    comm = {m for m in pieces if m == "ms_boost.comm" or m.startswith("ms_boost.comm.")}
    assert {m for m in pieces - comm if "ms_boost.comm" in edges[m]} == {"ms_boost.topology"}
    assert {f"ms_boost.{p.name}.section" for p in PACKAGE.iterdir()
            if (p / "spec.py").is_file()} <= pieces  # every built-in's section is among them
    paths = modules()
    loads = [f"{name} imports {target}" for name in sorted(pieces - comm)
             for target in module_level_imports(paths[name]) if target.split(".")[0] == "mindspore"]
    assert loads == []


def test_the_plans_are_the_builtin_specs_without_their_hooks():
    """ms_boost.plans lists each built-in's PLAN in the order ms_boost.builtins registers the specs, and a spec is its
    PLAN with hooks added: AutoBoost resolves a plan from these fields alone."""
    import dataclasses

    from ms_boost import registry
    from ms_boost.plans import BUILTIN_PLANS
    from ms_boost.spec import AlgorithmSpec

    hooks = {"rewrite_train", "rewrite_eval", "rewritten", "reducer", "apply", "stage", "describe", "apply_text",
             "check_model", "warn_data", "preview"}
    plan_fields = [f.name for f in dataclasses.fields(AlgorithmSpec) if f.name not in hooks]
    assert "warn_config" in plan_fields and "levels" in plan_fields
    specs = registry.builtin_specs()
    assert [p.name for p in BUILTIN_PLANS] == [s.name for s in specs]
    for plan, spec in zip(BUILTIN_PLANS, specs):
        assert all(getattr(plan, name) is None for name in hooks), plan.name
        assert [getattr(plan, n) for n in plan_fields] == [getattr(spec, n) for n in plan_fields], plan.name

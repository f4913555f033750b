"""The docs stay honest: names, defaults, config examples and paths they show match the code (no training here).

Cheap text checks over README.md, bench/README.md and docs/*.md; running the examples themselves is recorded in
docs/testing.md ("Docs' examples checked").
"""
from __future__ import annotations

import ast
import dataclasses
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "bench" / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
_TICKS = re.compile(r"`([^`\n]+)`")


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _fenced(path: Path):
    """(language, first line number, body) of every fenced block of ``path``."""
    lines = _text(path).split("\n")
    i = 0
    while i < len(lines):
        m = re.match(r"^\s*```(\w*)", lines[i])
        if m:
            start, body = i + 1, []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith("```"):
                body.append(lines[i])
                i += 1
            yield m.group(1), start, "\n".join(body)
        i += 1


def _resolve(name: str):
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:k]))
            break
        except ImportError:
            continue
    for attr in parts[k:]:
        obj = getattr(obj, attr)
    return obj


def test_ms_boost_names_in_backticks_resolve():
    pat = re.compile(r"\bms_boost(?:\.[A-Za-z_]\w*)+")
    names = {}
    for page in PAGES:
        for i, line in enumerate(_text(page).split("\n"), 1):
            for tick in _TICKS.findall(line):
                for name in pat.findall(tick):
                    names.setdefault(name, f"{page.relative_to(ROOT)}:{i}")
    assert len(names) > 20
    bad = []
    for name, where in sorted(names.items()):
        try:
            _resolve(name)
        except (ImportError, AttributeError) as exc:
            bad.append(f"{where}: `{name}` ({exc})")
    assert not bad, "\n".join(bad)


def test_python_blocks_parse():
    bad = []
    for page in PAGES:
        for lang, line, body in _fenced(page):
            if lang == "python":
                try:
                    ast.parse(body)
                except SyntaxError as exc:
                    bad.append(f"{page.relative_to(ROOT)}:{line}: {exc}")
    assert not bad, "\n".join(bad)


def test_repository_paths_in_backticks_exist():
    pat = re.compile(r"^((?:ms_boost|model_zoo|scripts|bench|tests|rank_table)/[\w./-]*)$")
    missing = []
    for page in PAGES:
        for i, line in enumerate(_text(page).split("\n"), 1):
            for tick in _TICKS.findall(line):
                m = pat.match(tick.strip())
                # a trailing "_" is a file-name prefix (``bench/results/tta_autotune_generated_``...)
                if m and not m.group(1).endswith("_") and "__pycache__" not in m.group(1):
                    if not (ROOT / m.group(1)).exists():
                        missing.append(f"{page.relative_to(ROOT)}:{i}: {m.group(1)}")
    assert not missing, "\n".join(missing)


def _readme_config() -> dict:
    blocks = [body for lang, _, body in _fenced(ROOT / "README.md")
              if lang == "python" and body.lstrip().startswith("{")]
    assert len(blocks) == 1
    return ast.literal_eval(blocks[0])


def test_readme_boost_config_lists_every_key_at_its_default_and_validates():
    from ms_boost import AutoBoost
    from ms_boost.registry import builtin_specs
    from ms_boost.spec import CommonConfig

    cfg = _readme_config()
    specs = {s.name: s for s in builtin_specs()}
    assert set(cfg["boost"]) - {"mode"} == set(specs)
    sections = {name: s.section for name, s in specs.items() if dataclasses.fields(s.section)}
    sections["common"] = CommonConfig
    assert set(cfg) - {"boost"} == set(sections)
    # values the README sets on purpose (not the default): accumulation over 4 steps
    chosen = {("grad_accumulation", "grad_accumulation_step")}
    for name, cls in sections.items():
        fields = {f.name: f.default for f in dataclasses.fields(cls)}
        assert set(cfg[name]) == set(fields), name
        for key, default in fields.items():
            value = cfg[name][key]
            if (name, key) not in chosen:
                assert value == default or (isinstance(default, tuple) and list(default) == value), (name, key)
    AutoBoost("O0", cfg)  # every key accepted


def _default_table(page: str, heading_cell: str):
    """{key: default cell} of the Markdown table of ``page`` whose header has ``heading_cell`` and "default"."""
    rows, col = {}, None
    for line in _text(ROOT / page).split("\n"):
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else None
        if cells is None:
            if rows:
                break
            col = None
            continue
        if col is None:
            if cells[0] == heading_cell and "default" in cells:
                col = cells.index("default")
            continue
        name = re.match(r"`(\w+)`", cells[0])
        if name:
            rows[name.group(1)] = cells[col].strip("`")
    assert rows, page
    return rows


def _literal(cell: str):
    low = cell.lower()
    if low in ("none", "true", "false"):
        return {"none": None, "true": True, "false": False}[low]
    try:
        value = ast.literal_eval(cell)
    except (ValueError, SyntaxError):
        return cell
    return tuple(value) if isinstance(value, list) else value


@pytest.mark.parametrize("page, heading, cls, undocumented", [
    ("docs/dim_reduce.md", "key", "ms_boost.dim_reduce.section.DimReduceConfig", set()),
    ("docs/autotune.md", "key", "ms_boost.autotune.options.AutotuneOptions", set()),
    ("docs/divergence.md", "field", "ms_boost.divergence.DivergencePolicy", {"names"}),
])
def test_default_tables_match_the_code(page, heading, cls, undocumented):
    fields = {f.name: f.default for f in dataclasses.fields(_resolve(cls))}
    table = _default_table(page, heading)
    assert set(fields) - set(table) == undocumented, page
    wrong = {k: (v, fields.get(k, "<no such field>")) for k, v in table.items()
             if k not in fields or _literal(v) != fields[k]}
    assert not wrong, f"{page}: documented default vs code: {wrong}"


def test_keyword_arguments_in_docs_exist():
    """``thor(..., key=...)``, ``Model(...)``, ``DivergencePolicy(...)``... in the docs name real parameters."""
    import inspect

    import ms_boost
    from ms_boost import comm
    from ms_boost.divergence import DivergencePolicy, DivergenceRollback
    from ms_boost.thor import ConvertModelUtils, thor

    targets = {"thor": thor, "DivergencePolicy": DivergencePolicy, "DivergenceRollback": DivergenceRollback,
               "AlgorithmSpec": ms_boost.AlgorithmSpec, "Handshake": comm.Handshake,
               "GroupLossScaleManager": ms_boost.GroupLossScaleManager, "LessBN": ms_boost.LessBN,
               "GradientAccumulation": ms_boost.GradientAccumulation, "AutoBoost": ms_boost.AutoBoost,
               "convert_to_thor_model": ConvertModelUtils.convert_to_thor_model}
    # thor.md's history of an option measured and removed (it says so where it names it)
    removed = {"kl_clip_schedule"}
    call = re.compile(r"\b(" + "|".join(targets) + r")\(([^`()]*(?:\([^`()]*\)[^`()]*)*)\)")
    bad = []
    for page in PAGES:
        text = _text(page)
        for m in call.finditer(text):
            params = inspect.signature(targets[m.group(1)]).parameters
            if any(p.kind == p.VAR_KEYWORD for p in params.values()):
                continue
            for kw in re.findall(r"\b([a-z_]\w*)\s*=(?!=)", m.group(2)):
                if kw not in params and kw not in removed:
                    bad.append(f"{page.relative_to(ROOT)}:{text[:m.start()].count(chr(10)) + 1}: "
                               f"{m.group(1)}(..., {kw}=...)")
    assert not bad, "\n".join(bad)

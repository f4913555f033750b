"""The library's own checks run with the suite: ruff (with the pydocstyle rules, Google convention) and mypy over
``ms_boost/`` are clean. Both tools are in setup.py's ``test`` extra; their settings live in pyproject.toml."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_ruff_with_docstring_rules_is_clean_over_ms_boost():
    result = _run("ruff", "check", "ms_boost", "--output-format", "concise")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    # the docstring rules are switched on in pyproject.toml (not only the defaults)
    settings = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert '"D"' in settings and 'convention = "google"' in settings


def test_mypy_is_clean_over_ms_boost():
    result = _run("mypy", "ms_boost")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "Success" in result.stdout

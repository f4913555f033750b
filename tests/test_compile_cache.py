"""MindSpore's compile cache keyed by ms_boost's settings (ms_boost/compile_cache.py).

MindSpore 2.10 reuses a cached graph when the Python source is unchanged, even when a value compiled into it
changed; without ms_boost's scoping the second run below trains with the first run's accumulation step.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from ms_boost import Model
from ms_boost.compile_cache import SCOPE_PREFIX, constant_settings, optimizer_settings, scope_compile_cache
from ms_boost.thor import thor
from tests.workers.compile_cache_run import train

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cache_context(monkeypatch):
    """The cache switched on through the environment (nothing compiles while it is on); context path restored."""
    old = ms.get_context("compile_cache_path") or ""
    monkeypatch.setenv("MS_COMPILER_CACHE_ENABLE", "1")
    yield
    ms.set_context(compile_cache_path=old)


def test_nothing_changes_when_the_cache_is_off(monkeypatch):
    monkeypatch.delenv("MS_COMPILER_CACHE_ENABLE", raising=False)
    before = ms.get_context("compile_cache_path")
    assert scope_compile_cache("anything") is None
    assert ms.get_context("compile_cache_path") == before


def test_scope_is_a_hash_of_the_settings_under_the_users_path(cache_context, monkeypatch, tmp_path):
    monkeypatch.setenv("MS_COMPILER_CACHE_PATH", str(tmp_path))
    ms.set_context(compile_cache_path="")
    first = scope_compile_cache("plan A")
    assert Path(first).parent == tmp_path and Path(first).name.startswith(SCOPE_PREFIX)
    assert ms.get_context("compile_cache_path") == first
    second = scope_compile_cache("plan B")  # replaces the scope, does not nest
    assert Path(second).parent == tmp_path and second != first
    assert scope_compile_cache("plan A") == first  # stable: a rerun finds its graphs


def test_optimizer_settings_hold_the_compiled_constants():
    net = nn.Dense(3, 2)
    plain = optimizer_settings(nn.Momentum(net.trainable_params(), 0.1, 0.9))
    assert plain == optimizer_settings(nn.Momentum(net.trainable_params(), 0.1, 0.9))
    assert plain != optimizer_settings(nn.Momentum(net.trainable_params(), 0.1, 0.9, use_nesterov=True))
    a = optimizer_settings(thor(nn.SequentialCell(nn.Dense(3, 2)), 0.1, 0.03, 0.9, frequency=10))
    b = optimizer_settings(thor(nn.SequentialCell(nn.Dense(3, 2)), 0.1, 0.03, 0.9, frequency=5))
    assert a != b and "frequency" in a

    class Custom(nn.Momentum):
        def compile_settings(self):
            return {"window": self.window}

    c1, c2 = Custom(net.trainable_params(), 0.1, 0.9), Custom(net.trainable_params(), 0.1, 0.9)
    object.__setattr__(c1, "window", 3)
    object.__setattr__(c2, "window", 4)
    assert "window" in optimizer_settings(c1) and optimizer_settings(c1) != optimizer_settings(c2)


def test_constant_settings_of_a_loss_scale_manager_hold_its_private_scale():
    from mindspore.train import FixedLossScaleManager

    a, b = FixedLossScaleManager(1024.0), FixedLossScaleManager(128.0)
    assert constant_settings(a, private=True) != constant_settings(b, private=True)
    assert constant_settings(a) == constant_settings(b)  # its settings are all private
    assert "FixedLossScaleManager" in constant_settings(a)


def test_model_scopes_the_cache_by_its_plan(cache_context, tmp_path):
    ms.set_context(compile_cache_path=str(tmp_path))
    net = nn.SequentialCell(nn.Dense(4, 3))
    paths = []
    for step in (2, 3, 3):
        Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
              nn.Momentum(net.trainable_params(), 0.1, 0.9), boost_level="O0",
              boost_config_dict={"boost": {"mode": "manual", "grad_accumulation": True},
                                 "grad_accumulation": {"grad_accumulation_step": step}})
        paths.append(ms.get_context("compile_cache_path"))
    assert paths[0] != paths[1] == paths[2] and all(Path(p).parent == tmp_path for p in paths)


def _run(cache: Path, steps: int) -> tuple:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), GLOG_v="3")
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "workers" / "compile_cache_run.py"), str(cache),
                           str(steps)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if line.startswith(("WEIGHTS ", "CACHE ")))
    return np.array(json.loads(lines["WEIGHTS"]), np.float32), lines["CACHE"]


def test_a_second_run_with_other_settings_does_not_reuse_the_first_runs_graph(tmp_path):
    two, path_two = _run(tmp_path, 2)
    four, path_four = _run(tmp_path, 4)
    np.testing.assert_allclose(two, train(2), rtol=0, atol=1e-5)  # PyNative, no cache: the references
    np.testing.assert_allclose(four, train(4), rtol=0, atol=1e-5)
    assert np.abs(two - four).max() > 1e-3  # the two settings really train differently
    assert path_two != path_four and Path(path_four).parent == tmp_path

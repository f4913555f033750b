"""MindSpore's compile cache keyed by ms_boost's settings (ms_boost/compile_cache.py).

MindSpore 2.10 reuses a cached graph when the Python source is unchanged, even when a value compiled into it
changed; without ms_boost's scoping the second run below trains with the first run's accumulation step. It also
keeps the first model's cache folder for the whole process: a later model with other settings runs uncached.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from ms_boost import Model, compile_cache
from ms_boost.compile_cache import (
    SCOPE_PREFIX,
    cache_enabled,
    constant_settings,
    optimizer_settings,
    scope_compile_cache,
)
from ms_boost.thor import thor
from tests.workers.compile_cache_run import train

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cache_context(monkeypatch):
    """The cache switched on through the environment (nothing compiles while it is on), as in a fresh process;
    the context's path and switch restored."""
    old = ms.get_context("compile_cache_path") or ""
    monkeypatch.setenv("MS_COMPILER_CACHE_ENABLE", "1")
    monkeypatch.setattr(compile_cache, "_process_scope", None)
    context = ms.context._context()  # set_context takes no None back: restore the unset switch by hand
    monkeypatch.setattr(context, "enable_compile_cache", context.enable_compile_cache)
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
    assert scope_compile_cache("plan A") == first  # stable: a rerun finds its graphs, the scope is not nested


def test_other_settings_later_in_the_process_turn_the_cache_off(cache_context, monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("MS_COMPILER_CACHE_PATH", str(tmp_path))
    ms.set_context(compile_cache_path="")
    first = scope_compile_cache("plan A")
    logger = logging.getLogger("ms_boost")
    logger.addHandler(caplog.handler)
    try:
        assert scope_compile_cache("plan B") is None
    finally:
        logger.removeHandler(caplog.handler)
    assert "compile cache is now off for this process" in caplog.text and first in caplog.text
    assert not cache_enabled() and ms.get_context("compile_cache_path") == first
    assert scope_compile_cache("plan A") is None  # off for the rest of the process


def test_the_context_switch_decides_over_the_environment(cache_context):
    assert cache_enabled()  # MS_COMPILER_CACHE_ENABLE=1 and the context switch unset
    ms.set_context(enable_compile_cache=False)
    assert not cache_enabled() and scope_compile_cache("plan A") is None  # MindSpore reads the context first


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
    paths, on = [], []
    for step in (2, 2, 3):
        Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
              nn.Momentum(net.trainable_params(), 0.1, 0.9), boost_level="O0",
              boost_config_dict={"boost": {"mode": "manual", "grad_accumulation": True},
                                 "grad_accumulation": {"grad_accumulation_step": step}})
        paths.append(ms.get_context("compile_cache_path"))
        on.append(cache_enabled())
    assert paths[0] == paths[1] == paths[2] and Path(paths[0]).parent == tmp_path
    assert Path(paths[0]).name.startswith(SCOPE_PREFIX)
    assert on == [True, True, False]  # the third model's settings differ: the cache is off from then on


def _run(cache: Path, *steps: int) -> tuple:
    """The worker's weights (one array per model, in order), its last cache path and its stderr."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), GLOG_v="3")
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "workers" / "compile_cache_run.py"), str(cache),
                           *map(str, steps)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    weights = [np.array(json.loads(line.split(" ", 1)[1]), np.float32)
               for line in proc.stdout.splitlines() if line.startswith("WEIGHTS ")]
    cache_path = [line.split(" ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("CACHE ")][-1]
    assert len(weights) == len(steps)
    return weights, cache_path, proc.stderr


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Three worker processes in turn, one cache root: steps (2, 4), then (4), then (2, 3). Each test below reads
    the processes its scenario needs; the others ran in the same root beforehand, as a user's earlier runs would
    (one process fewer than a fresh root per scenario)."""
    root = tmp_path_factory.mktemp("compile_cache_runs")
    return {steps: _run(root, *steps) for steps in ((2, 4), (4,), (2, 3))}


def test_a_second_run_with_other_settings_does_not_reuse_the_first_runs_graph(runs):
    """The first run's first model (steps 2) cached its graph; a later run whose model has other settings (steps 4)
    must not find it."""
    (two, _), path_two, _ = runs[(2, 4)]
    (four,), path_four, _ = runs[(4,)]
    np.testing.assert_allclose(two, train(2), rtol=0, atol=1e-5)  # PyNative, no cache: the references
    np.testing.assert_allclose(four, train(4), rtol=0, atol=1e-5)
    assert np.abs(two - four).max() > 1e-3  # the two settings really train differently
    assert path_two != path_four and Path(path_four).parent == Path(path_two).parent


def test_a_later_model_with_other_settings_is_not_cached_in_the_first_ones_folder(runs):
    """MindSpore keeps the first model's folder for the process and names graphs by compile order. Measured without
    the switch-off: run 1 (steps 2 then 4) saved the step-4 graph in the step-2 folder, and run 2 (steps 2 then 3)
    trained its step-3 model with it (its weights equal train(4))."""
    (_, four), _, log_one = runs[(2, 4)]
    (_, three), _, log_two = runs[(2, 3)]
    reference_three, reference_four = train(3), train(4)
    np.testing.assert_allclose(four, reference_four, rtol=0, atol=1e-5)
    np.testing.assert_allclose(three, reference_three, rtol=0, atol=1e-5)
    assert np.abs(reference_three - reference_four).max() > 1e-3  # the reuse would show
    assert "compile cache is now off for this process" in log_one and "is now off" in log_two

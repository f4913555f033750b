"""Shared fixtures: execution mode, seeds, tiny networks and data."""
from __future__ import annotations

import gc
import os
import resource
import sys
import time

# pytest caches each test module's assertion-rewritten code in tests/__pycache__ (git-ignored) unless bytecode writing
# is off, as it is where the environment sets PYTHONDONTWRITEBYTECODE=1 (this machine does): then every pytest-xdist
# worker rewrites all ~70 test files again on every run. Measured: collecting the suite in one process takes 4.3-4.7
# CPU-s with the cache, 7.0-9.3 without (three workers: ~10 CPU-s a run). Only this process (the test modules and
# what they import); subprocesses keep the environment's setting (compiling ms_boost and model_zoo in an msrun rank
# measured under 0.1 CPU-s).
sys.dont_write_bytecode = False

# One OpenBLAS thread per process (numpy's BLAS; set before numpy loads, inherited by the pytest-xdist workers,
# msrun ranks and scripts): the suite runs three workers on two cores, where a second BLAS thread only spins.
# Measured side by side under the same load: tests/test_thor_optimizer.py + test_thor_math.py +
# test_dim_reduce_pca.py 72.5 -> 68.9 CPU-s (-5%); OMP_NUM_THREADS=1 (MindSpore's OpenMP kernels) changed nothing.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# MindSpore launches kernels synchronously (set before MindSpore loads, inherited like the line above): with the
# asynchronous launch a thread that waits for the launch queue (``asnumpy``, a collective's result) spins, so a
# rank waiting for another rank at a collective burns a whole core for as long as it waits (measured: a rank
# waiting 15 s at a barrier used 14.8 CPU-s, 0.09 with this), and on two shared cores that is CPU the other
# ranks and test workers lose. Results do not change; only the order of host and kernel work.
os.environ.setdefault("MS_DEV_LAUNCH_BLOCKING", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

# MindSpore is imported by the processes that run tests (pytest_configure below), not at this file's import: the
# pytest-xdist controller loads this file too, runs no test, and starts the workers only after loading it, so an
# import here put ~2.3 CPU-s (and as many seconds of wall time) before the first worker started.
MODES = ("graph", "pynative")


def _runs_tests(config) -> bool:
    """False only in the pytest-xdist controller of a distributed run, which starts workers and neither collects
    nor runs a test; decided as xdist does (xdist/plugin.py: a ``--dist`` mode with ``--tx`` targets, and not
    ``--collect-only``, which xdist leaves to this process)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return True
    distributed = getattr(config.option, "dist", "no") != "no" and bool(getattr(config.option, "tx", None))
    return not distributed or bool(config.option.collectonly)


def pytest_configure(config):
    if _runs_tests(config):
        import mindspore as ms

        from tests.helpers import source_memo

        ms.set_device("CPU")
        source_memo.install()  # MindSpore's parser reads each function's source once per file text, not per compile


def _ms():
    import mindspore as ms

    return ms


@pytest.fixture(params=MODES)
def mode(request):
    """Run the test once in PyNative and once in Graph mode; restores PyNative afterwards."""
    ms = _ms()
    ms.set_context(mode=ms.GRAPH_MODE if request.param == "graph" else ms.PYNATIVE_MODE)
    yield request.param
    ms.set_context(mode=ms.PYNATIVE_MODE)


@pytest.fixture(scope="module", autouse=True)
def _pynative_at_module_start():
    """Every test file starts in PyNative mode (MindSpore's default), whatever mode the file run before it on the
    same pytest-xdist worker left behind; a file's own tests and fixtures set another mode as they need.

    And the objects alive when a file starts (modules, MindSpore's own, what earlier files keep) are collected once
    and then frozen (``gc.freeze``): MindSpore runs a full ``gc.collect()`` before every Cell graph compile, and
    without the freeze each one walks every object of the process again (~180k after collection, more as a worker
    goes on). Objects made by the file itself are collected as before; a frozen object that dies by its reference
    count is freed as before (only a frozen reference cycle that dies later is never freed). Measured (``-n 0``,
    test_model + test_o1_o2 + test_zoo_heal + test_thor_robust in one process, two processes side by side, load
    ~13): garbage collection 6.8 -> 2.0 CPU-s (the freezes included), the process 109.7 -> 105.3 CPU-s."""
    _ms().set_context(mode=_ms().PYNATIVE_MODE)
    gc.collect()
    gc.freeze()
    yield


@pytest.fixture(autouse=True)
def _seed():
    _ms().set_seed(0)
    np.random.seed(0)
    yield


TUTORIAL_CLASSES = 6


@pytest.fixture(scope="module")
def data_path(tmp_path_factory) -> str:
    """A tiny ImageNet-layout folder (train/ + val/, 6 classes of 32x32 JPEGs) for the tutorial tests."""
    from model_zoo.resnet.src.synthetic_data import ensure_dataset

    root = tmp_path_factory.mktemp("tutorial_data")
    return str(ensure_dataset(root, num_classes=TUTORIAL_CLASSES, image_size=32, train_per_class=16,
                              val_per_class=4, seed=0, verbose=False))


# Files in the order pytest-xdist should start them (heaviest first; measured CPU-seconds, docs/testing.md). The
# two-node job first: most of its wall time is waiting (a killed node's timeout), which other files' CPU fills; the
# files holding msrun jobs next (their ranks wait for each other), then by CPU-seconds.
# With ``--dist loadfile --no-loadscope-reorder`` (pyproject addopts) each worker takes the next whole file when it
# runs dry, so starting the long files first keeps the workers' finishing times close; files not named here
# follow in alphabetical order.
HEAVY_FIRST = [
    "test_multinode.py", "test_zoo_journey.py", "test_tutorials.py", "test_adasum.py", "test_thor_model.py",
    "test_scripts.py", "test_tutorials_thor.py",
    "test_thor_optimizer.py", "test_thor_robust.py", "test_gpu_check.py", "test_zoo_journey_inputs.py",
    "test_less_bn.py", "test_dim_reduce_stage.py", "test_model.py", "test_zoo_heal.py", "test_o1_o2.py",
    "test_thor_distributed.py", "test_divergence.py", "test_zoo_components.py", "test_thor_layers.py",
    "test_loss_scale.py", "test_resume.py", "test_grad_freeze.py", "test_dim_reduce_msrun.py", "test_zoo_recipes.py",
    "test_zoo_export.py", "test_grad_accumulation.py",
    # the files above 5 CPU-s that ran last, alphabetically, before (2026-11-28: 40, 28, 26, 24, 23, 22, 11, 10, 8, 7,
    # 6, 6, 5 CPU-s; with the eleventh round's users' scripts and test_gpu_code, 12-20 s each): before the light ones
    # now, so that a worker's last file is a short one
    "test_thor_checkpoint.py", "test_user_scripts_tenth.py", "test_user_scripts_eleventh.py", "test_gpu_code.py",
    "test_user_scripts_sixth.py", "test_user_scripts.py",
    "test_user_scripts_eighth.py", "test_autotune.py", "test_user_scripts_fourth.py", "test_overflow_step.py",
    "test_grad_process.py", "test_zoo_real_data.py", "test_cpu_gemm_conv.py", "test_compile_cache.py",
    "test_zoo_conv.py",
    "test_msrun_e2e.py",  # reads the tutorials' msrun job (tests/test_tutorials.py): late, when it has run
]


def pytest_collection_modifyitems(config, items):
    """Order the collected tests file by file as in ``HEAVY_FIRST`` (stable: a file's own order is kept)."""
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(HEAVY_FIRST)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With ``MS_BOOST_CPU_REPORT=<file>``, append one line per test to ``<file>.<worker>``: CPU-seconds of this
    process (all its threads) and of its finished child processes (msrun jobs, scripts) during the test's setup,
    call and teardown, then wall seconds and the test's end (seconds since the epoch, for the workers' timeline).
    CPU time does not depend on how loaded the machine is, wall time does."""
    target = os.environ.get("MS_BOOST_CPU_REPORT")
    if not target:
        yield
        return
    start = (time.process_time(), resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter())
    yield
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = time.process_time() - start[0]
    kids = children.ru_utime + children.ru_stime - start[1].ru_utime - start[1].ru_stime
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(f"{target}.{worker}", "a", encoding="utf-8") as out:
        out.write(f"{own:.2f}\t{kids:.2f}\t{time.perf_counter() - start[2]:.2f}\t{time.time():.1f}\t{item.nodeid}\n")

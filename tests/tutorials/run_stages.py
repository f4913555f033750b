"""Run tutorial scripts as written, one after the other, in the same msrun worker (one world, one ``init()``).

A tutorial whose stages start the same world one after the other (the dimension-reduce tutorial's stage 1, then
stage 2 in the same folder) runs here in one msrun job: each script runs as ``__main__`` (``runpy``) with its own
``sys.argv``, unchanged; only the second start of MindSpore and of the cluster is saved. The scripts call
``ms.set_device("CPU")`` and ``init()`` each: the first calls set the device and build the cluster, a later call
finds them set (MindSpore refuses a second ``set_device`` once msrun gave the rank its device id, and ``init()``
would build the cluster again) and returns at once.
Between two stages the ranks meet at a barrier, so that no rank starts a stage before every rank has finished
the one before (rank 0 writes the checkpoints the next stage loads, and evaluates, after its last step), and the
auto-parallel context is reset to MindSpore's defaults, as a new process would find it (a stage's
``all_reduce_fusion_config`` names parameter indices of its own network). A script outside this folder is named
relative to it (``../workers/e2e_graph.py``).

Under msrun (``MS_BOOST_RESULT_DIR`` set) each stage's saved values are kept under the stage's name:
``<name>.<key>``. In a later stage's arguments ``{<name>.<key>}`` is replaced by that stage's value on this rank
(an integer stays an integer: ``{stage1.step_size}``).

Usage: ``run_stages.py NAME SCRIPT [ARGS...] -- NAME SCRIPT [ARGS...] [-- ...]`` (scripts relative to this folder).
"""
from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def _stages(argv: list) -> list:
    stages, current = [], []
    for arg in argv + ["--"]:
        if arg != "--":
            current.append(arg)
            continue
        if len(current) < 2:
            raise SystemExit(f"run_stages.py: each stage needs NAME SCRIPT [ARGS...], got {current}")
        stages.append(current)
        current = []
    return stages


def _plain(value: np.ndarray):
    value = value.item() if value.ndim == 0 else value
    return int(value) if isinstance(value, float) and value.is_integer() else value


def main() -> None:
    import mindspore as ms
    import mindspore.communication as communication
    from mindspore.communication.management import GlobalComm

    from tests.helpers.msrun import save_result

    first_init = communication.init

    def init_once(backend_name=None):
        """The world of this job is built once: a later stage's ``init()`` finds it built."""
        if not GlobalComm.INITED:
            first_init(backend_name)

    first_set_device = ms.set_device

    def set_device_once(device_target, device_id=None):
        """The device of this job is set once: a later stage's ``set_device`` of the same target returns."""
        if device_id is None and ms.get_context("device_target") == device_target and GlobalComm.INITED:
            return
        first_set_device(device_target, device_id)

    communication.init = init_once
    ms.set_device = set_device_once
    result_dir = os.environ.get("MS_BOOST_RESULT_DIR")
    kept: dict = {}
    sys.path.insert(0, str(HERE))
    for index, (name, script, *args) in enumerate(_stages(sys.argv[1:])):
        values = {f"{{{key}}}": str(_plain(value)) for key, value in kept.items()}
        for placeholder, value in values.items():
            args = [arg.replace(placeholder, value) for arg in args]
        sys.argv = [str(HERE / script), *args]
        if index:
            from ms_boost import comm

            comm.barrier()
            ms.reset_auto_parallel_context()  # as a new process finds it (a script sets what it needs)
        try:
            runpy.run_path(str(HERE / script), run_name="__main__")
        except (Exception, SystemExit) as exc:  # a failure names its stage in the rank's log, then goes on as it was
            if not isinstance(exc, SystemExit) or exc.code not in (0, None):
                print(f"run_stages.py: stage {name!r} ({script}) failed", file=sys.stderr, flush=True)
            raise
        if result_dir:
            from ms_boost import comm

            path = Path(result_dir) / f"rank_{comm.get_rank()}.npz"
            with np.load(path, allow_pickle=False) as data:
                kept.update({f"{name}.{key}": data[key] for key in data.files})
            path.unlink()
    if result_dir:
        save_result(**kept)


if __name__ == "__main__":
    main()

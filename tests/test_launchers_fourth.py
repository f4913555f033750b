"""Journeys, fourth round (docs/model_zoo.md): the launchers' dry runs, as read by someone about to run them."""
from __future__ import annotations

import pytest

from tests.test_scripts import env, ranks, run  # noqa: F401  (env is a fixture)


@pytest.mark.parametrize("target", ["GPU", "CPU", "Ascend"])
def test_multinode_dry_run_prints_cuda_visible_devices_only_as_set_on_gpu(target, env, tmp_path):  # noqa: F811
    """An unset CUDA_VISIBLE_DEVICES was printed as ``CUDA_VISIBLE_DEVICES=`` (an empty value hides every GPU) for
    every target; it is printed only on GPU and only when set."""
    for extra, shown in (({}, None), ({"CUDA_VISIBLE_DEVICES": "0,1"}, "0,1")):
        proc = run("run_multinode_train.sh", 4, 2, 1, "10.0.0.1", "synthetic", "--dry-run", env=env, cwd=tmp_path,
                   extra_env=dict(extra, DEVICE_TARGET=target))
        assert proc.returncode == 0, proc.stderr
        printed = ranks(proc.stdout)
        assert sorted(printed) == [2, 3]
        for rank in printed.values():
            assert rank.get("CUDA_VISIBLE_DEVICES") == (shown if target == "GPU" else None), rank

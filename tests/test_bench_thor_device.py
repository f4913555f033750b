"""bench/bench_thor.py --device: the step times on another device (GPU) than the default CPU, refused by name when
the device is not one it knows."""
from __future__ import annotations

import pytest

from bench import bench_thor


class _Stop(Exception):
    pass


@pytest.mark.parametrize("argv, device", [([], "CPU"), (["--device", "GPU"], "GPU")])
def test_the_device_is_set_before_anything_runs(argv, device, monkeypatch):
    chosen = []

    def set_device(name):
        chosen.append(name)
        raise _Stop  # nothing is built or timed

    monkeypatch.setattr(bench_thor.ms, "set_device", set_device)
    with pytest.raises(_Stop):
        bench_thor.main(["--skip_convergence", "--no_write", *argv])
    assert chosen == [device]


def test_an_unknown_device_is_refused_by_name(capsys):
    with pytest.raises(SystemExit) as stopped:
        bench_thor.main(["--device", "TPU"])
    assert stopped.value.code == 2
    assert "--device: invalid choice: 'TPU' (choose from 'CPU', 'GPU')" in capsys.readouterr().err

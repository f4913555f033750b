"""Train 2N steps straight == N steps, checkpoint, new process, resume, N steps (every state Parameter)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

WORKER = Path(__file__).parent / "workers" / "resume.py"
ROOT = Path(__file__).resolve().parents[1]

CONFIGS = {
    "o0": {},
    "accumulate": {"boost": {"mode": "manual", "grad_accumulation": True},
                   "grad_accumulation": {"grad_accumulation_step": 2}},
    "freeze": {"boost": {"mode": "manual", "grad_freeze": True},
               "grad_freeze": {"param_groups": 3, "freeze_p": 0.5, "total_steps": 50}},
}


def run(mode, phase, steps, ckpt, out, boost):
    env = dict(os.environ, PYTHONPATH=str(ROOT), GLOG_v="3")
    proc = subprocess.run([sys.executable, str(WORKER), mode, phase, str(steps), str(ckpt), str(out),
                           json.dumps(boost)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_resume_is_exact(tmp_path, name):
    steps = 3  # odd: the accumulation stage is mid-cycle when the checkpoint is taken
    mode = "graph" if name == "o0" else "pynative"
    run(mode, "straight", steps, tmp_path, tmp_path / "straight.npz", CONFIGS[name])
    run(mode, "first", steps, tmp_path, tmp_path / "unused.npz", CONFIGS[name])
    run(mode, "second", steps, tmp_path, tmp_path / "resumed.npz", CONFIGS[name])
    with np.load(tmp_path / "straight.npz") as a, np.load(tmp_path / "resumed.npz") as b:
        assert sorted(a.files) == sorted(b.files)
        for key in a.files:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)

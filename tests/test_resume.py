"""Train 2N steps straight == N steps, checkpoint, new process, resume, N steps (every state Parameter).

Two processes in all: the first trains every configuration straight, checkpointing after step N (one Model, one
compilation per configuration), the second (fresh) resumes every configuration from that checkpoint."""
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
STEPS = 3  # odd: the accumulation stage is mid-cycle when the checkpoint is taken

CONFIGS = {
    "o0": ["graph", {}],
    "accumulate": ["pynative", {"boost": {"mode": "manual", "grad_accumulation": True},
                                "grad_accumulation": {"grad_accumulation_step": 2}}],
    "freeze": ["pynative", {"boost": {"mode": "manual", "grad_freeze": True},
                            "grad_freeze": {"param_groups": 3, "freeze_p": 0.5, "total_steps": 50}}],
}


def run(phase: str, work: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), GLOG_v="3")
    proc = subprocess.run([sys.executable, str(WORKER), phase, str(STEPS), str(work), json.dumps(CONFIGS)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("resume")
    run("fresh", folder)
    run("resume", folder)
    return folder


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_resume_is_exact(work, name):
    with np.load(work / name / "straight.npz") as a, np.load(work / name / "resumed.npz") as b:
        assert sorted(a.files) == sorted(b.files)
        for key in a.files:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)

"""scripts/gpu_check.sh and scripts/gpu_check.py: the no-GPU branch, the install plan (dry run), the loss comparison,
and the CPU self-check, whose first loss is checked against a numpy forward pass."""
from __future__ import annotations

import importlib.util
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
PACKAGES = {"nvidia-cuda-runtime-cu11": "11.8.89", "nvidia-cublas-cu11": "11.11.3.6", "nvidia-cudnn-cu11": "8.5.0.96",
            "nvidia-nccl-cu11": "2.16.5", "nvidia-curand-cu11": "10.3.0.86", "nvidia-cusolver-cu11": "11.4.1.48",
            "nvidia-cufft-cu11": "10.9.0.58", "nvidia-cusparse-cu11": "11.7.5.86", "nvidia-cuda-nvrtc-cu11": "11.8.89"}


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpu_check = _module()


def run(*args, tmp_path: Path, **env):
    full = {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_DIR": str(tmp_path / "gpu"), **env}
    full.pop("DRY_RUN", None)
    return subprocess.run(["bash", str(SCRIPT), *args], env=full, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)


def fake_smi(tmp_path: Path, listing: str, compute_cap: str = "") -> str:
    """An nvidia-smi printing ``listing`` for ``-L``; for ``--query-gpu=compute_cap`` ``compute_cap`` when given, else
    the listing again (as a driver too old to know the field answers something that is no number)."""
    smi = tmp_path / "nvidia-smi"
    answer = f"printf '%s\\n' '{compute_cap}'" if compute_cap else f"printf '%b' '{listing}'"
    smi.write_text(f"#!/bin/sh\ncase \"$*\" in *compute_cap*) {answer} ;; *) printf '%b' '{listing}' ;; esac\n")
    smi.chmod(0o755)
    return str(smi)


def test_without_a_gpu_it_says_so_and_exits_0(tmp_path):
    done = run(tmp_path=tmp_path, NVIDIA_SMI=str(tmp_path / "no-such-nvidia-smi"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (f"gpu_check: no NVIDIA GPU on this machine ({tmp_path / 'no-such-nvidia-smi'} not "
                                   "found): nothing to check")
    empty = run(tmp_path=tmp_path, NVIDIA_SMI=fake_smi(tmp_path, "No devices were found\n"))
    assert empty.returncode == 0 and "lists none): nothing to check" in empty.stdout, empty.stderr
    assert not (tmp_path / "gpu").exists()  # nothing installed, nothing made


def test_with_a_gpu_the_dry_run_prints_the_install_and_the_environment(tmp_path):
    smi = fake_smi(tmp_path, "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)\\n")
    done = run("--dry-run", tmp_path=tmp_path, NVIDIA_SMI=smi)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "gpu_check: 1 GPU(s): GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)"
    install = lines[1].split()
    assert install[:6] == ["install:", sys.executable, "-m", "pip", "install", "--no-input"]
    assert dict(item.split("==") for item in install[6:]) == PACKAGES
    site = Path(np.__file__).resolve().parents[1]  # this environment's site-packages
    paths = dict(line[len("env: "):].split("=", 1) for line in lines[2:4])
    dirs = paths["LD_LIBRARY_PATH"].split(":")
    assert dirs[0] == str(site / "mindspore" / "lib" / "plugin" / "gpu11.6")
    for name in ("cuda_runtime", "cublas", "cudnn", "nccl", "curand", "cusolver", "cufft", "cusparse", "cuda_nvrtc"):
        assert str(site / "nvidia" / name / "lib") in dirs
    assert paths["CUDA_HOME"].startswith(f"{tmp_path / 'gpu' / 'cuda_home'} (bin/nvcc prints: Cuda compilation tools, "
                                         "release 11.8")
    assert not (tmp_path / "gpu").exists()


def test_the_plugin_links_against_the_libraries_installed():
    """The sonames libmindspore_gpu.so.11.6 needs (readelf -d) are those of the pinned packages."""
    import shutil

    import mindspore

    plugin = Path(mindspore.__file__).parent / "lib" / "plugin" / "libmindspore_gpu.so.11.6"
    if shutil.which("readelf") is None or not plugin.is_file():
        pytest.skip("no readelf, or no CUDA 11.6 plugin in this MindSpore wheel")
    dynamic = subprocess.run(["readelf", "-d", str(plugin)], capture_output=True, text=True, timeout=60).stdout
    needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[(\S+)\]", dynamic))
    cuda = {n for n in needed if re.match(r"lib(cu|nv)", n) and not n.startswith("libcuda_ops")}  # ops: MindSpore's
    assert cuda == {"libcublas.so.11", "libcurand.so.10", "libcudnn.so.8", "libcudart.so.11.0", "libcuda.so.1",
                    "libcusolver.so.11", "libcufft.so.10", "libcusparse.so.11", "libnvrtc.so.11.2"}
    nccl = (plugin.parent / "gpu11.6" / "libnccl.so.2").read_bytes()
    assert b"NCCL version 2.16.5" in nccl  # nvidia-nccl-cu11==2.16.5


def fake_python(tmp_path: Path, mindspore_dir: str | None) -> str:
    """An interpreter that reports Python 3.12.3 and either fails to import mindspore or finds it in a given folder."""
    python = tmp_path / "python-fake"
    found = f'echo "{mindspore_dir}"' if mindspore_dir else "echo \"No module named 'mindspore'\" >&2; exit 1"
    python.write_text(f'#!/bin/sh\ncase "$1" in --version) echo "Python 3.12.3" ;; *) {found} ;; esac\n')
    python.chmod(0o755)
    return str(python)


def test_without_mindspore_it_stops_before_installing_anything(tmp_path):
    smi = fake_smi(tmp_path, "GPU 0: NVIDIA H200 (UUID: GPU-0)\\n")
    python = fake_python(tmp_path, None)
    done = run(tmp_path=tmp_path, NVIDIA_SMI=smi, PYTHON=python)
    assert done.returncode == 6, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == (
        f"gpu_check: FAIL: {python} (Python 3.12.3) cannot import mindspore: install the MindSpore 2.10 wheel into it "
        "first (pip install mindspore==2.10.0), or set PYTHON to the interpreter that has it")
    assert "installing" not in done.stdout and not (tmp_path / "gpu").exists()
    no_plugin = tmp_path / "site" / "mindspore"
    no_plugin.mkdir(parents=True)
    done = run(tmp_path=tmp_path, NVIDIA_SMI=smi, PYTHON=fake_python(tmp_path, str(no_plugin)))
    assert done.returncode == 6, done.stdout + done.stderr
    assert f"has no CUDA 11.6 GPU plugin ({no_plugin}/lib/plugin/gpu11.6 is missing)" in done.stdout


def test_wheels_installs_from_a_folder_with_no_index(tmp_path):
    smi = fake_smi(tmp_path, "GPU 0: NVIDIA H200 (UUID: GPU-0)\\n")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    dry = run("--dry-run", "--wheels", str(wheels), tmp_path=tmp_path, NVIDIA_SMI=smi)
    assert dry.returncode == 0, dry.stderr
    install = dry.stdout.splitlines()[1].split()
    assert install[:9] == ["install:", sys.executable, "-m", "pip", "install", "--no-input", "--no-index",
                           "--find-links", str(wheels)]
    assert dict(item.split("==") for item in install[9:]) == PACKAGES
    # an empty folder: pip finds nothing (and reaches no index), the script says what failed and exits 3
    done = run("--wheels", str(wheels), tmp_path=tmp_path, NVIDIA_SMI=smi)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "gpu_check: FAIL: pip could not install the CUDA 11 libraries (output above)" in done.stdout
    assert "pass --wheels DIR" not in done.stdout  # the hint is for runs that used an index
    assert not (tmp_path / "gpu").exists()


@pytest.mark.parametrize("args, message", [(["--steps", "0"], "--steps must be an integer >= 1, got '0'"),
                                           (["--wheels", "/no/such/folder"],
                                            "--wheels must be a folder of wheel files, got '/no/such/folder'"),
                                           (["--wheels", ".", "--no-install"],
                                            "--wheels and --no-install exclude each other"),
                                           (["--mode", "eager"], "--mode must be pynative or graph, got 'eager'"),
                                           (["--timeout", "0"], "--timeout must be whole seconds >= 1, got '0'"),
                                           (["--timeout", "1m"], "--timeout must be whole seconds >= 1, got '1m'"),
                                           (["--gpu"], "unknown argument '--gpu'")])
def test_bad_arguments(args, message, tmp_path):
    done = run(*args, tmp_path=tmp_path)
    assert done.returncode == 2 and message in done.stderr and "Usage:" in done.stderr


def test_hopper_gets_the_cudnn_with_its_code_and_a_note_on_the_jit(tmp_path):
    # the installed wheel's plugin (sm_60-sm_80 machine code, PTX 6.0 and 8.6) on GPUs of three generations
    hopper = run("--dry-run", tmp_path=tmp_path, NVIDIA_SMI=fake_smi(tmp_path, "GPU 0: NVIDIA H200 (UUID: GPU-0)\\n",
                                                                    "9.0"))
    assert hopper.returncode == 0, hopper.stdout + hopper.stderr
    lines = hopper.stdout.splitlines()
    assert lines[1] == "gpu_check: compute capability 9.0: cuDNN 8.9.6.50 (8.5.0.96 has no machine code for it)"
    assert lines[2].startswith("gpu_check: note: MindSpore's GPU kernels (libcuda_ops.so.11: sass sm_60 sm_61 sm_70 "
                               "sm_75 sm_80; ptx compute_60 compute_86) have no machine code for compute capability "
                               "9.0: the driver compiles them from PTX")
    install = dict(item.split("==") for item in lines[3].split()[6:])
    assert install == {**PACKAGES, "nvidia-cudnn-cu11": "8.9.6.50"}
    cache = [line for line in lines if line.startswith("env: CUDA_CACHE_PATH=")]
    assert cache == [f"env: CUDA_CACHE_PATH={tmp_path / 'gpu' / 'jit_cache'} CUDA_CACHE_MAXSIZE=4294967296 "
                     "CUDA_MODULE_LOADING=LAZY"]
    ampere = run("--dry-run", tmp_path=tmp_path, NVIDIA_SMI=fake_smi(tmp_path, "GPU 0: NVIDIA A100 (UUID: GPU-0)\\n",
                                                                    "8.0"))
    assert ampere.returncode == 0, ampere.stdout + ampere.stderr
    assert "compute capability" not in ampere.stdout and "note:" not in ampere.stdout
    assert dict(item.split("==") for item in ampere.stdout.splitlines()[1].split()[6:]) == PACKAGES
    maxwell = run("--dry-run", tmp_path=tmp_path, NVIDIA_SMI=fake_smi(tmp_path, "GPU 0: Tesla M60 (UUID: GPU-0)\\n",
                                                                     "5.2"))
    assert maxwell.returncode == 6, maxwell.stdout + maxwell.stderr
    assert maxwell.stdout.splitlines()[-1] == (
        "gpu_check: FAIL: MindSpore's GPU kernels (libcuda_ops.so.11: sass sm_60 sm_61 sm_70 sm_75 sm_80; ptx "
        "compute_60 compute_86) have no code a GPU of compute capability 5.2 can run")
    assert "install:" not in maxwell.stdout


def test_a_run_check_that_outlasts_the_timeout_fails_with_exit_4(tmp_path):
    # the interpreter as it is, except that run_check never ends (as the first run compiling the plugin from PTX)
    python = tmp_path / "python-slow-run-check"
    python.write_text(f"#!/bin/sh\ncase \"$*\" in *run_check*) exec sleep 30 ;; esac\nexec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    smi = fake_smi(tmp_path, "GPU 0: NVIDIA H200 (UUID: GPU-0)\\n")
    done = run("--no-install", "--timeout", "2", tmp_path=tmp_path, NVIDIA_SMI=smi, PYTHON=str(python))
    assert done.returncode == 4, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].startswith(
        "gpu_check: FAIL: mindspore.run_check() on GPU did not finish in 2 s (--timeout)")


def test_compare_numbers():
    ref = {"O0": [2.0, 1.5, 1.0], "THOR": [2.0, 1.0], "O1": [1.0], "DimReduce": [1.0, 1.0]}
    got = {"O0": [2.0019, 1.514, 1.0], "THOR": [2.0, float("nan")], "DimReduce": [1.0]}
    rows = {r["algorithm"]: r for r in gpu_check.compare(got, ref, rtol_first=1e-3, rtol=1e-2)}
    assert rows["O0"]["ok"] and rows["O0"]["reason"] == ""
    assert math.isclose(rows["O0"]["max_rel"], 0.014 / 1.5)
    assert not rows["THOR"]["ok"] and rows["THOR"]["max_rel"] == math.inf
    assert rows["THOR"]["reason"].startswith("step 2: loss nan against 1")
    assert not rows["O1"]["ok"] and rows["O1"]["reason"] == "no losses from the device run"
    assert not rows["DimReduce"]["ok"] and rows["DimReduce"]["reason"] == "1 step(s) against 2 on the reference"
    first = gpu_check.compare({"O0": [2.0021]}, {"O0": [2.0]}, rtol_first=1e-3, rtol=1e-2)[0]
    assert not first["ok"] and "relative difference 1.05e-03 > 0.001" in first["reason"]
    line = gpu_check.summary(list(rows.values()), "GPU", "CPU")
    assert line == ("gpu_check: FAIL: GPU vs CPU: 1/4 algorithms agree (O0; differ: THOR, O1, DimReduce); largest "
                    "relative loss difference inf")
    ok = gpu_check.summary([rows["O0"]], "GPU", "CPU")
    assert ok == "gpu_check: PASS: GPU vs CPU: 1/1 algorithms agree (O0); largest relative loss difference 9.33e-03"


def _numpy_first_loss() -> float:
    """Cross-entropy of the check's net on its first batch, from its initial weights (BatchNorm on batch
    statistics, as in training), in float64."""
    w = {k: v.astype(np.float64) for k, v in gpu_check.initial_weights().items()}
    x, y = gpu_check.arrays(1)
    x = x.astype(np.float64)

    def conv(a, k, stride):  # "same" padding, the extra row/column at the bottom/right as MindSpore
        size = a.shape[-1]
        out = -(-size // stride)
        pad = max((out - 1) * stride + k.shape[-1] - size, 0)
        a = np.pad(a, ((0, 0), (0, 0), (pad // 2, pad - pad // 2), (pad // 2, pad - pad // 2)))
        cols = np.stack([a[:, :, i:i + stride * out:stride, j:j + stride * out:stride]
                         for i in range(3) for j in range(3)], axis=2)  # (n, c, 9, out, out)
        return np.einsum("ncpij,ocp->noij", cols, k.reshape(k.shape[0], k.shape[1], 9))

    def bn_relu(a, name):
        mean, var = a.mean(axis=(0, 2, 3), keepdims=True), a.var(axis=(0, 2, 3), keepdims=True)
        g, b = w[f"{name}.gamma"].reshape(1, -1, 1, 1), w[f"{name}.beta"].reshape(1, -1, 1, 1)
        return np.maximum((a - mean) / np.sqrt(var + 1e-5) * g + b, 0.0)

    h = bn_relu(conv(x, w["conv1.weight"], 1), "bn1")
    h = bn_relu(conv(h, w["conv2.weight"], 2), "bn2")
    logits = h.reshape(len(h), -1) @ w["fc.weight"].T + w["fc.bias"]
    logits -= logits.max(axis=1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    return float(-logp[np.arange(len(y)), y].mean())


@pytest.mark.slow
def test_cpu_self_check_runs_every_algorithm_and_agrees(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--device", "CPU", "--steps", "2"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONPATH=str(ROOT), GLOG_v="3"))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    lines = done.stdout.strip().splitlines()
    assert lines[-1] == ("gpu_check: PASS: CPU vs CPU: 4/4 algorithms agree (O0, O1, THOR, DimReduce); largest "
                         "relative loss difference 0.00e+00")
    losses = {}
    for line in lines:
        match = re.match(r"  (\S+)\s+CPU: (\S+), (\S+)  CPU: (\S+), (\S+)  max rel", line)
        if match:
            losses[match.group(1)] = [float(v) for v in match.groups()[1:]]
    assert sorted(losses) == sorted(gpu_check.ALGORITHMS)
    expected = _numpy_first_loss()
    for name in ("O0", "THOR", "DimReduce"):  # the same weights on the same batch: the forward pass of step 1
        assert losses[name][0] == pytest.approx(expected, rel=1e-5), name
    assert losses["O1"][0] != pytest.approx(expected, rel=1e-3)  # LessBN's normalised head: another forward
    for name, values in losses.items():
        assert values[:2] == values[2:] and values[1] != values[0], name  # both runs equal; a step was taken

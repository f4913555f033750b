"""ms_boost/gpu_code.py (and its command line, scripts/fatbin_archs.py): the architectures a CUDA library's code is
built for, read from its fat binaries; the driver's rules per compute capability; the note Model.train gives once
on a GPU that MindSpore's kernels have no machine code for."""
from __future__ import annotations

import struct
import subprocess
import sys
import warnings
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from ms_boost import Model, gpu_code

ROOT = Path(__file__).resolve().parents[1]
CLI = ROOT / "scripts" / "fatbin_archs.py"
WHEEL_KERNELS = {"sass": [60, 61, 70, 75, 80], "ptx": [60, 86]}


def elf_with_fatbin(containers) -> bytes:
    """A minimal 64-bit ELF image whose one ``.nv_fatbin`` section holds ``containers``: lists of ``(kind, arch,
    payload bytes)``, 8 zero bytes of padding after each container."""
    body = b""
    for entries in containers:
        content = b""
        for kind, arch, payload in entries:
            header = bytearray(64)
            struct.pack_into("<HHIQ", header, 0, kind, 0x101, 64, len(payload))
            struct.pack_into("<I", header, 28, arch)
            content += bytes(header) + payload
        body += struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(content)) + content + bytes(8)
    names = b"\0.nv_fatbin\0.shstrtab\0"
    data_at = 64
    names_at = data_at + len(body)
    headers_at = names_at + len(names)
    ident = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    elf = ident + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, headers_at, 0, 64, 0, 0, 64, 3, 2)
    sections = [struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
                struct.pack("<IIQQQQIIQQ", 1, 1, 2, 0, data_at, len(body), 0, 0, 8, 0),
                struct.pack("<IIQQQQIIQQ", 12, 3, 0, 0, names_at, len(names), 0, 0, 1, 0)]
    return elf + body + names + b"".join(sections)


@pytest.fixture
def library(tmp_path):
    path = tmp_path / "libfake.so"
    path.write_bytes(elf_with_fatbin([[(2, 70, b"s" * 40), (2, 80, b"t" * 24), (1, 86, b"p" * 16)],
                                      [(2, 61, b"u" * 8), (1, 60, b"q" * 32)]]))
    return path


def test_sass_and_ptx_are_read_and_the_drivers_rules_applied(library):
    found = gpu_code.archs(library)
    assert found == {"sass": [61, 70, 80], "ptx": [60, 86]}
    assert gpu_code.describe(found) == "sass sm_61 sm_70 sm_80; ptx compute_60 compute_86"
    # SASS runs on its own major with a minor not below its own; else the newest PTX not above the GPU, else nothing
    assert [gpu_code.verdict(found, cc) for cc in ("8.0", "8.6", "7.5", "6.1", "9.0", "6.0", "5.2")] == [
        "native", "native", "native", "native", "jit compute_86", "jit compute_60", "none"]
    assert gpu_code.verdict({"sass": [86], "ptx": []}, "8.0") == "none"  # sm_86 code needs 8.6 or more
    assert gpu_code.describe({"sass": [], "ptx": []}) == "sass -; ptx -"


def test_the_command_line_and_bad_files(library, tmp_path):
    cli = subprocess.run([sys.executable, str(CLI), str(library), "--compute-capability", "9.0"],
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0 and cli.stdout.splitlines() == ["sass sm_61 sm_70 sm_80; ptx compute_60 compute_86",
                                                               "jit compute_86"], cli.stderr
    for name, content in (("text.txt", b"not an ELF file"), ("empty.so", b"")):
        bad = tmp_path / name
        bad.write_bytes(content)
        with pytest.raises(gpu_code.NotElfError):
            gpu_code.archs(bad)
        done = subprocess.run([sys.executable, str(CLI), str(bad)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and f"fatbin_archs: {bad}:" in done.stderr
    missing = subprocess.run([sys.executable, str(CLI), str(tmp_path / "none.so")], capture_output=True, text=True,
                             timeout=60)
    assert missing.returncode == 2 and "No such file" in missing.stderr
    wrong = subprocess.run([sys.executable, str(CLI), str(library), "--compute-capability", "nine"],
                           capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 2 and "--compute-capability must look like 9.0, got 'nine'" in wrong.stderr


def test_the_wheels_gpu_kernels_are_built_for_sm_60_to_sm_80_and_ptx_6_0_and_8_6():
    # what the notes on Hopper GPUs say about MindSpore 2.10's plugin (a wheel that adds sm_90 code fails here)
    assert gpu_code.plugin_kernels().is_file()
    assert gpu_code.archs(gpu_code.plugin_kernels()) == WHEEL_KERNELS


def test_the_note_per_compute_capability(library):
    hopper = gpu_code.ptx_note("9.0")
    assert hopper.startswith("MindSpore's GPU kernels (libcuda_ops.so.11: sass sm_60 sm_61 sm_70 sm_75 sm_80; ptx "
                             "compute_60 compute_86) have no machine code for compute capability 9.0: the driver "
                             "compiles all of them from PTX (compute_86) at the first GPU operation")
    assert "the run is not hung" in hopper
    assert gpu_code.ptx_note("8.0") is None and gpu_code.ptx_note("8.9") is None  # sm_80 code runs on 8.x
    maxwell = gpu_code.ptx_note("5.2")
    assert "have no code a GPU of compute capability 5.2 can run" in maxwell
    assert gpu_code.ptx_note(None) is None  # no driver: nothing claimed
    assert gpu_code.ptx_note("9.0", library.parent / "missing.so") is None  # an unreadable library: nothing claimed
    assert "(libfake.so: sass sm_61 sm_70 sm_80; ptx compute_60 compute_86)" in gpu_code.ptx_note("9.0", library)


def test_warned_once_per_device_on_gpu_and_nothing_read_elsewhere(monkeypatch):
    asked = []

    def capability(device_id):
        asked.append(device_id)
        return "9.0"

    monkeypatch.setattr(gpu_code, "compute_capability", capability)
    monkeypatch.setattr(gpu_code, "_warned", [])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert gpu_code.warn_if_compiled_from_ptx("CPU") is None
        assert gpu_code.warn_if_compiled_from_ptx("Ascend") is None
        assert asked == []  # no driver touched off GPU
        first = gpu_code.warn_if_compiled_from_ptx("GPU", 1)
        assert first is not None and gpu_code.warn_if_compiled_from_ptx("GPU", 1) is None  # once
        assert gpu_code.warn_if_compiled_from_ptx("GPU", 0) is not None  # another device: its own note
    assert asked == [1, 0]
    assert [str(w.message) for w in caught] == [f"ms_boost: {first}", f"ms_boost: {first}"]


def test_without_a_driver_the_capability_is_unknown():
    # this machine has no NVIDIA driver (libcuda.so.1): None, no exception
    assert gpu_code.compute_capability(0) is None


@pytest.mark.parametrize("mode", [ms.PYNATIVE_MODE, ms.GRAPH_MODE])
def test_model_train_gives_the_note_once_before_training(mode, monkeypatch):
    # the device target as a GPU run reports it (the steps still run on this CPU): the note comes once, at train
    ms.set_context(mode=mode)
    real = ms.get_context
    monkeypatch.setattr(gpu_code, "_warned", [])
    monkeypatch.setattr(gpu_code, "compute_capability", lambda device_id: "9.0")
    monkeypatch.setattr(ms, "get_context", lambda key: "GPU" if key == "device_target" else real(key))
    ms.set_seed(0)
    net = nn.Dense(4, 3)
    model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                  nn.Momentum(net.trainable_params(), 0.1, 0.9))
    rng = np.random.default_rng(0)
    data = ms.dataset.NumpySlicesDataset({"x": rng.standard_normal((8, 4)).astype(np.float32),
                                          "y": rng.integers(0, 3, 8).astype(np.int32)}, shuffle=False).batch(4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.train(1, data, dataset_sink_mode=False)
        model.train(1, data, dataset_sink_mode=False)
    notes = [str(w.message) for w in caught if "have no machine code for compute capability 9.0" in str(w.message)]
    assert len(notes) == 1 and notes[0].startswith("ms_boost: MindSpore's GPU kernels (libcuda_ops.so.11:")

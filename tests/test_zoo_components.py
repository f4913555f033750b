"""Model zoo building blocks: ResNet structure, weight init, CrossEntropySmooth, lr/THOR schedules, progress."""
from __future__ import annotations

import io
import math
import re
from types import SimpleNamespace

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from model_zoo.resnet.src.callbacks import ProgressMonitor, format_duration, loss_value
from model_zoo.resnet.src.loss import CrossEntropySmooth
from model_zoo.resnet.src.lr_generator import get_lr, get_thor_damping, get_thor_lr
from model_zoo.resnet.src.resnet import (
    Bottleneck,
    create_model,
    init_group_params,
    init_weight,
    list_models,
)


def n_params(net) -> int:
    return sum(int(np.prod(p.shape)) for p in net.trainable_params())


# ---------------------------------------------------------------------------------------------------------------
# ResNet
# ---------------------------------------------------------------------------------------------------------------
# Published parameter counts of the torchvision reference networks with 1000 classes.
REFERENCE_COUNTS = {"resnet18": 11_689_512, "resnet34": 21_797_672, "resnet50": 25_557_032}


def full_size(name: str, **kwargs):
    """A full-width network for the structure checks, its weights not drawn (``no_init_parameters``: the same
    construction, Parameters and shapes, the random initialisation deferred; drawing them took ~2.2 of the ~2.7
    CPU-s of a ResNet-152; the zoo's initialisers are checked on small networks below)."""
    from mindspore.nn.utils import no_init_parameters

    with no_init_parameters():
        return create_model(name, **kwargs)


@pytest.mark.parametrize("name", sorted(REFERENCE_COUNTS))
def test_parameter_counts_match_the_reference_networks(name):
    assert n_params(full_size(name, class_num=1000)) == REFERENCE_COUNTS[name]


def test_deep_variants_build_with_the_reference_block_counts():
    """Full-width ResNet-101/152: the reference block and parameter counts."""
    for name, blocks, count in (("resnet101", (3, 4, 23, 3), 44_549_160), ("resnet152", (3, 8, 36, 3), 60_192_808)):
        net = full_size(name, class_num=1000)
        assert tuple(len(getattr(net, f"layer{i}")) for i in range(1, 5)) == blocks
        assert n_params(net) == count


def test_resnet50_is_v1_5_stride_on_the_3x3_conv():
    net = full_size("resnet50")
    for layer, stride in (("layer1", 1), ("layer2", 2), ("layer3", 2), ("layer4", 2)):
        block = getattr(net, layer)[0]
        assert isinstance(block, Bottleneck)
        assert tuple(block.conv1.stride[-2:]) == (1, 1), layer
        assert tuple(block.conv2.stride[-2:]) == (stride, stride), layer
        assert block.conv2.kernel_size == (3, 3)
        assert tuple(block.shortcut[0].stride[-2:]) == (stride, stride)
        for later in list(getattr(net, layer))[1:]:
            assert tuple(later.conv2.stride[-2:]) == (1, 1)
    # 53 convolutions + 1 dense: the 54 layers THOR's split_indices=[26, 53] refers to
    layers = [c for _, c in net.cells_and_names() if isinstance(c, (nn.Conv2d, nn.Dense))]
    assert len(layers) == 54 and isinstance(layers[-1], nn.Dense)


@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_forward_shapes_and_feature_sizes(mode):
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    try:
        net = create_model("resnet50", class_num=7, base_width=4)
        net.set_train(False)
        out = net(ms.Tensor(np.random.default_rng(0).normal(size=(2, 3, 64, 64)).astype(np.float32)))
        assert out.shape == (2, 7) and np.isfinite(out.asnumpy()).all()
        assert net.feature_dim == 4 * 8 * 4  # stage-4 width (base * 8) times the bottleneck expansion
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)


def test_unknown_name_lists_the_known_ones():
    assert list_models() == ["resnet10", "resnet18", "resnet34", "resnet50", "resnet101", "resnet152"]
    with pytest.raises(ValueError) as err:
        create_model("resnet51")
    message = str(err.value)
    assert "resnet51" in message and all(name in message for name in list_models())
    with pytest.raises(ValueError, match="base_width=0"):
        create_model("resnet18", base_width=0)
    with pytest.raises(TypeError, match="class_num"):
        create_model("resnet18", class_num=10.0)


def test_zero_init_residual_starts_blocks_as_identity():
    net = create_model("resnet18", class_num=10, base_width=4)
    assert np.all(net.layer1[0].bn2.gamma.asnumpy() == 0)
    assert np.all(net.layer1[0].bn1.gamma.asnumpy() == 1)
    plain = create_model("resnet18", class_num=10, base_width=4, zero_init_residual=False)
    assert np.all(plain.layer1[0].bn2.gamma.asnumpy() == 1)


def test_init_weight_distributions_and_determinism():
    net = init_weight(create_model("resnet50", class_num=100, base_width=16), "XavierUniform", "TruncatedNormal", 3)
    conv = net.layer3[0].conv2.weight.asnumpy()  # (64, 64, 3, 3)
    fan_in, fan_out = 64 * 9, 64 * 9
    bound = math.sqrt(6 / (fan_in + fan_out))
    assert np.abs(conv).max() <= bound and np.abs(conv).max() > 0.95 * bound
    assert conv.std() == pytest.approx(bound / math.sqrt(3), rel=0.05)  # std of U(-b, b)
    dense = net.fc.weight.asnumpy()
    assert np.abs(dense).max() <= 0.02 + 1e-7
    # a N(0, 1) truncated at +-2 has standard deviation 0.8796
    assert dense.std() == pytest.approx(0.01 * 0.8796, rel=0.05)
    assert np.all(net.fc.bias.asnumpy() == 0)
    again = init_weight(create_model("resnet50", class_num=100, base_width=16), "XavierUniform", "TruncatedNormal", 3)
    np.testing.assert_array_equal(again.layer3[0].conv2.weight.asnumpy(), conv)
    other = init_weight(create_model("resnet50", class_num=100, base_width=16), "XavierUniform", "TruncatedNormal", 4)
    assert not np.array_equal(other.layer3[0].conv2.weight.asnumpy(), conv)


def test_init_weight_he_fan_out_and_random_normal():
    net = init_weight(create_model("resnet18", class_num=50, base_width=32), "TruncatedNormal", "RandomNormal", 0)
    conv = net.layer2[0].conv1.weight.asnumpy()  # (64, 32, 3, 3)
    std = math.sqrt(2.0 / (64 * 9))
    assert conv.std() == pytest.approx(std, rel=0.05)  # truncation compensated by the 0.8796 factor
    assert np.abs(conv).max() <= 2 * std / 0.87962566103423978 + 1e-7
    assert net.fc.weight.asnumpy().std() == pytest.approx(0.01, rel=0.1)
    with pytest.raises(ValueError, match="conv_init='Kaiming'.*XavierUniform"):
        init_weight(net, "Kaiming")
    with pytest.raises(ValueError, match="dense_init='Zeros'"):
        init_weight(net, dense_init="Zeros")


def test_group_params_decay_only_weights():
    net = create_model("resnet18", class_num=10, base_width=4)
    decayed, plain, order = init_group_params(net, 5e-4)
    assert decayed["weight_decay"] == 5e-4
    assert all(p.name.endswith(".weight") for p in decayed["params"])
    assert all(p.name.rsplit(".", 1)[-1] in ("gamma", "beta", "bias") for p in plain["params"])
    assert len(decayed["params"]) + len(plain["params"]) == len(order["order_params"]) == len(net.trainable_params())
    nn.Momentum([decayed, plain, order], 0.1, 0.9)  # a valid group specification


# ---------------------------------------------------------------------------------------------------------------
# CrossEntropySmooth
# ---------------------------------------------------------------------------------------------------------------
def smooth_ce_reference(logits: np.ndarray, labels: np.ndarray, factor: float) -> np.ndarray:
    k = logits.shape[1]
    target = np.full(logits.shape, factor / (k - 1))
    target[np.arange(len(labels)), labels] = 1 - factor
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return -(target * log_softmax).sum(axis=1)


@pytest.mark.parametrize("mode", ["pynative", "graph"])
@pytest.mark.parametrize("factor", [0.0, 0.1])
def test_cross_entropy_smooth_matches_numpy(mode, factor):
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    try:
        rng = np.random.default_rng(1)
        logits = rng.normal(size=(6, 5)).astype(np.float32) * 3
        labels = rng.integers(0, 5, size=6).astype(np.int32)
        ref = smooth_ce_reference(logits.astype(np.float64), labels, factor)
        mean = CrossEntropySmooth(sparse=True, reduction="mean", smooth_factor=factor, num_classes=5)
        assert float(mean(ms.Tensor(logits), ms.Tensor(labels)).asnumpy()) == pytest.approx(ref.mean(), rel=1e-5)
        none = CrossEntropySmooth(sparse=True, reduction="none", smooth_factor=factor, num_classes=5)
        np.testing.assert_allclose(none(ms.Tensor(logits), ms.Tensor(labels)).asnumpy(), ref, rtol=1e-5)
        onehot = np.eye(5, dtype=np.float32)[labels]
        dense = CrossEntropySmooth(sparse=False, reduction="sum", num_classes=5)
        assert float(dense(ms.Tensor(logits), ms.Tensor(onehot)).asnumpy()) == pytest.approx(
            smooth_ce_reference(logits.astype(np.float64), labels, 0.0).sum(), rel=1e-5)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)


def test_cross_entropy_smooth_rejects_bad_arguments():
    with pytest.raises(ValueError, match="reduction='avg'"):
        CrossEntropySmooth(reduction="avg")
    with pytest.raises(ValueError, match="smooth_factor=1.0"):
        CrossEntropySmooth(smooth_factor=1.0)
    with pytest.raises(ValueError, match="num_classes=1"):
        CrossEntropySmooth(num_classes=1)


# ---------------------------------------------------------------------------------------------------------------
# learning-rate schedules (references written as plain per-step loops)
# ---------------------------------------------------------------------------------------------------------------
def lr_reference(mode, lr_init, lr_end, lr_max, warmup_epochs, total_epochs, spe, power=2.0,
                 boundaries=(0.3, 0.6, 0.8), gamma=0.1):
    total = total_epochs * spe
    warm = int(round(warmup_epochs * spe))
    out = []
    for i in range(total):
        if i < warm:
            out.append(lr_init + (lr_max - lr_init) * (i + 1) / warm)
            continue
        p = (i - warm) / (total - warm)
        if mode == "linear":
            out.append(lr_max - (lr_max - lr_end) * p)
        elif mode == "cosine":
            out.append(lr_end + (lr_max - lr_end) * (1 + math.cos(math.pi * p)) / 2)
        elif mode == "poly":
            out.append(lr_end + (lr_max - lr_end) * (1 - p) ** power)
        elif mode == "steps":
            out.append(lr_max * gamma ** sum(1 for b in boundaries if i >= b * total))
        else:
            out.append(lr_max)
    return np.array(out)


@pytest.mark.parametrize("mode", ["linear", "cosine", "poly", "steps", "constant"])
@pytest.mark.parametrize("warmup", [0, 2, 0.5])
def test_lr_schedules_match_reference(mode, warmup):
    lr = get_lr(0.01, 0.001, 0.8, warmup, 10, 7, mode)
    assert lr.dtype == np.float32 and lr.shape == (70,)
    np.testing.assert_allclose(lr, lr_reference(mode, 0.01, 0.001, 0.8, warmup, 10, 7), rtol=1e-6, atol=1e-7)
    if warmup:
        steps = int(round(warmup * 7))
        assert lr[steps - 1] == pytest.approx(0.8) and np.all(np.diff(lr[:steps]) > 0)
    if mode in ("linear", "cosine", "poly"):
        assert np.all(np.diff(lr[int(round(warmup * 7)):]) <= 1e-7)  # non-increasing after warm-up
        assert lr[-1] > 0.001 and lr[-1] < 0.8


def test_lr_start_step_and_errors():
    full = get_lr(0.0, 0.0, 0.4, 1, 5, 4, "cosine")
    np.testing.assert_array_equal(get_lr(0.0, 0.0, 0.4, 1, 5, 4, "cosine", start_step=7), full[7:])
    with pytest.raises(ValueError, match="lr_decay_mode='exp'"):
        get_lr(0.0, 0.0, 0.4, 1, 5, 4, "exp")
    with pytest.raises(ValueError, match="warmup_epochs=5"):
        get_lr(0.0, 0.0, 0.4, 5, 5, 4)
    with pytest.raises(ValueError, match="start_step=20"):
        get_lr(0.0, 0.0, 0.4, 1, 5, 4, start_step=20)
    with pytest.raises(ValueError, match="steps_per_epoch=0"):
        get_lr(0.0, 0.0, 0.4, 1, 5, 0)


def test_thor_schedules_match_reference():
    spe, lr_init, decay, end_epoch, decay_epochs = 5, 0.05803, 4.04839, 12, 9
    lr = get_thor_lr(0, lr_init, decay, end_epoch, spe, decay_epochs=decay_epochs)
    ref = []
    for step in range(end_epoch * spe):
        epoch = (step + 1) / spe
        value = lr_init * (1 - epoch / end_epoch) ** decay
        if epoch >= decay_epochs:
            value *= 0.5
        if epoch >= decay_epochs + 1:
            value *= 0.5
        ref.append(value)
    np.testing.assert_allclose(lr, ref, rtol=1e-5, atol=1e-9)
    assert lr[-1] == 0.0
    longer = get_thor_lr(0, lr_init, decay, end_epoch, spe, decay_epochs=decay_epochs, total_epochs=15)
    assert longer.shape == (75,) and np.all(longer[60:] == 0) and np.all(np.isfinite(longer))
    damping = get_thor_damping(0, 0.02714, 0.50036, 30, spe)
    np.testing.assert_allclose(damping, [0.02714 * 0.50036 ** (((s + 1) / spe) / 10) for s in range(30 * spe)],
                               rtol=1e-6)
    assert damping[10 * spe - 1] == pytest.approx(0.02714 * 0.50036, rel=1e-6)
    np.testing.assert_array_equal(get_thor_damping(4, 0.02714, 0.50036, 30, spe), damping[4:])
    # the sample's call order: global_step first, a resumed run starts inside the schedule
    np.testing.assert_array_equal(get_thor_lr(7, lr_init, decay, end_epoch, spe, decay_epochs), lr[7:])
    with pytest.raises(ValueError, match="global_step=60"):
        get_thor_lr(60, lr_init, decay, end_epoch, spe)


# ---------------------------------------------------------------------------------------------------------------
# progress monitor
# ---------------------------------------------------------------------------------------------------------------
class _Run:
    def __init__(self):
        self.args = SimpleNamespace(cur_step_num=0, net_outputs=None)
        self.stopped = False

    def original_args(self):
        return self.args

    def request_stop(self):
        self.stopped = True


def test_progress_monitor_lines_eta_and_nan_stop(monkeypatch):
    clock = {"t": 100.0}
    monkeypatch.setattr("model_zoo.resnet.src.callbacks.time.time", lambda: clock["t"])
    out = io.StringIO()
    monitor = ProgressMonitor(total_steps=12, steps_per_epoch=6, batch_size=64, log_interval=3, stream=out,
                              rank=1, rank_size=2)
    run = _Run()
    monitor.on_train_begin(run)
    for step in range(1, 13):
        clock["t"] += 10.0 if step == 1 else 0.5  # first step includes compilation
        run.args.cur_step_num = step
        run.args.net_outputs = (ms.Tensor(np.float32(3.0 - 0.1 * step)), ms.Tensor(False), ms.Tensor(1024.0))
        monitor.on_train_step_end(run)
    monitor.on_train_end(run)
    lines = out.getvalue().splitlines()
    assert len(lines) == 5  # steps 3, 6, 9, 12 and the summary
    assert lines[0].startswith("[rank 1/2] epoch 1/2 step 3/6 (global 3/12) loss 2.7000")
    assert "ETA" in lines[0]
    second = re.search(r"([\d.]+) ms/step \| ([\d.]+) img/s \| ETA (\S+)", lines[1])
    assert second.group(1) == "500.0" and second.group(2) == "128.0"
    assert second.group(3) == format_duration(6 * 0.5)  # excludes the slow first interval
    assert "epoch 2/2 step 6/6 (global 12/12)" in lines[3] and lines[3].endswith("ETA 0:00:00")
    assert lines[4].startswith("[rank 1/2] training done: 12 steps")
    assert monitor.losses[-1] == pytest.approx(1.8)
    sunk = io.StringIO()  # data sinking: the callback sees only epoch ends (every 5 steps); each one prints
    sinking = ProgressMonitor(total_steps=15, steps_per_epoch=5, batch_size=8, log_interval=3, stream=sunk)
    sinking.on_train_begin(run)
    for step in (5, 10, 15):
        run.args.cur_step_num, run.args.net_outputs = step, ms.Tensor(np.float32(1.0))
        sinking.on_train_step_end(run)
    assert [line.split(" loss")[0] for line in sunk.getvalue().splitlines()] == [
        "epoch 1/3 step 5/5 (global 5/15)", "epoch 2/3 step 5/5 (global 10/15)", "epoch 3/3 step 5/5 (global 15/15)"]
    run.args.cur_step_num, run.args.net_outputs = 13, ms.Tensor(np.float32("nan"))
    monitor.on_train_step_end(run)
    assert run.stopped and "loss is nan" in out.getvalue()


def test_format_duration_and_loss_value():
    assert format_duration(3725.2) == "1:02:05"
    assert format_duration(59.6) == "0:01:00"
    assert format_duration(float("inf")) == "?"
    assert loss_value(ms.Tensor(np.array([1.0, 3.0], np.float32))) == 2.0
    assert loss_value((ms.Tensor(np.float32(0.5)), ms.Tensor(True))) == 0.5


def test_stem_max_pool_equals_the_padded_max_pool_on_relu_output():
    from model_zoo.resnet.src.resnet import StemMaxPool

    rng = np.random.default_rng(0)
    reference = nn.MaxPool2d(kernel_size=3, stride=2, pad_mode="pad", padding=1)
    for shape in ((2, 3, 9, 8), (1, 4, 16, 16), (1, 2, 7, 7)):
        x = rng.standard_normal(shape).astype(np.float32)
        x[:, :, 0, :] = -1.0  # a negative border row: the ReLU zeroes it, the pools still agree
        x = ms.Tensor(np.maximum(x, 0.0))
        assert np.array_equal(StemMaxPool()(x).asnumpy(), reference(x).asnumpy())
    # only export swaps it in: a zoo ResNet trains with MindSpore's padded pool
    from model_zoo.resnet.src.resnet import create_model, onnx_exportable

    net = create_model("resnet10", class_num=3, base_width=4)
    assert type(net.maxpool) is nn.MaxPool2d
    assert isinstance(onnx_exportable(net).maxpool, StemMaxPool)


def test_an_unsupported_device_target_is_one_error_line():
    """train.py --device_target GPU on a machine (or build) without GPU: one line naming the targets, status 1."""
    import subprocess
    import sys
    from pathlib import Path

    from model_zoo.resnet.src.device import unsupported_device_message

    assert unsupported_device_message(RuntimeError("something else")) is None
    assert unsupported_device_message(ValueError("Unsupported device target GPU.")) is None
    if ms.hal.is_available("GPU"):
        pytest.skip("this machine has a GPU")
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(root / "model_zoo/resnet/train.py"), "--device_target", "GPU",
                           "--check_data", "never", "--data_path", str(root / "no_such_data")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert re.search(r"^train.py: error: device_target='GPU' is not supported by this MindSpore build on this "
                     r"machine; supported here: CPU \(or auto", done.stderr, re.M), done.stderr[-2000:]


def test_resume_on_a_server_without_rank_0s_checkpoints_takes_its_own_and_all_ranks_check_the_step(tmp_path):
    """Several servers without a shared file system: only server 0 holds rank 0's ``checkpoint/`` files, server 1
    only ``checkpoint/rank_1/``. Rank 1 resumes from its own newest file (was: no checkpoint found), and the ranks
    compare their steps (loopback world of 2 ranks): equal steps pass, different steps are an error on every rank."""
    from pathlib import Path

    from model_zoo.resnet.src import run_state
    from model_zoo.resnet.src.config import parse_config
    from tests.helpers.loopback import run_ranks

    recipe = Path(__file__).resolve().parents[1] / "model_zoo/resnet/configs/resnet50_imagenet_momentum.yaml"
    base = parse_config([], recipe)
    for name in ("resnet-1_4.ckpt", "resnet-2_4.ckpt"):
        for folder in (tmp_path / "server0" / "checkpoint", tmp_path / "server1" / "checkpoint" / "rank_1"):
            folder.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(b"")

    def resume(steps):
        def rank_fn(rank):
            path = run_state._resume_path(base.replace(resume=str(tmp_path / f"server{rank}")))
            run_state._same_step_on_every_rank(path, steps[rank])
            return path.relative_to(tmp_path).as_posix()
        return run_ranks(2, rank_fn)

    assert resume([8, 8]) == ["server0/checkpoint/resnet-2_4.ckpt", "server1/checkpoint/rank_1/resnet-2_4.ckpt"]
    with pytest.raises(ValueError, match=r"different steps \{0: 8, 1: 4\}"):
        resume([8, 4])


def test_a_stopped_script_exits_130_or_143_and_train_py_says_how_to_resume(monkeypatch, capsys):
    """Ctrl-C (a KeyboardInterrupt) ends a zoo script with status 130 and SIGTERM with 143, without a traceback;
    train.py first names the run folder and the --resume to continue with."""
    import os
    import signal

    from model_zoo.resnet import train as zoo_train
    from model_zoo.resnet.src.device import run_script

    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as exited:
        run_script(interrupted, "x.py")
    assert exited.value.code == 130
    with pytest.raises(SystemExit) as exited:
        run_script(lambda: os.kill(os.getpid(), signal.SIGTERM), "x.py")
    assert exited.value.code == 143
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back

    monkeypatch.setattr(zoo_train, "train", lambda cfg: interrupted())
    with pytest.raises(SystemExit) as exited:
        run_script(lambda: zoo_train.main(["--output_path", "/runs/a"]), "train.py")
    assert exited.value.code == 130
    assert "train.py: interrupted; the checkpoints written so far are in '/runs/a': run the same command with " \
           "--resume /runs/a to continue" in capsys.readouterr().err


def test_run_sizes_are_checked_by_their_config_names():
    """--epoch_size 0 was refused as 'total_epochs=0', --steps_per_epoch -1 as 'num_steps=-1', --train_image_size 0
    as 'image_size=0' (the pipeline's argument names); now by the key the user typed, before anything is built.
    --num_parallel_workers 0 (or negative) silently meant the default 8: now refused too."""
    from pathlib import Path

    from model_zoo.resnet.src.config import parse_config
    from model_zoo.resnet.src.trainer import check_run_sizes

    recipe = Path(__file__).resolve().parents[1] / "model_zoo/resnet/configs/resnet50_imagenet_momentum.yaml"
    check_run_sizes(parse_config([], recipe))
    for key, value, allowed in (("epoch_size", "0", "an int >= 1"), ("steps_per_epoch", "-1", "an int >= 0"),
                                ("train_image_size", "0", "an int >= 1"), ("warmup_epochs", "-1", "an int >= 0"),
                                ("num_parallel_workers", "0", "an int >= 1")):
        with pytest.raises(ValueError, match=rf"^{key}={value} is not allowed; allowed: {allowed}\.$"):
            check_run_sizes(parse_config([f"--{key}", value], recipe))


def test_a_checkpoint_of_this_recipe_with_another_boost_plan_names_the_plan_not_the_recipe(tmp_path):
    """eval.py --config <quick start> on the quick start's own autotuned (or --boost_level O0) checkpoint said
    'written by recipe resnet18_synthetic_quickstart ... evaluate/export it with --config <the same file>': advice
    that repeats the failing command. Now the plan is named: the run's --boost_level, or --boost_level auto
    --autotune.plan <run>/autotune.yaml when the run was autotuned."""
    import re
    from pathlib import Path

    from model_zoo.resnet.src.config import parse_config
    from model_zoo.resnet.src.trainer import _check_recipe, recipe_manifest

    recipe = Path(__file__).resolve().parents[1] / "model_zoo/resnet/configs/resnet18_synthetic_quickstart.yaml"
    cfg = parse_config([], recipe)  # O1: LessBN
    run = tmp_path / "run"
    theirs = recipe_manifest(cfg.replace(boost_level="O0", output_path=str(run)))  # plain BatchNorm
    ckpt = run / "checkpoint" / "resnet-1_1.ckpt"
    head = (f"checkpoint '{ckpt}' was written by this recipe ('resnet18_synthetic_quickstart') with another boost "
            f"plan: it holds resnet18 width 8, 10 classes, plain BatchNorm (boost_level 'O0'), this config builds "
            f"resnet18 width 8, 10 classes, LessBN (FN head) (boost_level 'O1'); evaluate/export it with ")
    without = (", or give neither --config nor --boost_level/--boost_config_dict.*: eval.py and export.py then take "
               "the recipe and its boost plan from the checkpoint's run manifest.")
    with pytest.raises(ValueError, match="^" + re.escape(head + "the run's --boost_level O0 (and its "
                                                         "--boost_config_dict.* overrides)" + without) + "$"):
        _check_recipe(cfg, ckpt, theirs, "evaluate/export")
    run.mkdir()
    # journeys, second round: a stale autotune.yaml of an earlier run in the folder (--overwrite_output keeps it) was
    # named as this checkpoint's plan; only the file holding the plan the manifest records is
    (run / "autotune.yaml").write_text("boost: {mode: manual}\n")
    with pytest.raises(ValueError, match="^" + re.escape(head + "the run's --boost_level O0 (and its "
                                                         "--boost_config_dict.* overrides)" + without) + "$"):
        _check_recipe(cfg, ckpt, theirs, "evaluate/export")
    import yaml
    (run / "autotune.yaml").write_text(yaml.safe_dump(theirs["config"]["boost_config_dict"]))
    with pytest.raises(ValueError, match="^" + re.escape(head + f"--boost_level auto --autotune.plan "
                                                                f"{run / 'autotune.yaml'}" + without) + "$"):
        _check_recipe(cfg, ckpt, theirs, "evaluate/export")
    _check_recipe(cfg, ckpt, recipe_manifest(cfg), "evaluate/export")  # its own plan: accepted


def test_first_order_schedule_overrides_are_refused_for_thor_not_ignored():
    """--lr_max 0.1 (or --lr_decay_mode, --warmup_epochs 3, ...) with the THOR recipe trained THOR's own thor.*
    schedule and dropped the override without a word; now it is refused naming the thor.* keys to set. Given
    to a Momentum recipe, or --warmup_epochs 0 (what THOR does anyway), they pass."""
    import re
    from pathlib import Path

    from model_zoo.resnet.src.config import parse_config
    from model_zoo.resnet.src.trainer import check_schedule_keys

    configs = Path(__file__).resolve().parents[1] / "model_zoo/resnet/configs"
    thor = configs / "resnet50_imagenet_thor.yaml"
    with pytest.raises(ValueError, match="^" + re.escape(
            "--lr_max 0.1, --warmup_epochs 3: not used by optimizer='THOR', whose learning rate is thor.lr_init * "
            "(1 - epoch / thor.lr_end_epoch) ** thor.lr_decay, halved at thor.decay_epochs (no warm-up); set "
            "--thor.lr_init, --thor.lr_decay, --thor.lr_end_epoch or --thor.decay_epochs instead.") + "$"):
        check_schedule_keys(parse_config(["--lr_max", "0.1", "--warmup_epochs", "3"], thor))
    with pytest.raises(ValueError, match=r"^--lr_decay_mode 'cosine': not used by optimizer='THOR'"):
        check_schedule_keys(parse_config(["--lr_decay_mode", "cosine"], thor))
    check_schedule_keys(parse_config(["--warmup_epochs", "0", "--thor.lr_init", "0.1"], thor))
    check_schedule_keys(parse_config(["--lr_max", "0.1"], configs / "resnet50_imagenet_momentum.yaml"))


def test_the_boost_plan_is_checked_before_the_run_as_the_run_builds_it(tmp_path):
    """Journeys, second round: overrides of the plan that passed train.py's start (and the launchers' check) and
    failed later -- THOR with --boost_level O1/auto, an autotune option out of range, an unknown candidate,
    --autotune.plan without boost_level auto, a 'boost' section under auto -- or were dropped with only a note in the
    plan's summary (a --boost_config_dict.<section>.* key of an algorithm the plan leaves off) stop with one message
    naming the key and the way on. Recipe-file sections of an off algorithm stay valid (the quick start at O0)."""
    import re
    from pathlib import Path

    from model_zoo.resnet.src.config import parse_config
    from model_zoo.resnet.src.trainer import check_boost_plan

    configs = Path(__file__).resolve().parents[1] / "model_zoo/resnet/configs"
    momentum, thor = configs / "resnet50_imagenet_momentum.yaml", configs / "resnet50_imagenet_thor.yaml"
    refused = [
        (momentum, ["--boost_config_dict.grad_freeze.freeze_p", "0.5"],
         "--boost_config_dict.grad_freeze.*: the 'grad_freeze' algorithm is off in this run's plan (boost_level O0, "
         "boost.mode 'auto'), so these values would be unused; switch it on (--boost_level O1, or "
         "--boost_config_dict.boost.mode manual --boost_config_dict.boost.grad_freeze true) or leave them out."),
        (momentum, ["--boost_config_dict.grad_accumulation.grad_accumulation_step", "2"],
         "the 'grad_accumulation' algorithm is off in this run's plan"),
        (configs / "resnet50_imagenet_boost_o1.yaml", ["--boost_config_dict.grad_freeze.freeze_p", "1.5"],
         "boost config grad_freeze.freeze_p=1.5 is out of range; allowed: 0.0 <= value <= 1.0."),
        (thor, ["--boost_level", "O1"], "boost_level='O1' does not combine with optimizer='THOR'"),
        (thor, ["--boost_level", "auto"], "boost_level='auto' does not combine with optimizer='THOR'"),
        (momentum, ["--boost_level", "auto", "--autotune.budget", "1.5"],
         "boost config autotune.budget=1.5 is out of range; allowed: 0.0 < value < 1.0."),
        (momentum, ["--boost_level", "auto", "--autotune.candidates", "[O0, O3]"], "unknown candidate 'O3'; allowed"),
        (momentum, ["--boost_level", "auto", "--boost_config_dict.boost.mode", "manual"],
         "is not allowed with boost_level='auto'"),
        (momentum, ["--autotune.plan", str(tmp_path / "autotune.yaml")],
         "is only read with boost_level auto (this run has boost_level O0)"),
        (momentum, ["--boost_level", "auto", "--autotune.plan", str(tmp_path / "autotune.yaml")], "is not a file"),
    ]
    for recipe, args, message in refused:
        with pytest.raises(ValueError, match=re.escape(message)):
            check_boost_plan(parse_config(args, recipe))
    for recipe, args in [(momentum, ["--boost_level", "O1", "--boost_config_dict.grad_freeze.freeze_p", "0.5"]),
                         (momentum, ["--boost_level", "auto", "--boost_config_dict.grad_freeze.freeze_p", "0.5"]),
                         (momentum, ["--boost_level", "O2", "--boost_config_dict.common.device_num", "2"]),
                         (momentum, ["--boost_config_dict.boost.mode", "manual", "--boost_config_dict.boost.adasum",
                                     "true", "--boost_config_dict.common.device_number", "1"]),
                         (configs / "resnet18_synthetic_quickstart.yaml", ["--boost_level", "O0"]),
                         (thor, [])]:
        check_boost_plan(parse_config(args, recipe))


def test_a_saved_plan_keeps_its_level_and_takes_the_command_lines_boost_keys(tmp_path):
    """Journeys, second round: ``--boost_level auto --autotune.plan <another run's autotune.yaml>
    --boost_config_dict.grad_freeze.total_steps 30`` trained the file's sections and dropped the override without a
    word (the plan replaced the whole boost_config_dict), and a resumed autotuned run said 'these keys differ from the
    checkpoint's run: [boost_level]' (the trial's run recorded O1, the saved plan was read as O0). The command line's
    keys now go over the file's sections, the level is the one its header names, and a key of an algorithm the plan
    leaves off is refused as for a fixed plan."""
    from pathlib import Path

    import yaml

    from model_zoo.resnet.src.config import parse_config
    from model_zoo.resnet.src.trainer import check_boost_plan, concrete_plan

    momentum = Path(__file__).resolve().parents[1] / "model_zoo/resnet/configs/resnet50_imagenet_momentum.yaml"
    body = {"boost": {"mode": "manual", "less_bn": True, "grad_freeze": True, "grad_accumulation": False},
            "grad_freeze": {"total_steps": 20, "graph_variants": False}, "less_bn": {"fn_flag": True}}
    plan = tmp_path / "autotune.yaml"
    plan.write_text("# ms_boost autotune pick: O1 (boost_level O1), measured 2026-11-27 18:45 UTC\n"
                    "#   pick: O1 -> boost_level O1\n" + yaml.safe_dump(body))
    cfg = parse_config(["--boost_level", "auto", "--autotune.plan", str(plan),
                        "--boost_config_dict.grad_freeze.total_steps", "30"], momentum)
    concrete = concrete_plan(cfg, plan)
    assert concrete.boost_level == "O1"
    assert concrete.boost_config_dict.to_dict() == dict(body, grad_freeze={"total_steps": 30, "graph_variants": False})
    check_boost_plan(cfg)
    with pytest.raises(ValueError, match=r"^--boost_config_dict\.grad_accumulation\.\*: the 'grad_accumulation' "
                                         r"algorithm is off in this run's plan \(boost_level O1, boost\.mode "
                                         r"'manual'\)"):
        check_boost_plan(parse_config(["--boost_level", "auto", "--autotune.plan", str(plan),
                                       "--boost_config_dict.grad_accumulation.grad_accumulation_step", "2"], momentum))
    plan.write_text(yaml.safe_dump(body))  # no header (written by hand): level O0, the manual switches decide
    assert concrete_plan(parse_config([], momentum), plan).boost_level == "O0"


def test_resuming_another_optimizers_checkpoint_is_refused_naming_its_recipe(tmp_path):
    """Journeys, second round: --resume of a THOR run's checkpoint with the Momentum recipe (the same plain-BatchNorm
    network) went on training with Momentum, THOR's moments loaded as Momentum's, with only a note listing the keys
    that differ. It is refused now, naming the recipe to resume with (and --pretrained for its weights alone)."""
    import re
    from pathlib import Path

    from model_zoo.resnet.src.config import parse_config
    from model_zoo.resnet.src.trainer import _check_recipe, recipe_manifest

    configs = Path(__file__).resolve().parents[1] / "model_zoo/resnet/configs"
    thor = recipe_manifest(parse_config([], configs / "resnet50_imagenet_thor.yaml"))
    momentum = parse_config([], configs / "resnet50_imagenet_momentum.yaml")
    ckpt = tmp_path / "resnet-1_2.ckpt"
    with pytest.raises(ValueError, match="^" + re.escape(
            f"resume: checkpoint '{ckpt}' was written by recipe 'resnet50_imagenet_thor' with optimizer='THOR', this "
            f"run trains optimizer='Momentum': the optimizer's state does not carry over, so this would be another "
            f"run, not its continuation; resume it with --config {configs / 'resnet50_imagenet_thor.yaml'}, or start "
            f"a new run from its weights with --pretrained {ckpt}.") + "$"):
        _check_recipe(momentum, ckpt, thor, "resume")
    _check_recipe(momentum, ckpt, thor, "evaluate/export")  # evaluating it needs only the network: accepted


def test_steps_per_epoch_above_the_data_sets_batches_is_said():
    """Journeys, second round: --steps_per_epoch 4 on a set of 2 batches trained 2-step epochs without a word."""
    from pathlib import Path

    from model_zoo.resnet.src.config import parse_config
    from model_zoo.resnet.src.trainer import short_epoch_note

    recipe = Path(__file__).resolve().parents[1] / "model_zoo/resnet/configs/resnet50_imagenet_momentum.yaml"
    assert short_epoch_note(parse_config(["--steps_per_epoch", "4", "--batch_size", "8"], recipe), 2) == (
        "note: steps_per_epoch=4 is more than the 2 batches of batch_size 8 an epoch of this data set has (per rank): "
        "each epoch trains 2 steps.")
    assert short_epoch_note(parse_config(["--steps_per_epoch", "2"], recipe), 2) is None
    assert short_epoch_note(parse_config([], recipe), 5) is None  # 0: whole epochs


def test_a_command_line_key_in_ms_boosts_other_spelling_replaces_the_recipes():
    """Journeys, second round: upstream's docs spell ``dim_reduce.n_components`` (the stage-2 recipe: ``n_component``)
    and the stage-2 tutorial ``common.device_num`` (the O1 recipe: ``device_number``); given on the command line, the
    other spelling stayed in the recipe's section and ms_boost refused the pair as 'given twice ... give it once',
    although the user gave it once. The command line's spelling now replaces the recipe's."""
    from pathlib import Path

    from model_zoo.resnet.src.config import parse_config
    from model_zoo.resnet.src.trainer import boost_config_dict, check_boost_plan
    from ms_boost import AutoBoost

    configs = Path(__file__).resolve().parents[1] / "model_zoo/resnet/configs"
    stage2 = parse_config(["--pretrained", "/stage1/resnet-70_625.ckpt", "--boost_config_dict.dim_reduce.n_components",
                           "8"], configs / "resnet50_imagenet_dim_reduce_stage2.yaml")
    dim = boost_config_dict(stage2, total_steps=10)["dim_reduce"]
    assert dim["n_components"] == 8 and "n_component" not in dim
    check_boost_plan(stage2)
    o2 = parse_config(["--boost_level", "O2", "--boost_config_dict.common.device_num", "2"],
                      configs / "resnet50_imagenet_boost_o1.yaml")
    assert boost_config_dict(o2, total_steps=10)["common"] == {"device_num": 2}
    assert AutoBoost("O2", boost_config_dict(o2, total_steps=10)).common.device_number == 2


class _ResumeCfg(dict):
    """A config that ``restore_train_network`` reads by attribute and by ``get``."""

    __getattr__ = dict.__getitem__


def _resume_checkpoint(path, manifest: dict) -> None:
    """A one-Parameter checkpoint (``w`` = zeros(3)) carrying ``manifest`` as the zoo's run manifest."""
    import json

    import mindspore as ms
    import numpy as np
    from mindspore import Tensor

    from model_zoo.resnet.src.run_state import MANIFEST_KEY

    ms.save_checkpoint([{"name": "w", "data": Tensor(np.zeros(3, np.float32))}], str(path),
                       append_dict={MANIFEST_KEY: json.dumps(manifest)})


def test_resume_into_a_network_the_checkpoint_does_not_fit_names_the_settings_that_differ(tmp_path):
    """The Momentum recipe's checkpoint (fixed loss scale) resumed with ``--loss_scale_type dynamic``: the train
    network has the dynamic scale's counters, which the checkpoint lacks. The error named only the recipe and the
    boost level, both the same; it names the setting that differs, with both values."""
    import re

    import numpy as np
    from mindspore import Parameter, Tensor, nn

    from model_zoo.resnet.src.run_state import restore_train_network

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.w = Parameter(Tensor(np.ones(3, np.float32)), name="w")
            self.counter = Parameter(Tensor(np.zeros(1, np.int32)), name="current_iterator_step")

    path = tmp_path / "resnet-1_2.ckpt"
    _resume_checkpoint(path, {"global_step": 2, "steps_per_epoch": 2, "recipe": "resnet50_imagenet_momentum",
                              "boost_level": "O0",
                              "config": {"loss_scale_type": "fixed", "batch_size": 8, "lr_max": 0.1}})
    cfg = _ResumeCfg(resume=str(path), checkpoint_dir="checkpoint", checkpoint_prefix="resnet", epoch_size=2,
              loss_scale_type="dynamic", batch_size=8, lr_max=0.1)
    with pytest.raises(ValueError, match=re.escape(
            "lacks 1 Parameter(s) of this run's train network (first: ['current_iterator_step']); these settings "
            "differ from the checkpoint's run: loss_scale_type: checkpoint 'fixed', this run 'dynamic'; resume with "
            "the checkpoint's values.")):
        restore_train_network(cfg, Net(), 2, lambda p, m: None)
    with pytest.raises(ValueError, match=r"was it written by another recipe or boost setting \(it says recipe "
                                         r"'resnet50_imagenet_momentum', boost_level 'O0'\)\?"):
        restore_train_network(_ResumeCfg(cfg, loss_scale_type="fixed"), Net(), 2, lambda p, m: None)


def test_resume_with_another_rank_count_is_refused_even_with_steps_per_epoch_fixed(tmp_path):
    """A 2-rank run's checkpoint resumed by 1 rank: with ``steps_per_epoch`` fixed the step counts and batch size
    agree, and the run went on silently on other shards with half the global batch (the docs say the rank count is
    checked; it was only through the steps per epoch of whole epochs). Refused, naming both counts."""
    import numpy as np
    from mindspore import Parameter, Tensor, nn

    from model_zoo.resnet.src.run_state import restore_train_network

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.w = Parameter(Tensor(np.ones(3, np.float32)), name="w")

    path = tmp_path / "resnet-1_2.ckpt"
    cfg = _ResumeCfg(resume=str(path), checkpoint_dir="checkpoint", checkpoint_prefix="resnet", epoch_size=2,
                     batch_size=8)
    for ranks in (2, 1):
        _resume_checkpoint(path, {"global_step": 2, "steps_per_epoch": 2, "rank_size": ranks,
                                  "config": {"batch_size": 8}})
        if ranks == 2:
            with pytest.raises(ValueError, match=r"was written by a run of 2 rank\(s\), this run has 1 .*exact resume "
                                                 r"needs the same rank count: relaunch with 2 rank\(s\), or start a "
                                                 r"new run from its weights with --pretrained"):
                restore_train_network(cfg, Net(), 2, lambda p, m: None)
        else:
            net = Net()
            assert restore_train_network(cfg, net, 2, lambda p, m: None)[0] == 2
            np.testing.assert_array_equal(net.w.asnumpy(), np.zeros(3, np.float32))


def test_a_sigterm_the_blocked_main_thread_cannot_take_still_ends_the_script(tmp_path):
    """Journeys, fourth round: a two-node job whose node-1 worker was killed ended on node 0 only when the collective
    timed out (126 s, MS_CPU_COMM_OP_TIMEOUT 120), although the scheduler sent SIGTERM 10 s after the kill: the
    Python handler waited for the main thread, blocked inside MindSpore. Here the main thread blocks in C (a mutex
    locked twice, which no signal interrupts) and the SIGTERM still ends the script with 143 after STOP_GRACE."""
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "stuck.py"
    script.write_text(
        "import ctypes, sys, threading, time\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})\n"
        "from model_zoo.resnet.src import device\n"
        "device.STOP_GRACE = 0.5\n"
        "def say_blocked():\n"  # from another thread, once the main thread is inside the C call (it holds the GIL
        "    while sys._current_frames()[main_id].f_lineno != BLOCK_LINE:\n"  # until then), and a while later
        "        time.sleep(0.01)\n"
        "    time.sleep(0.3)\n"
        "    print('blocked', flush=True)\n"
        "def main():\n"
        "    libc, mutex = ctypes.CDLL(None), ctypes.create_string_buffer(64)\n"
        "    libc.pthread_mutex_lock(mutex)\n"
        "    threading.Thread(target=say_blocked, daemon=True).start()\n"
        "    libc.pthread_mutex_lock(mutex)\n"
        "main_id = threading.get_ident()\n"
        "BLOCK_LINE = 14\n"
        "device.run_script(main, 'x.py')\n", encoding="utf-8")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "blocked\n"
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 143
    assert "x.py: SIGTERM: the main thread did not stop within 0.5 s (blocked inside MindSpore" in err


def test_a_rollback_window_the_run_never_fills_is_said():
    """Journeys, fourth round: `--lr_max 300 --divergence_action rollback` over 30 steps (window 50) took the loss
    from 2.3 to 3e15 without a rollback and exited 0: the spike rule waits for a full window. A note says so."""
    from pathlib import Path

    from model_zoo.resnet.src.config import parse_config
    from model_zoo.resnet.src.trainer import rollback_window_note

    recipe = Path(__file__).resolve().parents[1] / "model_zoo/resnet/configs/resnet50_imagenet_momentum.yaml"
    rollback = parse_config(["--divergence_action", "rollback"], recipe)
    assert rollback_window_note(rollback, 30) == (
        "note: divergence_window=50 is not below the 30 steps this run trains: the spike rule (a loss above "
        "divergence_spike_factor=10 x the running median) judges losses only once 50 are recorded, so in this run only "
        "a NaN/Inf loss or a non-finite value rolls back; give a smaller --divergence_window to judge spikes.")
    assert rollback_window_note(rollback, 51) is None
    assert rollback_window_note(parse_config([], recipe), 30) is None  # stop: no spike rule
    assert rollback_window_note(parse_config(["--divergence_action", "rollback", "--divergence_spike_factor", "0"],
                                             recipe), 30) is None


def test_resume_keeps_the_runs_own_graceful_exit_flags(tmp_path, monkeypatch):
    """Users' scripts, eleventh round: with ``MS_ENABLE_GRACEFUL_EXIT=1`` the train cell holds OnRequestExit's two
    flags. ``--resume`` must not restore them: a checkpoint written without the variable lacks them (the resume was
    refused as "lacks 2 Parameter(s)"), and one written at an exit request holds ``graceful_exit`` True (the resumed
    run would stop after its first step)."""
    import json

    import mindspore as ms
    import numpy as np
    from mindspore import Tensor, nn

    from model_zoo.resnet.src.run_state import MANIFEST_KEY, restore_train_network, run_control_parameter_names
    from ms_boost import BoostTrainOneStepCell

    monkeypatch.setenv("MS_ENABLE_GRACEFUL_EXIT", "1")
    dense = nn.Dense(3, 1)
    dense.weight.name, dense.bias.name = "w", "b"
    cell = BoostTrainOneStepCell(nn.WithLossCell(dense, nn.MSELoss()),
                                 nn.SGD(dense.trainable_params(), learning_rate=0.1))
    assert run_control_parameter_names(cell) == {"graceful_exit", "graceful_init"}
    path = tmp_path / "resnet-1_2.ckpt"
    cfg = _ResumeCfg(resume=str(path), checkpoint_dir="checkpoint", checkpoint_prefix="resnet", epoch_size=2,
                     batch_size=8)
    saved = {p.name: p.asnumpy() for p in cell.get_parameters() if p.name not in ("graceful_exit", "graceful_init")}
    saved["w"] = np.full((1, 3), 0.5, np.float32)
    for flags in ({}, {"graceful_exit": np.array(True), "graceful_init": np.array([1], np.int32)}):
        ms.save_checkpoint([{"name": k, "data": Tensor(v)} for k, v in {**saved, **flags}.items()], str(path),
                           append_dict={MANIFEST_KEY: json.dumps({"global_step": 2, "steps_per_epoch": 2,
                                                                  "config": {"batch_size": 8}})})
        assert restore_train_network(cfg, cell, 2, lambda p, m: None)[0] == 2
        np.testing.assert_array_equal(dense.weight.asnumpy(), np.full((1, 3), 0.5, np.float32))
        assert not bool(cell.exit_param.asnumpy()) and int(cell.init_param.asnumpy()[0]) == 0
    monkeypatch.delenv("MS_ENABLE_GRACEFUL_EXIT")
    assert run_control_parameter_names(nn.Dense(2, 2)) == set()

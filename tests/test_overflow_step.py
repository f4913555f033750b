"""An overflow step is skipped whole, whatever produced the non-finite value and whichever layers are frozen.

Three ways a step goes bad (issue: an O1 PyNative freezing step with the input side frozen corrupted the
BatchNorm statistics and moved weights):

* ``inf_batch``: an ``inf`` in the input. With the input-side layers frozen their gradients are not computed,
  ReLU squashes the NaN activations, the loss stays finite; only the BatchNorm statistics show it.
* ``huge_batch``: a finite batch of magnitude 1e19, so BatchNorm's batch variance overflows float32 while the
  loss and the gradients that are computed stay finite.
* ``grad_overflow``: a finite forward pass (loss about -1e37) whose loss-scaled gradients overflow.

After each bad step: the step is reported as an overflow, and every weight, optimizer moment, freezing
counter and BatchNorm statistic is bit-for-bit what it was before; only the loss-scale machinery moved.
Checked in both modes, at O0, O1 and O2, with a bad step placed on every train set of the freezing schedule
(the input-side group, the output-side group, and the steps that train all weights).
"""
from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops
from mindspore.train import DynamicLossScaleManager

from ms_boost import Model
from ms_boost.grad_freeze import FreezeOpt
from ms_boost.stages import stage_chain
from tests.helpers.nets import all_params, learnable_data, make_net

KINDS = ("inf_batch", "huge_batch", "grad_overflow")
# the loss-scale machinery: its back-off must stick, and the snapshot copies are rewritten every step
SCALE_MACHINERY = ("scale_sense", "current_iterator_step", "last_overflow_iterator_step")


class _FactorLoss(nn.Cell):
    """Cross-entropy, times -1e37 when the batch's first label is negative (a bad label ``-1 - y`` stands for
    ``y``): a finite forward pass whose gradients overflow under any loss scale >= 64."""

    def __init__(self):
        super().__init__()
        self.ce = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def construct(self, logits, y):
        factor = ops.select(y[0] < 0, Tensor(-1e37, ms.float32), Tensor(1.0, ms.float32))
        label = ops.select(y < 0, -1 - y, y)
        return self.ce(logits, label) * factor


def _bad_batch(kind: str, x: np.ndarray, y: np.ndarray):
    x, y = x.copy(), y.copy()
    if kind == "inf_batch":
        x[0, 0, 0, 0] = np.inf
    elif kind == "huge_batch":
        x *= 1e19
    else:
        y[0] = -1 - y[0]
    return Tensor(x), Tensor(y)


def _freeze_opt(cell):
    found = [s.optimizer for s in stage_chain(cell.update) if isinstance(getattr(s, "optimizer", None), FreezeOpt)]
    return found[0] if found else None


def _train_set(freeze_opt) -> int:
    """The train set the coming step applies (-1 without freezing)."""
    if freeze_opt is None:
        return -1
    return int(freeze_opt.schedule[int(freeze_opt.global_step.asnumpy()[0]) % freeze_opt.period])


def _state(cell) -> dict:
    return {k: v for k, v in all_params(cell).items()
            if k not in SCALE_MACHINERY and not k.startswith("overflow_shadow")}


@pytest.mark.parametrize("level", ["O0", "O1", "O2"])
def test_overflow_step_is_skipped_whole_on_every_freezing_group(mode, level):
    x, y = learnable_data(16)
    net = make_net()
    opt = nn.Momentum(net.trainable_params(), 0.05, 0.9)
    config = {"grad_freeze": {"param_groups": 2, "freeze_p": 0.5, "seed": 0}} if level != "O0" else None
    model = Model(net, _FactorLoss(), opt, boost_level=level, boost_config_dict=config,
                  loss_scale_manager=DynamicLossScaleManager(2.0 ** 20, 2, 1000))  # >= 2**11 after 9 back-offs
    cell = model.train_network
    cell.set_train()
    freeze = _freeze_opt(cell)
    assert (freeze is not None) == (level != "O0")
    sets = list(range(freeze.groups_num)) if freeze is not None else [-1]
    if freeze is not None:
        # both a group-freezing set and the all-weights steps occur in the schedule's first 40 steps
        assert len({int(freeze.schedule[t]) for t in range(40)}) >= 2
    todo = {(kind, s) for kind in KINDS for s in sets if freeze is None or
            any(int(freeze.schedule[t]) == s for t in range(40))}
    good = (Tensor(x), Tensor(y))
    _, overflow, _ = cell(*good)  # a good first step: momentum state and BatchNorm statistics move
    assert not bool(overflow.asnumpy())
    covered = []
    for _ in range(80):
        if not todo:
            break
        current = _train_set(freeze)
        kind = next((k for k in KINDS if (k, current) in todo), None)
        if kind is None:
            _, overflow, _ = cell(*good)
            assert not bool(overflow.asnumpy())
            continue
        before = _state(cell)
        scale_before = float(cell.scale_sense.asnumpy())
        loss, overflow, _ = cell(*_bad_batch(kind, x, y))
        assert bool(overflow.asnumpy()), (kind, current)
        after = _state(cell)
        for name, value in before.items():
            np.testing.assert_array_equal(value, after[name], err_msg=f"{kind} on train set {current}: {name}")
        assert float(cell.scale_sense.asnumpy()) == scale_before / 2
        # the next good step trains again
        _, overflow, _ = cell(*good)
        assert not bool(overflow.asnumpy()), (kind, current)
        todo.discard((kind, current))
        covered.append((kind, current))
    assert not todo, f"bad steps never placed: {sorted(todo)}"
    assert len(covered) == len(KINDS) * (len(sets) if freeze is None else len({s for _, s in covered}))
    for name, value in all_params(cell).items():
        assert np.isfinite(value).all(), name
    # evaluation with the moving statistics is finite too
    net.set_train(False)
    logits = net(Tensor(x)).asnumpy()
    assert np.isfinite(logits).all()


class _GroupScaledBNNet(nn.Cell):
    """conv-BN-ReLU, dense, with a GroupLossScaleManager's markers between the two groups."""

    def __init__(self, amp):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, pad_mode="same", has_bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(4 * 8 * 8, 4)
        self.amp = amp

    def construct(self, x):
        x = self.amp(x, 0, 1)
        x = self.flatten(self.relu(self.bn(self.conv(x))))
        x = self.amp(x, 1, 2)
        return self.amp(self.fc(x), 2, 3)


def test_group_loss_scale_overflow_in_the_forward_pass_skips_the_step(mode):
    """GroupLossScaleManager: BatchNorm statistics that overflow make the step an overflow on their own."""
    from ms_boost import GroupLossScaleManager

    ms.set_seed(0)
    manager = GroupLossScaleManager(8, [])
    net = _GroupScaledBNNet(manager)
    manager.loss_scale_groups = [[net.conv.weight], [net.fc.weight, net.fc.bias]]
    model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                  nn.Momentum(net.trainable_params(), 0.02, 0.9), loss_scale_manager=manager,
                  boost_config_dict={"boost": {"mode": "manual", "loss_scale_group": True}})
    cell = model.train_network
    cell.set_train()
    x, y = learnable_data(16)
    _, overflow, _ = cell(Tensor(x), Tensor(y))
    assert not bool(overflow.asnumpy())
    before = _state(cell)
    _, overflow, _ = cell(Tensor(x * 1e19), Tensor(y))  # batch variance ~1e38 * 9: inf moving variance
    assert bool(overflow.asnumpy())
    for name, value in _state(cell).items():
        if not name.endswith("scales"):  # the manager's own state: groups that did not overflow grow
            np.testing.assert_array_equal(before[name], value, err_msg=name)
    assert np.isfinite(manager.group_loss_scales()).all()


class _InfLoss(nn.Cell):
    """Cross-entropy plus inf: the loss is inf, its gradients are cross-entropy's (finite)."""

    def __init__(self):
        super().__init__()
        self.ce = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def construct(self, logits, y):
        return self.ce(logits, y) + Tensor(np.inf, ms.float32)


@pytest.mark.parametrize("bad", ["inf_loss", "finite_loss"])
def test_a_run_whose_every_step_overflows_is_said_once(mode, bad, monkeypatch):
    """Every step skipped as an overflow trains nothing: ms_boost.Model's skipped-steps watch warns once, after
    ``limit`` steps in a row, with the streak, the loss scale and the cause (a non-finite loss, skipped at any scale;
    or a finite loss whose scaled gradients overflow). A run with fewer overflows in a row says nothing."""
    import warnings

    from mindspore.train import FixedLossScaleManager

    from ms_boost.overflow_watch import SkippedStepsWatch

    monkeypatch.setattr(SkippedStepsWatch, "DEFAULT_LIMIT", 4)
    x, y = learnable_data(96)
    if bad == "inf_loss":
        loss_fn = _InfLoss()  # an inf loss whose gradients are finite
    else:
        y = -1 - y  # _FactorLoss: a finite loss of about -1e37 whose gradients overflow at the scale 128
        loss_fn = _FactorLoss()
    from tests.helpers.nets import dataset

    net = make_net()
    before = _state(net)
    model = Model(net, loss_fn, nn.Momentum(net.trainable_params(), 0.1, 0.9),
                  loss_scale_manager=FixedLossScaleManager(128.0, drop_overflow_update=True))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        model.train(1, dataset(x, y, batch_size=16), dataset_sink_mode=False)  # 6 steps, all overflowing
    said = [str(w.message) for w in seen if "skipped as overflows" in str(w.message)]
    assert len(said) == 1, said
    assert said[0].startswith("ms_boost: 4 steps in a row were skipped as overflows (steps 1..4): the weights have "
                              "not changed since step 0. The loss scale is now 128; ")
    if bad == "inf_loss":
        assert "the loss itself is inf (skipped at any loss scale)" in said[0]
    else:
        assert "the loss is finite (-" in said[0] and "gradients (or BatchNorm statistics) are not" in said[0]
    after = _state(net)
    assert all(np.array_equal(before[k], after[k]) for k in before)  # nothing trained

    monkeypatch.setattr(SkippedStepsWatch, "DEFAULT_LIMIT", 7)  # longer than the run: silent
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        model.train(1, dataset(x, y, batch_size=16), dataset_sink_mode=False)
    assert not [w for w in seen if "skipped as overflows" in str(w.message)]


def test_skipped_steps_watch_refuses_a_bad_limit():
    from ms_boost.overflow_watch import SkippedStepsWatch

    for limit in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match=rf"SkippedStepsWatch: limit={limit!r} must be an int >= 1"):
            SkippedStepsWatch(limit)

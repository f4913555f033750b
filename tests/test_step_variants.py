"""The stage hook that chooses a compiled train-step variant on the host (``StageHooks.plan_graph_step``).

The train cell asks every stage of its update chain for its part of the step's variant, composes one phase name
(:func:`ms_boost.stages.plan_graph_variant`) and tells every stage ``end_step`` after the step. Gradient freezing's
per-set graphs are checked in tests/test_grad_freeze.py, THOR's variants against numpy in tests/test_thor_model.py;
here the composition rules, and a user stage composed with THOR in one train cell.
"""
from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn, ops

from ms_boost import BoostTrainOneStepCell
from ms_boost.stages import StageHooks, UpdateStage, plan_graph_variant
from ms_boost.thor import thor
from tests.helpers.nets import MLP, make_net
from tests.test_thor_model import assert_equals_numpy_thor, ce, record_phases
from tests.test_thor_optimizer import _mlp_data


class _Answer(StageHooks):
    def __init__(self, answer):
        self.answer = answer
        self.asked = []

    def plan_graph_step(self, outermost):
        self.asked.append(outermost)
        return self.answer


def test_plan_graph_variant_joins_the_parts_in_chain_order():
    """Parts join with "_" outermost first, stages answering None add nothing, only the first stage is asked as the
    outermost, the gradients read are the outermost stage's; no part at all: None (the default graph)."""
    mask = (True, False)
    outer, silent, inner = _Answer(("freeze_set1", mask)), _Answer(None), _Answer(("thor_plain", None))
    assert plan_graph_variant([outer, silent, inner]) == ("freeze_set1_thor_plain", mask)
    assert (outer.asked, silent.asked, inner.asked) == ([True], [False], [False])
    assert plan_graph_variant([silent, inner]) == ("thor_plain", None)
    assert plan_graph_variant([silent]) is None
    assert plan_graph_variant([]) is None


def test_only_the_outermost_stage_may_narrow_the_gradients():
    """A stage further in gets what the stages before it pass on: naming the gradients it reads is an error naming
    the stage."""
    with pytest.raises(ValueError, match=r"_Answer.plan_graph_step\(outermost=False\) named the gradients"):
        plan_graph_variant([_Answer(None), _Answer(("freeze_set2", (True, False)))])


class _ParityStage(UpdateStage):
    """A user stage before THOR: gradients unchanged; its variant part is the step's parity, chosen on the host.

    Each compiled variant adds its own constant to ``seen`` (even steps 1, odd steps 10, the default graph 100), so
    the sum shows which graph every step ran.
    """

    def __init__(self, inner):
        super().__init__(inner)
        self.seen = Parameter(Tensor(0.0, ms.float32), name="parity_seen", requires_grad=False)
        self.static = None
        self.steps = 0
        self.ended = 0

    def plan_graph_step(self, outermost):
        assert outermost
        self.static = "odd" if self.steps % 2 else "even"
        return self.static, None

    def end_step(self):
        self.static = None
        self.steps += 1
        self.ended += 1

    def construct(self, loss, grads, *inputs):
        add = 100.0
        if self.static == "even":
            add = 1.0
        elif self.static == "odd":
            add = 10.0
        done = ops.assign_add(self.seen, Tensor(add, ms.float32))
        return ops.depend(self.inner(loss, grads, *inputs), done)


def test_a_user_stage_and_thor_compose_one_variant_per_step():
    """Graph mode, a train cell called directly whose chain is a user stage before THOR: each step compiles/runs the
    variant named by both parts (``train_even_thor_capture_refresh``, ``train_odd_thor_plain``: two compiles for
    three steps, frequency 2), both stages are told the end of every step, the cell is back in its default phase,
    and the weights equal numpy's THOR (the user stage passes the gradients on unchanged)."""
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        weights, x, y = _mlp_data(seed=4, n=24)
        net = MLP(*weights)
        opt = thor(net, 0.05, 0.05, 0.9, frequency=2)
        cell = BoostTrainOneStepCell(nn.WithLossCell(opt.thor_network, ce()), opt).set_train()
        cell.update = stage = _ParityStage(cell.update)
        phases = record_phases(cell)
        for i in range(3):
            cell(Tensor(x[8 * i:8 * i + 8]), Tensor(y[8 * i:8 * i + 8]))
        # compile is asked at every call (MindSpore then finds the phase's graph): one phase per step, two graphs
        assert phases == ["train_even_thor_capture_refresh", "train_odd_thor_plain",
                          "train_even_thor_capture_refresh"], phases
        assert float(stage.seen.asnumpy()) == 12.0 and stage.ended == 3
        assert cell.phase == "train" and opt.static_refresh is None and stage.static is None
        assert_equals_numpy_thor(net, weights, x, y, steps=3)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)


class _Narrowing(UpdateStage):
    """A stage that names the gradients it reads wherever it sits (wrong when it is not the outermost)."""

    def plan_graph_step(self, outermost):
        return "narrow", (True,)

    def construct(self, loss, grads, *inputs):
        return self.inner(loss, grads, *inputs)


def test_a_plan_that_fails_half_way_still_ends_the_step_of_every_stage():
    """Graph mode: the second stage of the chain narrows the gradients, so planning fails after the first stage set
    its variant's constant; the error names the stage, nothing is compiled, and every stage was told the end of the
    step (the first one's constant is reset, the cell is in its default phase)."""
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        net = nn.Dense(3, 2)
        cell = BoostTrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.Momentum(net.trainable_params(), 0.1, 0.9))
        cell.update = stage = _ParityStage(_Narrowing(cell.update))
        phases = record_phases(cell)
        with pytest.raises(ValueError, match="_Narrowing.plan_graph_step"):
            cell(Tensor(np.ones((4, 3), np.float32)), Tensor(np.zeros((4, 2), np.float32)))
        assert phases == [] and stage.ended == 1 and stage.static is None and cell.phase == "train"
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)


def test_a_compiled_step_does_not_walk_the_network_again(monkeypatch):
    """Graph mode: MindSpore sets the compile phase on every sub-cell before each call of a cell, compiled or not.
    ms_boost's train cell walks its tree only when the phase is new or not compiled (the first step, a new input
    shape), and then reaches each cell of the network once (the loss wrapper holds the network without registering
    it a second time); a compiled step walks nothing, also after the network was compiled for a prediction in
    between and when it switches back to a phase compiled before. The steps equal MindSpore's
    ``nn.TrainOneStepCell``'s bit for bit."""
    set_calls = []
    original = nn.Cell.compile_phase

    def counting(self, value):
        set_calls.append(id(self))
        original.fset(self, value)

    monkeypatch.setattr(nn.Cell, "compile_phase", property(original.fget, counting))
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        rng = np.random.default_rng(5)
        x = rng.standard_normal((8, 3, 8, 8)).astype(np.float32)
        y = rng.integers(0, 4, 8).astype(np.int32)
        loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        nets = [make_net(seed=7), make_net(seed=7)]
        opts = [nn.Momentum(net.trainable_params(), 0.1, 0.9) for net in nets]
        cells = [BoostTrainOneStepCell(nn.WithLossCell(nets[0], loss), opts[0]).set_train(),
                 nn.TrainOneStepCell(nn.WithLossCell(nets[1], loss), opts[1]).set_train()]
        tree = {id(c) for _, c in cells[0].cells_and_names()}
        walks, losses = [], [[], []]

        def step(xb, yb):
            for k, cell in enumerate(cells):
                set_calls.clear()
                losses[k].append(cell(Tensor(xb), Tensor(yb)).asnumpy())
                if k == 0:
                    walks.append(list(set_calls))

        step(x, y)
        step(x, y)
        nets[0].set_train(False)
        nets[0](Tensor(x)).asnumpy()  # the network compiled for prediction: its cells get that phase
        nets[0].set_train(True)
        step(x, y)
        step(x[:4], y[:4])  # a new input shape: a new phase, compiled
        step(x[:4], y[:4])
        step(x, y)  # back to the first shape's phase, compiled: as THOR switching between its two step variants
        first, compiled, after_predict, new_shape, compiled_again, back = walks
        assert set(first) == tree and set(new_shape) == tree, "a new phase is set on every cell of the tree"
        network = [id(c) for _, c in cells[0].network.cells_and_names()]  # the loss network and its cells
        assert sorted(i for i in first if i in network) == sorted(network), "each of the network's cells once"
        assert compiled == [] and after_predict == [] and compiled_again == [] and back == []
        np.testing.assert_array_equal(np.array(losses[0]), np.array(losses[1]))
        for mine, theirs in zip(nets[0].trainable_params(), nets[1].trainable_params()):
            np.testing.assert_array_equal(mine.asnumpy(), theirs.asnumpy())
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)

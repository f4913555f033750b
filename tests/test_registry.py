"""A user's algorithm registered from outside the package runs exactly like a built-in one.

The toy algorithm is global-norm gradient clipping as an update stage,
``g <- g * min(1, c / ||g||_2)`` over all gradients together, checked against numpy in both modes.
"""
from __future__ import annotations

from dataclasses import dataclass

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops

import ms_boost
from ms_boost import (
    AlgorithmSpec,
    AutoBoost,
    BoostTrainOneStepCell,
    register_algorithm,
    registered,
    unregister_algorithm,
)
from ms_boost.stages import UpdateStage, scale_gradients, stage_chain
from ms_boost.validation import check_float


@dataclass(frozen=True)
class ClipConfig:
    """``clip_global_norm`` section: ``max_norm`` c > 0."""

    max_norm: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "max_norm", check_float("clip_global_norm.max_norm", self.max_norm, low=0.0,
                                                         low_open=True))


_MAP = ops.HyperMap()
_square_sum = ops.MultitypeFuncGraph("square_sum")


@_square_sum.register("Tensor")
def _square_sum_tensor(grad):
    return ops.reduce_sum(grad * grad)


class ClipStage(UpdateStage):
    """Scale every gradient by ``min(1, c / ||g||)`` (global norm over the tuple), then run ``inner``."""

    def __init__(self, inner, max_norm: float):
        super().__init__(inner)
        self.max_norm = Tensor(max_norm, ms.float32)

    def construct(self, loss, grads, *inputs):  # the HyperMap form of docs/adding_an_algorithm.md
        norm = ops.sqrt(ops.addn(_MAP(_square_sum, grads)))
        factor = ops.minimum(ops.ones_like(norm), self.max_norm / ops.maximum(norm, 1e-12))
        return self.inner(loss, scale_gradients(factor, grads), *inputs)


CLIP_SPEC = AlgorithmSpec(
    name="clip_global_norm", section=ClipConfig, order=45,
    stage=lambda inner, weights, cfg, ctx: ClipStage(inner, cfg.max_norm),
    describe=lambda cfg, ctx: f"clip global norm to {cfg.max_norm}")


@pytest.fixture
def clip_registered():
    register_algorithm(CLIP_SPEC)
    yield CLIP_SPEC
    unregister_algorithm(CLIP_SPEC.name)  # no global state leaks into other tests


def numpy_clipped_sgd(w, b, x, y, lr, max_norm, steps):
    for _ in range(steps):
        out = x @ w.T + b
        d_out = 2.0 * (out - y) / out.size  # d mean((out - y)^2) / d out
        gw, gb = d_out.T @ x, d_out.sum(0)
        norm = np.sqrt((gw ** 2).sum() + (gb ** 2).sum())
        factor = min(1.0, max_norm / norm)
        w, b = w - lr * factor * gw, b - lr * factor * gb
    return w, b


def test_registered_algorithm_switched_on_from_boost_config_dict(clip_registered, mode):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(8, 4)).astype(np.float32)
    y = rng.normal(size=(8, 3)).astype(np.float32) * 5.0
    net = nn.Dense(4, 3)
    w0, b0 = net.weight.asnumpy().copy(), net.bias.asnumpy().copy()
    boost = AutoBoost("O0", {"boost": {"mode": "manual", "clip_global_norm": True},
                             "clip_global_norm": {"max_norm": 0.05}})
    assert boost.enabled("clip_global_norm") and boost.clip_global_norm.max_norm == 0.05
    assert "accumulate" not in boost.summary(ranks=1)
    assert "clip global norm to 0.05 -> optimizer" in boost.summary(ranks=1)
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    step = BoostTrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), opt, boost_config=boost)
    assert isinstance(step.update, ClipStage)
    for _ in range(3):
        step(Tensor(x), Tensor(y))
    w_ref, b_ref = numpy_clipped_sgd(w0.astype(np.float64), b0.astype(np.float64), x, y, 0.1, 0.05, 3)
    np.testing.assert_allclose(net.weight.asnumpy(), w_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(net.bias.asnumpy(), b_ref, rtol=1e-5, atol=1e-6)
    # the clipping really acted: plain SGD lands elsewhere
    w_plain, _ = numpy_clipped_sgd(w0.astype(np.float64), b0.astype(np.float64), x, y, 0.1, np.inf, 3)
    assert np.abs(w_plain - w_ref).max() > 1e-3

    # with a loss scale of 128 and MindSpore's convention of an optimizer built with loss_scale=128 (it divides
    # by 128 itself): the stage sees the true gradients (it clipped 128x-scaled ones before, 128x too small a
    # step), the optimizer gets its share back, and the steps equal numpy's again
    from mindspore.train import FixedLossScaleManager

    from ms_boost import BoostTrainOneStepWithLossScaleCell

    net.weight.set_data(Tensor(w0))
    net.bias.set_data(Tensor(b0))
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1, loss_scale=128.0)
    manager = FixedLossScaleManager(128.0, drop_overflow_update=False)
    step = BoostTrainOneStepWithLossScaleCell(nn.WithLossCell(net, nn.MSELoss()), opt, manager.get_update_cell()
                                              or Tensor(128.0), boost_config=boost)
    for _ in range(3):
        step(Tensor(x), Tensor(y))
    np.testing.assert_allclose(net.weight.asnumpy(), w_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(net.bias.asnumpy(), b_ref, rtol=1e-5, atol=1e-6)


def test_registered_section_is_validated_and_composes_with_built_ins(clip_registered):
    with pytest.raises(ValueError, match=r"clip_global_norm\.max_norm=-1 is out of range"):
        AutoBoost("O0", {"clip_global_norm": {"max_norm": -1}})
    with pytest.raises(ValueError, match=r"unknown boost config key 'clip_global_norm\.norm'"):
        AutoBoost("O0", {"clip_global_norm": {"norm": 1.0}})
    boost = AutoBoost("O0", {"boost": {"mode": "manual", "clip_global_norm": True, "grad_accumulation": True},
                             "grad_accumulation": {"grad_accumulation_step": 2}})
    # order 30 (accumulate) wraps order 45 (clip): the summary reads in the same order
    assert "no gradient reduction (1 rank) -> accumulate x2 -> clip global norm to 1.0 -> optimizer" in \
        boost.summary(ranks=1)
    net = nn.Dense(4, 3)
    step = BoostTrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.1),
                                 boost_config=boost)
    assert [type(s).__name__ for s in stage_chain(step.update)] == ["AccumulateUpdate", "ClipStage",
                                                                    "OptimizerUpdate"]
    assert AutoBoost("O2").enabled("clip_global_norm") is False  # off at every level unless the spec says so


def test_registry_semantics():
    before = AutoBoost("O1")
    with pytest.raises(ValueError, match="unknown boost config section"):
        AutoBoost("O0", {"clip_global_norm": {}})
    with ms_boost.registered(CLIP_SPEC):
        with pytest.raises(ValueError, match="already registered"):
            register_algorithm(CLIP_SPEC)
        after = AutoBoost("O1")
        assert "clip_global_norm" in after.boost_config
        assert "clip_global_norm" not in before.boost_config  # an AutoBoost keeps its snapshot
    assert "clip_global_norm" in after.boost_config and "clip_global_norm" not in AutoBoost("O1").boost_config
    with pytest.raises(ValueError, match="built-in"):
        unregister_algorithm("adasum")
    with pytest.raises(KeyError, match="no boost algorithm 'nothing'"):
        unregister_algorithm("nothing")
    with pytest.raises(ValueError, match="reserved"):
        register_algorithm(AlgorithmSpec(name="summary", section=ClipConfig, order=1))
    with pytest.raises(TypeError, match="frozen dataclass"):
        AlgorithmSpec(name="bad", section=dataclass(type("NotFrozen", (), {})), order=1)
    with pytest.raises(TypeError, match="dataclass type"):
        AlgorithmSpec(name="bad", section=dict, order=1)
    with pytest.raises(ValueError, match="lower-case identifier"):
        AlgorithmSpec(name="Bad Name", section=ClipConfig, order=1)
    # a built-in's name is not "already registered ... unregister it first" (built-ins cannot be unregistered)
    with pytest.raises(ValueError, match=r"'grad_accumulation' is a built-in algorithm; give yours another name"):
        register_algorithm(AlgorithmSpec(name="grad_accumulation", section=ClipConfig, order=99))
    # two algorithms at one place of the pipeline would run in registration order: refused
    with pytest.raises(ValueError, match=r"'clip_twin' has order=40, the place of 'adasum' in the pipeline"):
        register_algorithm(AlgorithmSpec(name="clip_twin", section=ClipConfig, order=40))


def test_a_hook_with_the_wrong_signature_or_result_is_named():
    """A plugin author's mistakes in hooks: a stage hook without the ``weights`` argument, a describe taking one
    argument, a stage returning a plain function (trained in PyNative, failed to parse in Graph mode) -- each a
    TypeError naming the algorithm, the hook and what it is called with."""
    import dataclasses

    net = nn.Dense(4, 3)
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    cases = [
        (dict(stage=lambda inner, cfg, ctx: ClipStage(inner, cfg.max_norm)),
         r"algorithm 'clip_bad': its stage hook <lambda>\(inner, cfg, ctx\) cannot be called as "
         r"stage\(inner, weights, cfg, ctx\)"),
        (dict(describe=lambda cfg: "clip"),
         r"its describe hook <lambda>\(cfg\) cannot be called as describe\(cfg, ctx\)"),
        (dict(stage=lambda inner, weights, cfg, ctx: (lambda loss, grads: inner(loss, grads))),
         r"its stage hook returned function; it must return an nn.Cell"),
    ]
    for hooks, message in cases:
        spec = dataclasses.replace(CLIP_SPEC, name="clip_bad", **hooks)
        with registered(spec):
            boost = AutoBoost("O0", {"boost": {"mode": "manual", "clip_bad": True}})
            with pytest.raises(TypeError, match=message):
                boost.summary(ranks=1)
                BoostTrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), opt, boost_config=boost)

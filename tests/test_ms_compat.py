"""ms_boost.mindspore_api: public-API amp steps agree with MindSpore's private helpers (where present)."""
from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

from ms_boost import mindspore_api as compat


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MindSpore's amp rewrite writes rewritten_network/ into the working folder


def _net() -> nn.Cell:
    ms.set_seed(3)
    return nn.SequentialCell([nn.Dense(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dense(8, 3)])


def _data():
    rng = np.random.default_rng(0)
    return (Tensor(rng.standard_normal((4, 6)).astype(np.float32)),
            Tensor(rng.integers(0, 3, 4).astype(np.int32)))


def _loss(level: str, use_private) -> float:
    net = _net()
    net.set_train(False)
    config = compat.amp_level_config(level)
    net = compat.apply_amp_level(net, config, level, use_private=use_private)
    loss_net = compat.with_loss(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                                config["cast_model_type"], use_private=use_private)
    out = loss_net(*_data())
    assert out.dtype == ms.float32
    return float(out.asnumpy())


def _numpy_loss() -> float:
    net = _net()
    x, y = (t.asnumpy() for t in _data())
    d1, bn, _, d2 = net.cells()
    h = x @ d1.weight.asnumpy().T + d1.bias.asnumpy()
    h = (h - bn.moving_mean.asnumpy()) / np.sqrt(bn.moving_variance.asnumpy() + bn.eps)
    h = np.maximum(h * bn.gamma.asnumpy() + bn.beta.asnumpy(), 0)
    z = h @ d2.weight.asnumpy().T + d2.bias.asnumpy()
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return float(-logp[np.arange(len(y)), y].mean())


@pytest.mark.parametrize("level", ["O0", "O1", "O2", "O3"])
def test_public_path_matches_numpy_and_private_helpers(level):
    reference = _numpy_loss()
    public = _loss(level, use_private=False)
    tol = 1e-5 if level == "O0" else 5e-3  # float16 matmuls from O1 on
    assert abs(public - reference) < tol * max(1.0, abs(reference))
    if compat.has_private_amp():
        assert abs(_loss(level, use_private=True) - public) < tol * max(1.0, abs(reference))


def test_level_defaults_match_the_documented_table():
    for level in compat.AMP_LEVELS:
        config = compat.amp_level_config(level)
        assert config["keep_batchnorm_fp32"] == (level == "O2")
        assert config["cast_model_type"] == (ms.float16 if level in ("O2", "O3") else ms.float32)
        assert (config["loss_scale_manager"] is not None) == (level == "O2")
    a, b = compat.amp_level_config("O2")["loss_scale_manager"], compat.amp_level_config("O2")["loss_scale_manager"]
    assert isinstance(a, ms.amp.DynamicLossScaleManager) and a is not b  # never shared between networks
    if compat.has_private_amp():
        from mindspore.train import amp as private
        for level in compat.AMP_LEVELS:
            theirs, ours = private._config_level[level], compat.amp_level_config(level)
            assert theirs["keep_batchnorm_fp32"] == ours["keep_batchnorm_fp32"]
            assert theirs["cast_model_type"] == ours["cast_model_type"]
            assert type(theirs["loss_scale_manager"]) is type(ours["loss_scale_manager"])


def test_bad_level_and_missing_private_helpers(monkeypatch):
    with pytest.raises(ValueError, match=r"amp_level='O4' is not allowed; allowed: \['O0'"):
        compat.amp_level_config("O4")
    with pytest.raises(TypeError, match="loss_fn must be a mindspore.nn.Cell, got function"):
        compat.with_loss(_net(), lambda x, y: x, ms.float32)
    monkeypatch.setattr(compat, "_private_amp", lambda: None)
    assert not compat.has_private_amp()
    with pytest.raises(RuntimeError, match="lacks the private mindspore.train.amp helpers"):
        compat.apply_amp_level(_net(), compat.amp_level_config("O1"), "O1", use_private=True)
    assert _loss("O2", use_private=None) == pytest.approx(_numpy_loss(), rel=5e-3)  # automatic -> public


def test_cells_compile_cache_is_the_registry_cells_register_in():
    registry = compat.cells_compile_cache()
    assert isinstance(registry, dict)
    net = _net()
    assert registry.get(id(net)) is net.compile_cache  # Cell.__init__ registered the new cell there

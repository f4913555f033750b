"""The ``cpu_gemm_conv`` algorithm: nn.Conv2d swapped in place for im2col + GEMM on CPU.

Outputs and gradients (input and weight) equal nn.Conv2d's to 1e-5 in both modes for the padding modes and strides
the model zoo and the tutorials use (ResNet: 7x7/2 and 3x3/1, 3x3/2 and 1x1/2, as "same" or explicit "pad"), plus
"valid", dilation and a bias; the swapped network keeps its Parameters and names, its checkpoint loads into the
plain network; the rewrite is on at O1 on CPU, off when switched off, and changes nothing on other devices.
"""
from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops

import ms_boost
from ms_boost.config import AutoBoost
from ms_boost.cpu_gemm_conv import GemmConv2dSwap, restore_convolutions, swap_convolutions, swap_report
from ms_boost.cpu_gemm_conv import spec as gemm_spec

# (in, out, kernel, stride, pad_mode, padding, dilation, bias, input side)
CASES = [
    (3, 8, 7, 2, "same", 0, 1, False, 16),   # tutorial ResNet stem: asymmetric (2, 3) padding
    (3, 8, 7, 2, "pad", 3, 1, False, 16),    # zoo ResNet stem
    (4, 6, 3, 1, "same", 0, 1, False, 9),
    (4, 6, 3, 2, "same", 0, 1, False, 10),   # asymmetric (0, 1)
    (4, 6, 3, 2, "same", 0, 1, True, 9),     # odd side: symmetric (1, 1)
    (4, 6, 3, 2, "pad", 1, 1, False, 10),
    (4, 6, 1, 2, "same", 0, 1, False, 10),   # downsample 1x1/2
    (4, 6, 1, 1, "valid", 0, 1, True, 8),
    (4, 6, 3, 1, "valid", 0, 2, False, 11),  # dilation 2
    (4, 6, 3, 1, "pad", (1, 2, 0, 1), 1, False, 9),  # asymmetric explicit padding
]


class AllLayerOutputs(nn.Cell):
    """Several layers in one cell: each layer's output for its own input (one Graph-mode compile for them all)."""

    def __init__(self, convs):
        super().__init__()
        self.convs = nn.CellList(convs)

    def construct(self, *inputs):
        return tuple(self.convs[i](inputs[i]) for i in range(len(self.convs)))


class AllLayerGrads(nn.Cell):
    """Several layers in one cell: the gradients (inputs, then Parameters) of ``sum_i (layer_i(x_i) * dy_i).sum()``.
    The layers share no input or Parameter, so each layer's gradients are exactly those of its own
    ``(layer(x) * dy).sum()``; one cell means one Graph-mode compile for all the layers' gradients (per case it was
    two: the plain and the swapped layer's gradient cells, besides their two forward passes).

    The outputs are a separate cell (:class:`AllLayerOutputs`): one graph returning both the forward outputs and
    this gradient of the same layers compiled alone, but not after a THOR train step with a loss scale had been
    compiled in Graph mode in the same process (as tests/test_thor_model.py's deep-network test does before this
    file on a pytest-xdist worker): MindSpore 2.10 then failed with ``Illegal AnfNode for evaluating, node:
    ...param_convs.0.weight`` (docs/testing.md, seventh session). Gradients alone and outputs alone compile either
    way."""

    def __init__(self, convs):
        super().__init__()
        self.convs = nn.CellList(convs)
        self.grad = ops.GradOperation(get_all=True, get_by_list=True)
        self.weights = ms.ParameterTuple([p for conv in convs for p in conv.trainable_params()])

    def loss(self, *inputs):
        """``inputs``: one input per layer, then one output gradient per layer."""
        total = 0.0
        for i in range(len(self.convs)):
            total = total + (self.convs[i](inputs[i]) * inputs[len(self.convs) + i]).sum()
        return total

    def construct(self, *inputs):
        return self.grad(self.loss, self.weights)(*inputs)


def _side_out(side, k, s, pad_mode, padding, dilation):
    pads = _pads(pad_mode, padding, side, k, s, dilation)
    return (side + pads[0] + pads[1] - dilation * (k - 1) - 1) // s + 1, \
        (side + pads[2] + pads[3] - dilation * (k - 1) - 1) // s + 1


def outputs_and_grads(layers, xs, dys) -> list:
    """Per layer: ``(output, input gradient, [Parameter gradients])`` of ``(layer(x) * dy).sum()``, all the
    layers in one :class:`AllLayerOutputs` and one :class:`AllLayerGrads` call (numpy arrays in and out). Also
    used by tests/test_zoo_conv.py."""
    outs = AllLayerOutputs(layers)(*(Tensor(a) for a in xs))
    dxs, dparams = AllLayerGrads(layers)(*(Tensor(a) for a in [*xs, *dys]))
    offsets = np.cumsum([0] + [len(layer.trainable_params()) for layer in layers])
    return [(outs[i].asnumpy(), dxs[i].asnumpy(), [g.asnumpy() for g in dparams[offsets[i]:offsets[i + 1]]])
            for i in range(len(layers))]


_RESULTS: dict = {}


def _case_results(mode: str) -> list:
    """Every case's plain and swapped layer in the current mode, run once per mode for the whole module: the 10
    plain and the 10 swapped layers in one outputs cell and one gradient cell (:func:`outputs_and_grads`). Per case:
    the swap's report, whether the weight Parameter stayed the same object, the layers, the input, and each layer's
    output, input gradient and Parameter gradients."""
    if mode in _RESULTS:
        return _RESULTS[mode]
    rng = np.random.default_rng(7)
    cases, plains, swaps, xs, dys = [], [], [], [], []
    for cin, cout, k, s, pad_mode, padding, dilation, bias, side in CASES:
        x = rng.normal(size=(2, cin, side, side)).astype(np.float32)
        plain = nn.Conv2d(cin, cout, k, stride=s, pad_mode=pad_mode, padding=padding, dilation=dilation,
                          has_bias=bias, weight_init="normal", bias_init="normal")
        swapped = nn.Conv2d(cin, cout, k, stride=s, pad_mode=pad_mode, padding=padding, dilation=dilation,
                            has_bias=bias)
        swapped.weight.set_data(plain.weight.data.copy())
        if bias:
            swapped.bias.set_data(plain.bias.data.copy())
        weight_before = swapped.weight
        report = swap_convolutions(swapped)
        cases.append({"report": report, "swapped_type": type(swapped), "same_weight": swapped.weight is weight_before,
                      "plain": plain, "x": x})
        dys.append(rng.normal(size=(2, cout, *_side_out(side, k, s, pad_mode, padding, dilation))).astype(np.float32))
        plains.append(plain)
        swaps.append(swapped)
        xs.append(x)
    n = len(CASES)
    runs = outputs_and_grads(plains + swaps, xs + xs, dys + dys)
    for i, case in enumerate(cases):
        case["plain_run"], case["swapped_run"] = runs[i], runs[n + i]
    _RESULTS[mode] = cases
    return cases


def _pads(pad_mode, padding, side, k, s, dilation):
    """(top, bottom, left, right) as MindSpore's Conv2D pads: "same" puts the odd row/column after."""
    if pad_mode == "valid":
        return (0, 0, 0, 0)
    if pad_mode == "pad":
        return (padding,) * 4 if isinstance(padding, int) else tuple(padding)
    total = max((-(-side // s) - 1) * s + (k - 1) * dilation + 1 - side, 0)
    return (total // 2, total - total // 2) * 2


def _numpy_conv(x, w, stride, pads, dilation):
    """Reference cross-correlation (NCHW) with explicit (top, bottom, left, right) zero padding."""
    x = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[1]), (pads[2], pads[3])))
    n, _, h, wd = x.shape
    o, _, kh, kw = w.shape
    oh = (h - dilation * (kh - 1) - 1) // stride + 1
    ow = (wd - dilation * (kw - 1) - 1) // stride + 1
    out = np.zeros((n, o, oh, ow))
    for i in range(kh):
        for j in range(kw):
            patch = x[:, :, i * dilation:i * dilation + stride * (oh - 1) + 1:stride,
                      j * dilation:j * dilation + stride * (ow - 1) + 1:stride]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j])
    return out


@pytest.mark.parametrize("case", CASES, ids=[f"k{c[2]}s{c[3]}{c[4]}{c[5]}d{c[6]}{'b' if c[7] else ''}"
                                             for c in CASES])
def test_swapped_layer_equals_nn_conv2d_outputs_and_gradients(mode, case):
    cin, cout, k, s, pad_mode, padding, dilation, bias, side = case
    res = _case_results(mode)[CASES.index(case)]
    assert res["report"] == {"swapped": [""], "left": []}
    assert res["swapped_type"] is GemmConv2dSwap and res["same_weight"]
    plain, x = res["plain"], res["x"]
    out_ref, dx_ref, dp_ref = res["plain_run"]
    out, dx, dp = res["swapped_run"]
    assert out.shape == out_ref.shape == (2, cout, *_side_out(side, k, s, pad_mode, padding, dilation))
    assert dx.shape == x.shape and len(dp) == len(dp_ref) == 1 + bias
    np.testing.assert_allclose(out, out_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dx, dx_ref, rtol=1e-5, atol=1e-5)
    for g, g_ref in zip(dp, dp_ref):
        np.testing.assert_allclose(g, g_ref, rtol=1e-5, atol=1e-4)
    # and both against an independent numpy cross-correlation (the padding Conv2D applies)
    pads = _pads(pad_mode, padding, side, k, s, dilation)
    ref = _numpy_conv(x.astype(np.float64), plain.weight.asnumpy().astype(np.float64), s, pads, dilation)
    if bias:
        ref += plain.bias.asnumpy().reshape(1, -1, 1, 1)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


class _Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, stride=2, pad_mode="same", has_bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.grouped = nn.Conv2d(8, 8, 3, pad_mode="same", group=2)
        self.relu = nn.ReLU()
        self.head = nn.Dense(8, 4)

    def construct(self, x):
        x = self.grouped(self.relu(self.bn(self.stem(x))))
        return self.head(x.mean(axis=(2, 3)))


def _batches(n=3, seed=0):
    rng = np.random.default_rng(seed)
    return [(Tensor(rng.normal(size=(4, 3, 8, 8)).astype(np.float32)),
             Tensor(rng.integers(0, 4, 4).astype(np.int32))) for _ in range(n)]


def test_o1_on_cpu_swaps_by_default_reports_the_layers_left_and_its_checkpoint_loads_into_the_plain_net(
        mode, tmp_path):
    ms.set_seed(3)
    net = _Net()
    names = [p.name for p in net.get_parameters()]
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    model = ms_boost.Model(net, loss_fn=loss, optimizer=nn.Momentum(net.trainable_params(), 0.05, 0.9),
                           boost_level="O1", boost_config_dict={"less_bn": {"gc_flag": False, "fn_flag": False}})
    data = ms.dataset.GeneratorDataset([(x.asnumpy(), y.asnumpy()) for x, y in _batches()], ["x", "y"])
    model.train(1, data, dataset_sink_mode=False)
    assert type(net.stem) is GemmConv2dSwap and type(net.grouped) is nn.Conv2d
    assert swap_report(net) == {"swapped": ["stem"], "left": [("grouped", "group=2")]}
    ckpt = str(tmp_path / "swapped.ckpt")
    ms.save_checkpoint(net, ckpt)
    plain = _Net()
    assert [p.name for p in plain.get_parameters()] == names
    assert ms.load_param_into_net(plain, ms.load_checkpoint(ckpt), strict_load=True) == ([], [])
    x = _batches(1, seed=5)[0][0]
    net.set_train(False)
    plain.set_train(False)
    np.testing.assert_allclose(plain(x).asnumpy(), net(x).asnumpy(), rtol=1e-5, atol=1e-5)
    assert restore_convolutions(net) == ["stem"] and type(net.stem) is nn.Conv2d


def test_switched_off_skipped_or_not_on_cpu_leaves_nn_conv2d(monkeypatch):
    net = _Net()
    boost = AutoBoost("O1", {"boost": {"mode": "manual", "less_bn": True, "cpu_gemm_conv": False}})
    assert "cpu_gemm_conv" not in [s.name for s in boost.enabled_specs()]
    assert "cpu_gemm_conv" in [s.name for s in AutoBoost("O1", {}).enabled_specs()]
    assert "cpu_gemm_conv" in [s.name for s in AutoBoost("O2", {}).enabled_specs()]
    assert "cpu_gemm_conv" not in [s.name for s in AutoBoost("O0", {}).enabled_specs()]
    cfg = gemm_spec.CpuGemmConvConfig(skip=["stem"])
    gemm_spec._rewrite_train(net, None, cfg, None)
    assert type(net.stem) is nn.Conv2d
    assert swap_report(net)["left"] == [("stem", "named in cpu_gemm_conv.skip"), ("grouped", "group=2")]
    monkeypatch.setattr(gemm_spec, "_on_cpu", lambda: False)
    other = _Net()
    gemm_spec._rewrite_train(other, None, gemm_spec.CpuGemmConvConfig(), None)
    assert type(other.stem) is nn.Conv2d and swap_report(other) == {"swapped": [], "left": []}
    assert "off: device" in gemm_spec._describe(gemm_spec.CpuGemmConvConfig(), None)
    with pytest.raises(ms_boost.validation.BoostConfigError, match=r"cpu_gemm_conv.skip' must be a list of layer"):
        AutoBoost("O1", {"cpu_gemm_conv": {"skip": "stem"}})


def test_the_log_groups_the_layers_left_alone_by_reason(caplog):
    """A zoo network (its own GemmConv2d subclass) logged all its layers one by one with the same reason on every
    O1 run and evaluation on CPU, 2,000 characters for ResNet-18; now each reason once, with 3 names and a count."""
    import logging

    class Sub(nn.Conv2d):
        pass

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.subs = nn.CellList([Sub(3, 3, 3) for _ in range(5)])
            self.grouped = nn.Conv2d(4, 4, 3, group=2)
            self.plain = nn.Conv2d(3, 3, 3)

        def construct(self, x):
            return x

    with caplog.at_level(logging.INFO, logger="ms_boost"):
        report = swap_convolutions(Net())
    assert [r for _, r in report["left"]] == ["a subclass of nn.Conv2d (Sub)"] * 5 + ["group=2"]  # unchanged
    assert ("cpu_gemm_conv: 1 nn.Conv2d layer(s) computed as im2col + GEMM; left as nn.Conv2d: 5 x a subclass of "
            "nn.Conv2d (Sub): subs.0, subs.1, subs.2 and 2 more; 1 x group=2: grouped (swap_report lists them all)"
            ) in caplog.text

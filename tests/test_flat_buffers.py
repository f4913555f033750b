"""ms_boost.flat_buffers against numpy: flatten (with padding), split back, assign with dtype casts; run op by op
(PyNative) and inside a compiled function (how DimReduce and AdaSum call them)."""
from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor

from ms_boost.flat_buffers import assign_all, flat_layout, flatten_tensors, pad_and_flatten, split_flat

SHAPES = [(2, 3), (4,), (1, 2, 2), (5,)]


def arrays(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in SHAPES]


@pytest.mark.parametrize("compiled", [False, True], ids=["op_by_op", "jit"])
def test_flatten_pad_split_round_trip_matches_numpy(compiled):
    values = arrays()
    tensors = [Tensor(v) for v in values]
    tensors[1] = Tensor(values[1].astype(np.float16))  # cast to float32 on the way in
    pads, tail = (2, 0, 1, 3), 4
    starts = np.cumsum([0] + [v.size + p for v, p in zip(values, pads)])[:-1]
    layout = flat_layout(SHAPES, starts)
    flat_fn = ms.jit(flatten_tensors) if compiled else flatten_tensors

    def padded(*ts):
        return pad_and_flatten(ts, pads, tail)

    def split(flat):
        return split_flat(flat, layout)

    padded_fn = ms.jit(padded) if compiled else padded
    split_fn = ms.jit(split) if compiled else split

    expected_flat = np.concatenate([v.astype(np.float16).astype(np.float32).ravel() if i == 1 else v.ravel()
                                    for i, v in enumerate(values)])
    np.testing.assert_array_equal(flat_fn(tensors).asnumpy(), expected_flat)
    parts = []
    for i, (v, p) in enumerate(zip(values, pads)):
        parts += [expected_flat[sum(x.size for x in values[:i]):][:v.size], np.zeros(p, np.float32)]
    expected_padded = np.concatenate(parts + [np.zeros(tail, np.float32)])
    got = padded_fn(*tensors).asnumpy()
    np.testing.assert_array_equal(got, expected_padded)
    assert layout[1] == tuple(v.size for v in values) and layout[0] == tuple(int(s) for s in starts)
    for piece, v, shape in zip(split_fn(Tensor(got)), values, SHAPES):
        assert piece.shape == shape
        np.testing.assert_allclose(piece.asnumpy(), v, rtol=1e-3 if v is values[1] else 0)


@pytest.mark.parametrize("compiled", [False, True], ids=["op_by_op", "jit"])
def test_assign_all_casts_to_each_parameter_dtype(compiled):
    params = [Parameter(Tensor(np.zeros(s, np.float32)), name=f"w{i}") for i, s in enumerate(SHAPES)]
    params[2] = Parameter(Tensor(np.zeros(SHAPES[2], np.float16)), name="w2")
    values = arrays(1)

    def write(flat, *ps):
        return assign_all(ps, split_flat(flat, flat_layout(SHAPES)))

    fn = ms.jit(write) if compiled else write
    fn(Tensor(np.concatenate([v.ravel() for v in values])), *params)
    for p, v in zip(params, values):
        assert p.dtype == (ms.float16 if p.name == "w2" else ms.float32)
        np.testing.assert_allclose(p.asnumpy().astype(np.float32), v, rtol=1e-3 if p.name == "w2" else 0)


def test_flat_layout_rejects_mismatched_starts():
    with pytest.raises(ValueError, match="3 starts for 4 shapes"):
        flat_layout(SHAPES, [0, 6, 10])

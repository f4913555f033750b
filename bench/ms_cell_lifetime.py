"""Does MindSpore let a train cell go once it has run a Graph-mode step? (No ms_boost involved.)

Builds a small ``nn.TrainOneStepCell`` four times -- never run; run one step; run one step and free its graphs as
``Cell.__del__`` does (``del_net_res`` over its ``compile_cache``); run one step and ``mindspore.ms_memory_recycle()``
-- drops it (``del``, ``gc.collect()``) and prints whether a weak reference still reaches it, and its reference count
before the ``del``. ``python bench/ms_cell_lifetime.py`` (a few seconds; docs/autotune.md, "A dropped candidate's step
outlives the trial").
"""
from __future__ import annotations

import gc
import sys
import weakref

import numpy as np


def main() -> int:
    import mindspore as ms
    from mindspore import Tensor, nn
    from mindspore.graph.api import _cell_graph_executor

    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)

    def make() -> nn.Cell:
        net = nn.SequentialCell([nn.Dense(8, 16), nn.ReLU(), nn.Dense(16, 4)])
        loss = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
        cell = nn.TrainOneStepCell(loss, nn.Momentum(net.trainable_params(), 0.1, 0.9))
        cell.set_train(True)
        return cell

    x, y = Tensor(np.ones((4, 8), np.float32)), Tensor(np.zeros(4, np.int32))
    for how in ("never run", "one step", "one step, then del_net_res", "one step, then ms_memory_recycle"):
        cell = make()
        if how != "never run":
            cell(x, y).asnumpy()
        if how.endswith("del_net_res"):
            _cell_graph_executor.del_net_res(cell, cell.compile_cache)
            cell.compile_cache.clear()
        count = sys.getrefcount(cell) - 1  # without getrefcount's own argument
        ref = weakref.ref(cell)
        del cell
        if how.endswith("ms_memory_recycle"):
            ms.ms_memory_recycle()
        gc.collect()
        print(f"{how}: references before del {count}; alive after del + gc.collect(): {ref() is not None}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

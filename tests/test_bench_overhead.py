"""bench/bench_overhead.py builds what it names: upstream's AutoBoost singleton does not leak between contenders."""
from __future__ import annotations

from mindspore.boost import AutoBoost
from mindspore.boost.grad_freeze import FreezeOpt as UpstreamFreezeOpt

from bench import bench_overhead
from bench.common import random_batches


def test_upstream_o1_contender_runs_o1_after_an_o0_contender():
    """Without the reset, the first (O0) model fixes upstream's singleton and "upstream O1" trains at O0."""
    x, y = random_batches(1, 2, size=8)
    names = ["mindspore O0", "upstream O1 (gc off)", "mindspore O0"]
    built = []
    try:
        for name in names:
            cls, level, cfg = bench_overhead.CONTENDERS[name]
            model, _ = bench_overhead.build(cls, level, cfg, x, y, 2)
            built.append((model._train_network, AutoBoost._instance.level, AutoBoost._instance._gc_flag))
    finally:
        AutoBoost._instance = None
    (o0_net, o0_level, _), (o1_net, o1_level, o1_gc), (again_net, again_level, _) = built
    assert o0_level == "O0" and again_level == "O0" and not hasattr(o0_net, "freeze")
    assert o1_level == "O1" and o1_gc is False
    assert o1_net.freeze is True and isinstance(o1_net.optimizer, UpstreamFreezeOpt)
    assert type(again_net).__name__ == "TrainOneStepCell"

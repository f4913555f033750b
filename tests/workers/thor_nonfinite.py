"""msrun worker: data-parallel THOR where rank 1's inputs hold NaN at step 1 only; saves weights and THOR state.

Usage: thor_nonfinite.py MODE:LOSS_SCALE [MODE:LOSS_SCALE ...]   (e.g. ``graph:0 pynative:1``)
Each scenario (execution mode, fixed loss scale 0|1) trains a fresh model in the same worker (one msrun start
for all of them); its results are saved under the prefix ``"<mode><loss_scale>_"``.
Rows are laid out as in ``thor_data_parallel.py`` (step s of rank r: rows [s*B*n + r*B, s*B*n + (r+1)*B)),
so one process on :func:`poisoned_data` in batches of B*n is the reference.
"""
import sys

import numpy as np

STEPS, BATCH = 3, 4


def poisoned_data(size: int):
    """The fixed data set with NaN in the rows rank 1 trains on at step 1."""
    from tests.helpers.nets import learnable_data

    x, y = learnable_data(STEPS * BATCH * size, seed=1)
    start = 1 * BATCH * size + 1 * BATCH
    x[start:start + BATCH] = np.nan
    return x, y


if __name__ == "__main__":
    import mindspore as ms
    import mindspore.dataset as ds

    from tests.helpers.msrun import save_result
    from tests.test_thor_distributed import build_thor_model
    from tests.workers.common import data_parallel_shard

    scenarios = [(m, bool(int(ls))) for m, ls in (arg.split(":") for arg in sys.argv[1:])]
    rank, size, _, _ = data_parallel_shard(scenarios[0][0], STEPS, BATCH)
    x, y = poisoned_data(size)
    rows = [s * BATCH * size + rank * BATCH + i for s in range(STEPS) for i in range(BATCH)]
    results = {}
    for mode, loss_scale in scenarios:
        ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
        net, opt, model = build_thor_model(None, loss_scale=loss_scale)
        data = ds.NumpySlicesDataset({"x": x[rows], "y": y[rows]}, shuffle=False).batch(BATCH)
        model.train(1, data, dataset_sink_mode=False)
        prefix = f"{mode}{int(loss_scale)}_"
        results.update({prefix + "step": opt.global_step.asnumpy(),
                        prefix + "skipped": np.array(opt.health()["skipped_steps"]),
                        **{f"{prefix}w{i}": p.asnumpy() for i, p in enumerate(net.trainable_params())},
                        **{f"{prefix}a_inv{i}": p.asnumpy() for i, p in enumerate(opt.a_inverses)}})
    save_result(**results)

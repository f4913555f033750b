"""msrun worker: data-parallel THOR where rank 1's inputs hold NaN at step 1 only; saves weights and THOR state.

Usage: thor_nonfinite.py MODE LOSS_SCALE(0|1)
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
    import mindspore.dataset as ds

    from tests.helpers.msrun import save_result
    from tests.test_thor_distributed import build_thor_model
    from tests.workers.common import data_parallel_shard

    mode, loss_scale = sys.argv[1], bool(int(sys.argv[2]))
    rank, size, _, _ = data_parallel_shard(mode, STEPS, BATCH)
    x, y = poisoned_data(size)
    rows = [s * BATCH * size + rank * BATCH + i for s in range(STEPS) for i in range(BATCH)]
    net, opt, model = build_thor_model(None, loss_scale=loss_scale)
    data = ds.NumpySlicesDataset({"x": x[rows], "y": y[rows]}, shuffle=False).batch(BATCH)
    model.train(1, data, dataset_sink_mode=False)
    save_result(step=opt.global_step.asnumpy(), skipped=np.array(opt.health()["skipped_steps"]),
                **{f"w{i}": p.asnumpy() for i, p in enumerate(net.trainable_params())},
                **{f"a_inv{i}": p.asnumpy() for i, p in enumerate(opt.a_inverses)})

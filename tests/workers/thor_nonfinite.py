"""Data-parallel THOR where rank 1's inputs hold NaN at step 1 only (a scenario of tests/workers/e2e_graph.py).

Each case (execution mode, fixed loss scale 0|1) trains a fresh model in the same worker; its results are keyed
``"<mode><loss_scale>_<name>"``. Rows are laid out as in :func:`tests.workers.common.rank_rows` (step s of rank r:
rows [s*B*n + r*B, s*B*n + (r+1)*B)), so one process on :func:`poisoned_data` in batches of B*n is the reference.
"""
import numpy as np

STEPS, BATCH = 3, 4
#: (execution mode, fixed loss scale on/off): Graph without a loss scale, PyNative with one
CASES = (("graph", 0), ("pynative", 1))


def poisoned_data(size: int):
    """The fixed data set with NaN in the rows rank 1 trains on at step 1."""
    from tests.helpers.nets import learnable_data

    x, y = learnable_data(STEPS * BATCH * size, seed=1)
    start = 1 * BATCH * size + 1 * BATCH
    x[start:start + BATCH] = np.nan
    return x, y


def nonfinite_scenario(rank: int, size: int) -> dict:
    """Train every case of :data:`CASES` on this rank's rows; the execution mode is Graph again afterwards."""
    import mindspore as ms
    import mindspore.dataset as ds

    from tests.test_thor_distributed import build_thor_model

    x, y = poisoned_data(size)
    rows = [s * BATCH * size + rank * BATCH + i for s in range(STEPS) for i in range(BATCH)]
    results = {}
    try:
        for mode, loss_scale in CASES:
            ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
            net, opt, model = build_thor_model(None, loss_scale=bool(loss_scale))
            data = ds.NumpySlicesDataset({"x": x[rows], "y": y[rows]}, shuffle=False).batch(BATCH)
            model.train(1, data, dataset_sink_mode=False)
            prefix = f"{mode}{loss_scale}_"
            results.update({prefix + "step": opt.global_step.asnumpy(),
                            prefix + "skipped": np.array(opt.health()["skipped_steps"]),
                            **{f"{prefix}w{i}": p.asnumpy() for i, p in enumerate(net.trainable_params())},
                            **{f"{prefix}a_inv{i}": p.asnumpy() for i, p in enumerate(opt.a_inverses)}})
    finally:
        ms.set_context(mode=ms.GRAPH_MODE)
    return results

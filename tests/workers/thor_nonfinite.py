"""Data-parallel THOR where rank 1's inputs hold NaN at step 1 only (scenarios of tests/workers/e2e_graph.py).

Each case (execution mode, fixed loss scale 0|1) saves its results keyed ``"<mode><loss_scale>_<name>"``. Rows are
laid out as in :func:`tests.workers.common.rank_rows` (step s of rank r: rows [s*B*n + r*B, s*B*n + (r+1)*B)), so
one process on :func:`poisoned_data` in batches of B*n is the reference.

* ``graph0`` (Graph, no loss scale) goes on with the model of the ``thor`` scenario after its clean steps
  (:func:`train_poisoned`): one THOR compilation serves both scenarios, and the skip happens mid-training with
  trained curvature factors. Its reference trains those clean steps first.
* ``pynative1`` (PyNative with the compiled THOR step, fixed loss scale) trains a fresh model
  (:func:`nonfinite_scenario`).
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


def train_poisoned(net, opt, model, rank: int, size: int, prefix: str) -> dict:
    """Train ``model`` on this rank's rows of :func:`poisoned_data`; return its state keyed ``prefix + name``."""
    import mindspore.dataset as ds

    x, y = poisoned_data(size)
    rows = [s * BATCH * size + rank * BATCH + i for s in range(STEPS) for i in range(BATCH)]
    data = ds.NumpySlicesDataset({"x": x[rows], "y": y[rows]}, shuffle=False).batch(BATCH)
    model.train(1, data, dataset_sink_mode=False)
    return {prefix + "step": opt.global_step.asnumpy(),
            prefix + "skipped": np.array(opt.health()["skipped_steps"]),
            **{f"{prefix}w{i}": p.asnumpy() for i, p in enumerate(net.trainable_params())},
            **{f"{prefix}a_inv{i}": p.asnumpy() for i, p in enumerate(opt.a_inverses)}}


def nonfinite_scenario(rank: int, size: int) -> dict:
    """The ``pynative1`` case on a fresh model; the execution mode is Graph again afterwards."""
    import mindspore as ms

    from tests.test_thor_distributed import build_thor_model

    try:
        ms.set_context(mode=ms.PYNATIVE_MODE)
        return train_poisoned(*build_thor_model(None, loss_scale=True), rank, size, "pynative1_")
    finally:
        ms.set_context(mode=ms.GRAPH_MODE)

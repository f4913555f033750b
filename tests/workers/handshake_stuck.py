"""The PCA handshake with one rank alive but stuck (sleeping) before it: the last scenario of the msrun job of
tests/workers/e2e_graph.py (checked by tests/test_msrun_e2e.py::test_a_stuck_rank_is_named_within_the_handshake_...).

Every rank calls ``prepare_pca_matrix`` with ``timeout``; rank ``stuck`` first sleeps ``sleep`` seconds. Each rank
returns the error it got (or its rows) and the seconds it spent inside the handshake; the ranks leave together.
"""
import time

import numpy as np

#: dim_reduce.timeout (s), the stuck rank, and how long it sleeps: 3 s past the timeout, a margin over the skew
#: between the ranks (they leave a barrier together)
TIMEOUT, STUCK, SLEEP = 2.0, 1, 5.0


def stuck_scenario(ckpt_dir: str, pca_path: str, timeout: float = TIMEOUT, stuck: int = STUCK,
                   sleep: float = SLEEP) -> dict:
    from ms_boost import comm
    from ms_boost.dim_reduce import parameter_specs, prepare_pca_matrix
    from tests.workers.common import make_plain_net

    specs = parameter_specs(make_plain_net().trainable_params())
    comm.barrier()  # the ranks start the scenario together
    if comm.get_rank() == stuck:
        time.sleep(sleep)
    start = time.monotonic()
    try:
        rows = prepare_pca_matrix(specs, 2, pca_path, ckpt_dir, timeout=timeout, progress=None)
        result = {"error": np.array(""), "elapsed": np.array(time.monotonic() - start), "rows": rows}
    except Exception as exc:  # noqa: BLE001 -- the test reads the message
        result = {"error": np.array(f"{type(exc).__name__}: {exc}"), "elapsed": np.array(time.monotonic() - start)}
    # rank 0 serves the status store: it stays alive until the late rank has had its answer (a store client whose
    # server process exits under it may crash inside MindSpore, seen once as a SIGSEGV of rank 1 under load)
    comm.barrier()
    return result

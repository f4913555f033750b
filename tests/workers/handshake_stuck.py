"""msrun worker: the PCA handshake with one rank alive but stuck (sleeping) before it.

Usage: handshake_stuck.py WEIGHT_LOAD_DIR PCA_MAT_PATH TIMEOUT STUCK_RANK SLEEP_SECONDS
Every rank calls ``prepare_pca_matrix`` with ``timeout=TIMEOUT``; rank STUCK_RANK first sleeps SLEEP_SECONDS.
Each rank saves the error it got (or its rows) and the seconds it spent inside the handshake.
"""
import sys
import time

import mindspore as ms
import numpy as np


def main() -> None:
    from mindspore.communication import init

    from ms_boost import comm
    from ms_boost.dim_reduce import parameter_specs, prepare_pca_matrix
    from tests.helpers.msrun import save_result
    from tests.workers.common import make_plain_net

    ckpt_dir, pca_path = sys.argv[1], sys.argv[2]
    timeout, stuck, sleep = float(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    init()
    specs = parameter_specs(make_plain_net().trainable_params())
    if comm.get_rank() == stuck:
        time.sleep(sleep)
    start = time.monotonic()
    try:
        rows = prepare_pca_matrix(specs, 2, pca_path, ckpt_dir, timeout=timeout, progress=None)
        save_result(error=np.array(""), elapsed=np.array(time.monotonic() - start), rows=rows)
    except Exception as exc:  # noqa: BLE001 -- the test reads the message
        save_result(error=np.array(f"{type(exc).__name__}: {exc}"), elapsed=np.array(time.monotonic() - start))


if __name__ == "__main__":
    main()

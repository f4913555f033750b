"""msrun worker: data-parallel THOR with ms_boost.Model; saves this rank's weights and THOR state.

Usage: thor_data_parallel.py MODE STEPS PER_RANK_BATCH SPLIT_INDICES_JSON DISTRIBUTE_INVERSES(0|1)
Step s of rank r trains on rows [s*B*n + r*B, s*B*n + (r+1)*B) of a fixed data set, so one process on
the concatenated batch of B*n rows (tests/test_thor_distributed.py) is the reference.
"""
import json
import sys

import numpy as np

from tests.helpers.msrun import save_result
from tests.helpers.nets import dataset
from tests.test_thor_distributed import build_thor_model
from tests.workers.common import data_parallel_shard

mode, steps, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
split, distribute = json.loads(sys.argv[4]), bool(int(sys.argv[5]))
rank, _, x, y = data_parallel_shard(mode, steps, batch)
net, opt, model = build_thor_model(split, distribute)
model.train(1, dataset(x, y, batch_size=batch), dataset_sink_mode=False)
owned = sum(1 for owner in opt.inverse_owner if owner == rank)
save_result(owned=np.array(owned), step=opt.global_step.asnumpy(),
            **{f"w{i}": p.asnumpy() for i, p in enumerate(net.trainable_params())},
            **{f"a_inv{i}": p.asnumpy() for i, p in enumerate(opt.a_inverses)},
            **{f"g_inv{i}": p.asnumpy() for i, p in enumerate(opt.g_inverses)})

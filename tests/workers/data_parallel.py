"""msrun worker: data-parallel training with ms_boost.Model; saves this rank's final weights.

Usage: data_parallel.py MODE STEPS PER_RANK_BATCH [BOOST_JSON]
Each step, rank r trains on rows [s*B*n + r*B, s*B*n + (r+1)*B) of a fixed global data set, so one
process on the concatenated batch of B*n rows is the reference.
"""
import json
import sys

from mindspore import nn

from ms_boost import Model
from tests.helpers.msrun import save_result
from tests.helpers.nets import dataset, weights
from tests.workers.common import data_parallel_shard, make_plain_net

mode, steps, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
boost = json.loads(sys.argv[4]) if len(sys.argv) > 4 else None
_, _, x, y = data_parallel_shard(mode, steps, batch)
net = make_plain_net()
model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
              nn.Momentum(net.trainable_params(), 0.1, 0.9), boost_config_dict=boost)
model.train(1, dataset(x, y, batch_size=batch), dataset_sink_mode=False)
save_result(**{f"w{i}": w for i, w in enumerate(weights(net))})

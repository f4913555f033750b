"""Worker for the checkpoint-resume test (a separate process per phase).

Usage: resume.py MODE PHASE STEPS CKPT_DIR OUT_NPZ BOOST_JSON
  PHASE=straight: train 2*STEPS steps, save weights.
  PHASE=first:    train STEPS steps with ModelCheckpoint saving the train network at the end.
  PHASE=second:   fresh process: build the same Model, load that checkpoint into the train network,
                  train the next STEPS steps, save weights.
"""
import glob
import json
import os
import sys

import mindspore as ms
import numpy as np
from mindspore import nn
from mindspore.train import CheckpointConfig, DynamicLossScaleManager, ModelCheckpoint

from ms_boost import Model
from tests.helpers.nets import dataset, learnable_data, make_net

mode, phase, steps, ckpt_dir, out, boost = sys.argv[1:7]
steps = int(steps)
boost = json.loads(boost)
ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
ms.set_device("CPU")
ms.set_seed(0)
x, y = learnable_data(2 * steps * 8, seed=2)
net = make_net()
model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
              nn.Momentum(net.trainable_params(), 0.05, 0.9), boost_config_dict=boost,
              loss_scale_manager=DynamicLossScaleManager(2.0 ** 12, 2, 2))
if phase == "straight":
    model.train(1, dataset(x, y, 8), dataset_sink_mode=False)
elif phase == "first":
    ckpt = ModelCheckpoint(prefix="resume", directory=ckpt_dir,
                           config=CheckpointConfig(save_checkpoint_steps=steps, keep_checkpoint_max=1))
    model.train(1, dataset(x[: steps * 8], y[: steps * 8], 8), callbacks=[ckpt], dataset_sink_mode=False)
else:
    files = sorted(glob.glob(os.path.join(ckpt_dir, "*.ckpt")))
    params = ms.load_checkpoint(files[-1])
    not_loaded, _ = ms.load_param_into_net(model.train_network, params, strict_load=True)
    model.train(1, dataset(x[steps * 8:], y[steps * 8:], 8), dataset_sink_mode=False)
if phase != "first":
    state = {p.name: p.asnumpy() for p in model.train_network.get_parameters()}
    np.savez(out, **state)

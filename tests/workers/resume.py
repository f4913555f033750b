"""Worker for the checkpoint-resume test (one process per phase, every configuration in it).

Usage: resume.py PHASE STEPS WORK_DIR CONFIGS_JSON
  CONFIGS_JSON maps a name to ``[mode, boost_config_dict]``; for each, in WORK_DIR/<name>/:
  PHASE=fresh:  train 2*STEPS steps straight with ModelCheckpoint saving the train network after step STEPS (and
                2*STEPS), save every train-network Parameter to straight.npz (one Model: one compilation).
  PHASE=resume: a new process: build the same Model, load the step-STEPS checkpoint into the train network,
                train the next STEPS steps, save every train-network Parameter to resumed.npz.
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


def build(mode: str, boost: dict) -> Model:
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    ms.set_seed(0)
    net = make_net()
    return Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                 nn.Momentum(net.trainable_params(), 0.05, 0.9), boost_config_dict=boost,
                 loss_scale_manager=DynamicLossScaleManager(2.0 ** 12, 2, 2))


def save_state(model: Model, out: str) -> None:
    np.savez(out, **{p.name: p.asnumpy() for p in model.train_network.get_parameters()})


def main() -> None:
    phase, steps, work = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    configs = json.loads(sys.argv[4])
    ms.set_device("CPU")
    x, y = learnable_data(2 * steps * 8, seed=2)
    for name, (mode, boost) in configs.items():
        folder = os.path.join(work, name)
        os.makedirs(folder, exist_ok=True)
        if phase == "fresh":
            model = build(mode, boost)
            ckpt = ModelCheckpoint(prefix="resume", directory=folder,
                                   config=CheckpointConfig(save_checkpoint_steps=steps, keep_checkpoint_max=2))
            model.train(1, dataset(x, y, 8), callbacks=[ckpt], dataset_sink_mode=False)
            save_state(model, os.path.join(folder, "straight.npz"))
        else:
            model = build(mode, boost)
            saved = sorted(os.path.basename(f) for f in glob.glob(os.path.join(folder, "*.ckpt")))
            if saved != sorted([f"resume-1_{steps}.ckpt", f"resume-1_{2 * steps}.ckpt"]):
                raise RuntimeError(f"{folder}: expected the checkpoints of steps {steps} and {2 * steps}, got {saved}")
            ckpt_file = os.path.join(folder, f"resume-1_{steps}.ckpt")  # mid-way through the straight run
            ms.load_param_into_net(model.train_network, ms.load_checkpoint(ckpt_file), strict_load=True)
            model.train(1, dataset(x[steps * 8:], y[steps * 8:], 8), dataset_sink_mode=False)
            save_state(model, os.path.join(folder, "resumed.npz"))


if __name__ == "__main__":
    main()

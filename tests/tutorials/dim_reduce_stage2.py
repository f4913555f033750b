"""Dimension-reduce training tutorial, second stage (boost mode), as a user writes it, on CPU under msrun.

Follows the tutorial's ``train_boost_stage_2.py``: the network loads the last stage-1 checkpoint, the optimizer
is ``SGD(group_params, learning_rate=1)``, and ``Model(..., metrics={"acc"}, boost_level="O1",
boost_config_dict=boost_dict)`` with the tutorial's dictionary (manual mode, ``dim_reduce`` on,
``"common": {"device_num": N}``, ``"n_component"``, ``pca_mat_path`` from the command line -- None makes the
PCA from ``weight_load_dir="./checkpoint_stage_1/checkpoint_pca"`` --, ``timeout``). Trains 2 epochs saving to
``./checkpoint_stage_2`` on rank 0, then evaluates on rank 0.

Run in stage 1's folder: ``msrun --worker_num=2 ... dim_reduce_stage2.py --data_path DIR
--pretrained_weight_path ./checkpoint_stage_1/resnet-5_6.ckpt [--pca_mat_path /path/pca_mat.npy]``.
"""
from __future__ import annotations

import os

import mindspore as ms
from mindspore import load_checkpoint, load_param_into_net, set_auto_parallel_context, set_context
from mindspore.communication import get_rank, init
from mindspore.context import ParallelMode
from mindspore.nn import SGD
from mindspore.parallel import set_algo_parameters
from mindspore.train import CheckpointConfig, LossMonitor, ModelCheckpoint, TimeMonitor
from tutorial_common import LossRecorder, base_parser, context_mode, create_dataset, flat_weights, report, resnet

from model_zoo.resnet.src.loss import CrossEntropySmooth
from model_zoo.resnet.src.resnet import init_group_params
from ms_boost import Model


def get_rank_id():
    """Rank of this process (the sample code's helper)."""
    return get_rank()


def main():
    parser = base_parser(__doc__.split("\n")[0])
    parser.add_argument("--device_num", type=int, default=2, help="ranks of the job (the tutorial's 8)")
    parser.add_argument("--pretrained_weight_path", required=True)
    parser.add_argument("--pca_mat_path", default=None)
    parser.add_argument("--n_component", type=int, default=4, help="PCA components (the tutorial's 32)")
    parser.add_argument("--boost_level", choices=("O1", "O2"), default="O1", help='the tutorial: "O1" or "O2"')
    args = parser.parse_args()
    mode = context_mode(args)

    set_context(mode=mode)
    ms.set_device("CPU")
    set_auto_parallel_context(device_num=args.device_num, parallel_mode=ParallelMode.DATA_PARALLEL,
                              gradients_mean=True)
    set_algo_parameters(elementwise_op_strategy_follow=True)
    all_reduce_fusion_config = [85, 160]
    set_auto_parallel_context(all_reduce_fusion_config=all_reduce_fusion_config)
    init()
    ms.set_seed(1)

    train_data_path = os.path.join(args.data_path, "train")
    ds_train = create_dataset(dataset_path=train_data_path, do_train=True, batch_size=args.batch_size,
                              train_image_size=args.image_size, eval_image_size=args.image_size, target="CPU",
                              distribute=True)
    step_size = ds_train.get_dataset_size()

    # Defining the network and loading the initialization weights
    net = resnet(class_num=args.class_num)
    if os.path.isfile(args.pretrained_weight_path):
        weight_dict = load_checkpoint(args.pretrained_weight_path)
    load_param_into_net(net, weight_dict)
    start_weights = flat_weights(net)

    # Defining the Training Model
    loss = CrossEntropySmooth(sparse=True, reduction="mean", smooth_factor=0.1, num_classes=args.class_num)
    group_params = init_group_params(net)
    opt = SGD(group_params, learning_rate=1)
    metrics = {"acc"}
    boost_dict = {
        "boost": {
            "mode": "manual",
            "dim_reduce": True
        },
        "common": {
            "device_num": args.device_num
        },
        "dim_reduce": {
            "rho": 0.55,
            "gamma": 0.9,
            "alpha": 0.001,
            "sigma": 0.4,
            "n_component": args.n_component,                                   # PCA component
            "pca_mat_path": args.pca_mat_path,                                 # the path to load pca mat
            "weight_load_dir": "./checkpoint_stage_1/checkpoint_pca",          # the directory to load weight file
            "timeout": 1200
        }
    }
    model = Model(net, loss_fn=loss, optimizer=opt, metrics=metrics, boost_level=args.boost_level,
                  boost_config_dict=boost_dict)

    # Training the Model
    recorder = LossRecorder()
    cb = [TimeMonitor(data_size=step_size), LossMonitor(), recorder]
    if get_rank_id() == 0:
        config_ck = CheckpointConfig(save_checkpoint_steps=step_size, keep_checkpoint_max=2)
        ck_cb = ModelCheckpoint(prefix="resnet", directory="./checkpoint_stage_2", config=config_ck)
        cb += [ck_cb]
    print("============== Starting Training ==============", flush=True)
    model.train(args.epochs, ds_train, callbacks=cb, sink_size=step_size, dataset_sink_mode=True)

    acc = {}
    if get_rank_id() == 0:
        print("============== Starting Testing ==============", flush=True)
        ds_eval = create_dataset(dataset_path=os.path.join(args.data_path, "val"), do_train=False,
                                 batch_size=args.batch_size, eval_image_size=args.image_size, target="CPU")
        acc = model.eval(ds_eval)
        print(f"============== {acc} ==============", flush=True)

    weights = flat_weights(net)
    report(losses=recorder.losses, step_size=step_size, acc=acc, weights_sum=weights.sum(),
           weights_abs_sum=abs(weights).sum(), moved=float(abs(weights - start_weights).sum()))


if __name__ == "__main__":
    main()

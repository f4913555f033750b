"""Dimension-reduce training tutorial, first stage (regular training), as a user writes it, on CPU under msrun.

Follows the tutorial's ``train_stage_1.py``: data parallel with ``set_algo_parameters`` and
``all_reduce_fusion_config``, ``Model(..., metrics={"acc"}, amp_level="O2", boost_level="O0")`` with a fixed
loss scale, one checkpoint callback for the whole state (``./checkpoint_stage_1``) and one saving only the
network every epoch for the PCA of stage 2 (``./checkpoint_stage_1/checkpoint_pca``, ``saved_network=net``),
then ``model.eval`` on rank 0. Differences: ``from ms_boost import Model``, CPU, a tiny ResNet and data set.

Run (in the folder stage 2 will run in): ``msrun --worker_num=2 ... dim_reduce_stage1.py --data_path DIR``.
"""
from __future__ import annotations

import os

import mindspore as ms
from mindspore import Tensor, set_auto_parallel_context, set_context
from mindspore.communication import get_rank, init
from mindspore.context import ParallelMode
from mindspore.nn import Momentum
from mindspore.parallel import set_algo_parameters
from mindspore.train import CheckpointConfig, FixedLossScaleManager, LossMonitor, ModelCheckpoint, TimeMonitor
from tutorial_common import LossRecorder, base_parser, context_mode, create_dataset, flat_weights, report, resnet

from model_zoo.resnet.src.loss import CrossEntropySmooth
from model_zoo.resnet.src.lr_generator import get_lr
from model_zoo.resnet.src.resnet import init_group_params, init_weight
from ms_boost import Model


def get_rank_id():
    """Rank of this process (the sample code's helper)."""
    return get_rank()


def main():
    parser = base_parser(__doc__.split("\n")[0])
    parser.add_argument("--device_num", type=int, default=2, help="ranks of the job (the tutorial's 8)")
    parser.add_argument("--lr_max", type=float, default=0.1)
    args = parser.parse_args()
    mode = context_mode(args)

    # Runtime Mode and Backend Device Settings
    set_context(mode=mode)
    ms.set_device("CPU")
    set_auto_parallel_context(device_num=args.device_num, parallel_mode=ParallelMode.DATA_PARALLEL,
                              gradients_mean=True)
    set_algo_parameters(elementwise_op_strategy_follow=True)
    all_reduce_fusion_config = [85, 160]
    set_auto_parallel_context(all_reduce_fusion_config=all_reduce_fusion_config)
    init()
    ms.set_seed(1)

    # Loading the Dataset
    train_data_path = os.path.join(args.data_path, "train")
    ds_train = create_dataset(dataset_path=train_data_path, do_train=True, batch_size=args.batch_size,
                              train_image_size=args.image_size, eval_image_size=args.image_size, target="CPU",
                              distribute=True)
    step_size = ds_train.get_dataset_size()

    # Defining the Network
    net = resnet(class_num=args.class_num)
    init_weight(net=net)

    # Defining the Training Model
    loss = CrossEntropySmooth(sparse=True, reduction="mean", smooth_factor=0.1, num_classes=args.class_num)
    loss_scale = FixedLossScaleManager(1024, drop_overflow_update=False)
    group_params = init_group_params(net)
    lr = get_lr(lr_init=0, lr_end=0.0, lr_max=args.lr_max, warmup_epochs=1, total_epochs=args.epochs,
                steps_per_epoch=step_size, lr_decay_mode="linear")
    lr = Tensor(lr)
    opt = Momentum(group_params, lr, 0.9, loss_scale=1024)
    metrics = {"acc"}
    model = Model(net, loss_fn=loss, optimizer=opt, loss_scale_manager=loss_scale, metrics=metrics, amp_level="O2",
                  boost_level="O0", keep_batchnorm_fp32=False)

    # Training the Model: callback_1 saves everything, callback_2 the network's weights for the PCA
    recorder = LossRecorder()
    cb = [TimeMonitor(data_size=step_size), LossMonitor(), recorder]
    if get_rank_id() == 0:
        config_ck = CheckpointConfig(save_checkpoint_steps=step_size * 10, keep_checkpoint_max=10)
        ck_cb = ModelCheckpoint(prefix="resnet", directory="./checkpoint_stage_1", config=config_ck)
        cb += [ck_cb]
    if get_rank_id() == 0:
        config_ck = CheckpointConfig(save_checkpoint_steps=step_size, keep_checkpoint_max=40,
                                     saved_network=net)
        ck_cb = ModelCheckpoint(prefix="resnet", directory="./checkpoint_stage_1/checkpoint_pca", config=config_ck)
        cb += [ck_cb]

    print("============== Starting Training ==============", flush=True)
    model.train(args.epochs, ds_train, callbacks=cb, sink_size=step_size, dataset_sink_mode=True)

    # Testing the Model
    acc = {}
    if get_rank_id() == 0:
        print("============== Starting Testing ==============", flush=True)
        eval_data_path = os.path.join(args.data_path, "val")
        ds_eval = create_dataset(dataset_path=eval_data_path, do_train=False, batch_size=args.batch_size,
                                 eval_image_size=args.image_size, target="CPU")
        if ds_eval.get_dataset_size() == 0:
            raise ValueError("Please check dataset size > 0 and batch_size <= dataset size")
        acc = model.eval(ds_eval)
        print(f"============== {acc} ==============", flush=True)

    weights = flat_weights(net)
    report(losses=recorder.losses, step_size=step_size, acc=acc, weights_sum=weights.sum(),
           weights_abs_sum=abs(weights).sum())


if __name__ == "__main__":
    main()

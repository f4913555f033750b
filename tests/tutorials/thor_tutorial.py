"""ResNet-50 second-order optimization (THOR) tutorial, training, as a user writes it, on CPU.

Follows the tutorial's ``train.py``: the ``create_dataset`` shown in the tutorial (``ImageFolderDataset``,
RandomCropDecodeResize + flip + Normalize + HWC2CHW, TypeCast, batch ``drop_remainder=True``), the tutorial's
``CrossEntropy`` loss (label smoothing), ``thor(net, lr, damping, momentum, weight_decay, loss_scale,
batch_size, split_indices=[26, 53], frequency=...)``, ``Model(..., amp_level="O2", keep_batchnorm_fp32=False,
metrics={'acc'}, loss_scale_manager=FixedLossScaleManager(loss_scale, drop_overflow_update=False))`` converted
with ``ConvertModelUtils().convert_to_thor_model(...)``, TimeMonitor / LossMonitor / ModelCheckpoint(prefix
"resnet") callbacks and ``model.train(..., sink_size=step_size, dataset_sink_mode=True)``.

Differences: THOR, ``ConvertModelUtils`` and ``Model`` come from ms_boost; CPU; tiny ResNet and images.
``--run_distribute`` runs the data-parallel branch (under msrun), checkpoints then go to ``ckpt_<rank>/``.
"""
from __future__ import annotations

import os

import mindspore as ms
import mindspore.common.initializer as weight_init
import mindspore.dataset as ds
import numpy as np
from mindspore import Tensor, nn, ops, set_auto_parallel_context, set_context
from mindspore import dtype as mstype
from mindspore.communication import get_group_size, get_rank, init
from mindspore.context import ParallelMode
from mindspore.nn.loss.loss import LossBase as _Loss
from mindspore.train import CheckpointConfig, FixedLossScaleManager, LossMonitor, ModelCheckpoint, TimeMonitor
from tutorial_common import LossRecorder, base_parser, context_mode, flat_weights, report, resnet

from model_zoo.resnet.src.lr_generator import get_thor_damping, get_thor_lr
from ms_boost import Model
from ms_boost.thor import ConvertModelUtils, thor


def create_dataset(dataset_path, do_train, repeat_num=1, batch_size=32, target="Ascend", image_size=224,
                   distribute=False):
    """The tutorial's ``src/dataset.py`` (``image_size`` and ``distribute`` added for the CPU run)."""
    if distribute:
        rank_id = get_rank()
        device_num = get_group_size()
    else:
        rank_id, device_num = 0, 1
    num_parallels = 1
    if device_num == 1:
        data_set = ds.ImageFolderDataset(dataset_path, num_parallel_workers=num_parallels, shuffle=True)
    else:
        data_set = ds.ImageFolderDataset(dataset_path, num_parallel_workers=num_parallels, shuffle=True,
                                         num_shards=device_num, shard_id=rank_id)
    mean = [0.485 * 255, 0.456 * 255, 0.406 * 255]
    std = [0.229 * 255, 0.224 * 255, 0.225 * 255]
    # define map operations
    if do_train:
        trans = [
            ds.vision.RandomCropDecodeResize(image_size, scale=(0.08, 1.0), ratio=(0.75, 1.333)),
            ds.vision.RandomHorizontalFlip(prob=0.5),
            ds.vision.Normalize(mean=mean, std=std),
            ds.vision.HWC2CHW()
        ]
    else:
        trans = [
            ds.vision.Decode(),
            ds.vision.Resize(int(round(image_size / 0.875))),
            ds.vision.CenterCrop(image_size),
            ds.vision.Normalize(mean=mean, std=std),
            ds.vision.HWC2CHW()
        ]
    type_cast_op = ds.transforms.TypeCast(mstype.int32)
    data_set = data_set.map(operations=trans, input_columns="image", num_parallel_workers=num_parallels)
    data_set = data_set.map(operations=type_cast_op, input_columns="label", num_parallel_workers=num_parallels)
    # apply batch operations
    data_set = data_set.batch(batch_size, drop_remainder=True)
    # apply dataset repeat operation
    data_set = data_set.repeat(repeat_num)
    return data_set


class CrossEntropy(_Loss):
    """CrossEntropy (the tutorial's ``src/crossentropy.py``)."""

    def __init__(self, smooth_factor=0., num_classes=1000):
        super().__init__()
        self.onehot = ops.OneHot()
        self.on_value = Tensor(1.0 - smooth_factor, mstype.float32)
        self.off_value = Tensor(1.0 * smooth_factor / (num_classes - 1), mstype.float32)
        self.ce = nn.SoftmaxCrossEntropyWithLogits()
        self.mean = ops.ReduceMean(False)

    def construct(self, logit, label):
        one_hot_label = self.onehot(label, ops.shape(logit)[1], self.on_value, self.off_value)
        loss = self.ce(logit, one_hot_label)
        loss = self.mean(loss, 0)
        return loss


def main():
    parser = base_parser(__doc__.split("\n")[0])
    parser.add_argument("--run_distribute", action="store_true")
    parser.add_argument("--frequency", type=int, default=4, help="THOR refresh interval (the tutorial's 834)")
    parser.add_argument("--lr_init", type=float, default=0.05803)
    parser.add_argument("--loss_scale", type=float, default=128)
    parser.add_argument("--save_checkpoint_path", default="./")
    args = parser.parse_args()
    mode = context_mode(args)

    class config:  # noqa: N801 -- the tutorial's src/config.py, shrunk
        class_num = args.class_num
        batch_size = args.batch_size
        loss_scale = args.loss_scale
        momentum = 0.9
        weight_decay = 5e-4
        epoch_size = args.epochs
        save_checkpoint = True
        save_checkpoint_epochs = 1
        keep_checkpoint_max = 15
        save_checkpoint_path = args.save_checkpoint_path
        use_label_smooth = True
        label_smooth_factor = 0.1
        lr_init = args.lr_init
        lr_decay = 4.04839
        lr_end_epoch = args.epochs + 1
        damping_init = 0.02714
        damping_decay = 0.50036
        frequency = args.frequency

    target = "CPU"
    ckpt_save_dir = config.save_checkpoint_path
    set_context(mode=mode)
    ms.set_device(target)
    if args.run_distribute:
        init()
        set_auto_parallel_context(device_num=get_group_size(), parallel_mode=ParallelMode.DATA_PARALLEL,
                                  gradients_mean=True)
        set_auto_parallel_context(all_reduce_fusion_config=[85, 160])
        ckpt_save_dir = config.save_checkpoint_path + "ckpt_" + str(get_rank()) + "/"
    ms.set_seed(1)

    # create dataset
    dataset = create_dataset(dataset_path=os.path.join(args.data_path, "train"), do_train=True, repeat_num=1,
                             batch_size=config.batch_size, target=target, image_size=args.image_size,
                             distribute=args.run_distribute)
    step_size = dataset.get_dataset_size()

    # define net
    net = resnet(class_num=config.class_num)

    # init weight
    for _, cell in net.cells_and_names():
        if isinstance(cell, nn.Conv2d):
            cell.weight.set_data(weight_init.initializer(weight_init.XavierUniform(), cell.weight.shape,
                                                         cell.weight.dtype))
        if isinstance(cell, nn.Dense):
            cell.weight.set_data(weight_init.initializer(weight_init.TruncatedNormal(), cell.weight.shape,
                                                         cell.weight.dtype))

    # init lr
    lr = get_thor_lr(0, config.lr_init, config.lr_decay, config.lr_end_epoch, step_size, decay_epochs=39)
    lr = Tensor(lr)

    # define the loss function
    if not config.use_label_smooth:
        config.label_smooth_factor = 0.0
    loss = CrossEntropy(smooth_factor=config.label_smooth_factor, num_classes=config.class_num)
    loss_scale = FixedLossScaleManager(config.loss_scale, drop_overflow_update=False)
    metrics = {"acc"}

    # define the optimizer
    damping = get_thor_damping(0, config.damping_init, config.damping_decay, 70, step_size)
    split_indices = [26, 53]
    opt = thor(net, lr, Tensor(damping), config.momentum, config.weight_decay, config.loss_scale,
               config.batch_size, split_indices=split_indices, frequency=config.frequency)
    model = Model(net, loss_fn=loss, optimizer=opt, loss_scale_manager=loss_scale, metrics=metrics,
                  amp_level="O2", keep_batchnorm_fp32=False)
    model = ConvertModelUtils().convert_to_thor_model(model=model, network=net, loss_fn=loss, optimizer=opt,
                                                      loss_scale_manager=loss_scale, metrics={'acc'},
                                                      amp_level="O2", keep_batchnorm_fp32=False)

    # define callbacks
    time_cb = TimeMonitor(data_size=step_size)
    loss_cb = LossMonitor()
    recorder = LossRecorder()
    cb = [time_cb, loss_cb, recorder]
    if config.save_checkpoint:
        config_ck = CheckpointConfig(save_checkpoint_steps=config.save_checkpoint_epochs * step_size,
                                     keep_checkpoint_max=config.keep_checkpoint_max)
        ckpt_cb = ModelCheckpoint(prefix="resnet", directory=ckpt_save_dir, config=config_ck)
        cb += [ckpt_cb]

    initial = [p.asnumpy().copy() for p in net.trainable_params()]  # (for the acceptance test's report)

    # train model
    model.train(config.epoch_size, dataset, callbacks=cb, sink_size=dataset.get_dataset_size(),
                dataset_sink_mode=True)

    weights = flat_weights(net)
    params = [p.asnumpy() for p in net.trainable_params()]
    report(losses=recorder.losses, step_size=step_size, weights_sum=weights.sum(),
           weights_abs_sum=abs(weights).sum(), model_class=f"{type(model).__module__}.{type(model).__name__}",
           global_step=int(opt.global_step.asnumpy().reshape(-1)[0]), thor_layers=len(opt.thor_layers),
           unchanged_params=sum(int(np.array_equal(a, b)) for a, b in zip(params, initial)),
           zero_inverses=sum(int(not np.abs(p.asnumpy()).sum() > 0) for p in (*opt.a_inverses, *opt.g_inverses)))


if __name__ == "__main__":
    main()

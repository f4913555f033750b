"""The AdaSum tutorial ("Adaptive Gradient Summation Algorithm"), as a user writes it, on CPU under msrun.

Only two things differ from the tutorial: ``from ms_boost import Model`` and CPU instead of Ascend (with
``device_num`` the msrun world instead of 16, and a tiny ResNet on a tiny ImageFolder). ``--variant``:

* ``o2``: ``Model(..., amp_level="O2", boost_level="O2", keep_batchnorm_fp32=False)`` (every O2 algorithm);
* ``adasum``: the tutorial's ``boost_dict`` (manual mode, AdaSum only) with ``eval_network=ClassifyCorrectCell``.

``--device_per_server N`` adds ``"common": {"device_num": N}`` to the dict (the tutorial's 16 cards are two
servers of 8; with 2 CPU ranks, N=1 makes two servers so AdaSum really combines).

``--variant o2 adasum`` trains both in sequence in the same job (one ``init()``, then each variant from
"Loading Dataset" on, with its own network, optimizer and ``Model``), which saves the acceptance test a second
``msrun`` start; the reported values are prefixed with the variant (``o2_losses``, ``adasum_losses``, ...).

Run: ``msrun --worker_num=2 --local_worker_num=2 ... adasum_tutorial.py --data_path DIR``.
"""
from __future__ import annotations

import mindspore as ms
import mindspore.nn as nn
import mindspore.ops as ops
from mindspore import Tensor, set_auto_parallel_context, set_context
from mindspore import dtype as mstype
from mindspore.communication import GlobalComm, init
from mindspore.context import ParallelMode
from mindspore.nn import Momentum
from mindspore.train import FixedLossScaleManager, LossMonitor, TimeMonitor
from tutorial_common import LossRecorder, base_parser, context_mode, create_dataset, flat_weights, report, resnet

from model_zoo.resnet.src.loss import CrossEntropySmooth
from model_zoo.resnet.src.lr_generator import get_lr
from model_zoo.resnet.src.resnet import init_group_params, init_weight
from ms_boost import Model


class ClassifyCorrectCell(nn.Cell):
    """The ``models`` ResNet evaluation cell: number of correct predictions, summed over the ranks."""

    def __init__(self, network):
        super().__init__(auto_prefix=False)
        self._network = network
        self.argmax = ops.Argmax()
        self.equal = ops.Equal()
        self.cast = ops.Cast()
        self.reduce_sum = ops.ReduceSum()
        self.allreduce = ops.AllReduce(ops.ReduceOp.SUM, GlobalComm.WORLD_COMM_GROUP)

    def construct(self, data, label):
        outputs = self._network(data)
        y_pred = self.argmax(outputs)
        y_pred = self.cast(y_pred, mstype.int32)
        y_correct = self.equal(y_pred, label)
        y_correct = self.cast(y_correct, mstype.float32)
        y_correct = self.reduce_sum(y_correct)
        total_correct = self.allreduce(y_correct)
        return (total_correct,)


def main():
    parser = base_parser(__doc__.split("\n")[0])
    parser.add_argument("--variant", choices=("o2", "adasum"), nargs="+", default=["adasum"])
    parser.add_argument("--device_num", type=int, default=2, help="ranks of the job (the tutorial's 16)")
    parser.add_argument("--device_per_server", type=int, default=0)
    parser.add_argument("--lr_max", type=float, default=0.1)
    args = parser.parse_args()
    mode = context_mode(args)

    # Configuring the Operating Mode
    set_context(mode=mode)
    ms.set_device("CPU")
    set_auto_parallel_context(device_num=args.device_num, parallel_mode=ParallelMode.DATA_PARALLEL,
                              gradients_mean=True)
    init()

    results = {}
    for variant in args.variant:
        ms.set_seed(1)
        for key, value in train_variant(args, variant).items():
            results[f"{variant}_{key}"] = value
    report(**results)


def train_variant(args, variant: str) -> dict:
    """The tutorial from "Loading Dataset" to ``model.train`` for one variant; returns what the test checks."""
    # Loading Dataset in the Data Parallel Mode
    train_data_path = f"{args.data_path}/train"
    ds_train = create_dataset(dataset_path=train_data_path, do_train=True, batch_size=args.batch_size,
                              train_image_size=args.image_size, eval_image_size=args.image_size, target="CPU",
                              distribute=True)
    step_size = ds_train.get_dataset_size()

    # Defining the Network
    net = resnet(num_classes=args.class_num)
    init_weight(net=net)

    # Defining the Training Model
    loss = CrossEntropySmooth(sparse=True, reduction="mean", smooth_factor=0.1, num_classes=args.class_num)
    loss_scale = FixedLossScaleManager(1024, drop_overflow_update=False)
    group_params = init_group_params(net)
    lr = get_lr(lr_init=0, lr_end=0.0, lr_max=args.lr_max, warmup_epochs=1, total_epochs=args.epochs,
                steps_per_epoch=step_size, lr_decay_mode="linear")
    lr = Tensor(lr)
    opt = Momentum(group_params, lr, 0.9, loss_scale=1024)

    if variant == "o2":
        model = Model(net, loss_fn=loss, optimizer=opt, loss_scale_manager=loss_scale, amp_level="O2",
                      boost_level="O2", keep_batchnorm_fp32=False)
    else:
        dist_eval_network = ClassifyCorrectCell(net)
        boost_dict = {
            "boost": {
                "mode": "manual",
                "less_bn": False,
                "grad_freeze": False,
                "adasum": True,
                "grad_accumulation": False,
                "dim_reduce": False
            }
        }
        if args.device_per_server:
            boost_dict["common"] = {"device_num": args.device_per_server}
        model = Model(net, loss_fn=loss, optimizer=opt, loss_scale_manager=loss_scale, amp_level="O2",
                      boost_level="O2", keep_batchnorm_fp32=False, boost_config_dict=boost_dict,
                      eval_network=dist_eval_network)

    # Training the Model
    recorder = LossRecorder()
    cb = [TimeMonitor(data_size=step_size), LossMonitor(), recorder]
    print("============== Starting Training ==============", flush=True)
    model.train(args.epochs, ds_train, callbacks=cb, sink_size=step_size, dataset_sink_mode=True)

    weights = flat_weights(net)
    return {"losses": recorder.losses, "step_size": step_size, "weights_head": weights[:64],
            "weights_sum": weights.sum(), "weights_abs_sum": abs(weights).sum()}


if __name__ == "__main__":
    main()

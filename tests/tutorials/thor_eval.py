"""ResNet-50 THOR tutorial, model inference (``eval.py``), as a user writes it, on CPU.

Builds the plain network, ``net.add_flags_recursive(thor=False)``, loads the checkpoint written by THOR
training with ``load_checkpoint``, pops the ``damping`` keys, ``load_param_into_net``, ``net.set_train(False)``,
then ``Model(net, loss_fn=loss, metrics={'top_1_accuracy', 'top_5_accuracy'})`` and ``model.eval(dataset)``
over the tutorial's evaluation pipeline (Decode, Resize, CenterCrop, Normalize, HWC2CHW, TypeCast, batch).
Only ``Model`` comes from ms_boost.
"""
from __future__ import annotations

import os

import mindspore as ms
from mindspore import load_checkpoint, load_param_into_net, set_context
from thor_tutorial import CrossEntropy, create_dataset
from tutorial_common import base_parser, context_mode, flat_weights, report, resnet

from ms_boost import Model


def main():
    parser = base_parser(__doc__.split("\n")[0])
    parser.add_argument("--checkpoint_path", required=True)
    args = parser.parse_args()
    mode = context_mode(args)

    class config:  # noqa: N801 -- the tutorial's src/config.py, shrunk
        class_num = args.class_num
        batch_size = args.batch_size
        use_label_smooth = True
        label_smooth_factor = 0.1

    target = "CPU"
    set_context(mode=mode)
    ms.set_device(target)

    # create dataset
    dataset = create_dataset(dataset_path=os.path.join(args.data_path, "val"), do_train=False,
                             batch_size=config.batch_size, target=target, image_size=args.image_size)
    step_size = dataset.get_dataset_size()

    # define net
    net = resnet(class_num=config.class_num)
    net.add_flags_recursive(thor=False)

    # load checkpoint
    param_dict = load_checkpoint(args.checkpoint_path)
    keys = list(param_dict.keys())
    for key in keys:
        if "damping" in key:
            param_dict.pop(key)
    param_not_load = load_param_into_net(net, param_dict)
    net.set_train(False)

    # define loss, model
    if not config.use_label_smooth:
        config.label_smooth_factor = 0.0
    loss = CrossEntropy(smooth_factor=config.label_smooth_factor, num_classes=config.class_num)

    # define model
    model = Model(net, loss_fn=loss, metrics={'top_1_accuracy', 'top_5_accuracy'})

    # eval model
    res = model.eval(dataset)
    print("result:", res, "ckpt=", args.checkpoint_path, flush=True)

    not_loaded = list(param_not_load[0] if isinstance(param_not_load, tuple) else param_not_load)
    weights = flat_weights(net)
    report(result=res, step_size=step_size, not_loaded=len(not_loaded), weights_sum=weights.sum())
    if not_loaded:
        print("parameters not loaded:", not_loaded, flush=True)


if __name__ == "__main__":
    main()

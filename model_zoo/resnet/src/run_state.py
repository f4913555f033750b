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
import re
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple

import mindspore as ms
import numpy as np
from mindspore import nn
from mindspore.train import Callback

from model_zoo.resnet.src.callbacks import loss_value
from ms_boost.divergence import callback_mark, first_non_finite

__all__ = ["MANIFEST_KEY", "TrainingDiverged", "first_non_finite", "GuardedCheckpoint", "read_manifest",
           "find_resume_checkpoint", "checkpoint_step", "run_checkpoints"]

MANIFEST_KEY = "ms_boost_run"
_NAME = re.compile(r"^(?P<prefix>.+)-(?P<epoch>\d+)_(?P<step>\d+)\.ckpt$")


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
            self._before = [p for p in _checkpoints_in(self.directory, prefix)
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
        files = sorted(_checkpoints_in(self.directory, self.prefix),
                       key=lambda p: checkpoint_step(p, self.steps_per_epoch))
        newest = self.last_good
        for old in files[:-self.keep_max]:
            if old != newest:  # never the newest (finite) checkpoint
                old.unlink(missing_ok=True)


def read_manifest(path: Path, entries: Optional[Dict[str, Any]] = None) -> Optional[Dict[str, Any]]:
    """The ``ms_boost_run`` manifest of a checkpoint (``None`` for checkpoints written before it existed)."""
    entries = ms.load_checkpoint(str(path)) if entries is None else entries
    raw = entries.get(MANIFEST_KEY)
    if not isinstance(raw, str):
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


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
    for folder in (path / checkpoint_dir, path):
        found = _checkpoints_in(folder, prefix)
        if found:
            def key(p: Path) -> Tuple[int, int]:
                match = _NAME.match(p.name)
                return int(match.group("epoch")), int(match.group("step"))
            return max(found, key=key)
    raise ValueError(f"resume={target!r}: no '{prefix}-<epoch>_<step>.ckpt' checkpoint in {str(path)!r} or "
                     f"{str(path / checkpoint_dir)!r}.")


def _checkpoints_in(folder: Path, prefix: str) -> List[Path]:
    """The ``<prefix>-<epoch>_<step>.ckpt`` files directly in ``folder`` (none when it does not exist)."""
    return [p for p in folder.glob(f"{prefix}-*.ckpt") if _NAME.match(p.name)] if folder.is_dir() else []


def run_checkpoints(directory: Path, prefix: str, subfolders: Iterable[str] = ()) -> List[Path]:
    """``<prefix>-<epoch>_<step>.ckpt`` files of a run's checkpoint folder, its ``rank_<r>/`` folders and the
    given ``subfolders`` (e.g. the PCA's weight-only checkpoints), sorted by path."""
    directory = Path(directory)
    folders = [directory, *sorted(directory.glob("rank_*")), *(directory / name for name in subfolders if name)]
    return sorted(p for folder in folders for p in _checkpoints_in(folder, prefix))

"""Cell plumbing of the trial: copies of the starting objects, the batches, one candidate's step and held-out loss.

Each candidate trains on a deep copy of the network and optimizer (and loss-scale manager), so the user's
objects keep the starting weights, optimizer state and structure (LessBN converts a network in place; THOR
replaces the optimizer) whatever the trial does. The plain step (a plan that rewrites nothing) trains the user's
objects themselves. :meth:`CellTrialRun.restore` writes every Parameter of a train cell back to its starting value
after each use, so the pick's compiled step can serve the run; when that step trained copies,
:meth:`CellTrialRun.sync_to` writes the trained values back into the user's objects by Parameter name.
"""
from __future__ import annotations

import collections.abc
import copy
import logging
import threading
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
from mindspore import Tensor, nn, ops

__all__ = ["clone_for_trial", "CellTrialRun", "take_batches", "TrialBatches", "batch_size_of", "count_conv2d"]

logger = logging.getLogger("ms_boost")

#: stateless MindSpore functors the optimizers hold (they cannot be deep-copied; sharing them is safe)
_SHARED_TYPES = (ops.Map, ops.HyperMap, ops.MultitypeFuncGraph, ops.GradOperation)


def clone_for_trial(*objects: Any) -> Tuple[Any, ...]:
    """Deep copies of ``objects`` made together, so Parameters shared between them stay shared in the copies.

    The optimizer's Parameters are the copied network's. Names are kept; stateless functors are shared.

    Raises:
        TypeError: an object cannot be copied (the message names it).
    """
    memo: Dict[int, Any] = {}
    for obj in objects:
        if isinstance(obj, nn.Cell):
            for _, cell in obj.cells_and_names():
                for value in vars(cell).values():
                    if isinstance(value, _SHARED_TYPES):
                        memo[id(value)] = value
                # The arguments an optimizer recorded (``init_params``) may hold the iterator it was built from
                # (the tutorials' ``filter(lambda p: p.requires_grad, net.get_parameters())``), which no copy can
                # take (a generator) and which the optimizer's constructor consumed: shared as it is, exhausted;
                # rebuilds then read the optimizer's own parameters (``grad_process.optimizer_params``).
                recorded = getattr(cell, "init_params", None)
                if isinstance(recorded, dict):
                    for value in recorded.values():
                        if isinstance(value, collections.abc.Iterator):
                            memo[id(value)] = value
    try:
        return copy.deepcopy(tuple(objects), memo)
    except Exception as exc:  # noqa: BLE001 - re-raised with what could not be copied
        names = ", ".join(type(o).__name__ for o in objects if o is not None)
        raise TypeError(f"autotune: the trial trains copies of the starting objects ({names}) and one of them "
                        f"cannot be copied ({type(exc).__name__}: {exc}); give a fixed boost_level instead.") from exc


class CellTrialRun:
    """A candidate's train cell as the engine's :class:`~ms_boost.autotune.engine.TrialRun`.

    Every Parameter of the cell (weights, BatchNorm statistics, optimizer state, loss scale, boost state) is
    remembered when it is built, so that :meth:`restore` puts it back.

    Args:
        train_cell: the train step (``BoostTrainOneStepCell`` or its loss-scale form); its ``network`` attribute
            is the loss network, used in evaluation mode for the held-out loss.
        network: the (rewritten) network the step trains.
        optimizer: the (rewritten) optimizer the step updates with.
        on_originals: whether the step trains the caller's own objects (else copies of them).
    """

    def __init__(self, train_cell: nn.Cell, network: Any = None, optimizer: Any = None, on_originals: bool = False):
        self.train_cell = train_cell
        self.network = network
        self.optimizer = optimizer
        self.on_originals = on_originals
        self.loss_network = train_cell.network
        self._start = [(p, p.asnumpy().copy()) for p in train_cell.get_parameters()]

    def restore(self) -> None:
        """Write the remembered starting values back in place (the compiled step keeps using them)."""
        for param, value in self._start:
            ops.assign(param, Tensor(value))
        self.train_cell.set_train(True)

    def sync_to(self, *objects: Any) -> int:
        """Write this step's current Parameter values into the same-named Parameters of ``objects`` (Cells).

        For a step that trained copies: the caller's network and optimizer get the trained values. Parameters of
        another shape, or that only one side has (BatchNorm that LessBN removed, THOR's statistics), are left.

        Returns:
            How many Parameters were written.
        """
        if self.on_originals:
            return 0
        mine = {p.name: p for p in self.train_cell.get_parameters()}
        seen, written = set(), 0
        for obj in objects:
            if not isinstance(obj, nn.Cell):
                continue
            for param in obj.get_parameters():
                source = mine.get(param.name)
                if id(param) in seen or source is None or source is param or tuple(source.shape) != tuple(param.shape):
                    continue
                seen.add(id(param))
                ops.assign(param, Tensor(source.asnumpy()).astype(param.dtype))
                written += 1
        return written

    def step(self, *batch: Any) -> Any:
        """Train one step on ``batch`` (network in training mode); returns the train cell's output."""
        self.train_cell.set_train(True)
        return self.train_cell(*batch)

    def holdout_loss(self, batches: Sequence[tuple]) -> float:
        """Mean loss over ``batches``, the loss network in evaluation mode, no update."""
        self.loss_network.set_train(False)
        total = 0.0
        for batch in batches:
            out = self.loss_network(*batch)
            total += float(np.asarray(out.asnumpy(), np.float64).reshape(-1)[0])
        self.loss_network.set_train(True)
        return total / max(1, len(batches))


def _as_tensors(row: Sequence[Any]) -> Tuple[Tensor, ...]:
    return tuple(Tensor(np.asarray(col)) for col in row)


def take_batches(dataset: Any, count: int) -> List[Tuple[Tensor, ...]]:
    """The first ``count`` batches of one pass over ``dataset`` (fewer if it is shorter), as Tensors."""
    out: List[Tuple[Tensor, ...]] = []
    if count <= 0:
        return out
    iterator: Iterable = dataset.create_tuple_iterator(num_epochs=1, output_numpy=True)
    for row in iterator:
        out.append(_as_tensors(row))
        if len(out) >= count:
            break
    return out


def _release(iterator: Any) -> None:
    """Stop a data set iterator's pipeline now (MindSpore's ``Iterator.stop``; others are just dropped)."""
    stop = getattr(iterator, "stop", None)
    if callable(stop):
        stop()


class TrialBatches(Sequence):
    """The trial's batches, read while the trial runs: the first ``holdout + steps`` of one pass, as Tensors.

    The held-out batches (the first ``holdout``) and the first ``ready`` training batches are read when it is made,
    in the calling thread (the first probe trains on them). The other training batches are read from the same
    iterator, in the same order, by a background thread that starts only when they are asked for: :meth:`start`
    (the trial calls it when it is about to build a second plan, whose compile the reading then overlaps), or an
    index or slice past what is read so far, which waits for the reader. So a trial that probes one plan and
    measures no progress reads nothing beyond its first batches, and its first compile -- the run's own compile when
    the run reuses that plan's step -- runs with no reader beside it, as a fixed run's first step does (its data
    iterator open, as the fixed run's is). The iterator is released as soon as the last batch is read (its
    pipeline stops); :meth:`close` stops the reader early (the trial did not need the rest) and waits for it, or
    releases the iterator of a reader never started, so no thread or pipeline outlives the trial.

    Args:
        dataset: the training data set (``create_tuple_iterator``).
        holdout: held-out batches to read first (:attr:`holdout`).
        steps: training batches to read after them (fewer if the data set is shorter).
        ready: training batches read before returning (the others when asked for; 0 or ``>= steps``: all now).

    Attributes:
        holdout: the held-out batches (a list).
    """

    def __init__(self, dataset: Any, holdout: int, steps: int, ready: int):
        self.holdout: List[Tuple[Tensor, ...]] = []
        self._rows: List[Tuple[Tensor, ...]] = []
        self._steps = max(0, int(steps))
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._done = False
        self._error: Optional[BaseException] = None
        self._reported = False
        self._thread: Optional[threading.Thread] = None
        self._pending: Optional[Tuple[Any, Iterator]] = None  # the iterator the rest is read from, until started
        if holdout <= 0 and self._steps == 0:
            self._done = True
            return
        iterator = dataset.create_tuple_iterator(num_epochs=1, output_numpy=True)
        rows: Iterator = iter(iterator)
        now = self._steps if ready <= 0 else min(int(ready), self._steps)
        try:
            while len(self.holdout) < holdout:
                row = next(rows, None)
                if row is None:
                    break
                self.holdout.append(_as_tensors(row))
            more = len(self.holdout) >= holdout and self._read(rows, now)
        except BaseException:
            _release(iterator)
            raise
        if not more or len(self._rows) >= self._steps:  # all read (or the data set ended): nothing in the background
            _release(iterator)
            self._done = True
            return
        self._pending = (iterator, rows)  # the rest is read when asked for (start, or an index past what is read)

    def start(self) -> None:
        """Start reading the other batches in the background, if they are not read or being read already."""
        with self._cond:
            if self._pending is None or self._stop.is_set():
                return
            iterator, rows = self._pending
            self._pending = None
            self._thread = threading.Thread(target=self._background, args=(iterator, rows), daemon=True,
                                            name="autotune-batches")
            self._thread.start()

    @property
    def started(self) -> bool:
        """Whether the background reading started (or nothing was left to read in the background)."""
        return self._pending is None

    def _read(self, rows: Iterator, upto: int) -> bool:
        """Read training batches until ``upto`` are held (or a stop); False when the data set ended first."""
        while len(self._rows) < upto and not self._stop.is_set():
            row = next(rows, None)
            if row is None:
                return False
            with self._cond:
                self._rows.append(_as_tensors(row))
                self._cond.notify_all()
        return True

    def _background(self, iterator: Any, rows: Iterator) -> None:
        try:
            self._read(rows, self._steps)
        except BaseException as exc:  # noqa: BLE001 - raised in the trial's thread when it reads past here
            self._error = exc
        finally:
            try:
                _release(iterator)
            finally:
                with self._cond:
                    self._done = True
                    self._cond.notify_all()

    def _wait(self, count: Optional[int]) -> None:
        """Wait until ``count`` training batches are read (None: all), the reader is done, or it failed.

        Starts the reader when those batches are not read yet and it has not started.
        """
        if self._pending is not None and (count is None or len(self._rows) < count):
            self.start()
        with self._cond:
            while not self._done and (count is None or len(self._rows) < count):
                self._cond.wait()
        if self._error is not None and (count is None or len(self._rows) < count):
            self._reported = True
            raise RuntimeError(f"autotune: reading the trial's batches failed after {len(self._rows)} batches: "
                               f"{type(self._error).__name__}: {self._error}") from self._error

    @property
    def read(self) -> int:
        """Training batches read so far (without waiting)."""
        return len(self._rows)

    def __len__(self) -> int:
        self._wait(None)
        return len(self._rows)

    def __getitem__(self, index: Union[int, slice]) -> Any:
        if isinstance(index, slice):
            stop = index.stop
            self._wait(None if stop is None or stop < 0 or index.start is not None and index.start < 0 else stop)
            return self._rows[index]
        self._wait(None if index < 0 else index + 1)
        return self._rows[index]

    def close(self) -> None:
        """Stop the reader (the batches not read yet are not needed), wait for it; its iterator is released."""
        with self._cond:
            self._stop.set()
            pending, self._pending = self._pending, None
        if pending is not None:  # never started: nothing more is read; the pipeline stops now
            try:
                _release(pending[0])
            finally:
                with self._cond:
                    self._done = True
                    self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None and not self._reported:
            self._reported = True
            logger.warning("autotune: reading the trial's batches in the background failed after %d batches (%s: %s); "
                           "the trial used the batches read before", len(self._rows), type(self._error).__name__,
                           self._error)


def count_conv2d(network: Any) -> int:
    """``nn.Conv2d`` cells of ``network`` (exactly that type: what the ``cpu_gemm_conv`` rewrite replaces)."""
    if not isinstance(network, nn.Cell):
        return 0
    return sum(1 for _, cell in network.cells_and_names() if type(cell) is nn.Conv2d)  # noqa: E721


def batch_size_of(batch: Sequence[Tensor]) -> int:
    """Samples in a batch: the first dimension of its first column."""
    shape = tuple(batch[0].shape)
    return int(shape[0]) if shape else 1

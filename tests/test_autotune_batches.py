"""The trial's batches (ms_boost.autotune.cells.TrialBatches): the first batches of one pass, in order, the ones
past the first probe's read by a background thread only when the trial goes on past its first probe (or asks for
them); nothing of it outlives the trial.

References are the numpy arrays the data sets are sliced from; nothing is timed.
"""
from __future__ import annotations

import logging
import threading
from typing import List

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn
from mindspore.dataset.engine import iterators

import ms_boost.model as ms_model
from ms_boost import Model
from ms_boost.autotune import engine
from ms_boost.autotune.candidates import TrialContext
from ms_boost.autotune.cells import TrialBatches
from ms_boost.autotune.options import AutotuneOptions
from tests.helpers.nets import all_params, dataset, learnable_data, make_net

MODES = [ms.PYNATIVE_MODE, ms.GRAPH_MODE]
BATCH = 16
READER = "autotune-batches"


def _readers():
    return [t for t in threading.enumerate() if t.name == READER]


def _live_iterators() -> int:
    return sum(1 for ref in iterators.ITERATORS_LIST if ref() is not None)


def _expected(x, y, first, count):
    """Batches ``first`` .. ``first + count - 1`` of the unshuffled, batched arrays."""
    return [(x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH]) for i in range(first, first + count)]


def _same(got, want):
    assert len(got) == len(want)
    for batch, (bx, by) in zip(got, want):
        assert np.array_equal(batch[0].asnumpy(), bx) and np.array_equal(batch[1].asnumpy(), by)


@pytest.mark.parametrize("holdout,steps,ready", [(2, 6, 3), (0, 6, 3), (2, 3, 3), (1, 5, 0)])
def test_the_batches_are_the_first_of_one_pass_held_out_first_whoever_reads_them(holdout, steps, ready):
    x, y = learnable_data(160)  # 10 batches
    live = _live_iterators()
    batches = TrialBatches(dataset(x, y, BATCH), holdout, steps, ready=ready)
    background = 0 < ready < steps
    assert batches.read == (ready if background else steps)  # the first probe's batches are there at once
    assert not _readers() and batches.started is not background  # the rest is read only when asked for
    _same(batches.holdout, _expected(x, y, 0, holdout))
    _same(batches[:ready or steps], _expected(x, y, holdout, ready or steps))  # a bounded slice
    _same(batches[:], _expected(x, y, holdout, steps))  # all of them: waits for the reader
    assert len(batches) == steps
    _same([batches[-1]], _expected(x, y, holdout + steps - 1, 1))
    batches.close()
    assert not _readers() and _live_iterators() == live  # the reader ended and released its iterator


def test_a_short_data_set_gives_what_it_has():
    x, y = learnable_data(96)  # 6 batches
    batches = TrialBatches(dataset(x, y, BATCH), 2, 10, ready=3)
    _same(batches[:], _expected(x, y, 2, 4))
    assert len(batches) == 4 and batches[:10] == batches[:]
    batches.close()
    assert not _readers()
    empty = TrialBatches(dataset(x, y, BATCH), 7, 3, ready=3)  # the held-out batches take the whole pass
    assert len(empty.holdout) == 6 and len(empty) == 0 and empty[:1] == []
    empty.close()


class _Gated:
    """A data set whose rows past ``open_rows`` wait for ``gate``; it records what was read and released."""

    def __init__(self, rows: int, open_rows: int, fail_at: int = -1):
        self.rows, self.open_rows, self.fail_at = rows, open_rows, fail_at
        self.gate, self.read, self.stopped = threading.Event(), 0, 0

    def create_tuple_iterator(self, num_epochs=1, output_numpy=True):
        return _GatedIterator(self)


class _GatedIterator:
    def __init__(self, owner: _Gated):
        self.owner = owner

    def __iter__(self):
        return self

    def __next__(self):
        owner = self.owner
        if owner.read >= owner.rows:
            raise StopIteration
        if owner.read >= owner.open_rows:
            owner.gate.wait()
        if owner.read == owner.fail_at:
            raise OSError(f"unreadable row {owner.read}")
        owner.read += 1
        return np.full((2, 3), owner.read, np.float32), np.full((2,), owner.read, np.int32)

    def stop(self):
        self.owner.stopped += 1


def test_a_reader_never_started_reads_nothing_more_and_close_releases_its_iterator():
    data = _Gated(rows=50, open_rows=50)
    batches = TrialBatches(data, 1, 40, ready=3)  # 1 held out + 3 read now; nothing else until asked
    assert [int(b[0].asnumpy()[0, 0]) for b in batches[:3]] == [2, 3, 4]
    assert data.read == 4 and data.stopped == 0 and not _readers()
    batches.close()
    assert data.read == 4 and data.stopped == 1 and not _readers() and len(batches) == 3
    batches.start()  # after close: nothing is read
    assert data.read == 4 and not _readers()
    batches.close()
    assert data.stopped == 1


def test_close_stops_the_reader_after_the_batch_it_is_reading_and_releases_the_iterator():
    data = _Gated(rows=50, open_rows=4)
    batches = TrialBatches(data, 1, 40, ready=3)  # 1 held out + 3 read now; the reader will wait at the 5th row
    assert batches.read == 3 and [int(b[0].asnumpy()[0, 0]) for b in batches[:3]] == [2, 3, 4]
    batches.start()
    batches.start()  # a second start does nothing
    assert len(_readers()) == 1
    closer = threading.Thread(target=batches.close)
    closer.start()
    batches._stop.wait()  # close() asked the reader to stop; let the row it waits for through
    data.gate.set()
    closer.join()
    assert data.read == 5 and data.stopped == 1 and not _readers()
    assert len(batches) == 4  # what was read stays readable; nothing more is read
    batches.close()  # a second close does nothing
    assert data.stopped == 1


def test_a_read_failure_in_the_background_is_raised_where_the_batch_is_needed_and_logged_if_never(caplog):
    data = _Gated(rows=20, open_rows=20, fail_at=6)
    batches = TrialBatches(data, 0, 10, ready=3)
    assert len(batches[:3]) == 3  # the first probe's batches are fine
    with pytest.raises(RuntimeError, match=r"reading the trial's batches failed after 6 batches: OSError: unreadable "
                                           r"row 6"):
        batches[:8]
    batches.close()
    assert data.stopped == 1 and not _readers()
    unread = TrialBatches(_Gated(rows=20, open_rows=20, fail_at=5), 0, 10, ready=3)
    unread.start()
    unread._thread.join()  # the reader met the failure
    with caplog.at_level(logging.WARNING, logger="ms_boost"):
        unread.close()  # the trial never needed batch 6: the failure is logged, not lost
    assert "failed after 5 batches (OSError: unreadable row 5)" in caplog.text


@pytest.mark.parametrize("mode", MODES)
def test_a_one_probe_model_trial_reads_no_batch_past_its_probe_and_still_trains_as_plain_o0(mode, monkeypatch):
    made = []

    class Recorded(TrialBatches):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

        def _background(self, iterator, rows):
            self.reader = threading.current_thread().name
            super()._background(iterator, rows)

    monkeypatch.setattr(ms_model, "TrialBatches", Recorded)
    ms.set_context(mode=mode)
    x, y = learnable_data(256)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    net = make_net(width=4)
    opt = nn.Momentum(net.trainable_params(), 0.05, 0.9)
    live = _live_iterators()
    # 16 planned steps, budget 0.9: 14 steps would pay a probe and two progress windows of 4, so the trial may use 2
    # held-out and 4 training batches; O0 alone is tried, so it needs only its probe's 3: the 4th is never read (the
    # probe's compile has no reader beside it) and the iterator is released when the trial ends
    options = {"autotune": {"budget": 0.9, "candidates": ["O0"], "max_trial_steps": 4}}
    model = Model(net, loss, opt, boost_level="auto", boost_config_dict=options)
    model.train(1, dataset(x, y, BATCH))
    (batches,) = made
    assert not hasattr(batches, "reader") and batches.read == 3 and not _readers() and _live_iterators() == live
    _same(batches.holdout, _expected(x, y, 0, 2))
    _same(batches[:], _expected(x, y, 2, 3))
    assert model.autotune_report.pick == "O0" and model.autotune_report.trial_steps == 3
    plain_net = make_net(width=4)
    plain_opt = nn.Momentum(plain_net.trainable_params(), 0.05, 0.9)
    Model(plain_net, loss, plain_opt).train(1, dataset(x, y, BATCH))
    auto_state, plain_state = {**all_params(net), **all_params(opt)}, {**all_params(plain_net), **all_params(plain_opt)}
    assert auto_state.keys() == plain_state.keys()
    assert all(np.array_equal(auto_state[k], plain_state[k]) for k in plain_state)


class _Source(list):
    """The trial's batches as a list that records when the engine starts and stops reading the rest."""

    def __init__(self, rows, log):
        super().__init__(rows)
        self.log = log

    def start(self):
        self.log.append("start reading")

    def close(self):
        self.log.append("stop reading")


@pytest.mark.parametrize("candidates,events", [
    (["O0"], ["build O0", "O0 step", "O0 step", "O0 step", "stop reading"]),
    (["O0", "grad_accumulation_2"], ["build O0", "O0 step", "O0 step", "O0 step", "start reading",
                                     "build grad_accumulation_2", "grad_accumulation_2 step"]),
])
def test_the_engine_starts_reading_the_rest_only_before_a_second_probe(candidates, events):
    log: List[str] = []

    class Run:
        def __init__(self, name):
            self.name, self.train_cell, self.on_originals = name, object(), False

        def step(self, *batch):
            log.append(f"{self.name} step")
            return 1.0

        def holdout_loss(self, batches):
            return 1.0

        def restore(self):
            pass

    def build(boost, on_originals):
        name = "grad_accumulation_2" if boost.enabled("grad_accumulation") else "O0"
        log.append(f"build {name}")
        return Run(name)

    ctx = TrialContext(ranks=1, batch_size=BATCH, planned_steps=200, user_sections={}, device="CPU")
    options = AutotuneOptions(candidates=candidates, time_budget=False, measure_progress=False)
    batches = _Source([(np.zeros(1),)] * 10, log)
    engine.run_trials(build, ctx, options, batches, [])
    assert log[:len(events)] == events and log.count("start reading") == len(candidates) - 1
    assert log[-1] == "stop reading"

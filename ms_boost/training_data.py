"""What ``Model`` reads of a training data set before training: its batch size and a short last batch.

MindSpore's ``batch(n, drop_remainder=False)`` over a row count that ``n`` does not divide ends every epoch with a
shorter batch. Algorithms whose numbers depend on the batches being equal say so through their spec's
``warn_data`` hook (:class:`~ms_boost.spec.TrainingData`).
"""
from __future__ import annotations

from typing import Any, Optional

from ms_boost.spec import TrainingData

__all__ = ["describe_training_data"]


def _outermost_batch(dataset) -> Optional[Any]:
    """The ``batch`` node closest to the data set's output, following single-child nodes (repeat, map, project...)."""
    from mindspore.dataset.engine.datasets import BatchDataset

    node = dataset
    while node is not None:
        if isinstance(node, BatchDataset):
            return node
        children = getattr(node, "children", None) or []
        node = children[0] if len(children) == 1 else None
    return None


def _size_without_a_pass(dataset) -> bool:
    """Whether MindSpore knows ``dataset``'s row count without reading it.

    Not below a ``filter`` or a generator source without a length (``GeneratorDataset`` over a generator function:
    ``source_len`` -1).
    """
    from mindspore.dataset.engine.datasets import FilterDataset

    pending = [dataset]
    while pending:
        node = pending.pop()
        source_len = getattr(node, "source_len", None)
        if isinstance(node, FilterDataset) or (isinstance(source_len, int) and source_len < 0):
            return False
        pending.extend(getattr(node, "children", None) or [])
    return True


def describe_training_data(dataset) -> TrainingData:
    """The batch size of ``dataset``'s outermost ``batch`` and, when an epoch ends with a shorter batch, its rows.

    Reads the row count below that ``batch`` only where MindSpore knows it without a pass over the data (not below a
    ``filter`` or a generator source without a length: the last batch is then left unknown), and callers ask only
    when an enabled algorithm has a ``warn_data`` hook. Anything not known (no ``batch``, a per-batch size function,
    a data set that is not a MindSpore one) is left None.
    """
    batch = _outermost_batch(dataset)
    size = getattr(batch, "batch_size", None)
    if batch is None or isinstance(size, bool) or not isinstance(size, int) or size < 1:
        return TrainingData()
    if getattr(batch, "drop_remainder", True) is not False or len(batch.children) != 1 \
            or not _size_without_a_pass(batch.children[0]):
        return TrainingData(batch_size=size)
    rows = int(batch.children[0].get_dataset_size())
    last = rows % size
    return TrainingData(batch_size=size, last_batch=last if last else None)

r"""AdaSum: adaptive summation of the per-server weight updates (Maleki et al., 2020).

Two update vectors are combined, per parameter tensor, as

.. math::

    \operatorname{AdaSum}(g_1, g_2) = \Bigl(1 - \frac{g_1^\top g_2}{2\lVert g_1\rVert^2}\Bigr) g_1
                                    + \Bigl(1 - \frac{g_1^\top g_2}{2\lVert g_2\rVert^2}\Bigr) g_2 ,

so orthogonal updates add (:math:`g_1 + g_2`) and identical ones average (:math:`g`). Over :math:`n`
servers the pairs form a tree over contiguous blocks of ranks (the tutorial's
:math:`\operatorname{AdaSum}(g_{[0,n)}) = \operatorname{AdaSum}(\operatorname{AdaSum}(g_{[0,n/2)}),
\operatorname{AdaSum}(g_{[n/2,n)}))`): servers 0 and 1 pair first, then {0,1} with {2,3}, and so on.

**Any number of servers.** Level by level, neighbouring blocks pair up; when a level has an odd
number of blocks, the last one (the *leftover*) is carried up unchanged and pairs at a later level.
Equivalently, :math:`[a, b)` splits at :math:`a + p` with :math:`p` the largest power of two below
:math:`b - a`, and equivalently again, the count is padded to the next power of two with zero updates,
since :math:`\operatorname{AdaSum}(g, 0) = g`. For powers of two this is exactly the tutorial's tree.
Three servers give :math:`\operatorname{AdaSum}(\operatorname{AdaSum}(g_0, g_1), g_2)`.

**What is combined.** As in the tutorial (and unlike the paper's gradients), the combined vectors are
the *weight deltas* of the local optimizer step, :math:`\Delta = w_{\text{after}} - w_{\text{before}}`,
so every optimizer works (SGD, Momentum, LARS, Adam, ...). Each server keeps its own optimizer state
(moments are built from its own gradients, as in Horovod's delta AdaSum); every rank ends the step with
the same weights :math:`w_{\text{before}} + \operatorname{AdaSum}(\Delta_0, \dots, \Delta_{n-1})`.

**Hierarchy and transport.** The ranks are split into servers of ``device_number`` consecutive ranks
(:meth:`ms_boost.topology.Topology.server_group`); the train cell averages gradients inside a server, so
every rank of a server holds the same delta. The deltas are fused (in fp32) into buckets; for each bucket, rank
``d`` of every server contributes the ``d``-th of ``device_number`` equal shards to one world
``AllGather``, which hands every rank the full delta of every server (no byte is sent twice, and only
world collectives are needed -- MindSpore's CPU backend has AllGather on the world group only). Every
rank then evaluates the same tree, in fp32, in the same order, so the result is identical everywhere.
Each tensor starts on a chunk boundary of the fused buffer, so the per-tensor inner products and norms
of all pairs of a level are chunk sums times a 0/1 chunk-to-tensor matrix: a fixed number of
operations per level, however many tensors, and no atomics (deterministic on every backend).

Modules: :mod:`~ms_boost.adasum.math` (the formulas, numpy), :mod:`~ms_boost.adasum.layout` (buckets, shards,
the tree), :mod:`~ms_boost.adasum.stage` (the update stage), :mod:`~ms_boost.adasum.cell` (upstream's ``AdaSum``),
:mod:`~ms_boost.adasum.spec` (the ``adasum`` section and ``SPEC``).

Numerical safety: a zero-norm delta (frozen layer, zero gradient) is neutral
(:math:`\operatorname{AdaSum}(0, g) = g`, :math:`\operatorname{AdaSum}(0, 0) = 0`), never NaN; fp16
deltas are formed and combined in fp32.
"""
from __future__ import annotations

from ms_boost.adasum.cell import AdaSum
from ms_boost.adasum.layout import (
    DEFAULT_BUCKET_SIZE,
    DEFAULT_CHUNK,
    AdaSumLevel,
    FusedBucket,
    adasum_schedule,
    plan_buckets,
    server_layout,
)
from ms_boost.adasum.math import (
    adasum_coefficients,
    adasum_pair,
    adasum_rows,
    adasum_rows_segmented,
    adasum_tree_reduce,
)
from ms_boost.adasum.spec import SPEC, AdaSumConfig
from ms_boost.adasum.stage import AdaSumReduce, AdaSumUpdate

__all__ = [
    "AdaSumLevel", "adasum_schedule", "adasum_coefficients", "adasum_rows", "adasum_pair",
    "adasum_rows_segmented", "adasum_tree_reduce", "FusedBucket", "plan_buckets", "server_layout",
    "AdaSumReduce", "AdaSumUpdate", "AdaSum", "DEFAULT_BUCKET_SIZE", "DEFAULT_CHUNK", "AdaSumConfig", "SPEC",
]

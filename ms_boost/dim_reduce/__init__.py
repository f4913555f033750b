"""Dimension-reduce training (stage 2): PCA of the stage-1 weight trajectory, projected BFGS with line search.

* :mod:`ms_boost.dim_reduce.pca` -- streaming PCA of checkpoints (also ``python -m ms_boost.dim_reduce.pca``).
* :mod:`ms_boost.dim_reduce.math` -- BFGS, Armijo, projections, residual momentum (tensor functions).
* :mod:`ms_boost.dim_reduce.stage` -- the :class:`DimReduceUpdate` stage, the upstream-named
  :class:`DimReduce`, and :func:`build_dim_reduce_update` used by the train cell.

See ``docs/dim_reduce.md``.
"""
from __future__ import annotations

import warnings

from ms_boost.dim_reduce.handshake import local_pca_rows, prepare_pca_matrix
from ms_boost.dim_reduce.math import (
    armijo_accepts,
    back_project,
    bfgs_inverse_update,
    curvature_ok,
    local_row_block,
    project,
    quasi_newton_direction,
    residual_momentum,
)
from ms_boost.dim_reduce.pca import (
    compute_pca_matrix,
    infer_parameter_specs,
    list_checkpoints,
    open_pca_matrix,
    parameter_specs,
    read_flat_weights,
)
from ms_boost.dim_reduce.spec import SPEC, DimReduceConfig
from ms_boost.dim_reduce.stage import DimReduce, DimReduceUpdate, build_dim_reduce_update

# `python -m ms_boost.dim_reduce.pca` (the documented command) runs the module after this package imported it, which
# runpy reports on every run ("found in sys.modules ... unpredictable behaviour"): the command only calls main(), so
# the notice is noise to its users. This package is imported before runpy's check, so the filter is in time.
warnings.filterwarnings("ignore", message=r"'ms_boost\.dim_reduce\.pca' found in sys\.modules after import of package",
                        category=RuntimeWarning)

__all__ = [
    "DimReduce", "DimReduceUpdate", "build_dim_reduce_update", "prepare_pca_matrix", "local_pca_rows",
    "compute_pca_matrix", "open_pca_matrix", "parameter_specs", "list_checkpoints", "infer_parameter_specs",
    "read_flat_weights", "bfgs_inverse_update", "curvature_ok", "armijo_accepts", "quasi_newton_direction",
    "project", "back_project", "residual_momentum", "local_row_block", "DimReduceConfig", "SPEC",
]

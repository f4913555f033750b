"""THOR: second-order (K-FAC style) training that runs on CPU, GPU and Ascend.

* :mod:`ms_boost.thor.math` -- factor statistics, im2col, damped Cholesky block inverses, the update.
* :mod:`ms_boost.thor.layers` -- :class:`DenseThor`, :class:`Conv2dThor`, :class:`EmbeddingThor`.
* :mod:`ms_boost.thor.optimizer` -- :class:`THOR`; :mod:`ms_boost.thor.factory` -- :func:`thor`.
* :mod:`ms_boost.thor.boost` -- :func:`apply_boost_thor`; :mod:`ms_boost.thor.spec` -- its ``SPEC``.
* :mod:`ms_boost.thor.convert` -- :class:`ConvertNetUtils`, :class:`ConvertModelUtils`.
* :mod:`ms_boost.thor.checkpoint` -- :func:`load_thor_checkpoint`, :func:`convert_thor_checkpoint` (checkpoints of
  another factor layout).

Upstream-style use::

    opt = thor(net, lr, damping, momentum, weight_decay, loss_scale, batch_size, split_indices=[26, 53],
               frequency=100)
    model = ConvertModelUtils().convert_to_thor_model(model=Model(net, loss_fn=loss, optimizer=opt, ...),
                                                      network=net, loss_fn=loss, optimizer=opt, ...)

The package itself is callable: ``ms_boost.thor(net, lr, damping, momentum, ...)`` is :func:`thor` (upstream's
``mindspore.nn.thor(...)``), and ``ms_boost.thor.ConvertModelUtils`` / ``import ms_boost.thor.layers`` reach the
package's contents; ``from ms_boost import thor`` and ``from ms_boost.thor import thor`` both give something
that builds the optimizer.

or through the boost configuration: ``Model(..., boost_level="O0", boost_config_dict={"boost": {"thor": True},
"thor": {"damping": 0.03, "frequency": 100}})``, which calls :func:`apply_boost_thor`.
"""
from __future__ import annotations

import inspect
import sys
import types

from ms_boost.thor.boost import apply_boost_thor
from ms_boost.thor.checkpoint import convert_thor_checkpoint, load_thor_checkpoint
from ms_boost.thor.convert import ConvertedLayer, ConvertModelUtils, ConvertNetUtils, register_convertible
from ms_boost.thor.factory import thor
from ms_boost.thor.layers import Conv2dThor, DenseThor, EmbeddingThor, ThorLayer, thor_state_parameters
from ms_boost.thor.optimizer import THOR, ThorGuard, ThorNonFiniteError

__all__ = ["thor", "THOR", "DenseThor", "Conv2dThor", "EmbeddingThor", "ThorLayer", "ConvertNetUtils",
           "ConvertModelUtils", "ConvertedLayer", "register_convertible", "apply_boost_thor", "thor_state_parameters",
           "ThorGuard", "ThorNonFiniteError", "convert_thor_checkpoint", "load_thor_checkpoint"]


class _CallablePackage(types.ModuleType):
    """The ``ms_boost.thor`` package, callable as the :func:`thor` factory.

    ``ms_boost`` exports the factory under the package's own name (upstream's ``mindspore.nn.thor``), so one
    object has to be both: calling it builds the optimizer, its attributes are the package's.
    """

    def __call__(self, *args, **kwargs) -> THOR:
        """``thor(...)``: build the THOR optimizer (see :func:`ms_boost.thor.factory.thor`)."""
        return thor(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
__signature__ = inspect.signature(thor)  # help() and inspect show the factory's arguments

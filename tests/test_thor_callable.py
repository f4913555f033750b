"""``ms_boost.thor`` is both the THOR package and, called, the optimizer factory (upstream's ``mindspore.nn.thor``).

Every spelling users write keeps working: ``ms_boost.thor(net, ...)``, ``from ms_boost import thor``,
``from ms_boost.thor import thor, ConvertModelUtils``, ``import ms_boost.thor`` then ``ms_boost.thor.X``, and
``import ms_boost.thor.layers as L``.
"""
import importlib
import inspect

from mindspore import nn

import ms_boost
from ms_boost.thor.optimizer import THOR


def _net():
    return nn.SequentialCell([nn.Dense(4, 3)])


def test_ms_boost_thor_is_callable_after_package_import():
    importlib.import_module("ms_boost.thor.layers")
    opt = ms_boost.thor(_net(), 0.1, 0.03, 0.9)
    assert isinstance(opt, THOR)
    assert opt.frequency == 100 and opt.n_layers == 1  # the factory's defaults, the Dense layer converted
    from ms_boost import thor

    opt = thor(_net(), 0.1, 0.03, 0.9, frequency=7)
    assert isinstance(opt, THOR) and opt.frequency == 7


def test_ms_boost_thor_is_the_package():
    import ms_boost.thor
    import ms_boost.thor.layers as layers_module
    from ms_boost.thor import ConvertModelUtils, thor

    assert ms_boost.thor is importlib.import_module("ms_boost.thor")
    assert ms_boost.thor.ConvertModelUtils is ConvertModelUtils
    assert layers_module is importlib.import_module("ms_boost.thor.layers")
    assert ms_boost.thor.layers is layers_module
    assert inspect.isfunction(thor)  # the package's own ``thor`` is the factory function
    assert isinstance(thor(_net(), 0.1, 0.03, 0.9), THOR)
    # help() and inspect show the factory's arguments
    assert list(inspect.signature(ms_boost.thor).parameters)[:4] == ["net", "learning_rate", "damping", "momentum"]

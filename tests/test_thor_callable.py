"""``ms_boost.thor(...)`` is the optimizer factory even after the ms_boost.thor package was imported."""
import importlib

from mindspore import nn

import ms_boost
from ms_boost.thor.optimizer import THOR


def test_ms_boost_thor_is_callable_after_package_import():
    importlib.import_module("ms_boost.thor.layers")  # binds ms_boost.thor to the package
    net = ms_boost.ConvertNetUtils().convert_to_thor_net(nn.SequentialCell([nn.Dense(4, 3)]))
    opt = ms_boost.thor(net, 0.1, 0.03, 0.9)
    assert isinstance(opt, THOR)
    from ms_boost import thor

    assert isinstance(thor(net, 0.1, 0.03, 0.9), THOR)

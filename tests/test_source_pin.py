"""ms_boost.source_pin: a graph compiled after its source file was edited parses the text Python loaded (issue 30).

Issue 30's crash ("TypeError: The parameters number of the function is 0, but the number of provided arguments is
1" pointing at a ``def __init__(self):``, once, in a long O1 run of several seeds) is MindSpore compiling a
``construct`` from its file as it is at compile time, at the line numbers of the code loaded before an edit. The
tests write a network module to a temporary folder, import it, then move its lines (four lines inserted at the
top, the way a merge does) and compile in Graph mode.
"""
from __future__ import annotations

import importlib
import linecache
import sys

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
import pytest
from mindspore import nn

import ms_boost
from ms_boost.source_pin import SourceChangedError, pin_cell_sources

NET_SOURCE = '''import mindspore as ms
from mindspore import nn


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(3, 2, weight_init="ones", bias_init="zeros")

    def construct(self, x):
        return self.dense(x) * {scale}
'''
INSERTED = "from mindspore import nn\n\n\nclass Other:\n    pass\n"  # four lines above the class


def load_module(tmp_path, monkeypatch, name: str):
    path = tmp_path / f"{name}.py"
    path.write_text(NET_SOURCE.format(scale=1))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)  # removed again after the test
    return importlib.import_module(name), path


def move_lines(path) -> None:
    path.write_text(path.read_text().replace("from mindspore import nn\n", INSERTED, 1))


X = np.arange(6, dtype=np.float32).reshape(2, 3)


@pytest.fixture
def graph_mode():
    ms.set_context(mode=ms.GRAPH_MODE)
    yield
    ms.set_context(mode=ms.PYNATIVE_MODE)


def test_without_pinning_an_edited_file_compiles_other_lines_the_issue_30_error(tmp_path, monkeypatch, graph_mode):
    """What happened in issue 30, for reference: MindSpore alone parses the moved lines and fails (issue 30's
    TypeError; with another JIT syntax level left set by an earlier test in the process, its strict-mode error)."""
    module, path = load_module(tmp_path, monkeypatch, "pin_case_unpinned")
    net = module.Net()
    move_lines(path)
    with pytest.raises((TypeError, RuntimeError, ValueError),
                       match="The parameters number of the function is 0, but the number of provided arguments is 1"
                             "|In JIT strict mode"):
        net(ms.Tensor(X))


def test_a_model_built_before_the_edit_compiles_the_loaded_code(tmp_path, monkeypatch, graph_mode):
    """ms_boost.Model pins the network's module when built: its graphs compiled after the edit (train step, the
    evaluation, the network called directly) parse the loaded text and give the loaded code's numbers."""
    module, path = load_module(tmp_path, monkeypatch, "pin_case_model")
    net = module.Net()
    loss = nn.MSELoss()
    model = ms_boost.Model(net, loss, nn.SGD(net.trainable_params(), 0.0), metrics={"loss"})
    move_lines(path)
    assert linecache.getlines(str(path))[4] == "class Net(nn.Cell):\n"  # what inspect reads: the loaded text
    data = ds.NumpySlicesDataset({"x": X, "y": np.zeros((2, 2), np.float32)}, shuffle=False).batch(2)
    model.train(1, data, dataset_sink_mode=False)
    expected = X.sum(1, keepdims=True).repeat(2, 1)  # ones weights, zero bias, scale 1
    assert model.eval(data, dataset_sink_mode=False)["loss"] == pytest.approx(float((expected ** 2).mean()))
    np.testing.assert_allclose(net(ms.Tensor(X)).asnumpy(), expected)


def test_a_file_edited_before_the_model_is_built_is_refused_naming_it(tmp_path, monkeypatch):
    module, path = load_module(tmp_path, monkeypatch, "pin_case_late")
    net = module.Net()
    move_lines(path)
    with pytest.raises(SourceChangedError, match=rf"{path} changed on disk since Python loaded module "
                                                 r"'pin_case_late': line 6, where Net.__init__ starts, now reads "
                                                 r"'pass'.*restart the process"):
        ms_boost.Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.1))


def test_a_reloaded_module_is_read_again(tmp_path, monkeypatch, graph_mode):
    """importlib.reload makes new code from the file's new text: that text is pinned and compiled."""
    module, path = load_module(tmp_path, monkeypatch, "pin_case_reload")
    pin_cell_sources([module.Net()])
    path.write_text(NET_SOURCE.format(scale=3).replace("from mindspore import nn\n", INSERTED, 1))
    module = importlib.reload(module)
    net = module.Net()
    pin_cell_sources([net])
    np.testing.assert_allclose(net(ms.Tensor(X)).asnumpy(), 3 * X.sum(1, keepdims=True).repeat(2, 1))


def test_ms_boost_pins_its_own_modules_when_imported():
    from ms_boost.grad_freeze import optimizer

    entry = linecache.cache[optimizer.__file__]
    assert entry[1] is None and entry[2][optimizer.FreezeOpt.__init__.__code__.co_firstlineno - 1].strip() \
        .startswith("def __init__(")


def test_another_module_importing_a_function_keeps_the_pinned_text(tmp_path, monkeypatch, graph_mode):
    """A module holding one function of a pinned file (``from ... import``) sees only part of that file's code:
    pinning it later (the next Model, or ms_boost's own modules, which import each other's functions) keeps the
    text pinned first. Before, such a partial view read the file again and pinned what it read whenever the
    function's own first line still fit: an edit that moves no ``def`` was then compiled against the loaded code
    (here the scale 5 of the edited file instead of the loaded 1)."""
    module, path = load_module(tmp_path, monkeypatch, "pin_case_view")
    path.write_text(path.read_text() + "\n\ndef helper():\n    return 1\n")  # before the import: part of the code
    module = importlib.reload(module)
    user = tmp_path / "pin_case_view_user.py"
    user.write_text("from pin_case_view import helper\n")
    monkeypatch.delitem(sys.modules, "pin_case_view_user", raising=False)
    net = module.Net()
    pin_cell_sources([net])
    path.write_text(path.read_text().replace("* 1", "* 5"))  # no line moves
    from ms_boost.source_pin import pin_module_sources

    pin_module_sources(importlib.import_module("pin_case_view_user"))
    np.testing.assert_allclose(net(ms.Tensor(X)).asnumpy(), X.sum(1, keepdims=True).repeat(2, 1))


def test_the_test_processes_source_memo_answers_as_inspect(tmp_path, monkeypatch):
    """tests/helpers/source_memo.py (MindSpore's parser in the test processes): the same answer as
    ``inspect.getsourcelines``, again from memory, and after the file changed on disk the new file's answer."""
    import os

    from tests.helpers import source_memo

    path = tmp_path / "memo_case.py"
    path.write_text("def f(x):\n    return x + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "memo_case", raising=False)
    module = importlib.import_module("memo_case")
    first = source_memo.getsourcelines(module.f)
    assert first == source_memo._ORIGINAL(module.f) == (["def f(x):\n", "    return x + 1\n"], 1)
    assert source_memo.getsourcelines(module.f) == first and module.f.__code__ in source_memo._MEMO
    path.write_text("# moved\n\ndef f(x):\n    return x + 2\n")
    os.utime(path, (1, 1))  # another modification time whatever the clock's resolution
    after = source_memo.getsourcelines(module.f)  # first, so that it notices the change by itself
    assert after == source_memo._ORIGINAL(module.f) and after != first

"""bench/thor_plain_kernels.py refuses a run whose timed rounds would hold no refresh step (it failed at the end with
a KeyError, after compiling every cell)."""
from __future__ import annotations

import pytest

from bench import thor_plain_kernels


@pytest.mark.parametrize("argv", [["--rounds", "5"], ["--rounds", "9", "--frequency", "10"],
                                  ["--rounds", "4", "--frequency", "0"]])
def test_too_few_rounds_for_a_refresh_is_refused_by_name(argv, capsys):
    with pytest.raises(SystemExit) as stopped:
        thor_plain_kernels.main(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "--rounds" in err and "--frequency" in err and "refresh step" in err

"""The benchmark report's figures and summary page render from tiny result files (bench/plots.py, bench/__main__.py)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from bench import __main__ as runner
from bench import plots


def _tiny_results(folder):
    overhead = {"modes": {"pynative": {"ratios": {"mindspore O0 (twin) / mindspore O0": 1.03,
                                                  "ms_boost O0 / mindspore O0": 0.99,
                                                  "ms_boost O1 / upstream O1": 0.97},
                                       "ratio_quartiles": {"ms_boost O1 / upstream O1": [0.93, 1.01]}}}}
    dim = {"pca": {"data": {"runs": [{"weights": 10 ** 6, "seconds": 20.0, "peak_rss_mb": 1200.0},
                                     {"weights": 5 * 10 ** 6, "seconds": 90.0, "peak_rss_mb": 1100.0}],
                            "upstream": [{"weights": 10 ** 6, "seconds": 50.0, "peak_rss_mb": 2000.0}]}},
           "steps": {"data": {"runs": [{"width": 16, "weights": 703386, "mode": "graph", "ratio_median": 2.1,
                                        "ratio_quartiles": [1.9, 2.3], "noise_ratio": 1.04}]}},
           "e2e_short": {"data": {"runs": [{"seed": 0, "curve_stage1": [0.3, 0.5, 0.7], "curve_plain": [0.72, 0.75],
                                            "curve_dim_reduce": [0.71, 0.78]}]}}}
    adasum = {"convergence": {"table": {"mean": {"acc": [0.5, 0.7, 0.8]}, "adasum": {"acc": [0.55, 0.72, 0.83]}}},
              "steptime": {"rows": {"2/graph/TinyConvNet 16x16": {"ratio": 0.9}}}}
    for name, data in (("overhead", overhead), ("dim_reduce", dim), ("adasum", adasum)):
        (folder / f"{name}.json").write_text(json.dumps(data), encoding="utf-8")


def _is_png(path):
    with open(path, "rb") as handle:
        assert handle.read(8) == b"\x89PNG\r\n\x1a\n", path
    image = np.asarray(Image.open(path).convert("L"), dtype=np.float64)
    assert image.shape[0] > 100 and image.shape[1] > 200
    assert image.std() > 5  # something was drawn, not a blank canvas


def test_every_figure_renders_from_tiny_results(tmp_path):
    _tiny_results(tmp_path)
    written = plots.render_all(tmp_path)
    names = sorted(p.name for p in written)
    assert names == ["adasum_accuracy.png", "dim_reduce_e2e_short_seed0_accuracy.png", "pca_scaling.png",
                     "step_ratios.png"]
    for png in written:
        _is_png(png)
    rows, noise = plots.ratio_rows(tmp_path)
    assert noise == pytest.approx(0.04)  # the larger of the two noise floors (1.03 and 1.04 against 1)
    assert [r[0] for r in rows] == ["ms_boost O0 / mindspore O0 (pynative)",
                                    "ms_boost O1 / upstream O1 (pynative)", "DimReduce / SGD, width 16 (graph)",
                                    "AdaSum / mean, TinyConvNet, 2 workers (graph)"]
    assert rows[1][2] == (0.93, 1.01) and rows[2][2] == (1.9, 2.3)


def test_summary_page_lists_ratios_noise_figures_and_machine(tmp_path):
    _tiny_results(tmp_path)
    pngs = plots.render_all(tmp_path)
    status = [{"name": "overhead", "status": "ok", "seconds": 1.0, "load_before": [1.0, 2.0, 3.0], "exit_code": 0}]
    page = runner.write_summary(tmp_path, status, True, pngs, [0.5, 0.5, 0.5]).read_text(encoding="utf-8")
    assert "| ms_boost O1 / upstream O1 | pynative | 0.970 | 1.030 |" in page
    assert "| DimReduce step / SGD step, ResNet-18 width 16 (703,386 weights) | graph | 2.10 | 1.04 |" in page
    assert "![step_ratios](step_ratios.png)" in page and "python -m bench --quick" in page
    assert "Load average" in page and "MindSpore" in page


def test_registry_names_existing_scripts_and_rejects_unknown_names(capsys):
    names = [r.name for r in runner.REGISTRY]
    assert len(names) == len(set(names))
    for run in runner.REGISTRY:
        assert (runner.ROOT / "bench" / run.script).is_file(), run.script
    assert runner.main(["--list"]) == 0
    assert "dim_reduce_steps" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        runner.main(["--only", "no_such_bench"])
    assert "no_such_bench" in capsys.readouterr().err

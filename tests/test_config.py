"""AutoBoost: levels, modes, sections, aliases, files, exclusivity and one test per kind of mistake."""
from __future__ import annotations

import json
import warnings

import pytest

from ms_boost import AutoBoost
from ms_boost.config import LEVELS, SWITCHES


def on(cfg):
    return sorted(k for k, v in cfg.boost_config.items() if v)


# upstream's levels plus cpu_gemm_conv at O1/O2 (ms_boost's CPU convolution rewrite; a no-op on other devices)
@pytest.mark.parametrize("level,expected", [("O0", []), ("O1", ["cpu_gemm_conv", "grad_freeze", "less_bn"]),
                                            ("O2", ["adasum", "cpu_gemm_conv", "grad_freeze", "less_bn"])])
def test_levels_match_upstream(level, expected):
    cfg = AutoBoost(level)
    assert cfg.level == level and cfg.mode == "auto"
    assert on(cfg) == expected
    assert set(cfg.boost_config) == set(SWITCHES)


def test_two_instances_coexist_no_singleton():
    a = AutoBoost("O1")
    b = AutoBoost("O2", {"common": {"device_number": 2}})
    assert a.level == "O1" and b.level == "O2"
    assert not a.enabled("adasum") and b.enabled("adasum")
    assert a.common.device_number == 8 and b.common.device_number == 2
    # the level table is never written to
    assert LEVELS["O1"]["adasum"] is False


def test_manual_mode_applies_switches_and_keeps_level_defaults():
    cfg = AutoBoost("O0", {"boost": {"mode": "manual", "grad_accumulation": True},
                           "grad_accumulation": {"grad_accumulation_step": 4}})
    assert on(cfg) == ["grad_accumulation"]
    assert cfg.grad_accumulation.grad_accumulation_step == 4
    cfg = AutoBoost("O2", {"boost": {"mode": "manual", "less_bn": False, "grad_freeze": False, "adasum": True,
                                     "grad_accumulation": False, "dim_reduce": False}})
    assert on(cfg) == ["adasum", "cpu_gemm_conv"]  # a switch not given keeps its level default
    cfg = AutoBoost("O2", {"boost": {"mode": "manual", "less_bn": False, "grad_freeze": False, "cpu_gemm_conv": False}})
    assert on(cfg) == ["adasum"]


def test_enable_all_and_disable_all():
    assert on(AutoBoost("O0", {"boost": {"mode": "disable_all"}})) == []
    cfg = AutoBoost("O0", {"boost": {"mode": "enable_all"}})
    assert on(cfg) == ["adasum", "cpu_gemm_conv", "grad_accumulation", "grad_freeze", "less_bn"]


def test_auto_mode_with_switches_warns_not_silent():
    with pytest.warns(UserWarning, match="ignores the switches"):
        cfg = AutoBoost("O1", {"boost": {"mode": "auto", "adasum": True}})
    assert not cfg.enabled("adasum")


def test_tutorial_dim_reduce_dict_with_upstream_sample_spellings():
    cfg = AutoBoost("O1", {
        "boost": {"mode": "manual", "dim_reduce": True},
        "common": {"device_num": 8},
        "dim_reduce": {"rho": 0.55, "gamma": 0.9, "alpha": 0.001, "sigma": 0.4, "n_component": 32,
                       "pca_mat_path": None, "weight_load_dir": "./ckpt", "timeout": 1200}})
    assert on(cfg) == ["dim_reduce"]  # runs alone: the O1 defaults were switched off
    assert cfg.common.device_number == 8
    assert cfg.dim_reduce.n_components == 32 and cfg.dim_reduce.timeout == 1200
    assert cfg.dim_reduce.weight_load_dir == "./ckpt"
    assert any("runs alone" in n for n in cfg.notes)


def test_exclusivity_warns_naming_what_was_switched_off():
    with pytest.warns(UserWarning, match=r"'dim_reduce' runs alone: switched off \['adasum'\]"):
        cfg = AutoBoost("O0", {"boost": {"mode": "manual", "dim_reduce": True, "adasum": True}})
    assert on(cfg) == ["dim_reduce"]
    with pytest.warns(UserWarning, match=r"'thor' runs alone: switched off \['grad_accumulation'\]"):
        cfg = AutoBoost("O0", {"boost": {"mode": "manual", "thor": True, "grad_accumulation": True}})
    assert on(cfg) == ["thor"]


def test_config_from_yaml_and_json_files(tmp_path):
    y = tmp_path / "b.yaml"
    y.write_text("boost:\n  mode: manual\n  grad_freeze: true\ngrad_freeze:\n  freeze_p: 0.5\n  param_groups: 4\n")
    cfg = AutoBoost("O0", str(y))
    assert on(cfg) == ["grad_freeze"] and cfg.grad_freeze.freeze_p == 0.5 and cfg.grad_freeze.param_groups == 4
    j = tmp_path / "b.json"
    j.write_text(json.dumps({"boost": {"mode": "manual", "adasum": True}, "common": {"device_number": 1}}))
    cfg = AutoBoost("O0", j)
    assert on(cfg) == ["adasum"] and cfg.common.device_number == 1


def test_user_dict_is_not_modified():
    d = {"boost": {"mode": "manual", "dim_reduce": True, "less_bn": True}, "dim_reduce": {"n_component": 4}}
    snapshot = json.dumps(d, sort_keys=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        AutoBoost("O1", d)
    assert json.dumps(d, sort_keys=True) == snapshot


def test_summary_names_stages_and_values():
    cfg = AutoBoost("O2", {"common": {"device_number": 4}, "grad_freeze": {"freeze_p": 0.25}})
    text = cfg.summary(ranks=8)
    assert "level=O2" in text and "adasum" in text and "freeze_p': 0.25" in text
    assert "mean within each server (4 rank(s) per server) -> " in text
    pipeline = text.split("pipeline: ")[1].split("\n")[0]  # AdaSum combines what the optimizer produced: last
    assert pipeline.endswith("-> optimizer on this step's unfrozen groups -> AdaSum of the servers' weight deltas "
                             "across 2 servers")
    # fewer ranks than device_number: one server, AdaSum is inactive and the summary says so
    assert "across 2 ranks (one server of common.device_number=4: AdaSum inactive)" in cfg.summary(ranks=2)
    # not distributed (no communication initialised in the test process): no reduction at all
    assert "no gradient reduction (1 rank); AdaSum inactive" in cfg.summary()
    assert "mean all-reduce across 4 ranks (data parallel)" in AutoBoost("O1").summary(ranks=4)
    # the O1 pipeline line the CPU launcher printed for 2 ranks (its real run now only covers O2, test_scripts.py)
    assert ("pipeline: mean all-reduce across 2 ranks (data parallel) -> nn.Conv2d as im2col + GEMM (layers left "
            "alone are logged) -> optimizer on this step's unfrozen groups" in AutoBoost("O1").summary(ranks=2))
    with pytest.raises(ValueError, match="ranks=0"):
        cfg.summary(ranks=0)
    assert cfg.to_dict()["grad_freeze"]["freeze_p"] == 0.25


# ---- one test per kind of mistake ---------------------------------------------------------------
@pytest.mark.parametrize("level", ["O3", "o1", ""])
def test_unknown_level(level):
    with pytest.raises(ValueError, match="allowed: \\['O0', 'O1', 'O2'\\]"):
        AutoBoost(level)


def test_an_unknown_level_given_to_model_lists_auto_among_the_allowed_levels():
    """Model (and the zoo's --boost_level) take 'auto' too; the error listed only O0/O1/O2, so a user who had
    typed 'Auto' or 'O7' never learnt that the measured trial was one of the choices."""
    from mindspore import nn

    from ms_boost import Model

    net = nn.Dense(2, 2)
    opt = nn.Momentum(net.trainable_params(), 0.1, 0.9)
    with pytest.raises(ValueError, match=r"^boost_level='Auto' is not a boost level; allowed: \['O0', 'O1', 'O2'\], "
                                         r"or 'auto' for ms_boost.Model"):
        Model(net, nn.MSELoss(), opt, boost_level="Auto")


def test_level_wrong_type():
    with pytest.raises(TypeError, match="boost_level must be a str"):
        AutoBoost(1)


def test_unknown_mode():
    with pytest.raises(ValueError, match="'boost.mode'='fast'.*allowed"):
        AutoBoost("O1", {"boost": {"mode": "fast"}})


def test_unknown_section():
    with pytest.raises(ValueError, match="unknown boost config section.*'dimreduce'.*allowed sections"):
        AutoBoost("O1", {"dimreduce": {}})


def test_unknown_key_names_path_and_allowed():
    with pytest.raises(ValueError, match=r"'dim_reduce.n_comp'.*allowed keys.*n_components"):
        AutoBoost("O1", {"dim_reduce": {"n_comp": 3}})
    with pytest.raises(ValueError, match=r"'boost.lessbn'"):
        AutoBoost("O1", {"boost": {"mode": "manual", "lessbn": True}})


def test_alias_and_canonical_given_twice():
    # journeys, second round: both spellings named (a user recipe's device_num over its base's device_number said
    # "given twice (as 'device_number' and its alias)", although the user wrote one)
    with pytest.raises(ValueError, match=r"^boost config 'common\.device_number' is given twice, as "
                                         r"'common\.device_num' and as 'common\.device_number' \(two spellings"):
        AutoBoost("O1", {"common": {"device_num": 8, "device_number": 8}})


@pytest.mark.parametrize("section,key,value,kind", [
    ("less_bn", "fn_flag", 1, TypeError),
    ("grad_freeze", "param_groups", 2.5, TypeError),
    ("grad_freeze", "param_groups", True, TypeError),
    ("dim_reduce", "rho", "0.5", TypeError),
    ("dim_reduce", "pca_mat_path", 3, TypeError),
    ("common", "gradient_split_groups", "50", TypeError),
    ("boost", "adasum", "yes", TypeError),
])
def test_wrong_type(section, key, value, kind):
    d = {section: {key: value}}
    if section == "boost":
        d["boost"]["mode"] = "manual"
    with pytest.raises(kind, match=rf"boost config {section}\.{key} must be"):
        AutoBoost("O1", d)


@pytest.mark.parametrize("section,key,value", [
    ("grad_freeze", "freeze_p", 1.5), ("grad_freeze", "freeze_p", -0.1), ("grad_freeze", "param_groups", 0),
    ("grad_freeze", "freeze_type", 2), ("grad_accumulation", "grad_accumulation_step", 0),
    ("dim_reduce", "rho", 1.0), ("dim_reduce", "sigma", 0.0), ("dim_reduce", "n_components", 0),
    ("dim_reduce", "timeout", 0), ("common", "device_number", 0), ("common", "gradient_split_groups", [100, 50]),
    ("thor", "frequency", 0), ("thor", "damping", -1.0),
])
def test_out_of_range(section, key, value):
    with pytest.raises(ValueError, match=rf"boost config {section}\.{key}=.*(out of range; allowed|increasing)"):
        AutoBoost("O1", {section: {key: value}})


def test_section_wrong_type_and_dict_wrong_type():
    with pytest.raises(TypeError, match="section 'grad_freeze' must be a dict"):
        AutoBoost("O1", {"grad_freeze": [1, 2]})
    with pytest.raises(TypeError, match="boost_config_dict must be a dict"):
        AutoBoost("O1", 42)


def test_count_values_counts_shared_objects_each_time_and_stops_past_the_limit():
    from ms_boost.validation import count_values

    leaf = ["x"] * 10
    level = [leaf] * 10  # one list object referenced 10 times, as a YAML alias expands
    assert count_values({"a": level, "b": 1}, 10**6) == 1 + (1 + 10 * (1 + 10)) + 1
    assert count_values({"a": [level] * 10}, 50) == 51  # stops just past the limit


def test_missing_or_bad_config_file(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        AutoBoost("O1", str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json' is not valid JSON"):
        AutoBoost("O1", str(bad))
    # a few hundred bytes of nested YAML aliases standing for 10**8 values: refused before anything expands
    bomb = tmp_path / "bomb.yaml"
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 8)]
    bomb.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"bomb.yaml' expands to more than 100000 values") as err:
        AutoBoost("O1", str(bomb))
    assert len(str(err.value)) < 400


def test_enabled_unknown_name():
    with pytest.raises(ValueError, match="unknown boost algorithm"):
        AutoBoost("O1").enabled("turbo")


# ---- bounded, well-named errors (issue 12 item 4) -------------------------------------------------
def test_integers_bounded_by_their_counters():
    with pytest.raises(ValueError, match=r"grad_accumulation_step=2147483648 is out of range; allowed: "
                                         r"1 <= value <= 2147483647 \(the micro-step counter is an int32\)"):
        AutoBoost("O0", {"grad_accumulation": {"grad_accumulation_step": 2 ** 31}})
    assert AutoBoost("O0", {"grad_accumulation": {"grad_accumulation_step": 2 ** 31 - 1}}) \
        .grad_accumulation.grad_accumulation_step == 2 ** 31 - 1
    with pytest.raises(ValueError, match=r"thor\.frequency=2147483648 .*int32"):
        AutoBoost("O0", {"thor": {"frequency": 2 ** 31}})
    assert AutoBoost("O0", {"thor": {"stat_fraction": 0.25}}).thor.stat_fraction == 0.25
    assert AutoBoost("O0", {}).thor.stat_fraction == 1.0
    with pytest.raises(ValueError, match=r"thor\.stat_fraction=0 is out of range; allowed: 0 < value <= 1"):
        AutoBoost("O0", {"thor": {"stat_fraction": 0}})
    # total_steps: 10**12 as an int is a valid schedule length (the schedule is built lazily); int64 bounds it
    assert AutoBoost("O1", {"grad_freeze": {"total_steps": 10 ** 12}}).grad_freeze.total_steps == 10 ** 12
    with pytest.raises(ValueError, match=r"total_steps=9223372036854775808 is out of range.*int64"):
        AutoBoost("O1", {"grad_freeze": {"total_steps": 2 ** 63}})
    with pytest.raises(TypeError, match=r"grad_freeze\.total_steps must be an int, got 1000000000000\.0"):
        AutoBoost("O1", {"grad_freeze": {"total_steps": 1e12}})


def test_duplicate_keys_rejected_naming_both_lines(tmp_path):
    y = tmp_path / "dup.yaml"
    y.write_text("boost:\n  mode: manual\ngrad_freeze:\n  freeze_p: 0.5\n  param_groups: 4\n  freeze_p: 0.9\n")
    with pytest.raises(ValueError, match=r"dup\.yaml'.*'freeze_p' is given twice in one mapping \(lines 4 and 6\)"):
        AutoBoost("O1", str(y))
    j = tmp_path / "dup.json"
    j.write_text('{\n  "boost": {"mode": "manual"},\n  "common": {\n    "device_number": 2,\n'
                 '    "device_number": 4\n  }\n}\n')
    with pytest.raises(ValueError, match=r"dup\.json'.*'device_number' is given twice in one object "
                                         r"\(lines 4 and 5\)"):
        AutoBoost("O1", str(j))
    # a YAML merge key overridden by an explicit key is not a duplicate
    ok = tmp_path / "ok.yaml"
    ok.write_text("grad_freeze:\n  <<: {freeze_p: 0.5, param_groups: 4}\n  freeze_p: 0.25\n")
    assert AutoBoost("O1", str(ok)).grad_freeze.freeze_p == 0.25


def test_invalid_utf8_names_the_file(tmp_path):
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"grad_freeze:\n  freeze_p: 0.5 # caf\xe9\n")
    with pytest.raises(ValueError, match=r"latin1\.yaml' is not valid UTF-8 \(byte 34"):
        AutoBoost("O1", str(bad))


def test_error_messages_are_bounded(tmp_path):
    # ~200 bytes of YAML aliases: printed in full, the value is 10**4 items (tens of kilobytes of message; a
    # file expanding past 100000 values is refused when read, see test_missing_or_bad_config_file)
    levels = ["&a [x, x, x, x, x, x, x, x, x, x]"]
    for prev, name in zip("abc", "bcd"):
        levels.append(f"&{name} [{', '.join([f'*{prev}'] * 10)}]")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("boost:\n  mode: [" + ", ".join(levels) + "]\n")
    assert bomb.stat().st_size < 400
    with pytest.raises(ValueError, match=r"'boost.mode'=\[\['x', 'x'.*\.\.\..*is not allowed") as info:
        AutoBoost("O1", str(bomb))
    assert len(str(info.value)) < 1000
    with pytest.raises((TypeError, ValueError)) as info:
        AutoBoost("O1", {"common": {"gradient_split_groups": ["x" * 10 ** 6]}})
    assert len(str(info.value)) < 1000 and "gradient_split_groups[0]" in str(info.value)
    with pytest.raises(ValueError) as info:
        AutoBoost("O1", {"grad_freeze": {"k" * 10 ** 6: 1}})
    assert len(str(info.value)) < 1000
    with pytest.raises(ValueError) as info:
        AutoBoost("O1", {"boost": {"mode": "m" * 10 ** 6}})
    assert len(str(info.value)) < 1000


def test_dim_reduce_carry_search_is_a_validated_key():
    boost = AutoBoost("O0", {"boost": {"mode": "manual", "dim_reduce": True},
                             "dim_reduce": {"carry_search": True}})
    assert boost.dim_reduce.carry_search is True
    assert AutoBoost("O0").dim_reduce.carry_search is False
    with pytest.raises(TypeError, match="dim_reduce.carry_search"):
        AutoBoost("O0", {"dim_reduce": {"carry_search": "yes"}})


def test_numpy_numbers_are_accepted_like_python_numbers():
    """Values read from numpy (``np.int64``, ``np.float32``) validate as the Python numbers they hold; numpy bools
    stay refused where an int is needed."""
    import numpy as np

    cfg = AutoBoost("O1", {"grad_freeze": {"param_groups": np.int64(4), "freeze_p": np.float32(0.5)},
                           "common": {"gradient_split_groups": [np.int32(3), 7]}})
    assert cfg.grad_freeze.param_groups == 4 and type(cfg.grad_freeze.param_groups) is int
    assert cfg.grad_freeze.freeze_p == 0.5 and type(cfg.grad_freeze.freeze_p) is float
    assert cfg.common.gradient_split_groups == (3, 7)
    with pytest.raises(TypeError, match=r"grad_freeze.param_groups must be an int"):
        AutoBoost("O1", {"grad_freeze": {"param_groups": np.bool_(True)}})
    with pytest.raises(ValueError, match=r"grad_freeze.freeze_p=.* is out of range"):
        AutoBoost("O1", {"grad_freeze": {"freeze_p": np.float64(1.5)}})

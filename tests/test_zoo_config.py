"""Recipe configuration: YAML inheritance, typed --key value overrides, errors, --help, every shipped recipe."""
from __future__ import annotations

import copy
import pickle
from pathlib import Path

import pytest
import yaml

from model_zoo.resnet.src.config import Config, added_keys, apply_overrides, load_yaml, parse_config, parse_value
from model_zoo.resnet.src.lr_generator import LR_DECAY_MODES
from model_zoo.resnet.src.resnet import CONV_INITS, DENSE_INITS, list_models
from model_zoo.resnet.src.trainer import (
    LOSS_SCALE_TYPES,
    OPTIMIZERS,
    boost_config_dict,
    build_optimizer,
    check_schedule_keys,
)
from ms_boost.config import AutoBoost

CONFIGS = Path(__file__).resolve().parents[1] / "model_zoo" / "resnet" / "configs"
RECIPES = sorted(p.name for p in CONFIGS.glob("*.yaml"))


@pytest.fixture
def recipe(tmp_path) -> Path:
    (tmp_path / "base.yaml").write_text(yaml.safe_dump({
        "lr": 0.1, "epochs": 3, "name": "resnet50", "flag": False, "path": None, "ids": [26, 53], "empty": [],
        "section": {"inner": 1, "deeper": {"leaf": "x"}}, "nothing": {}}))
    (tmp_path / "child.yaml").write_text("base: base.yaml\nepochs: 5  # more epochs\nsection:\n  deeper:\n"
                                         "    leaf: y  # a leaf\n")
    return tmp_path / "child.yaml"


def test_base_inheritance_deep_merges(recipe):
    data = load_yaml(recipe)
    assert data["epochs"] == 5 and data["lr"] == 0.1
    assert data["section"] == {"inner": 1, "deeper": {"leaf": "y"}}
    assert "base" not in data


def test_base_cycle_and_bad_files(tmp_path):
    (tmp_path / "a.yaml").write_text("base: b.yaml\nx: 1\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\ny: 2\n")
    with pytest.raises(ValueError, match="cycle"):
        load_yaml(tmp_path / "a.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ValueError, match="must hold a mapping"):
        load_yaml(tmp_path / "list.yaml")
    with pytest.raises(ValueError, match="does not exist"):
        load_yaml(tmp_path / "missing.yaml")
    (tmp_path / "unsafe.yaml").write_text("x: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(ValueError, match="unsafe.yaml.*not valid YAML.*python/object"):
        load_yaml(tmp_path / "unsafe.yaml")


def test_a_base_that_is_not_there_is_named_with_the_recipe_that_gives_it(tmp_path):
    """A recipe copied out of configs/ keeps ``base: resnet50_imagenet_boost_o1.yaml``; the error named only
    '<copy's folder>/resnet50_imagenet_boost_o1.yaml', not the recipe whose ``base:`` it was nor where the shipped
    recipes are."""
    (tmp_path / "mine.yaml").write_text("base: resnet50_imagenet_boost_o1.yaml\nepoch_size: 2\n")
    missing = tmp_path / "resnet50_imagenet_boost_o1.yaml"
    with pytest.raises(ValueError, match=rf"^config '{tmp_path / 'mine.yaml'}': base='resnet50_imagenet_boost_o1.yaml' "
                                         rf"names '{missing}', which does not exist or is not a file; a base is a path "
                                         rf"relative to the recipe's own folder \(the shipped recipes are in "
                                         rf"'{CONFIGS}'\)\.$"):
        load_yaml(tmp_path / "mine.yaml")
    (tmp_path / "mine.yaml").write_text(f"base: {CONFIGS / 'resnet50_imagenet_boost_o1.yaml'}\nepoch_size: 2\n")
    assert load_yaml(tmp_path / "mine.yaml")["epoch_size"] == 2  # an absolute base is read as given


def test_overrides_take_the_type_of_the_default(recipe):
    cfg = parse_config(["--lr", "1e-3", "--epochs=7", "--name", "resnet18", "--flag", "yes", "--path", "/x.npy",
                        "--ids", "8,16", "--empty", "[1, 2.5, a]", "--section.deeper.leaf", "z",
                        "--section.inner", "4"], recipe)
    assert cfg.lr == 0.001 and isinstance(cfg.lr, float)
    assert cfg.epochs == 7 and isinstance(cfg.epochs, int)
    assert cfg.name == "resnet18" and cfg.flag is True and cfg.path == "/x.npy"
    assert cfg.ids == [8, 16] and cfg.empty == [1, 2.5, "a"]
    assert cfg.section.deeper.leaf == "z" and cfg.section["inner"] == 4
    assert parse_config(["--flag"], recipe).flag is True  # a bare bool flag means true
    assert parse_config(["--path", "null"], recipe).path is None
    assert parse_config(["--ids", ""], recipe).ids == []


@pytest.mark.parametrize("args, message", [
    (["--epoch", "3"], r"unknown config key --epoch\. Did you mean: --epochs\?"),
    (["--sectoin.inner", "3"], r"Did you mean: --section.inner"),
    (["--zzz", "1"], r"unknown config key --zzz\. \(--help"),
    (["--epochs", "3.5"], r"--epochs='3.5': expected an int"),
    (["--lr", "fast"], r"--lr='fast': expected a float"),
    (["--flag", "maybe"], r"--flag='maybe': expected a bool"),
    (["--ids", "1,x"], r"--ids='x': expected an int"),
    (["--section", "1"], r"--section is a section"),
    (["--epochs"], r"--epochs needs a value"),
    (["epochs", "3"], r"unexpected command-line argument 'epochs'"),
    (["--config"], r"--config needs a file name"),
])
def test_bad_overrides_name_the_key(recipe, args, message):
    with pytest.raises(ValueError, match=message):
        parse_config(args, recipe)


def test_config_is_read_only_and_replace_copies(recipe):
    cfg = parse_config([], recipe)
    with pytest.raises(AttributeError, match="read-only"):
        cfg.lr = 1.0
    with pytest.raises(AttributeError, match="no key 'lrr'"):
        _ = cfg.lrr
    changed = cfg.replace(lr=0.5)
    assert changed.lr == 0.5 and cfg.lr == 0.1
    with pytest.raises(ValueError, match="unknown config keys"):
        cfg.replace(lrr=1)
    plain = cfg.to_dict()
    plain["section"]["inner"] = 99
    assert cfg.section.inner == 1 and isinstance(cfg, Config)
    assert copy.deepcopy(cfg).to_dict() == cfg.to_dict() and pickle.loads(pickle.dumps(cfg)).lr == 0.1


def test_help_lists_keys_values_types_and_comments(recipe, capsys):
    with pytest.raises(SystemExit) as stop:
        parse_config(["--help", "--epochs", "9"], recipe, prog="train.py")
    assert stop.value.code == 0
    text = capsys.readouterr().out
    assert "usage: train.py" in text
    assert "--epochs 9 (int)  # more epochs" in text
    assert "--section.deeper.leaf 'y' (str)  # a leaf" in text
    assert "--lr 0.1 (float)" in text and "--ids [26, 53] (list)" in text


@pytest.mark.parametrize("child, message", [
    ("epochs_total: 5\n", r"child.yaml': unknown key 'epochs_total' \(value 5\).*base '.*base.yaml'.*Did you mean: "
                           r"epochs\?"),
    ("section:\n  iner: 2\n", r"unknown key 'section.iner' \(value 2\).*Did you mean: section.inner"),
    ("flag: 'false'\n", r"flag='false' \(str\): expected a bool"),
    ("epochs: 2.5\n", r"epochs=2.5 \(float\): expected an int, as in the base '.*base.yaml' \(3\)"),
    ("epochs: three\n", r"epochs='three' \(str\): expected an int"),
    ("name: null\n", r"name=null: expected a str.*null is allowed only where the base's value is null"),
    ("ids: [1, x]\n", r"ids=\[1, 'x'\] \(list\): expected a list whose items are each an int"),
    ("section: 4\n", r"section=4 \(int\): expected a section"),
    ("lr: {a: 1}\n", r"lr=\{'a': 1\} \(dict\): expected a float"),
    ("section: {}\n", r"section is an empty section; the base .* gives it the keys \['deeper', 'inner'\]"),
])
def test_recipe_keys_and_types_are_checked_against_the_base(recipe, child, message):
    recipe.write_text("base: base.yaml\n" + child)
    with pytest.raises(ValueError, match=message):
        load_yaml(recipe)


def test_recipe_values_that_fit_the_base(recipe):
    recipe.write_text("base: base.yaml\nlr: 1\npath: 3\nempty: [a, 1]\nids: []\nnothing: {}\n")
    cfg = parse_config(["--lr", "0.5"], recipe)  # lr: 1 became 1.0, so the override parses as a float
    assert cfg.lr == 0.5 and cfg.path == 3 and cfg.empty == ["a", 1] and cfg.ids == []
    assert isinstance(load_yaml(recipe)["lr"], float)
    # the thor section may be added; boost_config_dict is open (ms_boost.AutoBoost checks it), but typed where known
    child = recipe.parent / "thor_child.yaml"
    child.write_text(f"base: {CONFIGS / 'resnet50_imagenet_boost_o1.yaml'}\nthor:\n  frequency: 5\n"
                     f"boost_config_dict:\n  adasum:\n    anything: 1\n")
    assert load_yaml(child)["thor"] == {"frequency": 5}
    child.write_text(f"base: {CONFIGS / 'resnet50_imagenet_boost_o1.yaml'}\nthor:\n  frequncy: 5\n")
    with pytest.raises(ValueError, match="unknown key 'thor.frequncy'.*Did you mean: thor.frequency"):
        load_yaml(child)
    child.write_text(f"base: {CONFIGS / 'resnet50_imagenet_boost_o1.yaml'}\n"
                     f"boost_config_dict:\n  grad_freeze:\n    freeze_p: high\n")
    with pytest.raises(ValueError, match="boost_config_dict.grad_freeze.freeze_p='high' \\(str\\): expected a float"):
        load_yaml(child)


def test_boost_config_dict_keys_a_recipe_lacks_can_be_given_on_the_command_line():
    """The Momentum recipe's boost_config_dict is {}: a user tuning O1 on it gives the sections' keys on the command
    line, as a child recipe may add them (before, each was an unknown config key); YAML types the values, ms_boost
    checks them when the plan is built. THOR takes none (it trains alone at O0)."""
    momentum = CONFIGS / "resnet50_imagenet_momentum.yaml"
    cfg = parse_config(["--boost_level", "O1", "--boost_config_dict.grad_freeze.freeze_p", "0.5",
                        "--boost_config_dict.less_bn.fn_flag=false", "--boost_config_dict.grad_freeze.freeze_p",
                        "0.25"], momentum)
    assert cfg.boost_config_dict.to_dict() == {"grad_freeze": {"freeze_p": 0.25}, "less_bn": {"fn_flag": False}}
    assert added_keys(cfg) == ["boost_config_dict.grad_freeze.freeze_p", "boost_config_dict.less_bn.fn_flag"]
    boost = AutoBoost(cfg.boost_level, boost_config_dict(cfg, total_steps=100))
    assert boost.section("grad_freeze").freeze_p == 0.25 and boost.section("less_bn").fn_flag is False
    with pytest.raises(ValueError, match="unknown boost config key 'less_bn.fn_flg'"):
        AutoBoost("O1", boost_config_dict(parse_config(["--boost_config_dict.less_bn.fn_flg", "1"], momentum), 100))
    with pytest.raises(ValueError, match="--boost_config_dict.less_bn.fn_flag needs a value"):
        parse_config(["--boost_config_dict.less_bn.fn_flag"], momentum)
    o1 = CONFIGS / "resnet50_imagenet_boost_o1.yaml"  # below a value, or outside the open section: unknown keys
    with pytest.raises(ValueError, match="unknown config key --boost_config_dict.less_bn.fn_flag.x"):
        parse_config(["--boost_config_dict.less_bn.fn_flag.x", "1"], o1)
    with pytest.raises(ValueError, match="unknown config key --synthetic.colour"):
        parse_config(["--synthetic.colour", "1"], o1)
    assert added_keys(parse_config(["--boost_config_dict.less_bn.fn_flag", "false"], o1)) == []
    thor = parse_config(["--boost_config_dict.common.device_number", "2"], CONFIGS / "resnet50_imagenet_thor.yaml")
    with pytest.raises(ValueError, match="--boost_config_dict.common.device_number: not used by optimizer='THOR'"):
        check_schedule_keys(thor)


def test_parse_value_and_apply_overrides_do_not_mutate():
    data = {"a": {"b": 1}}
    out = apply_overrides(data, [("a.b", "2")])
    assert out == {"a": {"b": 2}} and data == {"a": {"b": 1}}
    assert parse_value("k", "[3, 4]", [1]) == [3, 4]
    assert parse_value("k", "OFF", True) is False


# ---------------------------------------------------------------------------------------------------------------
# the shipped recipes
# ---------------------------------------------------------------------------------------------------------------
def test_the_six_recipes_and_the_quickstart_are_shipped():
    assert RECIPES == sorted([
        "resnet50_imagenet_momentum.yaml", "resnet50_imagenet_boost_o1.yaml", "resnet50_imagenet_boost_o2_adasum.yaml",
        "resnet50_imagenet_dim_reduce_stage1.yaml", "resnet50_imagenet_dim_reduce_stage2.yaml",
        "resnet50_imagenet_thor.yaml", "resnet18_synthetic_quickstart.yaml"])


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_values_are_valid(name):
    cfg = parse_config([], CONFIGS / name)
    base = load_yaml(CONFIGS / "resnet50_imagenet_momentum.yaml")
    assert set(base) <= set(cfg), "a recipe may add sections but never drops a baseline key"
    assert cfg.net_name in list_models()
    assert cfg.optimizer in OPTIMIZERS and cfg.loss_scale_type in LOSS_SCALE_TYPES
    assert cfg.lr_decay_mode in LR_DECAY_MODES
    assert cfg.conv_init in CONV_INITS and cfg.dense_init in DENSE_INITS
    assert cfg.mode in ("graph", "pynative") and cfg.device_target in ("auto", "Ascend", "GPU", "CPU")
    assert cfg.data_path == "synthetic"  # every recipe runs out of the box on the built-in set
    pretrained = ["--pretrained", "/stage1/checkpoint_stage_1/resnet-70_625.ckpt"] if "stage2" in name else []
    cfg = parse_config(pretrained, CONFIGS / name)
    boost = AutoBoost(cfg.boost_level, boost_config_dict(cfg, total_steps=1000))  # ms_boost accepts the plan
    expected = {
        "resnet50_imagenet_momentum.yaml": set(),
        # cpu_gemm_conv: on at O1/O2 on CPU (the zoo's own GemmConv2d layers are left as they are)
        "resnet50_imagenet_boost_o1.yaml": {"less_bn", "grad_freeze", "cpu_gemm_conv"},
        "resnet18_synthetic_quickstart.yaml": {"less_bn", "grad_freeze", "cpu_gemm_conv"},
        "resnet50_imagenet_boost_o2_adasum.yaml": {"adasum", "cpu_gemm_conv"},
        "resnet50_imagenet_dim_reduce_stage1.yaml": set(),
        "resnet50_imagenet_dim_reduce_stage2.yaml": {"dim_reduce"},
        "resnet50_imagenet_thor.yaml": set(),
    }[name]
    assert {k for k, v in boost.boost_config.items() if v} == expected
    if "stage2" in name:
        assert boost.dim_reduce.weight_load_dir == "/stage1/checkpoint_stage_1/checkpoint_pca"
        assert boost.dim_reduce.pca_mat_path is None and boost.dim_reduce.n_components == 32
        assert boost.common.device_number == 8
    if "boost_o1" in name:
        assert boost.grad_freeze.total_steps == 1000


def test_tutorial_values_of_the_recipes():
    stage1 = parse_config([], CONFIGS / "resnet50_imagenet_dim_reduce_stage1.yaml")
    assert (stage1.pca_checkpoint, stage1.pca_keep_checkpoint_max, stage1.epoch_size) == (True, 40, 70)
    assert (stage1.lr_max, stage1.warmup_epochs, stage1.lr_decay_mode, stage1.loss_scale) == (0.8, 5, "linear", 1024)
    thor = parse_config([], CONFIGS / "resnet50_imagenet_thor.yaml")
    assert thor.thor.split_indices == [26, 53] and thor.batch_size == 32 and thor.optimizer == "THOR"
    stage2 = parse_config([], CONFIGS / "resnet50_imagenet_dim_reduce_stage2.yaml")
    assert stage2.optimizer == "SGD" and stage2.lr_max == 1.0 and stage2.lr_decay_mode == "constant"
    with pytest.raises(ValueError, match="pretrained is not set"):
        boost_config_dict(stage2, 10)
    baseline = parse_config(["--optimizer", "THOR"], CONFIGS / "resnet50_imagenet_momentum.yaml")
    with pytest.raises(ValueError, match="needs the 'thor' section"):
        build_optimizer(baseline, None, 10)
    with pytest.raises(ValueError, match="optimizer='Adam' is not allowed; allowed: Momentum, SGD, THOR"):
        build_optimizer(baseline.replace(optimizer="Adam"), None, 10)
    with pytest.raises(ValueError, match="boost_level='O1' does not combine with optimizer='THOR'.*allowed: 'O0'"):
        build_optimizer(parse_config(["--boost_level", "O1"], CONFIGS / "resnet50_imagenet_thor.yaml"), None, 10)


@pytest.mark.parametrize("key, value", [("mode", "grph"), ("boost_level", "O7"), ("optimizer", "Adam"),
                                        ("device_target", "cpu"), ("loss_scale_type", "static"),
                                        ("resume_data", "quick"), ("export_file_format", "PNG")])
def test_a_misspelt_choice_stops_the_parse_naming_key_value_and_allowed(key, value):
    """The choice keys are checked where the command line is parsed (MindSpore not needed): a launcher's dry run,
    which parses through scripts/check_overrides.py, stops on them as train.py would."""
    from model_zoo.resnet.src.config import CHOICES

    allowed = ", ".join(CHOICES[key])
    with pytest.raises(ValueError, match=rf"^{key}='{value}' \(config .*momentum.yaml' or the command line\) is "
                                         rf"not allowed; allowed.*: {allowed}\.$"):
        parse_config([f"--{key}", value], CONFIGS / "resnet50_imagenet_momentum.yaml")


def test_the_launchers_check_stops_on_a_misspelt_choice():
    import subprocess
    import sys

    root = CONFIGS.parents[2]
    args = [sys.executable, str(root / "scripts" / "check_overrides.py"), "--config",
            str(CONFIGS / "resnet50_imagenet_momentum.yaml")]
    bad = subprocess.run(args + ["--mode", "grph"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "mode='grph'" in bad.stderr and "graph, pynative" in bad.stderr
    good = subprocess.run(args + ["--mode", "PyNative", "--boost_level", "auto"], capture_output=True, text=True,
                          timeout=60)
    assert good.returncode == 0, good.stderr


def test_case_free_choices_are_normalised_and_the_tables_agree_with_their_users():
    from model_zoo.resnet import export
    from model_zoo.resnet.src.config import CHOICES
    from ms_boost.autotune.options import AUTO_LEVEL
    from ms_boost.config import _LEVEL_NAMES

    cfg = parse_config(["--mode", "GRAPH", "--export_file_format", "onnx"],
                       CONFIGS / "resnet50_imagenet_momentum.yaml")
    assert (cfg.mode, cfg.export_file_format) == ("graph", "ONNX")
    assert CHOICES["boost_level"] == (*_LEVEL_NAMES, AUTO_LEVEL)
    assert CHOICES["export_file_format"] == tuple(export._EXTENSIONS)
    assert CHOICES["optimizer"] == OPTIMIZERS and CHOICES["loss_scale_type"] == LOSS_SCALE_TYPES
    for name in RECIPES:  # every shipped recipe's own values pass
        parse_config([], CONFIGS / name)


def test_thor_recipe_stat_fraction_reaches_the_optimizer():
    """thor.stat_fraction of the THOR recipe (given on the command line) reaches ms_boost's THOR; a bad value is
    refused naming the key."""
    from mindspore import nn

    cfg = parse_config(["--thor.stat_fraction", "0.25"], CONFIGS / "resnet50_imagenet_thor.yaml")
    assert cfg.thor.stat_fraction == 0.25
    assert parse_config([], CONFIGS / "resnet50_imagenet_thor.yaml").thor.stat_fraction == 1.0
    opt = build_optimizer(cfg, nn.SequentialCell([nn.Dense(4, 3)]), 10)
    assert opt.stat_fraction == 0.25 and opt.thor_layers[0].stat_fraction == 0.25
    with pytest.raises(ValueError, match=r"thor\.stat_fraction=0\.0 is out of range; allowed: 0 < value <= 1"):
        build_optimizer(cfg.replace(thor=cfg.thor.replace(stat_fraction=0.0)), nn.Dense(4, 3), 10)

"""The bash launchers in scripts/: usage on wrong arguments, dry runs against rank tables, real CPU runs."""
from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
CONFIGS = ROOT / "model_zoo" / "resnet" / "configs"
TABLE_16 = ROOT / "rank_table" / "rank_table_16pcs.json"
TABLE_8 = ROOT / "rank_table" / "rank_table_8pcs.json"
LAUNCHERS = ["run_standalone_train.sh", "run_distribute_train.sh", "run_distribute_train_gpu.sh",
             "run_distribute_train_cpu.sh", "run_multinode_train.sh", "run_eval.sh", "run_stage_1.sh",
             "run_stage_2.sh"]
TINY = ["--net_name", "resnet10", "--base_width", "4", "--class_num", "10", "--batch_size", "8",
        "--train_image_size", "16", "--eval_image_size", "16", "--eval_batch_size", "10", "--epoch_size", "1",
        "--mode", "pynative", "--amp_level", "O0", "--loss_scale_type", "none", "--warmup_epochs", "0",
        "--log_interval", "1", "--num_parallel_workers", "1", "--synthetic.image_size", "16",
        "--synthetic.train_per_class", "8", "--synthetic.val_per_class", "1"]


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict:
    cache = tmp_path_factory.mktemp("zoo_cache")
    full = dict(os.environ)
    full.update({"PATH": os.pathsep.join([str(Path(sys.executable).parent), full.get("PATH", "")]),
                 "PYTHON": sys.executable, "MS_BOOST_CACHE": str(cache), "GLOG_v": "3"})
    for name in ("SERVER_ID", "RANK_SIZE", "RUN_DIR", "DRY_RUN", "CUDA_VISIBLE_DEVICES", "CONFIG_PATH",
                 "HCCL_CONNECT_TIMEOUT", "HCCL_EXEC_TIMEOUT", "CLUSTER_TIME_OUT", "MS_CPU_COMM_OP_TIMEOUT",
                 "STUCK_GRACE"):
        full.pop(name, None)
    return full


def run(script: str, *args, env: dict, cwd: Path, extra_env: dict = None, timeout: int = 120):
    full = dict(env, **(extra_env or {}))
    return subprocess.run(["bash", str(SCRIPTS / script), *map(str, args)], env=full, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def ranks(stdout: str) -> dict:
    """``rank R: K=V ...`` lines of a dry run -> {R: {K: V}} plus each rank's cwd, log and cmd."""
    found, current = {}, None
    for line in stdout.splitlines():
        match = re.match(r"rank (\d+): (.*)$", line)
        if match:
            current = int(match.group(1))
            assert current not in found, f"rank {current} printed twice"
            found[current] = dict(item.split("=", 1) for item in match.group(2).split())
        elif line.startswith("  cwd: ") and current is not None:
            cwd, log = re.match(r"  cwd: (\S+)  log: (\S+)", line).groups()
            found[current].update(cwd=cwd, log=log)
        elif line.startswith("  cmd: ") and current is not None:
            found[current]["cmd"] = line[len("  cmd: "):]
    return found


# ---------------------------------------------------------------------------------------------------------------
# usage
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("script", LAUNCHERS)
def test_usage_on_missing_arguments_and_help(script, env, tmp_path):
    proc = run(script, env=env, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: missing") and f"Usage: bash scripts/{script}" in proc.stderr
    shown = run(script, "--help", env=env, cwd=tmp_path)
    assert shown.returncode == 0 and f"Usage: bash scripts/{script}" in shown.stdout


@pytest.mark.parametrize("script, args, message", [
    ("run_standalone_train.sh", ["/no/such/data"], "DATASET_PATH '/no/such/data' is not a folder"),
    ("run_standalone_train.sh", ["synthetic", "missing.yaml"], "CONFIG_PATH 'missing.yaml' is not a file"),
    ("run_distribute_train.sh", ["/no/table.json", "synthetic"], "RANK_TABLE_FILE '/no/table.json' is not a file"),
    ("run_distribute_train.sh", [TABLE_16], "missing DATASET_PATH"),
    ("run_distribute_train_gpu.sh", ["two", "synthetic"], "DEVICE_NUM must be an integer, got 'two'"),
    ("run_distribute_train_gpu.sh", ["0", "synthetic"], "DEVICE_NUM must be >= 1"),
    ("run_distribute_train_gpu.sh", ["2", "synthetic", "--launcher", "slurm"], "--launcher must be msrun or mpirun"),
    ("run_distribute_train_cpu.sh", ["x", "synthetic"], "WORKER_NUM must be an integer"),
    ("run_multinode_train.sh", ["8", "3", "0", "10.0.0.1", "synthetic"], "WORKER_NUM=8 is not a multiple of"),
    ("run_multinode_train.sh", ["8", "4", "2", "10.0.0.1", "synthetic"], "NODE_RANK=2 must be < 2"),
    ("run_multinode_train.sh", ["8", "4", "0", "10.0.0.1"], "expected WORKER_NUM LOCAL_WORKER_NUM"),
    ("run_eval.sh", ["synthetic", "/no/model.ckpt"],
     "CHECKPOINT_PATH '/no/model.ckpt' is neither a checkpoint file nor a run folder"),
    ("run_stage_1.sh", ["synthetic", "table.txt"], "must be a rank table (.json)"),
    ("run_stage_2.sh", ["synthetic"], "missing CHECKPOINT_PATH"),
    # overrides are parsed as train.py will parse them, dry runs included (scripts/check_overrides.py)
    ("run_distribute_train_cpu.sh", ["2", "synthetic", "--dry-run", "--epoch", "3"],
     "unknown config key --epoch. Did you mean: --epoch_size?"),
    ("run_distribute_train.sh", [TABLE_8, "synthetic", "--dry-run", "--epoch_size", "3", "stray"],
     "unexpected command-line argument 'stray'"),
])
def test_wrong_arguments_print_the_reason_and_usage(script, args, message, env, tmp_path):
    proc = run(script, *args, env=env, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr and "Usage: bash scripts/" in proc.stderr
    assert not any(tmp_path.iterdir())  # nothing started, nothing written


# ---------------------------------------------------------------------------------------------------------------
# dry runs
# ---------------------------------------------------------------------------------------------------------------
def test_ascend_dry_run_matches_the_rank_table_on_both_servers(env, tmp_path):
    table = json.loads(TABLE_16.read_text())
    expected = {int(d["rank_id"]): (s_index, int(d["device_id"]), d["device_ip"])
                for s_index, server in enumerate(table["server_list"]) for d in server["device"]}
    seen = {}
    for server_id in (0, 1):
        proc = run("run_distribute_train.sh", TABLE_16, "synthetic", CONFIGS / "resnet50_imagenet_boost_o1.yaml",
                   "--dry-run", "--epoch_size", "2", env=env, cwd=tmp_path, extra_env={"SERVER_ID": str(server_id)})
        assert proc.returncode == 0, proc.stderr
        printed = ranks(proc.stdout)
        assert len(printed) == 8
        for rank, fields in printed.items():
            assert rank not in seen, f"rank {rank} launched on two servers"
            seen[rank] = server_id
            s_index, device_id, device_ip = expected[rank]
            assert s_index == server_id
            assert fields["RANK_ID"] == str(rank) and fields["DEVICE_ID"] == str(device_id)
            assert fields["DEVICE_IP"] == device_ip
            assert fields["RANK_SIZE"] == "16" and fields["DEVICE_NUM"] == "8" and fields["SERVER_ID"] == str(server_id)
            assert fields["RANK_TABLE_FILE"] == str(TABLE_16)
            assert fields["cwd"] == str(tmp_path / "train_parallel" / f"device{device_id}")
            assert fields["log"] == fields["cwd"] + "/log.txt"
            cmd = fields["cmd"]
            assert "--device_target Ascend --run_distribute true" in cmd and cmd.endswith("--epoch_size 2")
            # one run folder for every device of every server, as msrun: rank 0 saves in RUN_DIR/checkpoint,
            # rank r in RUN_DIR/checkpoint/rank_<r>, where --resume RUN_DIR looks for each rank's own state
            assert f"--output_path {tmp_path / 'train_parallel'} " in cmd and "resnet50_imagenet_boost_o1.yaml" in cmd
    assert sorted(seen) == list(range(16))
    assert not any(tmp_path.iterdir())  # a dry run creates nothing


def test_ascend_dry_run_single_server_env_switch_and_errors(env, tmp_path):
    proc = run("run_distribute_train.sh", TABLE_8, "synthetic", env=env, cwd=tmp_path, extra_env={"DRY_RUN": "1"})
    printed = ranks(proc.stdout)
    assert sorted(printed) == list(range(8))
    assert all(printed[r]["DEVICE_ID"] == str(r) and printed[r]["RANK_SIZE"] == "8" for r in printed)
    bad_size = run("run_distribute_train.sh", TABLE_16, "synthetic", "--dry-run", env=env, cwd=tmp_path,
                   extra_env={"RANK_SIZE": "8"})
    assert bad_size.returncode == 2 and "RANK_SIZE=8 but the rank table holds 16 ranks" in bad_size.stderr
    bad_server = run("run_distribute_train.sh", TABLE_16, "synthetic", "--dry-run", env=env, cwd=tmp_path,
                     extra_env={"SERVER_ID": "2"})
    assert bad_server.returncode == 2 and "server_index=2 is out of range" in bad_server.stderr
    broken = tmp_path / "broken.json"
    table = json.loads(TABLE_8.read_text())
    table["server_list"][0]["device"][1]["rank_id"] = "0"
    broken.write_text(json.dumps(table))
    invalid = run("run_distribute_train.sh", broken, "synthetic", "--dry-run", env=env, cwd=tmp_path)
    assert invalid.returncode == 2 and "device[1].rank_id='0' duplicates" in invalid.stderr


@pytest.mark.parametrize("launcher", ["msrun", "mpirun"])
def test_gpu_dry_run_prints_every_device(launcher, env, tmp_path):
    proc = run("run_distribute_train_gpu.sh", 4, "synthetic", "--launcher", launcher, "--dry-run", "--epoch_size",
               "1", env=env, cwd=tmp_path, extra_env={"CUDA_VISIBLE_DEVICES": "4,5,6,7"})
    assert proc.returncode == 0, proc.stderr
    printed = ranks(proc.stdout)
    assert sorted(printed) == [0, 1, 2, 3]
    cmd = proc.stdout.strip().splitlines()[-1]
    assert "--device_target GPU --run_distribute true" in cmd and cmd.endswith("--epoch_size 1")
    if launcher == "msrun":
        assert re.search(r"msrun --worker_num=4 --local_worker_num=4 .*--node_rank=0", cmd)
        assert [printed[r]["log"] for r in range(4)] == [
            str(tmp_path / "train_parallel_gpu" / "msrun_log" / f"worker_{r}.log") for r in range(4)]
    else:
        assert cmd.startswith("cmd: mpirun -n 4 --allow-run-as-root")
        assert [printed[r]["GPU"] for r in range(4)] == ["4", "5", "6", "7"]
    assert all(printed[r]["CUDA_VISIBLE_DEVICES"] == "4,5,6,7" for r in range(4))
    # the JIT cache large enough for MindSpore's GPU kernels compiled from PTX (Hopper), a user's value kept
    assert all(printed[r]["CUDA_CACHE_MAXSIZE"] == "4294967296" for r in range(4))
    if launcher == "mpirun":
        assert "-x CUDA_CACHE_MAXSIZE" in cmd
    own = run("run_distribute_train_gpu.sh", 2, "synthetic", "--launcher", launcher, "--dry-run", env=env,
              cwd=tmp_path, extra_env={"CUDA_CACHE_MAXSIZE": "1073741824"})
    assert own.returncode == 0 and ranks(own.stdout)[1]["CUDA_CACHE_MAXSIZE"] == "1073741824", own.stderr
    bad = run("run_distribute_train_gpu.sh", 2, "synthetic", "--launcher", launcher, "--dry-run", env=env,
              cwd=tmp_path, extra_env={"CUDA_CACHE_MAXSIZE": "4G"})
    assert bad.returncode == 2 and "CUDA_CACHE_MAXSIZE must be an integer, got '4G'" in bad.stderr
    too_few = run("run_distribute_train_gpu.sh", 4, "synthetic", "--dry-run", env=env, cwd=tmp_path,
                  extra_env={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert too_few.returncode == 2 and "lists fewer than 4 GPUs" in too_few.stderr


def test_multinode_dry_run_numbers_ranks_per_node(env, tmp_path):
    for node in (0, 1):
        proc = run("run_multinode_train.sh", 8, 4, node, "10.0.0.1", "synthetic", "--dry-run", env=env, cwd=tmp_path,
                   extra_env={"DEVICE_TARGET": "GPU", "MASTER_PORT": "9123"})
        assert proc.returncode == 0, proc.stderr
        printed = ranks(proc.stdout)
        assert sorted(printed) == list(range(4 * node, 4 * node + 4))
        assert all(printed[r]["MS_SCHED_HOST"] == "10.0.0.1" and printed[r]["RANK_SIZE"] == "8" for r in printed)
        cmd = proc.stdout.strip().splitlines()[-1]
        assert (f"--worker_num=8 --local_worker_num=4 --master_addr=10.0.0.1 --master_port=9123 "
                f"--node_rank={node}") in cmd
        assert "--device_target GPU" in cmd
        assert all(printed[r]["CUDA_CACHE_MAXSIZE"] == "4294967296" for r in printed)


def test_stage_scripts_dry_run(env, tmp_path):
    ckpt = tmp_path / "stage_1" / "checkpoint_stage_1" / "resnet-70_625.ckpt"
    ckpt.parent.mkdir(parents=True)
    ckpt.write_bytes(b"")
    one = run("run_stage_1.sh", "synthetic", TABLE_8, "--dry-run", env=env, cwd=tmp_path)
    assert one.returncode == 0, one.stderr
    printed = ranks(one.stdout)
    assert sorted(printed) == list(range(8))
    assert "resnet50_imagenet_dim_reduce_stage1.yaml" in printed[0]["cmd"]
    assert printed[3]["cwd"] == str(tmp_path / "stage_1" / "device3")
    alone = run("run_stage_1.sh", "synthetic", "--dry-run", "--epoch_size", "3", env=env, cwd=tmp_path)
    assert alone.returncode == 0 and "resnet50_imagenet_dim_reduce_stage1.yaml" in alone.stdout
    assert alone.stdout.strip().endswith("--epoch_size 3")

    two = run("run_stage_2.sh", "synthetic", "stage_1/checkpoint_stage_1/resnet-70_625.ckpt", "pca_mat.npy", TABLE_16,
              "--dry-run", env=env, cwd=tmp_path, extra_env={"SERVER_ID": "1"})
    assert two.returncode == 0, two.stderr
    printed = ranks(two.stdout)
    assert sorted(printed) == list(range(8, 16))
    cmd = printed[8]["cmd"]
    assert f"--pretrained {ckpt}" in cmd and "resnet50_imagenet_dim_reduce_stage2.yaml" in cmd
    assert f"--boost_config_dict.dim_reduce.pca_mat_path {tmp_path / 'pca_mat.npy'}" in cmd
    assert "--boost_config_dict.common.device_num 8" in cmd
    solo = run("run_stage_2.sh", "synthetic", ckpt, "--dry-run", env=env, cwd=tmp_path)
    assert solo.returncode == 0 and "--boost_config_dict.common.device_num 1" in solo.stdout
    assert "pca_mat_path" not in solo.stdout
    bad = run("run_stage_2.sh", "synthetic", ckpt, "pca.txt", env=env, cwd=tmp_path)
    assert bad.returncode == 2 and "'pca.txt' is neither a PCA matrix (.npy) nor a rank table (.json)" in bad.stderr


def test_boost_keys_a_recipe_lacks_are_checked_by_ms_boost_before_the_launch(env, tmp_path):
    """--boost_config_dict.* keys the Momentum recipe lacks are taken (O1 tuned on it); a typo among them stops the
    dry run with ms_boost's own message (unknown key and the allowed ones), as train.py would stop."""
    key = "--boost_config_dict.grad_freeze.freeze_p"
    good = run("run_standalone_train.sh", "synthetic", "--boost_level", "O1", key, "0.5", "--dry-run", env=env,
               cwd=tmp_path)
    assert good.returncode == 0, good.stderr
    assert good.stdout.strip().splitlines()[-1].endswith(f"--boost_level O1 {key} 0.5")
    bad = run("run_standalone_train.sh", "synthetic", "--boost_level", "O1", key[:-1] + "q", "0.5", "--dry-run",
              env=env, cwd=tmp_path)
    assert bad.returncode == 2 and "unknown boost config key 'grad_freeze.freeze_q'; allowed keys:" in bad.stderr


def test_a_boost_value_out_of_range_on_a_key_the_recipe_has_stops_the_launch(env, tmp_path):
    """Journeys, second round: ``--boost_config_dict.grad_freeze.freeze_p 1.5`` on the O1 recipe (which has the key)
    passed the launcher's check (only keys the recipe lacked went to ms_boost) and stopped train.py on every rank;
    every override of the plan is now checked before the launch (the cases: tests/test_zoo_components.py)."""
    bad = run("run_standalone_train.sh", "synthetic", CONFIGS / "resnet50_imagenet_boost_o1.yaml",
              "--boost_config_dict.grad_freeze.freeze_p", "1.5", "--dry-run", env=env, cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.startswith(
        "error: bad override (train.py and eval.py would stop on it): boost config grad_freeze.freeze_p=1.5 is out "
        "of range; allowed: 0.0 <= value <= 1.0."), bad.stderr


#: runs scripts/check_overrides.py as ``python check_overrides.py ARGS`` would, then prints whether MindSpore was loaded
_CHECK_WRAPPER = ("import runpy, sys\n"
                  "sys.argv = sys.argv[1:]\n"
                  "try:\n"
                  "    runpy.run_path(sys.argv[0], run_name='__main__')\n"
                  "finally:\n"
                  "    print('mindspore loaded:', any(m.split('.')[0] == 'mindspore' for m in sys.modules))\n")


@pytest.mark.parametrize("recipe, args", [
    ("resnet50_imagenet_momentum.yaml", ["--boost_level", "O1", "--boost_config_dict.grad_freeze.freeze_p", "0.5"]),
    ("resnet50_imagenet_momentum.yaml", ["--boost_level", "O1", "--boost_config_dict.grad_freeze.freeze_q", "0.5"]),
    ("resnet50_imagenet_boost_o1.yaml", ["--boost_config_dict.grad_freeze.freeze_p", "1.5"]),
    ("resnet50_imagenet_boost_o1.yaml", ["--boost_config_dict.dim_reduce.rho", "0.5"]),  # an algorithm left off
    ("resnet50_imagenet_thor.yaml", ["--boost_config_dict.grad_freeze.freeze_p", "0.5"]),
    ("resnet50_imagenet_thor.yaml", ["--boost_level", "O1"]),
])
def test_the_launchers_plan_check_loads_no_mindspore_and_says_what_the_full_check_says(recipe, args, capsys):
    """The pre-launch check of a command line touching the boost plan ran ``trainer.check_boost_plan``, importing
    ms_boost and MindSpore (about 2 CPU-s a launch); it now checks the plan from ms_boost's configuration pieces
    (``ms_boost.plans``): MindSpore is never loaded, and the verdict and message are the full check's (the script's
    ``main`` in this process, where ms_boost is imported for real)."""
    import importlib.util

    import ms_boost  # noqa: F401 -- the in-process check below takes the full path

    argv = ["--config", str(CONFIGS / recipe), *args]
    light = subprocess.run([sys.executable, "-c", _CHECK_WRAPPER, str(SCRIPTS / "check_overrides.py"), *argv],
                           capture_output=True, text=True, timeout=60)
    assert light.stdout.strip().splitlines()[-1] == "mindspore loaded: False", light.stdout + light.stderr
    spec = importlib.util.spec_from_file_location("check_overrides_full", SCRIPTS / "check_overrides.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    capsys.readouterr()
    full_rc = module.main(argv)
    full = capsys.readouterr().err
    assert "mindspore" in sys.modules and light.returncode == full_rc, (light.stderr, full)
    assert light.stderr == full, (light.stderr, full)
    assert (full_rc == 0) == (args[-1] == "0.5" and "freeze_p" in args[-2] and "thor" not in recipe), full


def test_the_light_plan_check_leaves_no_light_module_behind():
    """The check's ``main`` in a process without ms_boost (as test_a_users_recipe_... below, run alone) loads the
    plan's pieces without the packages' ``__init__``; a real ``import ms_boost`` after it must get the full specs
    (hooks and all), not the light registry of PLANs."""
    code = (f"import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('co', {str(SCRIPTS / 'check_overrides.py')!r})\n"
            f"module = importlib.util.module_from_spec(spec)\n"
            f"spec.loader.exec_module(module)\n"
            f"rc = module.main(['--config', {str(CONFIGS / 'resnet50_imagenet_momentum.yaml')!r}, '--boost_level', "
            f"'O1'])\n"
            f"assert rc == 0 and 'mindspore' not in sys.modules\n"
            f"import ms_boost\n"
            f"print([spec.rewrite_train is not None for spec in ms_boost.registry.builtin_specs()][:2])\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "[True, True]", proc.stdout + proc.stderr


def test_a_users_recipe_has_its_boost_plan_checked_before_the_launch(tmp_path):
    """Journeys, second round: a recipe of one's own (``base:`` the O1 recipe, ``freeze_p: 1.5``) passed the launchers'
    check with no override given, and stopped train.py on every rank; a recipe outside the zoo's configs/ has its plan
    checked as the run builds it (in this process: the check's ``main``)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_overrides_under_test", SCRIPTS / "check_overrides.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    mine = tmp_path / "my_o1.yaml"
    mine.write_text(f"base: {CONFIGS / 'resnet50_imagenet_boost_o1.yaml'}\nboost_config_dict:\n  grad_freeze:\n"
                    f"    freeze_p: 1.5\n")
    assert module.main(["--config", str(mine)]) == 2
    mine.write_text(f"base: {CONFIGS / 'resnet50_imagenet_boost_o1.yaml'}\nboost_config_dict:\n  grad_freeze:\n"
                    f"    freeze_p: 0.5\n")
    assert module.main(["--config", str(mine)]) == 0


def test_relative_paths_in_overrides_become_absolute(env, tmp_path):
    (tmp_path / "weights.ckpt").write_bytes(b"")
    proc = run("run_standalone_train.sh", "synthetic", "--pretrained", "weights.ckpt", "--dry-run", env=env,
               cwd=tmp_path)
    assert proc.returncode == 0 and f"--pretrained {tmp_path / 'weights.ckpt'}" in proc.stdout


@pytest.mark.parametrize("script, args, cwd_of_rank", [
    ("run_standalone_train.sh", ["synthetic"], "train_standalone"),
    ("run_distribute_train.sh", [TABLE_8, "synthetic"], "train_parallel/device0"),
    ("run_distribute_train_cpu.sh", [2, "synthetic"], "train_parallel_cpu"),
    ("run_distribute_train_gpu.sh", [2, "synthetic"], "train_parallel_gpu"),
    ("run_multinode_train.sh", [4, 2, 0, "10.0.0.1", "synthetic"], "train_multinode"),
    ("run_stage_1.sh", ["synthetic"], "stage_1"),
    ("run_eval.sh", ["synthetic", "weights.ckpt"], "eval"),
])
def test_only_input_paths_become_absolute_outputs_stay_in_the_run_folder(script, args, cwd_of_rank, env, tmp_path):
    """Issue 12 item 6: an existing ./checkpoint must not turn --checkpoint_dir into a path outside the run."""
    for name in ("checkpoint", "resnet18", "out"):
        (tmp_path / name).mkdir()
    (tmp_path / "weights.ckpt").write_bytes(b"")
    stage_2 = CONFIGS / "resnet50_imagenet_dim_reduce_stage2.yaml"  # a recipe with dim_reduce.pca_mat_path
    config = [] if script == "run_stage_1.sh" else [stage_2]
    proc = run(script, *args, *config, "--dry-run", "--checkpoint_dir", "checkpoint", "--net_name", "resnet18",
               "--export_file_name=out", "--pretrained", "weights.ckpt", "--boost_config_dict.dim_reduce.pca_mat_path",
               "new/pca.npy", "--resume=run1", "--data_path", "synthetic", env=env, cwd=tmp_path,
               extra_env={"CUDA_VISIBLE_DEVICES": "0,1", "CONFIG_PATH": str(stage_2)})
    assert proc.returncode == 0, proc.stderr
    printed = ranks(proc.stdout)
    cmd = printed[0].get("cmd") or proc.stdout.strip().splitlines()[-1]
    assert cmd.endswith(f"--checkpoint_dir checkpoint --net_name resnet18 --export_file_name=out "
                        f"--pretrained {tmp_path / 'weights.ckpt'} --boost_config_dict.dim_reduce.pca_mat_path "
                        f"{tmp_path / 'new' / 'pca.npy'} --resume={tmp_path / 'run1'} --data_path synthetic"), cmd
    assert printed[0]["cwd"] == str(tmp_path / cwd_of_rank)  # relative outputs land in the run folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "out", "resnet18", "weights.ckpt"]


def test_launchers_bound_how_long_a_rank_waits_for_the_others(env, tmp_path):
    """Issue 12 item 8: the launchers set the settings that bound a collective's wait (docs/model_zoo.md)."""
    ascend = run("run_distribute_train.sh", TABLE_8, "synthetic", "--dry-run", env=env, cwd=tmp_path)
    assert ascend.returncode == 0, ascend.stderr
    printed = ranks(ascend.stdout)
    assert all(printed[r]["HCCL_CONNECT_TIMEOUT"] == "600" and printed[r]["HCCL_EXEC_TIMEOUT"] == "1800"
               for r in range(8))
    chosen = run("run_multinode_train.sh", 4, 2, 1, "10.0.0.1", "synthetic", "--dry-run", env=env, cwd=tmp_path,
                 extra_env={"HCCL_EXEC_TIMEOUT": "300", "CLUSTER_TIME_OUT": "90"})
    assert chosen.returncode == 0, chosen.stderr
    printed = ranks(chosen.stdout)
    assert printed[2]["HCCL_EXEC_TIMEOUT"] == "300" and printed[3]["HCCL_CONNECT_TIMEOUT"] == "600"
    assert "--cluster_time_out=90 " in chosen.stdout.strip().splitlines()[-1]
    cpu = run("run_distribute_train_cpu.sh", 2, "synthetic", "--dry-run", env=env, cwd=tmp_path)
    assert "--cluster_time_out=600 " in cpu.stdout and "HCCL" not in cpu.stdout
    assert all(rank["MS_CPU_COMM_OP_TIMEOUT"] == "120" for rank in ranks(cpu.stdout).values())  # issue 30
    cpu = run("run_distribute_train_cpu.sh", 2, "synthetic", "--dry-run", env=env, cwd=tmp_path,
              extra_env={"MS_CPU_COMM_OP_TIMEOUT": "15"})
    assert all(rank["MS_CPU_COMM_OP_TIMEOUT"] == "15" for rank in ranks(cpu.stdout).values())
    assert "MS_CPU_COMM_OP_TIMEOUT" not in ascend.stdout
    for name, value, message in [("HCCL_CONNECT_TIMEOUT", "60", "HCCL_CONNECT_TIMEOUT must be >= 120, got '60'"),
                                 ("HCCL_CONNECT_TIMEOUT", "9000", "HCCL_CONNECT_TIMEOUT must be <= 7200"),
                                 ("HCCL_EXEC_TIMEOUT", "1e3", "HCCL_EXEC_TIMEOUT must be an integer, got '1e3'"),
                                 ("CLUSTER_TIME_OUT", "-1", "CLUSTER_TIME_OUT must be an integer, got '-1'")]:
        bad = run("run_distribute_train.sh", TABLE_8, "synthetic", "--dry-run", env=env, cwd=tmp_path,
                  extra_env={name: value})
        assert bad.returncode == 2 and message in bad.stderr, (name, bad.stderr)
    for name, value, message in [("MS_CPU_COMM_OP_TIMEOUT", "0", "MS_CPU_COMM_OP_TIMEOUT must be >= 1, got '0'"),
                                 ("STUCK_GRACE", "x", "STUCK_GRACE must be an integer, got 'x'")]:
        bad = run("run_distribute_train_cpu.sh", 2, "synthetic", "--dry-run", env=env, cwd=tmp_path,
                  extra_env={name: value})
        assert bad.returncode == 2 and message in bad.stderr, (name, bad.stderr)


def test_integers_must_be_ascii_digits(env, tmp_path):
    proc = run("run_distribute_train_cpu.sh", "\u0662", "synthetic", "--dry-run", env=env, cwd=tmp_path)
    assert proc.returncode == 2 and "WORKER_NUM must be an integer, got '\u0662' (ASCII digits 0-9)" in proc.stderr


# ---------------------------------------------------------------------------------------------------------------
# real runs on CPU
# ---------------------------------------------------------------------------------------------------------------
def test_standalone_train_then_run_eval_for_real(env, tmp_path):
    proc = run("run_standalone_train.sh", "synthetic", "--device_target", "CPU", "--steps_per_epoch", "2",
               "--save_checkpoint_steps", "2", *TINY, env=env, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = (tmp_path / "train_standalone" / "log.txt").read_text()
    assert "training done: 2 steps" in log and "after training: top-1" in log
    ckpt = tmp_path / "train_standalone" / "checkpoint" / "resnet-1_2.ckpt"
    assert ckpt.is_file()
    evaluated = run("run_eval.sh", "synthetic", ckpt, "--device_target", "CPU", *TINY, env=env, cwd=tmp_path,
                    timeout=600)
    assert evaluated.returncode == 0, evaluated.stdout[-3000:] + evaluated.stderr[-3000:]
    match = re.search(r"top-1 accuracy: (\d\.\d{4})  top-5 accuracy: (\d\.\d{4})", evaluated.stdout)
    assert match and 0 <= float(match.group(1)) <= float(match.group(2)) <= 1
    train_top1 = re.search(r"after training: top-1 (\d\.\d{4})", log).group(1)
    assert match.group(1) == train_top1  # the same weights give the same accuracy
    assert (tmp_path / "eval" / "log.txt").read_text().count("top-1 accuracy") == 1


# One real msrun launcher journey (O2: AdaSum between 2 "servers" of one rank each): train 2 epochs of one step
# each (each launch is 3 processes importing MindSpore and compiling its PyNative ops: a step more per epoch only
# costs CPU), stop after epoch 1, relaunch with --resume, and the resumed run ends bit-identical on both ranks.
# The O1 launcher command line is checked by the dry runs above, its pipeline text by tests/test_config.py
# (AutoBoost("O1").summary) and O1 data parallel over two real ranks by
# tests/test_msrun_e2e.py::test_light_o1_two_ranks_equal_one_process.
O2_EXTRA = ["--boost_config_dict.common.device_number", "1", "--epoch_size", "2", "--steps_per_epoch", "1",
            "--save_checkpoint_epochs", "1", "--save_checkpoint_steps", "0"]
O2_PIPELINE = ("mean within each server (1 rank(s) per server) -> nn.Conv2d as im2col + GEMM (layers left alone are "
               "logged) -> optimizer -> AdaSum of the servers' weight deltas "
               "across 2 servers")  # 2 "servers" of one rank each


def _launch_o2(env, cwd: Path, *extra) -> dict:
    """Run the CPU launcher (2 workers, O2 recipe) in ``cwd``; assert exit 0; return each rank's log text."""
    proc = run("run_distribute_train_cpu.sh", 2, "synthetic", CONFIGS / "resnet50_imagenet_boost_o2_adasum.yaml",
               *TINY, *O2_EXTRA, *extra, env=env, cwd=cwd,
               extra_env={"MASTER_PORT": str(random.randint(8200, 8999))}, timeout=900)
    logs = cwd / "train_parallel_cpu" / "msrun_log"
    texts = {r: (logs / f"worker_{r}.log").read_text(errors="replace")
             for r in (0, 1) if (logs / f"worker_{r}.log").exists()}
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:] + "".join(t[-3000:] for t in texts.values())
    return texts


def _step_losses(text: str, rank: int) -> list:
    return re.findall(rf"\[rank {rank}/2\] epoch \d/2 step 1/1 \(global (\d)/2\) loss (\d+\.\d+)", text)


@pytest.mark.msrun
def test_cpu_launcher_o2_trains_stops_and_resumes_exactly_on_both_ranks(env, tmp_path):
    from tests.test_zoo_journey import assert_same_state, state

    straight = tmp_path / "straight"
    straight.mkdir()
    texts = _launch_o2(env, straight)
    first_losses = []
    for rank in (0, 1):
        steps = _step_losses(texts[rank], rank)
        assert [s for s, _ in steps] == ["1", "2"], texts[rank][-3000:]
        first_losses.append(steps[0][1])
        assert f"[rank {rank}/2] training done: 2 steps" in texts[rank]
    assert first_losses[0] != first_losses[1]  # each rank reads its own shard
    assert "boost_level O2 | 2 rank(s) on CPU" in texts[0] and O2_PIPELINE in texts[0]
    assert "after training: top-1" in texts[0] and "after training" not in texts[1]  # eval on rank 0 only
    # rank 0 in checkpoint/, every other rank its own state in checkpoint/rank_<r>/ (save_rank_checkpoints:
    # exact resume), all inside the run folder
    run_dir = straight / "train_parallel_cpu"
    ckpts = sorted(p.relative_to(run_dir) for p in run_dir.rglob("*.ckpt"))
    assert ckpts == [Path(f"checkpoint/{r}resnet-{e}_1.ckpt") for r in ("rank_1/", "") for e in (1, 2)]

    # stop after epoch 1: a run folder holding only the epoch-1 checkpoints; relaunch it with --resume
    stopped = tmp_path / "stopped" / "train_parallel_cpu" / "checkpoint"
    (stopped / "rank_1").mkdir(parents=True)
    shutil.copy(run_dir / "checkpoint" / "resnet-1_1.ckpt", stopped)
    # rank 1's own state: under AdaSum each server's momentum follows its own gradients
    shutil.copy(run_dir / "checkpoint" / "rank_1" / "resnet-1_1.ckpt", stopped / "rank_1")
    moments = [k for k in state(stopped / "resnet-1_1.ckpt") if k.startswith("moments.")]
    assert moments and any(not np.array_equal(state(stopped / "resnet-1_1.ckpt")[k],
                                              state(stopped / "rank_1" / "resnet-1_1.ckpt")[k]) for k in moments)
    # the evaluation after training ran in the straight run; the resumed one skips it (run_eval is resume-free)
    resumed = _launch_o2(env, tmp_path / "stopped", "--resume", "./train_parallel_cpu", "--run_eval", "false")
    assert "resumed from" in resumed[0] and "at step 1 (epoch 2, step 1)" in resumed[0], resumed[0][-3000:]
    assert "after training" not in resumed[0] and "these keys differ" not in resumed[0]
    for rank in (0, 1):  # each rank goes on from its own epoch-1 state: epoch 2's losses as in the straight run
        assert _step_losses(resumed[rank], rank) == _step_losses(texts[rank], rank)[1:]
    for own in ("", "rank_1/"):  # the whole train state of both ranks: weights, moments, AdaSum state, counters
        names = sorted(state(stopped / f"{own}resnet-2_1.ckpt"))
        assert any(name.startswith("adasum") for name in names), names[:10]
        assert_same_state(run_dir / "checkpoint" / f"{own}resnet-2_1.ckpt", stopped / f"{own}resnet-2_1.ckpt")


def test_version_matrix_dry_run_and_arguments(env, tmp_path):
    """scripts/version_matrix.sh (docs/compatibility.md): one venv per release, the core tests in each."""
    proc = run("version_matrix.sh", "2.7.0", "2.10.0", "--dry-run", env=env, cwd=tmp_path,
               extra_env={"WORK_DIR": str(tmp_path / "vm")})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == "releases: 2.7.0 2.10.0"
    assert lines[1].startswith(f"2.7.0: {sys.executable} -m venv {tmp_path / 'vm' / 'venv-2.7.0'}; "
                               "pip install mindspore==2.7.0")
    assert "pytest -n 0 tests/test_config.py tests/test_model.py" in lines[2] and "test_ms_compat.py" in lines[2]
    assert not any(tmp_path.iterdir())  # a dry run creates nothing
    bad = run("version_matrix.sh", "latest", env=env, cwd=tmp_path)
    assert bad.returncode == 2 and "'latest' is neither a MindSpore version" in bad.stderr


# ---------------------------------------------------------------------------------------------------------------
# stopping a launcher: stub processes in place of train.py / msrun (PYTHON and MSRUN choose them)
# ---------------------------------------------------------------------------------------------------------------
STUB_PYTHON = """#!/bin/bash
# train.py: note pid, rank and folder, then sleep (SIGINT is ignored in background jobs; SIGTERM ends it)
case "$1" in *train.py) echo "$$ ${RANK_ID} $PWD $*" >>"${STUB_DIR}/started"; exec sleep 300 ;; esac
exec %(python)s "$@"
"""
STUB_MSRUN = """#!%(python)s
# msrun's stop behaviour: workers in sessions of their own; SIGINT kills them and exits 0; SIGTERM just ends msrun
import os, signal, subprocess, sys, time
workers = [subprocess.Popen(["sleep", "300"], start_new_session=True) for _ in range(2)]
def stop(sig, frame):
    for w in workers:
        os.killpg(w.pid, signal.SIGKILL)
    sys.exit(0)
mode = os.environ.get("STUB_MODE")  # as msrun once its handler is installed, or before (ignored / inherited)
signal.signal(signal.SIGINT, {"handler": stop, "ignore": signal.SIG_IGN, "die": signal.default_int_handler}[mode])
with open(os.path.join(os.environ["STUB_DIR"], "started"), "a") as out:
    out.write(" ".join(str(p) for p in [os.getpid()] + [w.pid for w in workers]) + "\\n")
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _stop_launcher(script, args, sig, env, tmp_path, extra_env, expected_lines):
    """Start ``script`` with the stubs, send ``sig`` to the launcher alone once the stubs run; return
    (exit status, stderr, pids the stubs noted, their lines)."""
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    for name, text in (("python", STUB_PYTHON), ("msrun", STUB_MSRUN)):
        (stubs / name).write_text(text % {"python": sys.executable})
        (stubs / name).chmod(0o755)
    full = dict(env, PYTHON=str(stubs / "python"), MSRUN=str(stubs / "msrun"), STUB_DIR=str(stubs),
                STOP_TIMEOUT="3", **extra_env)
    with open(stubs / "out", "w") as out, open(stubs / "err", "w") as errors:  # files: no pipe an orphan holds
        # started as `launcher &` from a script is: SIGINT ignored on entry (the launcher restores it)
        proc = subprocess.Popen(["bash", str(SCRIPTS / script), *map(str, args)], env=full, cwd=tmp_path,
                                stdout=out, stderr=errors,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    started = stubs / "started"
    for _ in range(200):
        if started.exists() and len(started.read_text().splitlines()) >= expected_lines:
            break
        time.sleep(0.05)
    lines = started.read_text().splitlines()
    assert len(lines) == expected_lines, lines
    proc.send_signal(sig)
    proc.wait(timeout=30)
    err = (stubs / "err").read_text()
    pids = [int(p) for line in lines for p in line.split()[:3 if script.endswith("cpu.sh") else 1]]
    time.sleep(0.2)
    return proc.returncode, err, [p for p in pids if _alive(p)], lines


def test_ascend_launcher_stop_reaches_every_device_and_exits_143(env, tmp_path):
    """SIGTERM to the rank-table launcher (a scheduler's stop): every device process ends, exit 143, and the line
    saying how to continue; the devices ran in their own folders with the one shared --output_path."""
    rc, err, alive, lines = _stop_launcher("run_distribute_train.sh", [TABLE_8, "synthetic", "--epoch_size", "3"],
                                           signal.SIGTERM, env, tmp_path, {}, 8)
    assert rc == 143 and not alive, (rc, alive, err)
    run_dir = tmp_path / "train_parallel"
    assert f"stopped by SIGTERM; to continue from the newest checkpoint run the same command with --resume {run_dir}" \
        in err
    seen = {int(line.split()[1]): line.split()[2] for line in lines}
    assert seen == {r: str(run_dir / f"device{r}") for r in range(8)}
    assert all(f"--output_path {run_dir} --epoch_size 3" in line for line in lines)
    assert all((run_dir / f"device{r}" / "log.txt").is_file() for r in range(8))


@pytest.mark.parametrize("mode", ["handler", "ignore", "die"])
def test_cpu_launcher_ctrl_c_stops_msrun_and_its_workers_and_exits_130(mode, env, tmp_path):
    """SIGINT to the launcher: forwarded to msrun, whose own stop kills the workers (handler); an msrun still
    starting either ignores it (then it and its workers are killed after STOP_TIMEOUT) or dies of it, leaving its
    workers (then they get SIGTERM). Exit 130 and nothing left running in every case."""
    rc, err, alive, _ = _stop_launcher("run_distribute_train_cpu.sh", [2, "synthetic"], signal.SIGINT, env,
                                       tmp_path, {"STUB_MODE": mode}, 1)
    assert rc == 130 and not alive, (rc, alive, err)
    assert f"--resume {tmp_path / 'train_parallel_cpu'}" in err
    assert ("killing (SIGKILL)" in err) == (mode == "ignore")


# ---------------------------------------------------------------------------------------------------------------
# a rank that hangs (alive, never reaching the collective) under the CPU launcher: named in one line
# ---------------------------------------------------------------------------------------------------------------
STUB_STUCK_PYTHON = """#!/bin/bash
# msrun starts each worker as `python train.py ...`: run tests/workers/stuck_collective.py in its place
case "$1" in *train.py) exec %(python)s %(worker)s ;; esac
exec %(python)s "$@"
"""


@pytest.mark.msrun
def test_cpu_launcher_names_the_rank_that_never_reached_the_collective(env, tmp_path):
    """Issue 30: rank 1 of a 2-rank msrun job sleeps instead of its third step's AllReduce. Rank 0 waits
    MS_CPU_COMM_OP_TIMEOUT (5 s here) and fails with MindSpore's "Launch kernel failed" naming no rank; the launcher
    names rank 1 in one line, stops the job (rank 1, sleeping for 300 s, is killed: no process is left and it never
    takes its step) and exits 1. Real msrun and MindSpore; only train.py is replaced (a stub `python` first on
    PATH, which msrun uses to start the workers)."""
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    worker = ROOT / "tests" / "workers" / "stuck_collective.py"
    (stubs / "python").write_text(STUB_STUCK_PYTHON % {"python": sys.executable, "worker": worker})
    (stubs / "python").chmod(0o755)
    full = dict(env, PATH=os.pathsep.join([str(stubs), env["PATH"]]), MS_CPU_COMM_OP_TIMEOUT="5",
                STUCK_SECONDS="300", STUCK_RANK="1", STUCK_AFTER="2", PYTHONPATH=str(ROOT))
    proc = subprocess.run(["bash", str(SCRIPTS / "run_distribute_train_cpu.sh"), "2", "synthetic"], env=full,
                          cwd=tmp_path, capture_output=True, text=True, timeout=240)
    logs = tmp_path / "train_parallel_cpu" / "msrun_log"
    texts = {r: (logs / f"worker_{r}.log").read_text(errors="replace") for r in (0, 1)}
    assert proc.returncode == 1, (proc.stdout[-2000:], proc.stderr[-2000:])
    assert "rank 1: stuck before step 2" in texts[1] and "step 2" not in texts[1].replace("before step 2", "")
    assert "rank 0: step 1" in texts[0]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("launcher: ")]
    assert lines == [f"launcher: rank(s) 1 did not respond (alive but never reached the collective, or hung): "
                     f"rank(s) 0 waited 5 s (MS_CPU_COMM_OP_TIMEOUT) in Default/reduce-AllReduce/AllReduce-op0 and "
                     f"failed; job stopped (logs: {logs})"], proc.stderr[-3000:]
    left = subprocess.run(["pgrep", "-f", str(worker)], capture_output=True, text=True).stdout.split()
    assert not left, left


def _stuck_ranks_line(log_dir: Path, first: int, count: int, extra_env: dict = None) -> subprocess.CompletedProcess:
    script = f'usage() {{ :; }}; source "{SCRIPTS / "common.sh"}"; stuck_ranks_line "$1" "$2" "$3"'
    return subprocess.run(["bash", "-c", script, "stuck", str(log_dir), str(first), str(count)],
                          env=dict(os.environ, **(extra_env or {})), capture_output=True, text=True, timeout=60)


def test_stuck_ranks_line_reads_pynative_and_graph_failures_and_other_nodes(tmp_path):
    """The log analysis alone, on logs as MindSpore 2.10 writes them (PyNative: "Launch kernel failed, name:...";
    Graph: "Launch kernel failed: ..."): ranks 4..7 of node 1 of a multi-node job."""
    (tmp_path / "worker_4.log").write_text("step 1\nRuntimeError: Launch kernel failed, name:Default/AllGather-op3\n")
    (tmp_path / "worker_5.log").write_text("step 1\n")
    (tmp_path / "worker_6.log").write_text("- Kernel error:\nLaunch kernel failed: Default/grad/AllReduce-op7\n")
    # rank 7 has no log yet: it never got going, so it did not respond either
    done = _stuck_ranks_line(tmp_path, 4, 4, {"MS_CPU_COMM_OP_TIMEOUT": "42"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (f"launcher: rank(s) 5 7 did not respond (alive but never reached the collective, "
                                   f"or hung): rank(s) 4 6 waited 42 s (MS_CPU_COMM_OP_TIMEOUT) in "
                                   f"Default/AllGather-op3 and failed; job stopped (logs: {tmp_path})")
    for r in (5, 7):
        (tmp_path / f"worker_{r}.log").write_text("Launch kernel failed: Default/Broadcast-op0\n")
    done = _stuck_ranks_line(tmp_path, 4, 4, {"MS_CPU_COMM_OP_TIMEOUT": "42"})
    assert done.stdout.startswith("launcher: no rank of this node (ranks 4..7) is stuck: rank(s) 4 5 6 7 waited 42 s")
    assert "run on another node" in done.stdout
    # a failure that is no collective's, or no failure: nothing to report
    for r, op in ((4, "Conv2D-op1"), (5, "net/ReduceMean-op3"), (6, "grad/AllReduceX-op2"), (7, "AllGather")):
        (tmp_path / f"worker_{r}.log").write_text(f"Launch kernel failed: Default/{op}\n")
    none = _stuck_ranks_line(tmp_path, 4, 4)
    assert none.returncode == 1 and none.stdout == ""


def test_run_sh_refuses_an_unknown_command_before_making_the_venv(tmp_path):
    """`bash run.sh demoo` created .venv and pip-installed MindSpore (minutes) before printing its usage, and the
    usage ended with the script's 'set -euo pipefail' line. Now the command is checked first (the venv path here
    cannot be created, so an attempt would fail with another status) and the usage is the comment alone."""
    venv = tmp_path / "file" / "venv"
    (tmp_path / "file").write_text("")  # a file where the venv's parent folder would be
    done = subprocess.run(["bash", str(ROOT / "run.sh"), "demoo"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "MS_BOOST_VENV": str(venv)})
    assert done.returncode == 2, done.stderr
    assert done.stdout.startswith("ms_boost quick start.\n") and "bash run.sh demo [args...]" in done.stdout
    assert "set -e" not in done.stdout
    assert not venv.exists()

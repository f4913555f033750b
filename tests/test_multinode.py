"""scripts/run_multinode_train.sh for real: two "nodes" on one host, each a network namespace of its own joined to
the other by a veth pair (one address each, as two machines have), one launcher call inside each
(``ip netns exec``). The O2 recipe runs AdaSum across the two servers, one rank each (cross-node collectives; the
mean within a server of 2 real ranks is tests/test_adasum.py's 4-rank msrun job): the job trains, one node's msrun
is killed (its launcher then kills the workers msrun left), the other node ends with a message naming it, and a
restart with --resume continues every rank exactly. Plus the launcher's dead-node message on hand-made logs and
the O2 override on the recipes that can run O2 (fast, no namespaces)."""
from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
CONFIGS = ROOT / "model_zoo" / "resnet" / "configs"
O2_RECIPE = CONFIGS / "resnet50_imagenet_boost_o2_adasum.yaml"
# 2 nodes x 1 rank; AdaSum combines the 2 servers. One rank a node, not 2: every rank and msrun imports MindSpore
# and compiles, and a second rank a node only repeated what one shows (the two-node job: 4 launches)
WORKERS, LOCAL = 2, 1
NODE_TIMEOUT = 10  # MS_NODE_TIMEOUT for the job: how long the scheduler waits for a silent node
DEAD_NODE_BOUND = 180  # s: the surviving launcher must have ended by then (about NODE_TIMEOUT + 15 s measured)
EPOCHS = 4  # one step each: epochs 1-2 complete on every rank, node 1 dies after; steps are left to run into it
TINY = ["--net_name", "resnet10", "--base_width", "4", "--class_num", "10", "--batch_size", "8",
        "--train_image_size", "16", "--eval_image_size", "16", "--eval_batch_size", "10", "--mode", "pynative",
        "--amp_level", "O0", "--loss_scale_type", "none", "--warmup_epochs", "0", "--log_interval", "1",
        "--num_parallel_workers", "1", "--synthetic.image_size", "16", "--synthetic.train_per_class", "8",
        "--synthetic.val_per_class", "1", "--epoch_size", str(EPOCHS), "--steps_per_epoch", "1",
        "--save_checkpoint_epochs", "1", "--save_checkpoint_steps", "0", "--run_eval", "false",
        "--boost_config_dict.common.device_number", str(LOCAL)]


# ---------------------------------------------------------------------------------------------------------------
# two network namespaces
# ---------------------------------------------------------------------------------------------------------------
def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def _namespace_pids(name: str) -> List[int]:
    out = _ip("netns", "pids", name)
    return [int(p) for p in out.stdout.split()] if out.returncode == 0 else []


def _kill_namespace(name: str) -> None:
    """SIGKILL every process of namespace ``name`` (all started by this test): the node dies."""
    for pid in _namespace_pids(name):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _msrun_pid(name: str) -> int:
    """The msrun process of namespace ``name``."""
    for pid in _namespace_pids(name):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"/msrun") for a in args[:2]) and any(a.startswith(b"--node_rank=") for a in args):
            return pid
    raise AssertionError(f"no msrun in namespace {name}")


@dataclass
class Nodes:
    names: tuple  # namespace of node 0, of node 1
    addrs: tuple  # their addresses on the veth pair


@pytest.fixture(scope="module")
def nodes(request) -> Nodes:
    """Two fresh namespaces ``msb<tag>a`` / ``msb<tag>b`` joined by a veth pair, 10.213.7.1 and .2 (a private
    subnet that exists only inside them), loopback up in each; removed with everything running in them."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (ip netns add)")
    if shutil.which("ip") is None:
        pytest.skip("no 'ip' command (iproute2) to make network namespaces")
    tag = f"{os.getpid() % 10000}{secrets.token_hex(2)}"  # unique per run: parallel sessions do not clash
    names, veths, addrs = (f"msb{tag}a", f"msb{tag}b"), (f"msv{tag}a", f"msv{tag}b"), ("10.213.7.1", "10.213.7.2")

    def remove():
        for name in names:
            _kill_namespace(name)
        for name in names:
            for _ in range(50):
                if not _namespace_pids(name):
                    break
                time.sleep(0.1)
            _ip("netns", "delete", name)  # takes its end of the veth pair, and so the pair, with it

    request.addfinalizer(remove)
    steps = [("netns", "add", names[0]), ("netns", "add", names[1]),
             ("link", "add", veths[0], "type", "veth", "peer", "name", veths[1])]
    for name, veth, addr in zip(names, veths, addrs):
        steps += [("link", "set", veth, "netns", name), ("-n", name, "addr", "add", f"{addr}/24", "dev", veth),
                  ("-n", name, "link", "set", veth, "up"), ("-n", name, "link", "set", "lo", "up")]
    for step in steps:
        done = _ip(*step)
        if done.returncode != 0:  # e.g. a container without CAP_SYS_ADMIN / CAP_NET_ADMIN
            pytest.skip(f"network namespaces unavailable: ip {' '.join(step)}: {done.stderr.strip()}")
    return Nodes(names, addrs)


# ---------------------------------------------------------------------------------------------------------------
# the launcher on each node
# ---------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict:
    full = dict(os.environ)
    full.update({"PATH": os.pathsep.join([str(Path(sys.executable).parent), full.get("PATH", "")]),
                 "PYTHON": sys.executable, "MS_BOOST_CACHE": str(tmp_path_factory.mktemp("zoo_cache")), "GLOG_v": "3",
                 "DEVICE_TARGET": "CPU", "MASTER_PORT": "8118", "MS_NODE_TIMEOUT": str(NODE_TIMEOUT)})
    for name in ("RUN_DIR", "DRY_RUN", "CLUSTER_TIME_OUT", "CUDA_VISIBLE_DEVICES"):
        full.pop(name, None)
    return full


@dataclass
class Launch:
    proc: subprocess.Popen
    folder: Path  # where the launcher was started; the run folder is folder/train_multinode

    @property
    def run_dir(self) -> Path:
        return self.folder / "train_multinode"

    def stderr(self) -> str:
        return (self.folder / "launcher.err").read_text(errors="replace")

    def logs(self) -> dict:
        return {int(p.stem.split("_")[1]): p.read_text(errors="replace")
                for p in (self.run_dir / "msrun_log").glob("worker_*.log")}

    def dump(self) -> str:
        tails = [f"--- {self.folder.name} stderr:\n{self.stderr()[-2000:]}"]
        tails += [f"--- worker {r}:\n{text[-2500:]}" for r, text in sorted(self.logs().items())]
        return "\n".join(tails)


def launch(nodes: Nodes, node: int, folder: Path, env: dict, *extra: str) -> Launch:
    folder.mkdir(parents=True, exist_ok=True)
    cmd = ["ip", "netns", "exec", nodes.names[node], "bash", str(SCRIPTS / "run_multinode_train.sh"), str(WORKERS),
           str(LOCAL), str(node), nodes.addrs[0], "synthetic", str(O2_RECIPE), *TINY, *extra]
    with open(folder / "launcher.out", "w") as out, open(folder / "launcher.err", "w") as err:
        return Launch(subprocess.Popen(cmd, cwd=folder, env=env, stdout=out, stderr=err), folder)


def rank_checkpoint(run_dir: Path, rank: int, epoch: int) -> Path:
    own = "" if rank == 0 else f"rank_{rank}/"
    return run_dir / "checkpoint" / f"{own}resnet-{epoch}_1.ckpt"


def node_of(rank: int) -> int:
    return rank // LOCAL


def wait_for(paths: List[Path], launches: List[Launch], timeout: float) -> None:
    """Until every path exists; fails at once (with the logs) when a launcher ends first."""
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        ended = [lo for lo in launches if lo.proc.poll() is not None]
        assert not ended, "a launcher ended early:\n" + "\n".join(lo.dump() for lo in launches)
        assert time.monotonic() < deadline, "no checkpoints in time:\n" + "\n".join(lo.dump() for lo in launches)
        time.sleep(0.5)


def finish(launch_: Launch, timeout: float) -> int:
    try:
        return launch_.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{launch_.folder.name}: launcher still running after {timeout} s (a hang):\n{launch_.dump()}")


def step_lines(text: str, rank: int) -> List[str]:
    return re.findall(rf"\[rank {rank}/{WORKERS}\] epoch \d/{EPOCHS} step 1/1 \(global \d/{EPOCHS}\) loss \d+\.\d+",
                      text)


def state(path: Path) -> dict:
    import mindspore as ms

    return {k: v.asnumpy() for k, v in ms.load_checkpoint(str(path)).items() if not isinstance(v, str)}


@pytest.fixture(scope="module")
def crashed(nodes, env, tmp_path_factory):
    """Both nodes train; once every rank has saved epoch 2, node 1's msrun is killed (SIGKILL): its launcher kills
    the workers msrun left running, and node 1 is gone from the job. Returns the two launches, node 0's exit status,
    seconds from the kill to its end and the processes still in either namespace 10 s after that."""
    work = tmp_path_factory.mktemp("crash")
    runs = [launch(nodes, node, work / f"node{node}", env) for node in (0, 1)]
    try:
        wait_for([rank_checkpoint(runs[node_of(r)].run_dir, r, 2) for r in range(WORKERS)], runs, timeout=600)
        os.kill(_msrun_pid(nodes.names[1]), signal.SIGKILL)
        killed = time.monotonic()
        status = finish(runs[0], DEAD_NODE_BOUND)
        ended = time.monotonic() - killed
        finish(runs[1], 30)
        left = {}
        for _ in range(100):  # node 0: the scheduler and workers end with its msrun; node 1: killed by its launcher
            left = {name: pids for name in nodes.names if (pids := _namespace_pids(name))}
            if not left:
                break
            time.sleep(0.1)
    finally:
        for node, run_ in enumerate(runs):
            if run_.proc.poll() is None:
                _kill_namespace(nodes.names[node])
    return runs, status, ended, left


@pytest.fixture(scope="module")
def resumed(nodes, env, crashed, tmp_path_factory):
    """A restart on both nodes from run folders holding only the epoch-1 checkpoints (each node its own ranks'),
    with --resume; the same command otherwise."""
    runs = crashed[0]
    work = tmp_path_factory.mktemp("resume")
    for rank in range(WORKERS):
        node = node_of(rank)
        target = rank_checkpoint(work / f"node{node}" / "train_multinode", rank, 1)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(rank_checkpoint(runs[node].run_dir, rank, 1), target)
    again = [launch(nodes, node, work / f"node{node}", env, "--resume", "./train_multinode") for node in (0, 1)]
    statuses = [finish(run_, 600) for run_ in again]
    assert statuses == [0, 0], "\n".join(run_.dump() for run_ in again)
    return again


@pytest.mark.msrun
@pytest.mark.slow
def test_two_nodes_train_o2_with_adasum_across_the_servers(crashed):
    runs = crashed[0]
    for rank in range(WORKERS):
        text = runs[node_of(rank)].logs()[rank]
        assert [line.split("(global ")[1][0] for line in step_lines(text, rank)][:2] == ["1", "2"], text[-3000:]
    head = runs[0].logs()[0]
    assert f"boost_level O2 | {WORKERS} rank(s) on CPU" in head
    assert (f"mean within each server ({LOCAL} rank(s) per server) -> nn.Conv2d as im2col + GEMM (layers left alone "
            "are logged) -> optimizer -> AdaSum of the servers' weight deltas "
            "across 2 servers") in head
    for epoch in (1, 2):
        states = [state(rank_checkpoint(runs[node_of(r)].run_dir, r, epoch)) for r in range(WORKERS)]
        names = sorted(states[0])
        assert all(sorted(s) == names for s in states) and any(n.startswith("adasum") for n in names)
        for name in names:  # momentum follows its own server's gradient (below); BatchNorm its own batches
            if not name.startswith("moments.") and "moving_" not in name:
                # weights, AdaSum state, counters: one value on every rank of both nodes
                for r in range(1, WORKERS):
                    np.testing.assert_array_equal(states[0][name], states[r][name], err_msg=f"{name} rank {r}")
        moments = [n for n in names if n.startswith("moments.")]
        assert moments and any(not np.array_equal(states[0][n], states[LOCAL][n]) for n in moments)  # two servers


@pytest.mark.msrun
@pytest.mark.slow
def test_a_dead_node_ends_the_other_with_a_message_naming_it(crashed):
    runs, status, ended, left = crashed  # finish() failed the fixture had node 0 run past DEAD_NODE_BOUND
    err = runs[0].stderr()
    assert status != 0, runs[0].dump()
    assert not left, f"still running after the launchers ended ({ended:.0f} s after the kill): {left}"
    assert runs[1].proc.returncode == 128 + signal.SIGKILL  # node 1's launcher: its msrun's status
    stopped = re.search(r"launcher: msrun ended by signal 9 without stopping what it started: killed (\d+) "
                        r"process\(es\) it left running \(pids [\d ]+\)", runs[1].stderr())
    assert stopped and int(stopped.group(1)) >= LOCAL, runs[1].stderr()[-2000:]  # its workers at least
    match = re.search(r"launcher: node 1 \(rank 1\) did not respond: the scheduler heard nothing from rank (1) "
                      rf"for MS_NODE_TIMEOUT={NODE_TIMEOUT} s \(noticed at \d\d:\d\d:\d\d\)", err)
    assert match, err[-3000:]
    assert "restart every node with --resume" in err


@pytest.mark.msrun
@pytest.mark.slow
def test_restart_resumes_every_rank_of_both_nodes_exactly(crashed, resumed):
    runs = crashed[0]
    head = resumed[0].logs()[0]
    assert re.search(r"resumed from \S*resnet-1_1\.ckpt\S* at step 1 \(epoch 2, step 1\)", head), head[-3000:]
    for rank in range(WORKERS):
        text = resumed[node_of(rank)].logs()[rank]
        if node_of(rank) == 1:  # node 1 holds no rank-0 checkpoint: each rank takes its own newest
            assert f"[rank {rank}] resume: no rank-0 checkpoint" in text and "rank_" in text, text[-3000:]
        straight = step_lines(runs[node_of(rank)].logs()[rank], rank)
        again = step_lines(text, rank)
        assert [line.split("(global ")[1][0] for line in again] == [str(e) for e in range(2, EPOCHS + 1)], text[-3000:]
        assert again[0] == straight[1]  # epoch 2: the same loss as before the crash
        # the whole train state of epoch 2 (weights, moments, AdaSum state, BatchNorm statistics, counters)
        before, after = state(rank_checkpoint(runs[node_of(rank)].run_dir, rank, 2)), state(
            rank_checkpoint(resumed[node_of(rank)].run_dir, rank, 2))
        assert sorted(before) == sorted(after)
        for name in before:
            np.testing.assert_array_equal(before[name], after[name], err_msg=f"rank {rank} {name}")
    final = [state(rank_checkpoint(resumed[node_of(r)].run_dir, r, EPOCHS)) for r in range(WORKERS)]
    weights = [n for n in final[0] if not n.startswith("moments.") and "moving_" not in n]
    for name in weights:
        for r in range(1, WORKERS):
            np.testing.assert_array_equal(final[0][name], final[r][name], err_msg=f"{name} rank {r}")


# ---------------------------------------------------------------------------------------------------------------
# the dead-node message on hand-made logs, the O2 override (fast)
# ---------------------------------------------------------------------------------------------------------------
SCHED_TIMEOUT = ("[ERROR] DISTRIBUTED(22149,7f2a17fff6c0,python):2026-11-26-17:09:39.440.294 [mindspore/ccsrc/cluster/"
                 "topology/meta_server_node.cc:548] UpdateTopoState] The node: {rank} is timed out. It may exit with "
                 "exception, please check this node's log.\n")
WORKER_ERROR = ("[ERROR] DISTRIBUTED(18002,7f260ffff6c0,python):2026-11-26-17:06:56.911.636 [mindspore/ccsrc/cluster/"
                "rpc/core/collective_ops_impl.cc:381] RingAllGather] CollectiveWait [const pair] failed.\n")


def report(log_dir: Path, local: int, node: int, nodes: int, port: int, **env) -> str:
    """stderr of common.sh's report_missing_node (run time 42 s)."""
    script = (f"usage() {{ :; }}; source {SCRIPTS / 'common.sh'}; "
              f"report_missing_node {log_dir} {local} {node} {nodes} 127.0.0.1 {port} 42")
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30,
                          env=dict(os.environ, **env))
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    return done.stderr


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dead_node_message_from_the_scheduler_log(tmp_path):
    (tmp_path / "scheduler.log").write_text("[WARNING] something\n" + SCHED_TIMEOUT.format(rank=5) * 2)
    err = report(tmp_path, 2, 0, 4, closed_port(), MS_NODE_TIMEOUT="12")
    assert err.strip() == ("launcher: node 2 (ranks 4-5) did not respond: the scheduler heard nothing from rank 5 for "
                           "MS_NODE_TIMEOUT=12 s (noticed at 17:09:39); that node is down, its msrun was killed or the "
                           "network to it is cut. The job ended on this node after 42 s; restart every node with "
                           "--resume to continue.")
    (tmp_path / "scheduler.log").write_text(SCHED_TIMEOUT.format(rank=3))
    assert "launcher: node 3 (rank 3) did not respond" in report(tmp_path, 1, 0, 4, closed_port(), MS_NODE_TIMEOUT="9")
    (tmp_path / "scheduler.log").write_text("[ERROR] ... Building networking for MS_SCHED failed.\n")
    err = report(tmp_path, 2, 0, 2, closed_port(), CLUSTER_TIME_OUT="15")
    assert "launcher: node 1 (ranks 2-3) did not join the job within CLUSTER_TIME_OUT=15 s" in err
    assert "one of the other nodes did not join" in report(tmp_path, 2, 0, 3, closed_port(), CLUSTER_TIME_OUT="15")
    (tmp_path / "scheduler.log").write_text("[ERROR] a worker failed on its own\n")
    assert report(tmp_path, 2, 0, 2, closed_port()) == ""  # nothing names a missing node: nothing said


def test_dead_node_message_on_the_other_nodes(tmp_path):
    (tmp_path / "worker_2.log").write_text("[rank 2/4] epoch 1/3 ...\n" + WORKER_ERROR)
    port = closed_port()
    err = report(tmp_path, 2, 1, 2, port, MS_NODE_TIMEOUT="10")
    assert err.strip() == (f"launcher: node 0 (ranks 0-1) did not respond: the scheduler at 127.0.0.1:{port} no "
                           "longer answers and this node's workers failed talking to the others at 17:06:56 (bound: "
                           "MS_NODE_TIMEOUT=10 s without an answer); node 0 is down, its msrun was killed or the "
                           "network to it is cut (node 0's launcher output says which, if it ran on). The job ended on "
                           "this node after 42 s.")
    assert "cut, or node 0 ended the job because another node stopped responding (node 0's" in report(
        tmp_path, 2, 1, 3, port, MS_NODE_TIMEOUT="10")
    (tmp_path / "worker_2.log").write_text("Traceback (most recent call last):\nValueError: a bad batch\n")
    assert report(tmp_path, 2, 1, 2, port) == ""  # this node's own failure, not a silent node 0
    (tmp_path / "worker_2.log").write_text(WORKER_ERROR)
    with socket.socket() as server:  # the scheduler still answers: the failure is not node 0's
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        assert report(tmp_path, 2, 1, 2, server.getsockname()[1], MS_NODE_TIMEOUT="10") == ""


def test_multinode_dry_run_prints_the_node_timeout_and_checks_it(env, tmp_path):
    env = {k: v for k, v in env.items() if k != "MS_NODE_TIMEOUT"}  # the default
    args = ["bash", str(SCRIPTS / "run_multinode_train.sh"), "4", "2", "1", "10.0.0.1", "synthetic", "--dry-run"]
    done = subprocess.run(args, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "node 1 of 2: MS_NODE_TIMEOUT=30" in done.stdout, done.stderr
    bad = subprocess.run(args, env=dict(env, MS_NODE_TIMEOUT="ten"), cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "MS_NODE_TIMEOUT must be an integer, got 'ten'" in bad.stderr


@pytest.mark.parametrize("recipe", ["resnet50_imagenet_boost_o2_adasum.yaml", "resnet50_imagenet_boost_o1.yaml",
                                    "resnet18_synthetic_quickstart.yaml"])
def test_recipes_that_can_run_o2_take_the_server_size(recipe, env, tmp_path):
    """The launcher's usage names these recipes for AdaSum across nodes: each takes --boost_level O2 with
    common.device_number, and the plan is AdaSum across servers of that many ranks."""
    from model_zoo.resnet.src.config import parse_config
    from model_zoo.resnet.src.trainer import boost_config_dict
    from ms_boost import AutoBoost

    overrides = ["--boost_level", "O2", "--boost_config_dict.common.device_number", "2"]
    cfg = parse_config(overrides, CONFIGS / recipe)
    plan = AutoBoost(cfg.boost_level, boost_config_dict(cfg, total_steps=10))
    assert plan.boost_config["adasum"] and plan.common.device_number == 2
    done = subprocess.run(["bash", str(SCRIPTS / "run_multinode_train.sh"), "4", "2", "0", "10.0.0.1", "synthetic",
                           str(CONFIGS / recipe), *overrides, "--dry-run"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "--boost_level O2 --boost_config_dict.common.device_number 2" in done.stdout.splitlines()[-1]
    usage = subprocess.run(["bash", str(SCRIPTS / "run_multinode_train.sh"), "--help"], capture_output=True, text=True,
                           timeout=60).stdout
    assert recipe in usage.replace("\n", " ")


def test_recipes_that_cannot_run_o2_refuse_the_server_size(env, tmp_path):
    done = subprocess.run(["bash", str(SCRIPTS / "run_multinode_train.sh"), "4", "2", "0", "10.0.0.1", "synthetic",
                           str(CONFIGS / "resnet50_imagenet_thor.yaml"), "--boost_config_dict.common.device_number",
                           "2", "--dry-run"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "--boost_config_dict.common.device_number: not used by optimizer='THOR'" in done.stderr


def test_a_killed_msrun_leaves_nothing_of_its_job_running(tmp_path):
    """stop_orphaned_workers: the processes of this run (train.py with --output_path RUN_DIR, tail -f of its logs)
    are killed, another run's are not."""
    train_py = ROOT / "model_zoo" / "resnet" / "train.py"
    run_dir, other = tmp_path / "run", tmp_path / "other"
    (run_dir / "msrun_log").mkdir(parents=True)
    (run_dir / "msrun_log" / "worker_0.log").write_text("")

    def start(*args):  # "sleep; :" keeps bash from exec-ing sleep: the command line stays
        return subprocess.Popen(["bash", "-c", "sleep 60; :", *map(str, args)], start_new_session=True)

    ours = [start(train_py, "--config", "x.yaml", "--output_path", run_dir, "--epoch_size", "2"),
            subprocess.Popen(["tail", "-f", str(run_dir / "msrun_log" / "worker_0.log")], start_new_session=True)]
    theirs = start(train_py, "--output_path", other)
    try:
        time.sleep(0.3)
        script = f"usage() {{ :; }}; source {SCRIPTS / 'common.sh'}; stop_orphaned_workers {run_dir} 137"
        done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        said = re.fullmatch(r"launcher: msrun ended by signal 9 without stopping what it started: killed 2 "
                            r"process\(es\) it left running \(pids (\d+) (\d+)\)", done.stderr.strip())
        assert said and {int(p) for p in said.groups()} == {p.pid for p in ours}, done.stderr
        assert [p.wait(timeout=10) for p in ours] == [-signal.SIGKILL] * 2
        assert theirs.poll() is None
    finally:
        for proc in (*ours, theirs):
            if proc.poll() is None:
                proc.kill()
            proc.wait()

#!/bin/bash
# Data-parallel training with several CPU processes on this machine (msrun, MCCL collectives).
usage() {
    cat <<'USAGE'
Usage: bash scripts/run_distribute_train_cpu.sh WORKER_NUM DATASET_PATH [CONFIG_PATH] [--dry-run] [--key value ...]

  WORKER_NUM     number of processes (ranks)
  DATASET_PATH   ImageNet root holding train/ and val/, or "synthetic" for the built-in data set
  CONFIG_PATH    recipe YAML (default: model_zoo/resnet/configs/resnet50_imagenet_momentum.yaml)
  --dry-run      print every worker's command and environment, start nothing (also DRY_RUN=1)
  --key value    any config key, forwarded to train.py (e.g. --net_name resnet18 --steps_per_epoch 4)

Environment: MASTER_PORT (default: random in 8200..8999), RUN_DIR (default ./train_parallel_cpu),
CLUSTER_TIME_OUT (msrun --cluster_time_out, default 600 s), STOP_TIMEOUT (seconds a stopped job gets before
it is killed, default 30), MS_CPU_COMM_OP_TIMEOUT (seconds a collective waits for the other ranks, default
120; a rank that does not respond is then named in one line and the job stops STUCK_GRACE=3 s later, exit 1).
Logs: RUN_DIR/msrun_log/worker_<rank>.log. Checkpoints: rank 0 in RUN_DIR/checkpoint/, rank r in
RUN_DIR/checkpoint/rank_<r>/; --resume RUN_DIR continues every rank. Ctrl-C / SIGTERM stop every worker
(exit 130 / 143).
USAGE
}
source "$(cd "$(dirname "$0")" && pwd)/common.sh"

[ $# -ge 1 ] || die "missing WORKER_NUM"
case "$1" in -h|--help) usage; exit 0 ;; esac
[ $# -ge 2 ] || die "missing DATASET_PATH"
require_int WORKER_NUM "$1" 1
WORKER_NUM="$1"
DATASET_PATH="$(dataset_arg "$2")"
shift 2
split_options "$@"

RUN_DIR="$(abs_path "${RUN_DIR:-./train_parallel_cpu}")"
MASTER_PORT="${MASTER_PORT:-$((8200 + RANDOM % 800))}"
msrun_launch CPU "${WORKER_NUM}" "${WORKER_NUM}" 0 127.0.0.1 "${MASTER_PORT}" "${RUN_DIR}" "${CONFIG_PATH}" "${DATASET_PATH}"

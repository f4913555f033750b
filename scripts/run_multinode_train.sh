#!/bin/bash
# Multi-node data-parallel training with msrun: run this script once on every node with its NODE_RANK.
usage() {
    cat <<'USAGE'
Usage: bash scripts/run_multinode_train.sh WORKER_NUM LOCAL_WORKER_NUM NODE_RANK MASTER_ADDR DATASET_PATH [CONFIG_PATH]
                                           [--dry-run] [--key value ...]

  WORKER_NUM        ranks over all nodes
  LOCAL_WORKER_NUM  ranks on this node (WORKER_NUM must be a multiple of it)
  NODE_RANK         this node's index, 0..WORKER_NUM/LOCAL_WORKER_NUM-1 (node 0 hosts the scheduler)
  MASTER_ADDR       IPv4 address (or host name) of node 0
  DATASET_PATH      ImageNet root holding train/ and val/ (same path on every node), or "synthetic"
  CONFIG_PATH       recipe YAML (default: model_zoo/resnet/configs/resnet50_imagenet_momentum.yaml)
  --dry-run         print every local rank's command and environment, start nothing (also DRY_RUN=1)
  --key value       any config key, forwarded to train.py

Environment: DEVICE_TARGET (Ascend, GPU or CPU; default Ascend), MASTER_PORT (default 8118),
RUN_DIR (default ./train_multinode), CLUSTER_TIME_OUT (msrun --cluster_time_out, default 600 s),
HCCL_CONNECT_TIMEOUT / HCCL_EXEC_TIMEOUT (Ascend, default 600 / 1800 s), STOP_TIMEOUT (default 30 s).
Ranks of node n are n*LOCAL_WORKER_NUM .. (n+1)*LOCAL_WORKER_NUM-1. Checkpoints: rank 0 in RUN_DIR/checkpoint/,
rank r in RUN_DIR/checkpoint/rank_<r>/ on its own node; use the same RUN_DIR path on every node (for --resume
without a shared file system see docs/model_zoo.md). Ctrl-C / SIGTERM stop this node's workers (exit 130 / 143).
With AdaSum (boost O2) set --boost_config_dict.common.device_number LOCAL_WORKER_NUM.
USAGE
}
source "$(cd "$(dirname "$0")" && pwd)/common.sh"

[ $# -ge 1 ] || die "missing WORKER_NUM"
case "$1" in -h|--help) usage; exit 0 ;; esac
[ $# -ge 5 ] || die "expected WORKER_NUM LOCAL_WORKER_NUM NODE_RANK MASTER_ADDR DATASET_PATH"
require_int WORKER_NUM "$1" 1
require_int LOCAL_WORKER_NUM "$2" 1
require_int NODE_RANK "$3" 0
WORKER_NUM="$1"; LOCAL_WORKER_NUM="$2"; NODE_RANK="$3"; MASTER_ADDR="$4"
[ $((WORKER_NUM % LOCAL_WORKER_NUM)) -eq 0 ] || die "WORKER_NUM=${WORKER_NUM} is not a multiple of LOCAL_WORKER_NUM=${LOCAL_WORKER_NUM}"
NODES=$((WORKER_NUM / LOCAL_WORKER_NUM))
[ "${NODE_RANK}" -lt "${NODES}" ] || die "NODE_RANK=${NODE_RANK} must be < ${NODES} (the number of nodes)"
[[ "${MASTER_ADDR}" =~ ^[A-Za-z0-9._-]+$ ]] || die "MASTER_ADDR '${MASTER_ADDR}' is not an address or host name"
DATASET_PATH="$(dataset_arg "$5")"
shift 5
split_options "$@"

DEVICE_TARGET="${DEVICE_TARGET:-Ascend}"
case "${DEVICE_TARGET}" in Ascend|GPU|CPU) ;; *) die "DEVICE_TARGET must be Ascend, GPU or CPU, got '${DEVICE_TARGET}'" ;; esac
RUN_DIR="$(abs_path "${RUN_DIR:-./train_multinode}")"
msrun_launch "${DEVICE_TARGET}" "${WORKER_NUM}" "${LOCAL_WORKER_NUM}" "${NODE_RANK}" "${MASTER_ADDR}" \
    "${MASTER_PORT:-8118}" "${RUN_DIR}" "${CONFIG_PATH}" "${DATASET_PATH}"

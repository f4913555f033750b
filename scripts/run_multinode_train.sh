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
HCCL_CONNECT_TIMEOUT / HCCL_EXEC_TIMEOUT (Ascend, default 600 / 1800 s), STOP_TIMEOUT (default 30 s),
MS_NODE_TIMEOUT (seconds without a heartbeat before a node counts as dead, default 30).
Ranks of node n are n*LOCAL_WORKER_NUM .. (n+1)*LOCAL_WORKER_NUM-1. Checkpoints: rank 0 in RUN_DIR/checkpoint/,
rank r in RUN_DIR/checkpoint/rank_<r>/ on its own node; use the same RUN_DIR path on every node (for --resume
without a shared file system see docs/model_zoo.md). Ctrl-C / SIGTERM stop this node's workers (exit 130 / 143).
A node that dies mid-run ends the job on the others within about MS_NODE_TIMEOUT + 15 s; each launcher then names
the node that did not respond (node 0 from the scheduler's log, the others when node 0 stops answering). When this
node's msrun is killed, the launcher kills the workers it left running (exit 128 + the signal).
MASTER_ADDR must be node 0's own address, not 127.0.0.1: msrun starts the scheduler on every node that has it.
With AdaSum (boost O2) set --boost_config_dict.common.device_number LOCAL_WORKER_NUM; the recipes that take it:
resnet50_imagenet_boost_o2_adasum.yaml, and resnet50_imagenet_boost_o1.yaml and resnet18_synthetic_quickstart.yaml
with --boost_level O2 (their auto mode adds AdaSum). The others do not take it: THOR and dimension-reduce stage 2
never run AdaSum, and the Momentum baseline under --boost_level O2 keeps ms_boost's default of 8 ranks per server.
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
MASTER_PORT="${MASTER_PORT:-8118}"
require_int MASTER_PORT "${MASTER_PORT}" 1
node_timeout
[ "${DRY_RUN}" != "1" ] || echo "node ${NODE_RANK} of ${NODES}: MS_NODE_TIMEOUT=${MS_NODE_TIMEOUT}"
STATUS=0
msrun_launch "${DEVICE_TARGET}" "${WORKER_NUM}" "${LOCAL_WORKER_NUM}" "${NODE_RANK}" "${MASTER_ADDR}" \
    "${MASTER_PORT}" "${RUN_DIR}" "${CONFIG_PATH}" "${DATASET_PATH}" || STATUS=$?
if [ "${STATUS}" -gt 128 ]; then  # msrun killed (a stop of the launcher itself exits in finish_jobs)
    stop_orphaned_workers "${RUN_DIR}" "${STATUS}"
elif [ "${STATUS}" -ne 0 ] && [ "${NODES}" -gt 1 ]; then
    report_missing_node "${RUN_DIR}/msrun_log" "${LOCAL_WORKER_NUM}" "${NODE_RANK}" "${NODES}" "${MASTER_ADDR}" \
        "${MASTER_PORT}" "${SECONDS}"
fi
exit "${STATUS}"

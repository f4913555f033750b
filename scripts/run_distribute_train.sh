#!/bin/bash
# Data-parallel training on Ascend with an HCCL rank table: one process, folder and log per device of this server.
usage() {
    cat <<'USAGE'
Usage: bash scripts/run_distribute_train.sh RANK_TABLE_FILE DATASET_PATH [CONFIG_PATH] [--dry-run] [--key value ...]

  RANK_TABLE_FILE  HCCL rank table (rank_table/rank_table_8pcs.json; make one with rank_table/hccl_tool.py)
  DATASET_PATH     ImageNet root holding train/ and val/, or "synthetic" for the built-in data set
  CONFIG_PATH      recipe YAML (default: model_zoo/resnet/configs/resnet50_imagenet_momentum.yaml)
  --dry-run        print every device's command and environment, start nothing (also DRY_RUN=1)
  --key value      any config key, forwarded to train.py

Environment:
  SERVER_ID   this server's 0-based position in the rank table's server_list (multi-node: run the
              script on every server with its SERVER_ID; default 0)
  RANK_SIZE   optional; when set it must equal the number of ranks in the table
  RUN_DIR     the job's run folder (default ./train_parallel); multi-node: the same path on every server
  HCCL_CONNECT_TIMEOUT, HCCL_EXEC_TIMEOUT  bounds on HCCL link setup / a collective's wait, seconds
              (default 600 / 1800; see scripts/common.sh)
  STOP_TIMEOUT  seconds the devices get to end after a stop before they are killed (default 30)
Every device runs train.py with --output_path RUN_DIR, as msrun's workers do: rank 0 writes its checkpoints
to RUN_DIR/checkpoint/, rank r to RUN_DIR/checkpoint/rank_<r>/, so --resume RUN_DIR continues every rank
from its own state. Device d of this server runs in RUN_DIR/device<d> (its working folder) with DEVICE_ID and
RANK_ID from the rank table, logging to RUN_DIR/device<d>/log.txt. The script waits for all of them and
fails if any fails; Ctrl-C or SIGTERM stops every device (exit 130 / 143).
USAGE
}
source "$(cd "$(dirname "$0")" && pwd)/common.sh"

[ $# -ge 1 ] || die "missing RANK_TABLE_FILE"
case "$1" in -h|--help) usage; exit 0 ;; esac
[ $# -ge 2 ] || die "missing DATASET_PATH"
require_file RANK_TABLE_FILE "$1"
RANK_TABLE_FILE="$(abs_path "$1")"
DATASET_PATH="$(dataset_arg "$2")"
shift 2
split_options "$@"

SERVER_ID="${SERVER_ID:-0}"
require_int SERVER_ID "${SERVER_ID}" 0
TABLE_INFO="$("${PYTHON}" "${RANK_TABLE_TOOL}" info "${RANK_TABLE_FILE}")" || die "invalid rank table (see above)"
TABLE_RANK_SIZE="$(awk '$1 == "rank_size" {print $2}' <<<"${TABLE_INFO}")"
if [ -n "${RANK_SIZE:-}" ] && [ "${RANK_SIZE}" != "${TABLE_RANK_SIZE}" ]; then
    die "RANK_SIZE=${RANK_SIZE} but the rank table holds ${TABLE_RANK_SIZE} ranks"
fi
DEVICE_LINES="$("${PYTHON}" "${RANK_TABLE_TOOL}" devices "${RANK_TABLE_FILE}" --server_index "${SERVER_ID}")" \
    || die "SERVER_ID=${SERVER_ID} does not select a server of the rank table (see above)"
export RANK_TABLE_FILE SERVER_ID
collective_timeouts Ascend
export RANK_SIZE="${TABLE_RANK_SIZE}"
export DEVICE_NUM="$(wc -l <<<"${DEVICE_LINES}" | tr -d ' ')"
RUN_DIR="$(abs_path "${RUN_DIR:-./train_parallel}")"

# One run folder for the whole job: a relative --output_path given as an override counts from RUN_DIR (not from
# each device's working folder), so the devices never split the run into per-device folders.
for i in "${!EXTRA_ARGS[@]}"; do
    case "${EXTRA_ARGS[$i]}" in
        --output_path=*) value="${EXTRA_ARGS[$i]#--output_path=}"
                         [[ "${value}" == /* ]] || EXTRA_ARGS[$i]="--output_path=${RUN_DIR}/${value}" ;;
        --output_path) next=$((i + 1))
                       if [ -n "${EXTRA_ARGS[$next]:-}" ] && [[ "${EXTRA_ARGS[$next]}" != /* ]]; then
                           EXTRA_ARGS[$next]="${RUN_DIR}/${EXTRA_ARGS[$next]}"
                       fi ;;
    esac
done
check_overrides "${CONFIG_PATH}"

DIRS=()
RANKS=()
while read -r DEVICE_ID RANK_ID DEVICE_IP; do
    DIR="${RUN_DIR}/device${DEVICE_ID}"
    CMD=("${PYTHON}" "${TRAIN_PY}" --config "${CONFIG_PATH}" --data_path "${DATASET_PATH}" --device_target Ascend
         --run_distribute true --output_path "${RUN_DIR}" ${EXTRA_ARGS[@]+"${EXTRA_ARGS[@]}"})
    if [ "${DRY_RUN}" = "1" ]; then
        echo "rank ${RANK_ID}: $(print_env DEVICE_ID RANK_ID RANK_SIZE DEVICE_NUM SERVER_ID RANK_TABLE_FILE) DEVICE_IP=${DEVICE_IP}" \
             "$(timeout_env Ascend)"
        echo "  cwd: ${DIR}  log: ${DIR}/log.txt"
        echo "  cmd: $(quote_cmd "${CMD[@]}")"
        continue
    fi
    start_job "device${DEVICE_ID}" GROUP_TERM "${DIR}" "${DIR}/log.txt" \
        env DEVICE_ID="${DEVICE_ID}" RANK_ID="${RANK_ID}" "${CMD[@]}"
    [ "${#JOB_PIDS[@]}" -gt "${#DIRS[@]}" ] || break  # stopped while starting
    DIRS+=("${DIR}")
    RANKS+=("${RANK_ID}")
    echo "rank ${RANK_ID} on device ${DEVICE_ID}: pid ${JOB_PIDS[-1]}, log ${DIR}/log.txt"
done <<<"${DEVICE_LINES}"
[ "${DRY_RUN}" = "1" ] && exit 0

wait_jobs
finish_jobs "${RUN_DIR}"
FAILED=0
for i in "${!JOB_PIDS[@]}"; do
    if [ "${JOB_STATUS[$i]}" -ne 0 ]; then
        echo "FAILED: rank ${RANKS[$i]} in ${DIRS[$i]} (exit ${JOB_STATUS[$i]}; see ${DIRS[$i]}/log.txt)" >&2
        FAILED=$((FAILED + 1))
    fi
done
[ "${FAILED}" -eq 0 ] || { echo "${FAILED} of ${#JOB_PIDS[@]} device process(es) failed" >&2; exit 1; }
echo "all ${#JOB_PIDS[@]} device process(es) finished; run folder ${RUN_DIR}"

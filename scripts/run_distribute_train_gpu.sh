#!/bin/bash
# Data-parallel training on the GPUs of one server with NCCL, started by msrun (default) or OpenMPI's mpirun.
usage() {
    cat <<'USAGE'
Usage: bash scripts/run_distribute_train_gpu.sh DEVICE_NUM DATASET_PATH [CONFIG_PATH] [--launcher msrun|mpirun]
                                                [--dry-run] [--key value ...]

  DEVICE_NUM     number of GPUs (processes)
  DATASET_PATH   ImageNet root holding train/ and val/, or "synthetic" for the built-in data set
  CONFIG_PATH    recipe YAML (default: model_zoo/resnet/configs/resnet50_imagenet_momentum.yaml)
  --launcher     msrun (default) or mpirun
  --dry-run      print every device's command and environment, start nothing (also DRY_RUN=1)
  --key value    any config key, forwarded to train.py

Environment: CUDA_VISIBLE_DEVICES (default 0..DEVICE_NUM-1), MASTER_PORT (msrun, default 8118),
RUN_DIR (default ./train_parallel_gpu), CLUSTER_TIME_OUT (msrun --cluster_time_out, default 600 s),
STOP_TIMEOUT (seconds a stopped job gets before it is killed, default 30), CUDA_CACHE_MAXSIZE (the driver's cache
of kernels compiled from PTX, default 4294967296 here: see docs/compatibility.md, "First run on a GPU"). Logs: RUN_DIR/msrun_log/worker_<rank>.log
(msrun) or RUN_DIR/mpirun_log/1/rank.<rank>/stdout (mpirun). Checkpoints: rank 0 in RUN_DIR/checkpoint/, rank r in
RUN_DIR/checkpoint/rank_<r>/ (--resume RUN_DIR continues every rank). Ctrl-C / SIGTERM stop the job (exit 130 / 143).
USAGE
}
source "$(cd "$(dirname "$0")" && pwd)/common.sh"

[ $# -ge 1 ] || die "missing DEVICE_NUM"
case "$1" in -h|--help) usage; exit 0 ;; esac
[ $# -ge 2 ] || die "missing DATASET_PATH"
require_int DEVICE_NUM "$1" 1
DEVICE_NUM="$1"
DATASET_PATH="$(dataset_arg "$2")"
shift 2
LAUNCHER="${LAUNCHER:-msrun}"
split_options "$@"
case "${LAUNCHER}" in msrun|mpirun) ;; *) die "--launcher must be msrun or mpirun, got '${LAUNCHER}'" ;; esac

if [ -z "${CUDA_VISIBLE_DEVICES:-}" ]; then
    CUDA_VISIBLE_DEVICES="$(seq -s, 0 $((DEVICE_NUM - 1)))"
fi
IFS=',' read -r -a GPUS <<<"${CUDA_VISIBLE_DEVICES}"
[ "${#GPUS[@]}" -ge "${DEVICE_NUM}" ] || die "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES} lists fewer than ${DEVICE_NUM} GPUs"
export CUDA_VISIBLE_DEVICES
gpu_jit_cache GPU
RUN_DIR="$(abs_path "${RUN_DIR:-./train_parallel_gpu}")"
MASTER_PORT="${MASTER_PORT:-8118}"

if [ "${LAUNCHER}" = "msrun" ]; then
    msrun_launch GPU "${DEVICE_NUM}" "${DEVICE_NUM}" 0 127.0.0.1 "${MASTER_PORT}" "${RUN_DIR}" "${CONFIG_PATH}" "${DATASET_PATH}"
    exit $?
fi

CMD=(mpirun -n "${DEVICE_NUM}" --allow-run-as-root --output-filename "${RUN_DIR}/mpirun_log" --merge-stderr-to-stdout
     -x CUDA_VISIBLE_DEVICES -x CUDA_CACHE_MAXSIZE -x PYTHONPATH
     "${PYTHON}" "${TRAIN_PY}" --config "${CONFIG_PATH}" --data_path "${DATASET_PATH}" --device_target GPU
     --run_distribute true --output_path "${RUN_DIR}" ${EXTRA_ARGS[@]+"${EXTRA_ARGS[@]}"})
check_overrides "${CONFIG_PATH}"
if [ "${DRY_RUN}" = "1" ]; then
    for ((i = 0; i < DEVICE_NUM; i++)); do
        echo "rank ${i}: OMPI_COMM_WORLD_RANK=${i} RANK_SIZE=${DEVICE_NUM} GPU=${GPUS[$i]} $(print_env CUDA_VISIBLE_DEVICES CUDA_CACHE_MAXSIZE)"
        echo "  cwd: ${RUN_DIR}  log: ${RUN_DIR}/mpirun_log/1/rank.${i}/stdout"
    done
    echo "cmd: $(quote_cmd "${CMD[@]}")"
    exit 0
fi
# mpirun forwards SIGTERM to every rank and ends them
start_job mpirun TERM "${RUN_DIR}" "" "${CMD[@]}"
wait_jobs
finish_jobs "${RUN_DIR}"
exit "${JOB_STATUS[0]}"

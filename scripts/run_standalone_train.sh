#!/bin/bash
# Train a ResNet recipe on one device (any backend).
usage() {
    cat <<'USAGE'
Usage: bash scripts/run_standalone_train.sh DATASET_PATH [CONFIG_PATH] [--dry-run] [--key value ...]

  DATASET_PATH   ImageNet root holding train/ and val/, or "synthetic" for the built-in data set
  CONFIG_PATH    recipe YAML (default: model_zoo/resnet/configs/resnet50_imagenet_momentum.yaml)
  --dry-run      print the command and environment, start nothing (also DRY_RUN=1)
  --key value    any config key, forwarded to train.py (e.g. --epoch_size 2 --device_target CPU)

Environment: RUN_DIR (output folder, default ./train_standalone), DEVICE_ID (Ascend/GPU device, default 0),
PYTHON (interpreter). Output: RUN_DIR/log.txt, checkpoints under RUN_DIR/<checkpoint_dir>.
USAGE
}
source "$(cd "$(dirname "$0")" && pwd)/common.sh"

[ $# -ge 1 ] || die "missing DATASET_PATH"
case "$1" in -h|--help) usage; exit 0 ;; esac
DATASET_PATH="$(dataset_arg "$1")"; shift
split_options "$@"

RUN_DIR="$(abs_path "${RUN_DIR:-./train_standalone}")"
export DEVICE_ID="${DEVICE_ID:-0}"
export RANK_ID=0 RANK_SIZE=1
CMD=("${PYTHON}" "${TRAIN_PY}" --config "${CONFIG_PATH}" --data_path "${DATASET_PATH}" --output_path "${RUN_DIR}"
     ${EXTRA_ARGS[@]+"${EXTRA_ARGS[@]}"})
check_overrides "${CONFIG_PATH}"
if [ "${DRY_RUN}" = "1" ]; then
    echo "rank 0: $(print_env DEVICE_ID RANK_ID RANK_SIZE)"
    echo "  cwd: ${RUN_DIR}  log: ${RUN_DIR}/log.txt"
    echo "cmd: $(quote_cmd "${CMD[@]}")"
    exit 0
fi
echo "training in ${RUN_DIR} (log: ${RUN_DIR}/log.txt)"
run_logged "${RUN_DIR}" "${RUN_DIR}/log.txt" "${CMD[@]}"

#!/bin/bash
# Evaluate a checkpoint on the eval split: prints top-1 and top-5 accuracy.
usage() {
    cat <<'USAGE'
Usage: bash scripts/run_eval.sh DATASET_PATH CHECKPOINT_PATH [CONFIG_PATH] [--dry-run] [--key value ...]

  DATASET_PATH     ImageNet root holding val/ (eval_dir), or "synthetic" for the built-in data set
  CHECKPOINT_PATH  checkpoint to evaluate (.ckpt)
  CONFIG_PATH      recipe YAML the checkpoint was trained with (default: resnet50_imagenet_momentum.yaml)
  --dry-run        print the command, start nothing (also DRY_RUN=1)
  --key value      any config key, forwarded to eval.py (e.g. --device_target CPU)

Environment: RUN_DIR (default ./eval), DEVICE_ID (default 0). Log: RUN_DIR/log.txt.
USAGE
}
source "$(cd "$(dirname "$0")" && pwd)/common.sh"

[ $# -ge 1 ] || die "missing DATASET_PATH"
case "$1" in -h|--help) usage; exit 0 ;; esac
[ $# -ge 2 ] || die "missing CHECKPOINT_PATH"
DATASET_PATH="$(dataset_arg "$1")"
require_file CHECKPOINT_PATH "$2"
CHECKPOINT_PATH="$(abs_path "$2")"
shift 2
split_options "$@"

RUN_DIR="$(abs_path "${RUN_DIR:-./eval}")"
export DEVICE_ID="${DEVICE_ID:-0}"
CMD=("${PYTHON}" "${EVAL_PY}" --config "${CONFIG_PATH}" --data_path "${DATASET_PATH}"
     --checkpoint_file_path "${CHECKPOINT_PATH}" ${EXTRA_ARGS[@]+"${EXTRA_ARGS[@]}"})
check_overrides "${CONFIG_PATH}"
if [ "${DRY_RUN}" = "1" ]; then
    echo "rank 0: $(print_env DEVICE_ID)"
    echo "  cwd: ${RUN_DIR}  log: ${RUN_DIR}/log.txt"
    echo "cmd: $(quote_cmd "${CMD[@]}")"
    exit 0
fi
run_logged "${RUN_DIR}" "${RUN_DIR}/log.txt" "${CMD[@]}"

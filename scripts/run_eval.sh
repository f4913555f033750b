#!/bin/bash
# Evaluate a checkpoint on the eval split: prints top-1 and top-5 accuracy.
usage() {
    cat <<'USAGE'
Usage: bash scripts/run_eval.sh DATASET_PATH CHECKPOINT_PATH [CONFIG_PATH] [--dry-run] [--key value ...]

  DATASET_PATH     ImageNet root holding val/ (eval_dir), or "synthetic" for the built-in data set
  CHECKPOINT_PATH  checkpoint to evaluate (.ckpt), or a run's output folder (its newest checkpoint)
  CONFIG_PATH      recipe YAML the checkpoint was trained with (default: the recipe its run manifest names,
                   else resnet50_imagenet_momentum.yaml)
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
[ -f "$2" ] || [ -d "$2" ] || die "CHECKPOINT_PATH '$2' is neither a checkpoint file nor a run folder"
CHECKPOINT_PATH="$(abs_path "$2")"
shift 2
split_options "$@"

RUN_DIR="$(abs_path "${RUN_DIR:-./eval}")"
export DEVICE_ID="${DEVICE_ID:-0}"
# without CONFIG_PATH, eval.py takes the recipe the checkpoint's run manifest names (model_zoo/resnet/src/recipe_lookup.py)
CONFIG_ARGS=()
[ "${CONFIG_GIVEN}" = "1" ] && CONFIG_ARGS=(--config "${CONFIG_PATH}")
CMD=("${PYTHON}" "${EVAL_PY}" ${CONFIG_ARGS[@]+"${CONFIG_ARGS[@]}"} --data_path "${DATASET_PATH}"
     --checkpoint_file_path "${CHECKPOINT_PATH}" ${EXTRA_ARGS[@]+"${EXTRA_ARGS[@]}"})
EXTRA_ARGS=(--checkpoint_file_path "${CHECKPOINT_PATH}" ${EXTRA_ARGS[@]+"${EXTRA_ARGS[@]}"})  # for the check alone
if [ "${CONFIG_GIVEN}" = "1" ]; then check_overrides "${CONFIG_PATH}"; else check_overrides; fi
if [ "${DRY_RUN}" = "1" ]; then
    echo "rank 0: $(print_env DEVICE_ID)"
    echo "  cwd: ${RUN_DIR}  log: ${RUN_DIR}/log.txt"
    echo "cmd: $(quote_cmd "${CMD[@]}")"
    exit 0
fi
run_logged "${RUN_DIR}" "${RUN_DIR}/log.txt" "${CMD[@]}"

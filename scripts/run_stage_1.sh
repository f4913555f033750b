#!/bin/bash
# Dimension-reduce training, stage 1: regular Momentum training that also keeps weight-only checkpoints for the PCA.
usage() {
    cat <<'USAGE'
Usage: bash scripts/run_stage_1.sh DATASET_PATH [RANK_TABLE_FILE] [--dry-run] [--key value ...]

  DATASET_PATH     ImageNet root holding train/ and val/, or "synthetic" for the built-in data set
  RANK_TABLE_FILE  HCCL rank table (.json): train on this server's Ascend devices; without it, one device
  --dry-run        print the command(s) and environment, start nothing (also DRY_RUN=1)
  --key value      any config key, forwarded to train.py

Environment: CONFIG_PATH (default model_zoo/resnet/configs/resnet50_imagenet_dim_reduce_stage1.yaml),
RUN_DIR (default ./stage_1), SERVER_ID (with a rank table). Checkpoints: RUN_DIR/checkpoint_stage_1/
(other ranks: RUN_DIR/checkpoint_stage_1/rank_<r>/), the weight-only ones for stage 2 in
RUN_DIR/checkpoint_stage_1/checkpoint_pca/.
USAGE
}
source "$(cd "$(dirname "$0")" && pwd)/common.sh"

[ $# -ge 1 ] || die "missing DATASET_PATH"
case "$1" in -h|--help) usage; exit 0 ;; esac
DATASET_PATH="$1"; shift
CONFIG_PATH="${CONFIG_PATH:-${CONFIG_DIR}/resnet50_imagenet_dim_reduce_stage1.yaml}"
export RUN_DIR="${RUN_DIR:-./stage_1}"
if [ $# -ge 1 ] && [[ "$1" != --* ]]; then
    [[ "$1" == *.json ]] || die "second argument '$1' must be a rank table (.json) or an option"
    RANK_TABLE_FILE="$1"; shift
    exec bash "${SCRIPT_DIR}/run_distribute_train.sh" "${RANK_TABLE_FILE}" "${DATASET_PATH}" "${CONFIG_PATH}" "$@"
fi
exec bash "${SCRIPT_DIR}/run_standalone_train.sh" "${DATASET_PATH}" "${CONFIG_PATH}" "$@"

#!/bin/bash
# Dimension-reduce training, stage 2: boost with dim_reduce (PCA subspace quasi-Newton) from stage 1's weights.
usage() {
    cat <<'USAGE'
Usage: bash scripts/run_stage_2.sh DATASET_PATH CHECKPOINT_PATH [PCA_MAT.npy] [RANK_TABLE_FILE.json]
                                   [--dry-run] [--key value ...]

  DATASET_PATH     ImageNet root holding train/ and val/, or "synthetic" for the built-in data set
  CHECKPOINT_PATH  stage-1 checkpoint to start from; its folder's checkpoint_pca/ holds the weight-only
                   checkpoints the PCA reads
  PCA_MAT.npy      optional PCA matrix: loaded if it exists, else computed and saved there (skip the PCA
                   next time)
  RANK_TABLE_FILE  optional HCCL rank table (.json): train on this server's Ascend devices
  --dry-run        print the command(s) and environment, start nothing (also DRY_RUN=1)
  --key value      any config key, forwarded to train.py

Environment: CONFIG_PATH (default model_zoo/resnet/configs/resnet50_imagenet_dim_reduce_stage2.yaml),
RUN_DIR (default ./stage_2), SERVER_ID (with a rank table). Checkpoints: <run folder>/checkpoint_stage_2/.
USAGE
}
source "$(cd "$(dirname "$0")" && pwd)/common.sh"

[ $# -ge 1 ] || die "missing DATASET_PATH"
case "$1" in -h|--help) usage; exit 0 ;; esac
[ $# -ge 2 ] || die "missing CHECKPOINT_PATH"
DATASET_PATH="$1"
require_file CHECKPOINT_PATH "$2"
CHECKPOINT_PATH="$(abs_path "$2")"
shift 2
PCA_MAT=""
RANK_TABLE_FILE=""
while [ $# -ge 1 ] && [[ "$1" != --* ]]; do
    case "$1" in
        *.npy) [ -z "${PCA_MAT}" ] || die "two PCA matrices given"; PCA_MAT="$(abs_path "$1")" ;;
        *.json) [ -z "${RANK_TABLE_FILE}" ] || die "two rank tables given"; RANK_TABLE_FILE="$1" ;;
        *) die "'$1' is neither a PCA matrix (.npy) nor a rank table (.json)" ;;
    esac
    shift
done
CONFIG_PATH="${CONFIG_PATH:-${CONFIG_DIR}/resnet50_imagenet_dim_reduce_stage2.yaml}"
export RUN_DIR="${RUN_DIR:-./stage_2}"
STAGE_ARGS=(--pretrained "${CHECKPOINT_PATH}")
[ -n "${PCA_MAT}" ] && STAGE_ARGS+=(--boost_config_dict.dim_reduce.pca_mat_path "${PCA_MAT}")
if [ -n "${RANK_TABLE_FILE}" ]; then
    require_file RANK_TABLE_FILE "${RANK_TABLE_FILE}"
    DEVICES="$("${PYTHON}" "${RANK_TABLE_TOOL}" devices "${RANK_TABLE_FILE}" --server_index "${SERVER_ID:-0}")" \
        || die "invalid rank table or SERVER_ID (see above)"
    STAGE_ARGS+=(--boost_config_dict.common.device_num "$(wc -l <<<"${DEVICES}" | tr -d ' ')")
    exec bash "${SCRIPT_DIR}/run_distribute_train.sh" "${RANK_TABLE_FILE}" "${DATASET_PATH}" "${CONFIG_PATH}" \
        "${STAGE_ARGS[@]}" "$@"
fi
STAGE_ARGS+=(--boost_config_dict.common.device_num 1)
exec bash "${SCRIPT_DIR}/run_standalone_train.sh" "${DATASET_PATH}" "${CONFIG_PATH}" "${STAGE_ARGS[@]}" "$@"

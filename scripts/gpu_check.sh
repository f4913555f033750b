#!/bin/bash
# The GPU path with the MindSpore wheel already installed: its CUDA 11.6 plugin (mindspore/lib/plugin/gpu11.6) plus
# the CUDA 11.x user-space libraries from pip, then run_check on GPU and a few steps of each algorithm against CPU.
usage() {
    cat <<'USAGE'
Usage: bash scripts/gpu_check.sh [--steps N] [--mode pynative|graph] [--timeout S] [--wheels DIR] [--no-install]
                                 [--dry-run]

On a machine with an NVIDIA GPU (nvidia-smi lists one; the driver provides libcuda.so.1) whose PYTHON has the
MindSpore 2.10 wheel installed (checked first: without it, or without its CUDA 11.6 plugin, nothing is installed):
  1. reads which architectures the plugin's kernels are built for (scripts/fatbin_archs.py) against the GPU's
     compute capability: MindSpore 2.10's carry machine code for sm_60-sm_80 and PTX above, so on a newer GPU
     (Hopper: 9.0) every kernel is compiled from PTX at its first use, once per machine (kept in CUDA_CACHE_PATH):
     it says so; where the GPU can run none of the code it stops (exit 6);
  2. pip-installs into the Python environment of PYTHON the CUDA 11 user-space libraries that
     mindspore/lib/plugin/libmindspore_gpu.so.11.6 links against (readelf -d): runtime (libcudart.so.11.0),
     cuBLAS (libcublas.so.11), cuDNN 8 (libcudnn.so.8: 8.5 as MindSpore recommends for CUDA 11.6; 8.9.6 on a GPU of
     compute capability 9.0 or more, as 8.5 has no machine code for it), NCCL 2.16.5
     (the version the plugin's own libnccl.so.2 carries), cuRAND, cuSOLVER, cuFFT, cuSPARSE and NVRTC;
  3. points LD_LIBRARY_PATH at them and CUDA_HOME at a folder whose bin/nvcc only prints the installed runtime's
     release (MindSpore picks its GPU plugin from `$CUDA_HOME/bin/nvcc --version`; the pip packages ship no nvcc);
  4. runs mindspore.run_check() on GPU;
  5. runs scripts/gpu_check.py --device GPU: N steps (default 3) of O0, O1, THOR and DimReduce through
     ms_boost.Model on GPU and on CPU (same seed, data and initial weights) and compares the losses (step 1
     within 1e-3 relative, later steps within 1e-2), ending with one summary line.
Without a GPU it says so and exits 0. Exit status: 0 all agree (or no GPU), 1 the losses differ, 2 bad arguments,
3 installing failed, 4 run_check failed (or ran out of --timeout), 5 a training run failed, 6 PYTHON has no
MindSpore or no CUDA 11.6 plugin, or the plugin has no code this GPU can run.

  --steps N      training steps per algorithm (default 3)
  --mode M       pynative (default) or graph
  --timeout S    seconds allowed to run_check and to the comparison, each (default 3600: on a GPU that compiles
                 the plugin from PTX the first run took more than 8.8 minutes on an H200)
  --wheels DIR   install from the wheels in DIR, with no package index (a machine without internet access;
                 fill DIR elsewhere with `pip download --no-deps -d DIR <the packages the dry run lists>`)
  --no-install   use the libraries already installed (step 2 skipped)
  --dry-run      print the pip command and the environment, run nothing (also DRY_RUN=1)
Environment: PYTHON (default python3), NVIDIA_SMI (default nvidia-smi), GPU_CHECK_DIR (where CUDA_HOME and the JIT
cache are made, default ${TMPDIR:-/tmp}/ms_boost_gpu_check), CUDA_CACHE_PATH (default GPU_CHECK_DIR/jit_cache).
USAGE
}
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${SCRIPT_DIR}/.." && pwd)"
PYTHON="${PYTHON:-python3}"
NVIDIA_SMI="${NVIDIA_SMI:-nvidia-smi}"
DRY_RUN="${DRY_RUN:-0}"
STEPS=3
MODE=pynative
TIMEOUT=3600
INSTALL=1
WHEELS=""
# pip names and versions (checked with pip index versions); cuDNN 8.5 and NCCL 2.16.5 as explained above
CUDNN_PRE_HOPPER=8.5.0.96
CUDNN_HOPPER=8.9.6.50  # the cuDNN 8 for CUDA 11 whose libraries carry sm_90 code (scripts/fatbin_archs.py); 8.5: PTX 7.0
CUDA_PACKAGES=(nvidia-cuda-runtime-cu11==11.8.89 nvidia-cublas-cu11==11.11.3.6 "nvidia-cudnn-cu11==${CUDNN_PRE_HOPPER}"
               nvidia-nccl-cu11==2.16.5 nvidia-curand-cu11==10.3.0.86 nvidia-cusolver-cu11==11.4.1.48
               nvidia-cufft-cu11==10.9.0.58 nvidia-cusparse-cu11==11.7.5.86 nvidia-cuda-nvrtc-cu11==11.8.89)

die() {
    echo "gpu_check: error: $*" >&2
    echo >&2
    usage >&2
    exit 2
}

while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --steps) [ $# -ge 2 ] || die "--steps needs a value"; STEPS="$2"; shift ;;
        --mode) [ $# -ge 2 ] || die "--mode needs a value"; MODE="$2"; shift ;;
        --timeout) [ $# -ge 2 ] || die "--timeout needs a value"; TIMEOUT="$2"; shift ;;
        --wheels) [ $# -ge 2 ] || die "--wheels needs a folder"; WHEELS="$2"; shift ;;
        --no-install) INSTALL=0 ;;
        --dry-run|--dry_run) DRY_RUN=1 ;;
        *) die "unknown argument '$1'" ;;
    esac
    shift
done
[[ "${STEPS}" =~ ^[0123456789]+$ ]] && [ "${STEPS}" -ge 1 ] || die "--steps must be an integer >= 1, got '${STEPS}'"
case "${MODE}" in pynative|graph) ;; *) die "--mode must be pynative or graph, got '${MODE}'" ;; esac
[[ "${TIMEOUT}" =~ ^[0123456789]+$ ]] && [ "${TIMEOUT}" -ge 1 ] || die "--timeout must be whole seconds >= 1, got '${TIMEOUT}'"
[ -z "${WHEELS}" ] || [ -d "${WHEELS}" ] || die "--wheels must be a folder of wheel files, got '${WHEELS}' (no such folder)"
[ -z "${WHEELS}" ] || [ "${INSTALL}" = "1" ] || die "--wheels and --no-install exclude each other (--no-install installs nothing)"

# 0. a GPU?
if ! command -v "${NVIDIA_SMI}" >/dev/null 2>&1; then
    echo "gpu_check: no NVIDIA GPU on this machine (${NVIDIA_SMI} not found): nothing to check"
    exit 0
fi
GPUS="$("${NVIDIA_SMI}" -L 2>/dev/null | grep -c '^GPU ' || true)"
if [ "${GPUS}" -eq 0 ]; then
    echo "gpu_check: no NVIDIA GPU on this machine (${NVIDIA_SMI} -L lists none): nothing to check"
    exit 0
fi
echo "gpu_check: ${GPUS} GPU(s): $("${NVIDIA_SMI}" -L | head -n 1)"
# the first GPU's compute capability (e.g. 9.0); empty when this nvidia-smi cannot say (older drivers)
CC="$("${NVIDIA_SMI}" --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' \r' || true)"
[[ "${CC}" =~ ^[0123456789]+\.[0123456789]+$ ]] || CC=""
if [ -n "${CC}" ] && [ "${CC%%.*}" -ge 9 ]; then
    CUDA_PACKAGES=("${CUDA_PACKAGES[@]/nvidia-cudnn-cu11==${CUDNN_PRE_HOPPER}/nvidia-cudnn-cu11==${CUDNN_HOPPER}}")
    echo "gpu_check: compute capability ${CC}: cuDNN ${CUDNN_HOPPER} (${CUDNN_PRE_HOPPER} has no machine code for it)"
fi

# 1. MindSpore and its CUDA 11.6 plugin in PYTHON, before anything is installed
if ! MS_DIR="$("${PYTHON}" -c 'import os, mindspore; print(os.path.dirname(mindspore.__file__))' 2>/dev/null)"; then
    echo "gpu_check: FAIL: ${PYTHON} ($("${PYTHON}" --version 2>&1 || echo 'not found')) cannot import mindspore:" \
         "install the MindSpore 2.10 wheel into it first (pip install mindspore==2.10.0), or set PYTHON to the" \
         "interpreter that has it"
    exit 6
fi
PLUGIN="${MS_DIR}/lib/plugin/gpu11.6"
if [ ! -d "${PLUGIN}" ]; then
    echo "gpu_check: FAIL: this MindSpore has no CUDA 11.6 GPU plugin (${PLUGIN} is missing): a MindSpore 2.10 wheel" \
         "from the package index carries it"
    exit 6
fi

# 2. the plugin's kernels on this GPU
if [ -n "${CC}" ]; then
    OPS="${MS_DIR}/lib/plugin/gpu/libcuda_ops.so.11"
    if CODE="$("${PYTHON}" "${SCRIPT_DIR}/fatbin_archs.py" "${OPS}" --compute-capability "${CC}" 2>&1)"; then
        BUILT="$(echo "${CODE}" | head -n 1)"
        case "$(echo "${CODE}" | tail -n 1)" in
            native) ;;
            jit*) echo "gpu_check: note: MindSpore's GPU kernels (${OPS##*/}: ${BUILT}) have no machine code for" \
                       "compute capability ${CC}: the driver compiles them from PTX when they are first used, all at" \
                       "once (the plugin's own CUDA 11.6 runtime loads every module), once per machine: seen on an" \
                       "H200, more than 8.8 minutes (three runs, the cache kept between them) without" \
                       "run_check's first operation ending; what is compiled is kept in CUDA_CACHE_PATH" ;;
            *) echo "gpu_check: FAIL: MindSpore's GPU kernels (${OPS##*/}: ${BUILT}) have no code a GPU of compute" \
                    "capability ${CC} can run"
               exit 6 ;;
        esac
    else
        echo "gpu_check: note: could not read the architectures of ${OPS}: ${CODE}"
    fi
fi

# 3. the libraries
PIP=("${PYTHON}" -m pip install --no-input)
[ -z "${WHEELS}" ] || PIP+=(--no-index --find-links "${WHEELS}")
PIP+=("${CUDA_PACKAGES[@]}")
if [ "${DRY_RUN}" = "1" ]; then
    echo "install: $(printf '%q ' "${PIP[@]}")"
elif [ "${INSTALL}" = "1" ]; then
    echo "gpu_check: installing the CUDA 11 libraries (about 2 GB)"
    if ! "${PIP[@]}"; then
        echo "gpu_check: FAIL: pip could not install the CUDA 11 libraries (output above)"
        [ -n "${WHEELS}" ] || echo "gpu_check: without a reachable package index, download the wheels on a machine" \
            "that has one (pip download --no-deps -d DIR, the packages above) and pass --wheels DIR"
        exit 3
    fi
fi

# 4. the environment
SITE="$("${PYTHON}" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"  # where pip puts nvidia/
LIBS="${PLUGIN}"
for dir in cuda_runtime cublas cudnn nccl curand cusolver cufft cusparse cuda_nvrtc; do
    LIBS+=":${SITE}/nvidia/${dir}/lib"
done
export LD_LIBRARY_PATH="${LIBS}${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
RUNTIME="$("${PYTHON}" -c 'from importlib.metadata import version; print(version("nvidia-cuda-runtime-cu11"))' \
           2>/dev/null || echo 11.8.89)"
export CUDA_HOME="${GPU_CHECK_DIR:-${TMPDIR:-/tmp}/ms_boost_gpu_check}/cuda_home"
# the driver's cache of kernels compiled from PTX: kept between runs, large enough for the whole plugin (4 GiB, the
# most CUDA allows); lazy loading where a runtime supports it (11.7 and later: cuBLAS, cuDNN, cuSOLVER here)
export CUDA_CACHE_PATH="${CUDA_CACHE_PATH:-${GPU_CHECK_DIR:-${TMPDIR:-/tmp}/ms_boost_gpu_check}/jit_cache}"
export CUDA_CACHE_MAXSIZE="${CUDA_CACHE_MAXSIZE:-4294967296}" CUDA_MODULE_LOADING="${CUDA_MODULE_LOADING:-LAZY}"
echo "env: LD_LIBRARY_PATH=${LD_LIBRARY_PATH}"
echo "env: CUDA_HOME=${CUDA_HOME} (bin/nvcc prints: Cuda compilation tools, release ${RUNTIME%.*}, V${RUNTIME})"
echo "env: CUDA_CACHE_PATH=${CUDA_CACHE_PATH} CUDA_CACHE_MAXSIZE=${CUDA_CACHE_MAXSIZE} CUDA_MODULE_LOADING=${CUDA_MODULE_LOADING}"
[ "${DRY_RUN}" != "1" ] || exit 0
mkdir -p "${CUDA_HOME}/bin"
printf '#!/bin/sh\n# the release of the pip CUDA runtime, for MindSpore'"'"'s plugin choice; compiles nothing\necho "Cuda compilation tools, release %s, V%s"\n' \
    "${RUNTIME%.*}" "${RUNTIME}" >"${CUDA_HOME}/bin/nvcc"
chmod +x "${CUDA_HOME}/bin/nvcc"

# 5. run_check
CHECK_LOG="$(dirname "${CUDA_HOME}")/run_check.log"
rc=0
timeout "${TIMEOUT}" "${PYTHON}" -c 'import mindspore as ms; ms.set_device("GPU"); ms.run_check()' >"${CHECK_LOG}" 2>&1 ||
    rc=$?
cat "${CHECK_LOG}" >&2
if [ "${rc}" = "124" ]; then
    echo "gpu_check: FAIL: mindspore.run_check() on GPU did not finish in ${TIMEOUT} s (--timeout); where the note" \
         "above says the kernels are compiled from PTX, run again with a longer --timeout: what was compiled is kept" \
         "in ${CUDA_CACHE_PATH}"
    exit 4
fi
if ! grep 'installed on platform \[GPU\] successfully' "${CHECK_LOG}" >/dev/null; then
    echo "gpu_check: FAIL: mindspore.run_check() on GPU did not succeed (output above)"
    exit 4
fi

# 6. the algorithms against CPU
export PYTHONPATH="${REPO_ROOT}${PYTHONPATH:+:${PYTHONPATH}}"
rc=0
timeout "${TIMEOUT}" "${PYTHON}" "${SCRIPT_DIR}/gpu_check.py" --device GPU --steps "${STEPS}" --mode "${MODE}" || rc=$?
[ "${rc}" != "124" ] || echo "gpu_check: FAIL: the comparison did not finish in ${TIMEOUT} s (--timeout)"
case "${rc}" in 0|1) exit "${rc}" ;; *) exit 5 ;; esac

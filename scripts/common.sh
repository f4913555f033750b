#!/bin/bash
# Shared helpers of the ResNet launchers (sourced, not run). Each launcher defines a `usage` function
# before sourcing this file.
#
# Environment understood by every launcher:
#   PYTHON   interpreter to run (default: python3, or python when python3 is missing)
#   MSRUN    msrun executable (default: msrun next to PYTHON, else on PATH)
#   DRY_RUN  1 = print each device's command and environment instead of starting anything
# Bounds on how long a rank waits for the others (see docs/model_zoo.md, "Stuck or dead ranks"):
#   HCCL_CONNECT_TIMEOUT  Ascend: seconds to build the HCCL links (default here 600; CANN: 120..7200)
#   HCCL_EXEC_TIMEOUT     Ascend: seconds a collective waits for the other devices (default here 1800)
#   CLUSTER_TIME_OUT      msrun --cluster_time_out: seconds to wait for every process to join (default 600)
#   MS_CPU_COMM_OP_TIMEOUT CPU: seconds a collective waits for the other ranks (default here 120); a rank that does
#                         not respond is named, see watch_stuck_ranks below
# Stopping (see start_job below): SIGINT (Ctrl-C) or SIGTERM to a launcher stops its whole job and the launcher
# exits 130 / 143 after printing how to continue with --resume.
#   STOP_TIMEOUT  seconds a stopped job may take to end before it is killed (SIGKILL; default 30)

set -euo pipefail

# A launcher started in the background by a script inherits SIGINT ignored, and bash can neither trap nor reset a
# signal ignored on entry: start it again with SIGINT at its default, so that SIGINT stops the job (start_job).
# Only a launcher script can be started again: sourced from `bash -c` (no script file; $0 is "bash"), it is not.
if [ -n "${MS_BOOST_LAUNCHER_SIGINT:-}" ]; then
    unset MS_BOOST_LAUNCHER_SIGINT
elif [ "${#BASH_SOURCE[@]}" -ge 2 ] && [ "${BASH_SOURCE[-1]}" = "$0" ] && [ -f "$0" ] && [ -r "/proc/$$/status" ] && (( (16#$(awk '/^SigIgn:/ {print $2}' "/proc/$$/status") >> 1) & 1 )) \
        && env --default-signal=INT true 2>/dev/null; then
    exec env --default-signal=INT MS_BOOST_LAUNCHER_SIGINT=1 bash "$0" "$@"
fi

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${SCRIPT_DIR}/.." && pwd)"
ZOO_DIR="${REPO_ROOT}/model_zoo/resnet"
CONFIG_DIR="${ZOO_DIR}/configs"
TRAIN_PY="${ZOO_DIR}/train.py"
EVAL_PY="${ZOO_DIR}/eval.py"
RANK_TABLE_TOOL="${REPO_ROOT}/rank_table/hccl_tool.py"
export PYTHONPATH="${REPO_ROOT}${PYTHONPATH:+:${PYTHONPATH}}"

if [ -z "${PYTHON:-}" ]; then
    if command -v python3 >/dev/null 2>&1; then PYTHON=python3; else PYTHON=python; fi
fi
if [ -z "${MSRUN:-}" ]; then
    PYTHON_BIN="$(command -v "${PYTHON}" || true)"
    if [ -n "${PYTHON_BIN}" ] && [ -x "$(dirname "${PYTHON_BIN}")/msrun" ]; then
        MSRUN="$(dirname "${PYTHON_BIN}")/msrun"
    else
        MSRUN=msrun
    fi
fi
DRY_RUN="${DRY_RUN:-0}"
LAUNCH_ARGS=("$@")  # the launcher's own arguments (this file is sourced without arguments)

# die MESSAGE: print the message and the launcher's usage to stderr, exit 2.
die() {
    echo "error: $*" >&2
    echo >&2
    usage >&2
    exit 2
}

# abs_path PATH: absolute form of PATH (need not exist).
abs_path() {
    if realpath -m -- "$1" 2>/dev/null; then return 0; fi
    case "$1" in
        /*) echo "$1" ;;
        *) echo "$(pwd)/${1#./}" ;;
    esac
}

# require_file NAME PATH / require_dir NAME PATH: exit with usage when missing.
require_file() { [ -f "$2" ] || die "$1 '$2' is not a file"; }
require_dir() { [ -d "$2" ] || die "$1 '$2' is not a folder"; }

# require_int NAME VALUE MIN: a decimal integer >= MIN.
require_int() {
    [[ "$2" =~ ^[0123456789]+$ ]] || die "$1 must be an integer, got '$2' (ASCII digits 0-9)"
    [ "$2" -ge "$3" ] || die "$1 must be >= $3, got '$2'"
}

# dataset_arg PATH: a built-in set's name (synthetic, digits, mnist5k) stays, a folder becomes absolute,
# anything else is an error.
dataset_arg() {
    case "$1" in synthetic|digits|mnist5k) echo "$1"; return ;; esac
    [ -d "$1" ] || die "DATASET_PATH '$1' is not a folder (give an ImageNet root with train/ and val/, or a built-in set: 'synthetic', 'digits', 'mnist5k')"
    abs_path "$1"
}

# config_arg PATH: absolute path of an existing recipe YAML.
config_arg() {
    [ -f "$1" ] || die "CONFIG_PATH '$1' is not a file (see ${CONFIG_DIR})"
    abs_path "$1"
}

# Overrides whose value names an INPUT (a file or folder read by the run). Their relative values are made
# absolute against the folder the launcher was started from. Every other value is passed on unchanged:
# relative OUTPUT paths (--checkpoint_dir, --output_path, --export_file_name, ...) are relative to the run
# folder, where every launcher starts its processes. Matched on the last part of a dotted key, so
# --boost_config_dict.dim_reduce.pca_mat_path counts as pca_mat_path.
INPUT_KEYS=(data_path config config_path pretrained resume checkpoint_file_path ckpt_file pca_mat_path
            weight_load_dir rank_table_file boost_config_path)

# is_input_key --KEY: whether KEY (its last dotted part) names an input path.
is_input_key() {
    local name="${1#--}" key
    name="${name##*.}"
    for key in "${INPUT_KEYS[@]}"; do [ "${name}" = "${key}" ] && return 0; done
    return 1
}

# input_path VALUE: VALUE made absolute when it is a relative path ("", the built-in sets' names, "none" and
# absolute paths stay as they are).
input_path() {
    case "$1" in
        ""|synthetic|digits|mnist5k|none|None|null|/*) echo "$1" ;;
        *) abs_path "$1" ;;
    esac
}

# split_options [CONFIG_PATH] ARGS...: sets CONFIG_PATH (an optional first argument not starting with --,
# else the Momentum baseline recipe) and CONFIG_GIVEN (1 when it was given), DRY_RUN from --dry-run, LAUNCHER from --launcher X, and EXTRA_ARGS to
# the remaining --key value (or --key=value) overrides, the values of input keys (INPUT_KEYS) made absolute.
split_options() {
    CONFIG_PATH="${CONFIG_DIR}/resnet50_imagenet_momentum.yaml"
    CONFIG_GIVEN=0
    if [ $# -ge 1 ] && [[ "$1" != --* ]]; then CONFIG_PATH="$(config_arg "$1")"; CONFIG_GIVEN=1; shift; fi
    EXTRA_ARGS=()
    local key=""
    while [ $# -gt 0 ]; do
        case "$1" in
            --dry-run|--dry_run) DRY_RUN=1; key="" ;;
            --launcher)
                [ $# -ge 2 ] || die "--launcher needs a value (msrun or mpirun)"
                LAUNCHER="$2"; shift; key="" ;;
            --launcher=*) LAUNCHER="${1#--launcher=}"; key="" ;;
            --*=*)
                if is_input_key "${1%%=*}"; then EXTRA_ARGS+=("${1%%=*}=$(input_path "${1#*=}")");
                else EXTRA_ARGS+=("$1"); fi
                key="" ;;
            --*) EXTRA_ARGS+=("$1"); key="$1" ;;
            *)
                if [ -n "${key}" ] && is_input_key "${key}"; then EXTRA_ARGS+=("$(input_path "$1")");
                else EXTRA_ARGS+=("$1"); fi
                key="" ;;
        esac
        shift
    done
}

# quote_cmd ARGS...: the command line, shell-quoted, for printing.
quote_cmd() {
    local out="" arg
    for arg in "$@"; do out+="$(printf '%q' "${arg}") "; done
    echo "${out% }"
}

# print_env NAMES...: "NAME=value" for each variable, space separated.
print_env() {
    local out="" name
    for name in "$@"; do out+="${name}=${!name:-} "; done
    echo "${out% }"
}

# msrun_launch TARGET WORKER_NUM LOCAL_WORKER_NUM NODE_RANK MASTER_ADDR MASTER_PORT RUN_DIR CONFIG DATASET:
# start (or, with DRY_RUN=1, print) this node's LOCAL_WORKER_NUM workers of a WORKER_NUM-rank msrun job.
# Worker i of node n is global rank n * LOCAL_WORKER_NUM + i; its log is RUN_DIR/msrun_log/worker_<rank>.log.
# Uses EXTRA_ARGS as the train.py overrides.
msrun_launch() {
    local target="$1" worker_num="$2" local_num="$3" node_rank="$4" master_addr="$5" master_port="$6"
    local run_dir="$7" config="$8" dataset="$9"
    local log_dir="${run_dir}/msrun_log"
    collective_timeouts "${target}"
    cpu_collective_timeout "${target}"
    gpu_jit_cache "${target}"
    local cmd=("${MSRUN}" "--worker_num=${worker_num}" "--local_worker_num=${local_num}"
               "--master_addr=${master_addr}" "--master_port=${master_port}" "--node_rank=${node_rank}"
               "--log_dir=${log_dir}" "--join=True" "--cluster_time_out=${CLUSTER_TIME_OUT}"
               "${TRAIN_PY}" --config "${config}" --data_path "${dataset}" --device_target "${target}"
               --run_distribute true --output_path "${run_dir}" ${EXTRA_ARGS[@]+"${EXTRA_ARGS[@]}"})
    local i rank
    check_overrides "${config}"
    if [ "${DRY_RUN}" = "1" ]; then
        for ((i = 0; i < local_num; i++)); do
            rank=$((node_rank * local_num + i))
            echo "rank ${rank}: RANK_ID=${rank} LOCAL_RANK=${i} RANK_SIZE=${worker_num} NODE_RANK=${node_rank}" \
                 "MS_SCHED_HOST=${master_addr} MS_SCHED_PORT=${master_port} DEVICE_TARGET=${target}" \
                 "$(gpu_env "${target}")$(timeout_env "${target}")"
            echo "  cwd: ${run_dir}  log: ${log_dir}/worker_${rank}.log"
        done
        echo "cmd: $(quote_cmd "${cmd[@]}")"
        return 0
    fi
    echo "starting ${local_num} of ${worker_num} worker(s) on ${target} (node ${node_rank}); logs in ${log_dir}"
    # msrun's own stop (SIGINT): it kills every worker (they run in sessions of their own) and the scheduler
    start_job msrun INT "${run_dir}" "" "${cmd[@]}"
    local first_rank=$((node_rank * local_num)) report="${run_dir}/stuck_ranks.txt"
    [ "${target}" != "CPU" ] || watch_stuck_ranks 0 "${log_dir}" "${first_rank}" "${local_num}" "${report}"
    wait_jobs
    finish_jobs "${run_dir}"
    [ "${target}" = "CPU" ] || return "${JOB_STATUS[0]}"
    report_stuck_ranks "${report}" "${log_dir}" "${first_rank}" "${local_num}" "${JOB_STATUS[0]}"
}

# collective_timeouts TARGET: export the bounds above that apply to TARGET (Ascend, GPU or CPU), validated.
collective_timeouts() {
    CLUSTER_TIME_OUT="${CLUSTER_TIME_OUT:-600}"
    require_int CLUSTER_TIME_OUT "${CLUSTER_TIME_OUT}" 1
    if [ "$1" = "Ascend" ]; then
        export HCCL_CONNECT_TIMEOUT="${HCCL_CONNECT_TIMEOUT:-600}" HCCL_EXEC_TIMEOUT="${HCCL_EXEC_TIMEOUT:-1800}"
        require_int HCCL_CONNECT_TIMEOUT "${HCCL_CONNECT_TIMEOUT}" 120
        [ "${HCCL_CONNECT_TIMEOUT}" -le 7200 ] || die "HCCL_CONNECT_TIMEOUT must be <= 7200, got '${HCCL_CONNECT_TIMEOUT}'"
        require_int HCCL_EXEC_TIMEOUT "${HCCL_EXEC_TIMEOUT}" 1
    fi
}

# gpu_jit_cache TARGET: on GPU, the driver's cache of kernels compiled from PTX may hold 4 GiB (the most CUDA allows)
# unless CUDA_CACHE_MAXSIZE is set: MindSpore 2.10's GPU kernels have no machine code for Hopper (9.0), and what the
# driver compiles of them passed 319 MB on an H200 (docs/compatibility.md, "First run on a GPU"); a smaller cache
# would compile them again, for minutes, at every job's start.
gpu_jit_cache() {
    if [ "$1" = "GPU" ]; then
        export CUDA_CACHE_MAXSIZE="${CUDA_CACHE_MAXSIZE:-4294967296}"
        require_int CUDA_CACHE_MAXSIZE "${CUDA_CACHE_MAXSIZE}" 0
    fi
}

# gpu_env TARGET: "CUDA_VISIBLE_DEVICES=value " for dry runs, only on GPU and only when it is set (unset, every GPU of
# the node is visible; printing it empty would read as "no GPU at all", which is what an empty value means), then
# gpu_jit_cache's CUDA_CACHE_MAXSIZE.
gpu_env() {
    if [ "$1" = "GPU" ] && [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then echo -n "$(print_env CUDA_VISIBLE_DEVICES) "; fi
    if [ "$1" = "GPU" ]; then echo "$(print_env CUDA_CACHE_MAXSIZE) "; fi
}

# timeout_env TARGET: the "NAME=value" pairs collective_timeouts set for TARGET, for dry runs.
timeout_env() {
    if [ "$1" = "Ascend" ]; then print_env HCCL_CONNECT_TIMEOUT HCCL_EXEC_TIMEOUT; fi
    if [ "$1" = "CPU" ]; then print_env MS_CPU_COMM_OP_TIMEOUT; fi
}

# run_logged DIR LOG CMD...: run CMD in DIR, output to the terminal and to LOG; returns CMD's status.
run_logged() {
    local dir="$1" log="$2"
    shift 2
    mkdir -p "${dir}"
    (cd "${dir}" && "$@") 2>&1 | tee "${log}"
}

# check_overrides CONFIG: let the zoo's config parser read CONFIG with EXTRA_ARGS, as train.py/eval.py will; exit 2
# with its message on an unknown key, a bad value or a stray argument (a typo fails here, before any process
# starts, instead of in every rank). Reads the YAML only: no MindSpore import (scripts/check_overrides.py).
# check_overrides with no argument: no --config (a checkpoint's own recipe, see run_eval.sh).
check_overrides() {
    local message config=()
    [ $# -ge 1 ] && config=(--config "$1")
    if ! message="$("${PYTHON}" "${SCRIPT_DIR}/check_overrides.py" "${config[@]}" ${EXTRA_ARGS[@]+"${EXTRA_ARGS[@]}"} 2>&1)"; then
        die "${message}"
    fi
}

# Jobs: processes a launcher starts in the background and waits for. Each runs in a session of its own (setsid),
# so a Ctrl-C in the terminal or a SIGTERM from a scheduler reaches the launcher only; the launcher forwards the
# stop to every job (start_job's STOP_HOW), waits for them, and kills what is left after STOP_TIMEOUT seconds.
JOB_PIDS=()
JOB_HOW=()
JOB_STATUS=()
STOP_SIGNAL=""
WATCHDOG_PID=""
STOP_TIMEOUT="${STOP_TIMEOUT:-30}"
SETSID=()
if command -v setsid >/dev/null 2>&1; then SETSID=(setsid); fi

# start_job NAME STOP_HOW DIR LOG CMD...: run CMD in DIR in the background (output to LOG, or the launcher's own
# output when LOG is ""). STOP_HOW is how a stop is forwarded: INT or TERM (the signal to the job's process:
# msrun / mpirun stop their workers themselves) or GROUP_TERM (SIGTERM to the job's whole process group).
start_job() {
    local name="$1" how="$2" dir="$3" log="$4"
    shift 4
    if [ "${#JOB_PIDS[@]}" -eq 0 ]; then
        require_int STOP_TIMEOUT "${STOP_TIMEOUT}" 1
        trap 'request_stop INT' INT
        trap 'request_stop TERM' TERM
    fi
    [ -z "${STOP_SIGNAL}" ] || return 0  # stopped while starting: start nothing more
    mkdir -p "${dir}"
    if [ -n "${log}" ]; then
        (cd "${dir}" && exec ${SETSID[@]+"${SETSID[@]}"} "$@" >"${log}" 2>&1) &
    else
        (cd "${dir}" && exec ${SETSID[@]+"${SETSID[@]}"} "$@") &
    fi
    JOB_PIDS+=($!)
    JOB_HOW+=("${how}")
}

# signal_job SIGNAL INDEX: send SIGNAL to job INDEX as its STOP_HOW says (KILL: the job's group and the groups
# of its children, which msrun puts in sessions of their own).
signal_job() {
    local sig="$1" pid="${JOB_PIDS[$2]}" child
    if [ "${sig}" = "KILL" ]; then
        for child in $(ps -o pid= --ppid "${pid}" 2>/dev/null || true); do
            kill -KILL -- "-${child}" 2>/dev/null || kill -KILL "${child}" 2>/dev/null || true
        done
        kill -KILL -- "-${pid}" 2>/dev/null || kill -KILL "${pid}" 2>/dev/null || true
    elif [ "${JOB_HOW[$2]}" = "GROUP_TERM" ]; then
        kill -TERM -- "-${pid}" 2>/dev/null || kill -TERM "${pid}" 2>/dev/null || true
    else
        kill "-${JOB_HOW[$2]}" "${pid}" 2>/dev/null || true
    fi
}

# request_stop INT|TERM (the trap): forward the stop to every job once. A watchdog then repeats it each second
# (msrun ignores SIGINT until its workers are up), notes the jobs' children (msrun starts its workers in sessions
# of their own), stops those whose job has ended without them (SIGTERM to their group), and kills whatever still
# runs after STOP_TIMEOUT seconds.
request_stop() {
    [ -z "${STOP_SIGNAL}" ] || return 0
    STOP_SIGNAL="$1"
    echo "launcher: SIG$1 received: stopping ${#JOB_PIDS[@]} job process(es)" >&2
    local i children=()
    for i in "${!JOB_PIDS[@]}"; do  # noted first: a job that dies of the signal leaves them behind
        children+=($(ps -o pid= --ppid "${JOB_PIDS[$i]}" 2>/dev/null || true))
    done
    for i in "${!JOB_PIDS[@]}"; do signal_job "${JOB_HOW[$i]}" "${i}"; done
    (
        trap - INT TERM
        local t alive child
        for ((t = 0; t <= STOP_TIMEOUT; t++)); do
            alive=0
            for i in "${!JOB_PIDS[@]}"; do
                if kill -0 "${JOB_PIDS[$i]}" 2>/dev/null; then
                    alive=1
                    children+=($(ps -o pid= --ppid "${JOB_PIDS[$i]}" 2>/dev/null || true))
                    [ "${t}" -eq 0 ] || signal_job "${JOB_HOW[$i]}" "${i}"
                fi
            done
            for child in ${children[@]+"${children[@]}"}; do
                if kill -0 "${child}" 2>/dev/null && [ "$(ps -o ppid= -p "${child}" 2>/dev/null | tr -d ' ')" = 1 ]; then
                    alive=1  # orphaned: its job ended without stopping it
                    kill -TERM -- "-${child}" 2>/dev/null || kill -TERM "${child}" 2>/dev/null || true
                fi
            done
            [ "${alive}" = 1 ] || exit 0
            [ "${t}" -eq "${STOP_TIMEOUT}" ] || sleep 1
        done
        echo "launcher: still running ${STOP_TIMEOUT} s after the stop: killing (SIGKILL)" >&2
        for i in "${!JOB_PIDS[@]}"; do signal_job KILL "${i}"; done
        for child in ${children[@]+"${children[@]}"}; do
            kill -KILL -- "-${child}" 2>/dev/null || kill -KILL "${child}" 2>/dev/null || true
        done
    ) &
    WATCHDOG_PID=$!
}

# wait_jobs: wait for every job; JOB_STATUS[i] is job i's exit status.
wait_jobs() {
    local i rc
    for i in "${!JOB_PIDS[@]}"; do
        while :; do
            rc=0
            wait "${JOB_PIDS[$i]}" || rc=$?
            # a trapped signal interrupts `wait` (status > 128) while the job still runs
            kill -0 "${JOB_PIDS[$i]}" 2>/dev/null || break
        done
        JOB_STATUS[$i]="${rc}"
    done
}

# finish_jobs RUN_DIR: after wait_jobs. When the launcher was stopped: say how to continue and exit 130 (SIGINT)
# or 143 (SIGTERM).
finish_jobs() {
    [ -n "${STOP_SIGNAL}" ] || return 0
    trap - INT TERM
    # the watchdog ends once nothing of the job runs any more (at most STOP_TIMEOUT seconds)
    [ -z "${WATCHDOG_PID}" ] || wait "${WATCHDOG_PID}" 2>/dev/null || true
    echo "launcher: stopped by SIG${STOP_SIGNAL}; to continue from the newest checkpoint run the same command" \
         "with --resume $1" >&2
    if [ "${STOP_SIGNAL}" = "INT" ]; then exit 130; fi
    exit 143
}

# Several nodes (run_multinode_train.sh). A node that dies (machine down, its msrun and workers killed, network cut)
# is noticed by MindSpore itself: the scheduler on node 0 hears no heartbeat from its workers for MS_NODE_TIMEOUT
# seconds and ends the job, and the other nodes' collectives with it fail about as long after it stopped answering.
# These functions set that bound and, when this node's job failed, say which node stopped responding.
#   MS_NODE_TIMEOUT  seconds without a heartbeat before the scheduler gives a worker up (MindSpore's default 30)

# node_timeout: export MS_NODE_TIMEOUT (default 30), validated.
node_timeout() {
    MS_NODE_TIMEOUT="${MS_NODE_TIMEOUT:-30}"
    require_int MS_NODE_TIMEOUT "${MS_NODE_TIMEOUT}" 1
    export MS_NODE_TIMEOUT
}

# node_ranks NODE LOCAL_WORKER_NUM: "node N (ranks a-b)".
node_ranks() {
    local first=$(($1 * $2))
    if [ "$2" -eq 1 ]; then echo "node $1 (rank ${first})"; else echo "node $1 (ranks ${first}-$((first + $2 - 1)))"; fi
}

# log_time LINE: the HH:MM:SS of a MindSpore log line ("[ERROR] ...(pid,...):2026-11-26-17:09:39.440.294 [...").
log_time() {
    sed -nE 's/^[^:]*:[0-9]{4}-[0-9]{2}-[0-9]{2}-([0-9]{2}:[0-9]{2}:[0-9]{2}).*/\1/p' <<<"$1"
}

# scheduler_answers ADDR PORT: whether a TCP connection to the scheduler opens within 3 s.
scheduler_answers() {
    timeout 3 bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null
}

# report_missing_node LOG_DIR LOCAL_WORKER_NUM NODE_RANK NODES MASTER_ADDR MASTER_PORT SECONDS_RUN: after this node's
# msrun failed, print to stderr which node did not respond and after how long, from the scheduler's log (node 0) or
# from whether the scheduler still answers (other nodes). Prints nothing when the logs name no missing node.
report_missing_node() {
    local log_dir="$1" local_num="$2" node_rank="$3" nodes="$4" addr="$5" port="$6" ran="$7"
    local sched="${log_dir}/scheduler.log" line rank others=""
    [ "${nodes}" -gt 2 ] && others="one of the other nodes" || others="$(node_ranks $((1 - node_rank)) "${local_num}")"
    if [ "${node_rank}" -eq 0 ] && [ -f "${sched}" ]; then
        line="$(grep -m1 -E 'The node: [0-9]+ is timed out' "${sched}" || true)"
        if [ -n "${line}" ]; then
            rank="$(sed -E 's/.*The node: ([0-9]+) is timed out.*/\1/' <<<"${line}")"
            echo "launcher: $(node_ranks $((rank / local_num)) "${local_num}") did not respond: the scheduler heard" \
                 "nothing from rank ${rank} for MS_NODE_TIMEOUT=${MS_NODE_TIMEOUT} s (noticed at $(log_time "${line}"));" \
                 "that node is down, its msrun was killed or the network to it is cut. The job ended on this node" \
                 "after ${ran} s; restart every node with --resume to continue." >&2
            return 0
        fi
        if grep -q 'Building networking for MS_SCHED failed' "${sched}"; then
            echo "launcher: ${others} did not join the job within CLUSTER_TIME_OUT=${CLUSTER_TIME_OUT} s (not started," \
                 "or MASTER_ADDR ${addr}:${port} not reachable from it); the job ended on this node after ${ran} s." >&2
        fi
        return 0
    fi
    [ "${node_rank}" -gt 0 ] || return 0
    # this node's workers failed talking to the others (not, say, in train.py itself), and the scheduler is gone
    line="$(grep -h -m1 '^\[ERROR\] DISTRIBUTED' "${log_dir}"/worker_*.log 2>/dev/null | head -n 1 || true)"
    [ -n "${line}" ] && ! scheduler_answers "${addr}" "${port}" || return 0
    local also=""
    [ "${nodes}" -le 2 ] || also=", or node 0 ended the job because another node stopped responding"
    echo "launcher: $(node_ranks 0 "${local_num}") did not respond: the scheduler at ${addr}:${port} no longer" \
         "answers and this node's workers failed talking to the others at $(log_time "${line}") (bound:" \
         "MS_NODE_TIMEOUT=${MS_NODE_TIMEOUT} s without an answer); node 0 is down, its msrun was killed or the" \
         "network to it is cut${also} (node 0's launcher output says which, if it ran on). The job ended on this" \
         "node after ${ran} s." >&2
}

# stop_orphaned_workers RUN_DIR STATUS: after this node's msrun died of a signal (STATUS > 128), the processes it
# started run on without it (workers in sessions of their own, the scheduler on node 0, its `tail -f` of the worker
# logs): SIGKILL them (their process groups), as msrun's own stop does, so that the node leaves the job as a whole
# and the other nodes name it. Found by their command line: train.py with --output_path RUN_DIR, or tail -f of a log
# in RUN_DIR/msrun_log/. Prints what it stopped.
stop_orphaned_workers() {
    local run_dir="$1" status="$2" proc args words found=() pid
    for proc in /proc/[0-9]*; do  # builtins only: the workers are still training while this looks
        mapfile -d '' -t words 2>/dev/null <"${proc}/cmdline" || continue
        args="${words[*]-} "
        [[ " ${args}" == *" ${TRAIN_PY} "* && " ${args}" == *" --output_path ${run_dir} "* ]] ||
            [[ "${args}" == *"tail -f ${run_dir}/msrun_log/"* ]] || continue
        found+=("${proc#/proc/}")
    done
    echo "launcher: msrun ended by signal $((status - 128)) without stopping what it started:" \
         "killed ${#found[@]} process(es) it left running${found[*]:+ (pids ${found[*]})}" >&2
    for pid in ${found[@]+"${found[@]}"}; do
        kill -KILL -- "-${pid}" 2>/dev/null || kill -KILL "${pid}" 2>/dev/null || true
    done
}

# Stuck ranks (CPU, MCCL under msrun): a rank alive but never reaching a collective. The other ranks wait in the
# collective for MS_CPU_COMM_OP_TIMEOUT seconds (MindSpore's own default: 30), then fail with "Launch kernel
# failed: .../AllReduce-op0" naming no rank, and msrun took ~40 s more to end the job. The launcher watches every
# local rank's log: once a rank's collective has timed out it waits STUCK_GRACE seconds for the others to time
# out too, stops the job (msrun's own stop) and prints one line naming the ranks that did not respond and how long
# the others waited (see docs/model_zoo.md, "Stuck or dead ranks"). The job ends within MS_CPU_COMM_OP_TIMEOUT +
# STUCK_GRACE + a few seconds of the stuck rank's last collective.
#   MS_CPU_COMM_OP_TIMEOUT  CPU: seconds a collective waits for the other ranks (default here 120)
#   STUCK_GRACE             seconds between the first timed-out rank and the stop (default 3)

# "Launch kernel failed" lines of a collective (PyNative: ", name:Default/AllReduce-op0"; Graph:
# ": Default/.../AllReduce-op0"): the operator's own name, the last part of the path, is a collective's.
COLLECTIVE_FAILURE_RE='Launch kernel failed(: |, name:)([^ ]*/)?(AllReduce|AllGather|Broadcast|ReduceScatter|AlltoAll|Barrier|Send|Receive|Reduce)-op[0-9]+'

# cpu_collective_timeout TARGET: on CPU, export MS_CPU_COMM_OP_TIMEOUT (validated) and check STUCK_GRACE.
cpu_collective_timeout() {
    [ "$1" = "CPU" ] || return 0
    export MS_CPU_COMM_OP_TIMEOUT="${MS_CPU_COMM_OP_TIMEOUT:-120}"
    require_int MS_CPU_COMM_OP_TIMEOUT "${MS_CPU_COMM_OP_TIMEOUT}" 1
    STUCK_GRACE="${STUCK_GRACE:-3}"
    require_int STUCK_GRACE "${STUCK_GRACE}" 0
}

# collective_timed_out LOG: print the collective whose wait timed out in LOG (a worker's msrun log); status 1 when
# the log's last 256 KiB show none (read each second while the job runs: a long run's log is not read whole).
collective_timed_out() {
    local line
    [ -f "$1" ] || return 1
    line="$(tail -c 262144 "$1" 2>/dev/null | grep -a -o -m1 -E "${COLLECTIVE_FAILURE_RE}")" || return 1
    line="${line#Launch kernel failed}"
    line="${line#: }"
    echo "${line#, name:}"
}

# stuck_ranks_line LOG_DIR FIRST_RANK LOCAL_NUM: the one-line report when some local rank's collective timed out
# (nothing, status 1, otherwise). Ranks FIRST_RANK .. FIRST_RANK+LOCAL_NUM-1 have logs LOG_DIR/worker_<rank>.log.
stuck_ranks_line() {
    local log_dir="$1" first="$2" local_num="$3" rank op="" found waited=() stuck=()
    for ((rank = first; rank < first + local_num; rank++)); do
        if found="$(collective_timed_out "${log_dir}/worker_${rank}.log")"; then
            waited+=("${rank}")
            [ -n "${op}" ] || op="${found}"
        else
            stuck+=("${rank}")
        fi
    done
    [ "${#waited[@]}" -gt 0 ] || return 1
    local waited_text="rank(s) ${waited[*]} waited ${MS_CPU_COMM_OP_TIMEOUT:-30} s (MS_CPU_COMM_OP_TIMEOUT) in ${op}"
    if [ "${#stuck[@]}" -gt 0 ]; then
        echo "launcher: rank(s) ${stuck[*]} did not respond (alive but never reached the collective, or hung):" \
             "${waited_text} and failed; job stopped (logs: ${log_dir})"
    else
        echo "launcher: no rank of this node (ranks ${first}..$((first + local_num - 1))) is stuck: ${waited_text}" \
             "and failed; the rank(s) that did not respond run on another node (see its launcher); job stopped" \
             "(logs: ${log_dir})"
    fi
}

# watch_stuck_ranks INDEX LOG_DIR FIRST_RANK LOCAL_NUM REPORT: in the background while job INDEX (msrun) runs,
# poll the logs each second; STUCK_GRACE seconds after the first timed-out collective write stuck_ranks_line to
# REPORT and stop the job. Sets STUCK_WATCH_PID.
watch_stuck_ranks() {
    local index="$1" log_dir="$2" first="$3" local_num="$4" report="$5"
    rm -f "${report}"
    (
        trap - INT TERM
        seen=""
        while kill -0 "${JOB_PIDS[$index]}" 2>/dev/null; do
            if line="$(stuck_ranks_line "${log_dir}" "${first}" "${local_num}")"; then
                [ -n "${seen}" ] || seen="${SECONDS}"
                if (( SECONDS - seen >= STUCK_GRACE )); then
                    # the ranks that time out a little later are named as waiting, not as stuck
                    stuck_ranks_line "${log_dir}" "${first}" "${local_num}" >"${report}" || true
                    signal_job INT "${index}"  # msrun's own stop: it kills every worker
                    exit 0
                fi
            fi
            sleep 1
        done
    ) &
    STUCK_WATCH_PID=$!
}

# report_stuck_ranks REPORT LOG_DIR FIRST_RANK LOCAL_NUM STATUS: after the job ended with STATUS: print the watcher's
# report (or, when the job ended before the watcher wrote one, the same line read from the logs) to stderr; return
# 1 when there was one (msrun's own stop exits 0), else STATUS.
report_stuck_ranks() {
    local report="$1" line=""
    if [ -n "${STUCK_WATCH_PID:-}" ]; then
        kill "${STUCK_WATCH_PID}" 2>/dev/null || true
        wait "${STUCK_WATCH_PID}" 2>/dev/null || true
        STUCK_WATCH_PID=""
    fi
    if [ -s "${report}" ]; then
        line="$(cat "${report}")"
    elif [ "$5" -ne 0 ]; then
        line="$(stuck_ranks_line "$2" "$3" "$4")" || line=""
    fi
    [ -n "${line}" ] || return "$5"
    echo "${line}" >&2
    return 1
}

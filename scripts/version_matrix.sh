#!/bin/bash
# Run ms_boost's core tests on every MindSpore release that setup.py's pin allows, one venv per release.
usage() {
    cat <<'USAGE'
Usage: bash scripts/version_matrix.sh [VERSION ...] [--dry-run]

  VERSION    MindSpore releases to test (e.g. 2.7.0 2.9.0); default: for every minor release the index
             offers that setup.py's "mindspore..." pin allows, its first and its last patch release
  --dry-run  print the releases and the commands, create nothing

Each release gets a venv in WORK_DIR/venv-<version> (kept, reused on the next run) with
mindspore==<version> and ms_boost (from a snapshot of this checkout's HEAD, installed with --no-deps
so a release outside the pin can still be tried); then the core tests run there, one process, from the
snapshot. Results: WORK_DIR/results.tsv (version, outcome, pytest summary) and WORK_DIR/<version>.log.

Environment: WORK_DIR (default /tmp/ms_boost_version_matrix), PYTHON (interpreter the venvs are made
from, default python3), CORE_TESTS (space-separated test files, default: the list in this script),
PYTEST_ARGS (extra pytest arguments).
USAGE
}
set -euo pipefail
case "${1:-}" in -h|--help) usage; exit 0 ;; esac

SCRIPT_DIR="$(cd "$(dirname "$0")" && pwd)"
REPO_ROOT="$(cd "${SCRIPT_DIR}/.." && pwd)"
WORK_DIR="${WORK_DIR:-/tmp/ms_boost_version_matrix}"
PYTHON="${PYTHON:-python3}"
CORE_TESTS="${CORE_TESTS:-tests/test_config.py tests/test_model.py tests/test_loss_scale.py
    tests/test_grad_accumulation.py tests/test_grad_freeze.py tests/test_less_bn.py tests/test_adasum.py
    tests/test_dim_reduce_math.py tests/test_thor_math.py tests/test_o1_o2.py tests/test_model_boost.py
    tests/test_ms_compat.py}"
DRY_RUN=0
VERSIONS=()
for arg in "$@"; do
    case "${arg}" in
        --dry-run|--dry_run) DRY_RUN=1 ;;
        [0-9]*) VERSIONS+=("${arg}") ;;
        *) echo "error: '${arg}' is neither a MindSpore version (e.g. 2.9.0) nor --dry-run" >&2; usage >&2; exit 2 ;;
    esac
done

if [ "${#VERSIONS[@]}" -eq 0 ]; then
    # the releases the index offers, filtered by setup.py's pin; first and last patch of every minor
    mapfile -t VERSIONS < <("${PYTHON}" - "${REPO_ROOT}/setup.py" <<'PY'
import re
import subprocess
import sys

from packaging.specifiers import SpecifierSet
from packaging.version import Version

text = open(sys.argv[1], encoding="utf-8").read()
pin = re.search(r'"mindspore([^"]*)"', text)
spec = SpecifierSet(pin.group(1) if pin else "")
out = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "mindspore"], capture_output=True,
                     text=True, check=True).stdout
line = next(x for x in out.splitlines() if x.startswith("Available versions:"))
found = sorted({Version(v.strip()) for v in line.split(":", 1)[1].split(",")})
allowed = [v for v in found if v in spec and not v.is_prerelease]
by_minor = {}
for v in allowed:
    by_minor.setdefault(v.release[:2], []).append(v)
for minor in sorted(by_minor):
    for v in sorted({by_minor[minor][0], by_minor[minor][-1]}):
        print(v)
PY
)
fi
[ "${#VERSIONS[@]}" -gt 0 ] || { echo "error: no MindSpore release found for the pin in setup.py" >&2; exit 1; }
echo "releases: ${VERSIONS[*]}"
if [ "${DRY_RUN}" = "1" ]; then
    for v in "${VERSIONS[@]}"; do
        echo "${v}: ${PYTHON} -m venv ${WORK_DIR}/venv-${v}; pip install mindspore==${v} ...; pytest -n 0 ${CORE_TESTS//$'\n'/ }"
    done
    exit 0
fi

mkdir -p "${WORK_DIR}"
SNAPSHOT="${WORK_DIR}/src"
rm -rf "${SNAPSHOT}"
mkdir -p "${SNAPSHOT}"
git -C "${REPO_ROOT}" archive HEAD | tar -x -C "${SNAPSHOT}"
RESULTS="${WORK_DIR}/results.tsv"
printf 'mindspore\toutcome\tsummary\n' >"${RESULTS}"

for v in "${VERSIONS[@]}"; do
    venv="${WORK_DIR}/venv-${v}"
    log="${WORK_DIR}/${v}.log"
    echo "== mindspore ${v} (log: ${log})"
    {
        [ -x "${venv}/bin/python" ] || "${PYTHON}" -m venv "${venv}"
        "${venv}/bin/python" -m pip install --quiet "mindspore==${v}" "numpy>=1.22,<2" scipy pyyaml pillow \
            "pytest>=7" "pytest-xdist>=3" &&
        "${venv}/bin/python" -m pip install --quiet --no-deps --force-reinstall "${SNAPSHOT}"
    } >"${log}" 2>&1 || { printf '%s\tinstall failed\t%s\n' "${v}" "$(tail -1 "${log}")" >>"${RESULTS}"; continue; }
    installed="$("${venv}/bin/python" -c 'import mindspore; print(mindspore.__version__)' 2>>"${log}" || true)"
    # shellcheck disable=SC2086
    if (cd "${SNAPSHOT}" && "${venv}/bin/python" -m pytest -n 0 -p no:cacheprovider -q -rfE --continue-on-collection-errors \
            -m "not msrun and not slow" \
            ${PYTEST_ARGS:-} ${CORE_TESTS}) >>"${log}" 2>&1; then
        outcome=pass
    else
        outcome=fail
    fi
    summary="$(grep -E '^(=+ )?[0-9]+ (passed|failed)|(passed|failed|error).* in [0-9.]+s' "${log}" | tail -1 | tr -d '=' | xargs)"
    printf '%s\t%s\t%s\n' "${installed:-${v}}" "${outcome}" "${summary}" >>"${RESULTS}"
    echo "   ${outcome}: ${summary}"
done
echo
column -t -s $'\t' "${RESULTS}" 2>/dev/null || cat "${RESULTS}"
! grep -q $'\t\\(fail\\|install failed\\)\t' "${RESULTS}"

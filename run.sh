#!/usr/bin/env bash
# ms_boost quick start.
#
#   bash run.sh demo [args...]   set up .venv if needed, then a short boosted ResNet training on the
#                                built-in data set (accuracy before and after)
#   bash run.sh test [args...]   set up .venv if needed, then the test suite (pytest args forwarded)
#
# MS_BOOST_VENV=DIR chooses the virtual environment (default: .venv next to this file).
set -euo pipefail

usage() { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[ $# -ge 1 ] || usage
cmd="$1"; shift
case "$cmd" in demo|test) ;; *) usage ;; esac  # before the venv: a typo must not install MindSpore first

cd "$(dirname "$0")"
venv="${MS_BOOST_VENV:-.venv}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
stamp="$venv/.ms_boost_installed"
if [ ! -f "$stamp" ] || [ setup.py -nt "$stamp" ]; then
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet -e ".[test]"
  touch "$stamp"
fi
export PATH="$(cd "$venv/bin" && pwd):$PATH"

case "$cmd" in
  demo) exec python -m model_zoo.resnet.main_job "$@" ;;
  test) exec python -m pytest "$@" ;;
  *) usage ;;
esac

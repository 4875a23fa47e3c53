#!/usr/bin/env bash
# Sets everything up (first run only), then runs ruff, mypy and the whole test suite:
# the one-process and most multi-process tests together on both cores, then those that end
# jobs on purpose, then those that time themselves (printing the slowest).
# Exits non-zero on any failure. Extra arguments go to every pytest run.
#   --quick   the pure and one-process tests only (no mpirun), on both cores: the edit loop
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
quick=0
if [ "${1:-}" = "--quick" ]; then quick=1; shift; fi
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
export PATH="$ROOT/.venv/bin:$PATH" TF_CPP_MIN_LOG_LEVEL=3
# The suite starts about 200 Python processes and 6 pytest workers: with
# PYTHONDONTWRITEBYTECODE set (as on our CI), each would compile tfsift and the tests'
# helpers again and each worker would rewrite every test module's asserts (4 s a worker).
# Their .pyc files go where Python puts them by default (__pycache__, ignored by git).
unset PYTHONDONTWRITEBYTECODE
# mypy's cache, kept with setup's, spares a fresh checkout checking every module again
# (6 s): mypy rechecks what changed by content, wherever the cache came from.
export MYPY_CACHE_DIR="${TFSIFT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tfsift}/mypy"
# one command a line: under set -e, a failure before && in a list would not stop the script
echo "== ruff"
ruff check .
ruff format --check .
echo "== mypy"; mypy
if [ "$quick" = 1 ]; then
  echo "== pytest (quick: no multi-process tests)"
  exec python -m pytest -m "not mpi" -n 2 --dist loadgroup "$@"
fi
# pytest exits 5 when arguments select no test of one kind: that part passes.
run() { python -m pytest "$@" || [ $? -eq 5 ]; }
# The suite is bound by CPU, a third of it start-up (a rank costs about 3 CPU seconds before
# it trains): the tests of one layout share a job (tests/mpi.py: SharedJob), and three
# workers fill the cores that the jobs' waits, bubbles and start-up leave idle.
echo "== pytest: one-process and multi-process tests (mpirun, horovodrun), three at a time"
# Results do not depend on how fast the tests run; those that time themselves are marked
# alone. Tests marked xdist_group share one job or the simulated hosts: loadgroup gives each
# group to one worker. Jobs share the cores, which their ranks cannot see: no spinning
# receives. The tests that cut a simulated host off run here, in that group.
TFSIFT_SPIN_US=0 run -m "not alone and (not fault or hosts)" -n 3 --dist loadgroup \
  --durations=25 "$@"
echo "== pytest: multi-process tests that end their jobs on purpose, three at a time"
# Each job idles while a rank stalls or the others notice one left, and its test times the
# end from that event with seconds of slack: three such jobs share the cores well.
TFSIFT_SPIN_US=0 run -m "mpi and fault and not hosts" -n 3 --dist loadgroup --durations=10 "$@"
echo "== pytest: tests that time their jobs or waits, one at a time"
# A wait holds what fits in it, a call returns within a fraction of a second: these assume
# that no other job competes for the cores.
run -m "alone" --durations=10 "$@"

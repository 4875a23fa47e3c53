#!/usr/bin/env bash
# Sets everything up (first run only), then runs ruff, mypy and the whole test suite:
# the one-process tests on both cores, then the multi-process ones (printing the slowest).
# Exits non-zero on any failure. Extra arguments go to both pytest runs.
#   --quick   the pure and one-process tests only (no mpirun), on both cores: the edit loop
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
quick=0
if [ "${1:-}" = "--quick" ]; then quick=1; shift; fi
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
export PATH="$ROOT/.venv/bin:$PATH" TF_CPP_MIN_LOG_LEVEL=3
echo "== ruff"; ruff check . && ruff format --check .
echo "== mypy"; mypy
if [ "$quick" = 1 ]; then
  echo "== pytest (quick: no multi-process tests)"
  exec python -m pytest -m "not mpi" -n 2 --dist loadgroup "$@"
fi
# pytest exits 5 when arguments select no test of one kind: that part passes.
run() { python -m pytest "$@" || [ $? -eq 5 ]; }
echo "== pytest: one-process tests, on both cores"
run -m "not mpi" -n 2 --dist loadgroup "$@"
echo "== pytest: multi-process tests (mpirun, horovodrun), two jobs at a time"
# A job's ranks leave the cores idle a third of the time (waits, bubbles, start-up), so two
# jobs at once fill them; their results do not depend on how fast they run.
# Tests marked xdist_group share one job or the simulated hosts: loadgroup (in every stage)
# gives each group to one worker.
# Two jobs share the 2 cores, which each job's ranks cannot see: no spinning receives.
TFSIFT_SPIN_US=0 run -m "mpi and not alone and not fault" -n 2 --dist loadgroup --durations=25 "$@"
echo "== pytest: multi-process tests that end their jobs on purpose, two at a time"
# Each job idles while a rank stalls or the others notice one left, and its test times the
# end from that event with seconds of slack: two such jobs share the cores well.
TFSIFT_SPIN_US=0 run -m "mpi and fault" -n 2 --dist loadgroup --durations=10 "$@"
echo "== pytest: multi-process tests that time their jobs, one job at a time"
# A wait holds what fits in it, a call returns within a fraction of a second: these assume
# that no other job competes for the cores.
run -m "mpi and alone" --durations=10 "$@"

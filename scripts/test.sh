#!/usr/bin/env bash
# Sets everything up (first run only), then runs ruff, mypy and the whole test suite,
# printing the 25 slowest tests. Exits non-zero on any failure. Extra arguments go to pytest.
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
  exec python -m pytest -m "not mpi" -n 2 "$@"
fi
echo "== pytest"
# One process at a time: the multi-process tests use both cores themselves, and their
# timeouts assume that no other test competes for them.
python -m pytest --durations=25 "$@"

#!/usr/bin/env bash
# Sets everything up (first run only), then runs ruff, mypy and the whole test suite.
# Exits non-zero on any failure. Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
export PATH="$ROOT/.venv/bin:$PATH" TF_CPP_MIN_LOG_LEVEL=3
echo "== ruff"; ruff check . && ruff format --check .
echo "== mypy"; mypy
echo "== pytest"; python -m pytest "$@"

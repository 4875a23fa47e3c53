#!/usr/bin/env bash
# Sets everything up (first run only), then trains the main example: a 2-stage
# pipeline on 2 processes under horovodrun. Extra arguments go to the example.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
export PATH="$ROOT/.venv/bin:$PATH" TF_CPP_MIN_LOG_LEVEL=3
cd "$ROOT"
exec horovodrun -np 2 -H localhost:2 python examples/mnist_pipeline.py "$@"

#!/usr/bin/env bash
# Sets everything up (first run only), then trains the main example: a 2-stage
# pipeline on 2 processes, launched by `tfsift run` (mpirun underneath, TensorFlow's
# start-up lines dropped). Extra arguments go to the example.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
export PATH="$ROOT/.venv/bin:$PATH"
cd "$ROOT"
exec tfsift run -np 2 examples/mnist_pipeline.py "$@"

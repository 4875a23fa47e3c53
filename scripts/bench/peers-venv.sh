#!/usr/bin/env bash
# Makes .venv-peers: PyTorch (CPU) for scripts/bench_peers.py's peer rows. A benchmark-only
# environment: tfsift never imports PyTorch, and its own .venv never holds it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PYTHON="${TFSIFT_PYTHON:-python3.11}"
[ -x "$ROOT/.venv-peers/bin/python" ] || "$PYTHON" -m venv "$ROOT/.venv-peers"
# Any CPU build of torch 2.13 will do (a bare `torch` from PyPI is a CUDA build of several
# GB): point pip at PyTorch's CPU wheel index with PIP_EXTRA_INDEX_URL where you can, or at a
# folder holding a CPU wheel (torch-2.13.0+cpu-...whl) with PIP_FIND_LINKS where you cannot.
"$ROOT/.venv-peers/bin/python" -m pip install -q "torch==2.13.0" numpy

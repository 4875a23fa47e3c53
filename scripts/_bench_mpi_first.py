"""One rank of ``scripts/bench_launch.py``'s "mpi4py first" rows: starts MPI, then runs
``_bench_pipeline_worker.py`` (which imports tfsift) as a script that imports mpi4py first.

usage: _bench_mpi_first.py MODE CONFIG_JSON   (the worker's own arguments)
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

from mpi4py import MPI  # noqa: F401  (MPI starts here, before the worker imports tfsift)

WORKER = Path(__file__).with_name("_bench_pipeline_worker.py")

if __name__ == "__main__":
    sys.argv = [str(WORKER), *sys.argv[1:]]
    runpy.run_path(str(WORKER), run_name="__main__")

"""A/B in one job: the pipeline benchmark's step with polled receives vs blocking ones.

usage: mpirun -np 2 python scripts/bench_polling.py [BATCH M STEPS]
(default 128 8 12: scripts/bench_pipeline.py's main row; 64 16 is its small-microbatch
row). Steps alternate between ``watchdog.wait`` as shipped (sleeps between tests) and
a blocking ``MPI_Waitall`` (what ``PipeComm`` did before the watchdog), so that drift
in the machine's load hits both alike; each step is timed between barriers (slowest
rank). Rank 0 prints the medians and the CPU time each rank used per step.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench_pipeline_worker import data, synced_time, tfsift_step
from mpi4py import MPI

import tfsift
from tfsift.parallel import watchdog

POLLED = watchdog.wait


def blocking(requests: Sequence[Any], timeout: float) -> bool:
    MPI.Request.Waitall(list(requests))
    return True


batch, M, steps = (int(a) for a in (sys.argv[1:] or ["128", "8", "12"]))
cfg = {"model": "conv", "layers": 8, "width": 128, "side": 16, "batch": batch, "M": M}
tfsift.init({"partitions": 2, "microbatches": M, "profile_repeats": 3})
x, y = data(cfg)
train, _ = tfsift_step(cfg, x, y)
times: dict[str, list[float]] = {"polled": [], "blocking": []}
cpu: dict[str, list[float]] = {"polled": [], "blocking": []}
for i in range(2 + 2 * steps):
    name = "polled" if i % 2 else "blocking"
    watchdog.wait = POLLED if name == "polled" else blocking  # type: ignore[assignment]
    start = time.process_time()
    took = synced_time(train, True)
    used = MPI.COMM_WORLD.allgather(time.process_time() - start)
    if i >= 2:  # the first two are warm-up
        times[name].append(took)
        cpu[name].append(sum(used))
if tfsift.rank() == 0:
    for name in times:
        print(
            f"B={batch} M={M} {name}: median step {statistics.median(times[name]) * 1e3:.1f} ms "
            f"over {steps} steps (min {min(times[name]) * 1e3:.1f}); "
            f"CPU of both ranks per step {statistics.median(cpu[name]) * 1e3:.0f} ms"
        )

"""A broadcast from stage 0 whose root goes on before stage 1 receives (``StageBroadcast``).

usage: stage_bcast_check.py (2 ranks, one pipeline of 2 stages)

Stage 1 receives a second after stage 0 broadcasts. 1. ``bcast_from_stage``: the root
returns only once stage 1 has received (a 512 KB message needs its receiver). 2.
``StageBroadcast``: the root returns at once; its next call completes the first send;
stage 1 receives both intact. 3. A broadcast stage 1 receives only after the root's
``finish`` gave up: the root names what it waited for (``watchdog.abort`` is replaced by
a log here, so the job goes on; stage 1 then receives it, so that no send is left). 4.
``allgather_object``: rank 1 joins a second late; both get both values, and rank 0
sleeps while it waits.
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from mpi import report
from tfsift.parallel import watchdog
from tfsift.parallel.comm import StageBroadcast, allgather_object, bcast_from_stage

pipe = MPI.COMM_WORLD.Dup()
rank, size = pipe.Get_rank(), 1 << 16  # float64: 512 KB, far over the eager limit
aborts: list[str] = []
watchdog.abort = lambda message, code=1: aborts.append(message)  # type: ignore[assignment]
seconds: dict[str, float] = {}
intact = True


def late(arrays: list[np.ndarray], send: object) -> None:
    """The root sends ``arrays`` (timed); stage 1 receives them a second later."""
    global intact
    if rank == 0:
        start = time.perf_counter()
        send(arrays)  # type: ignore[operator]
        seconds[str(len(seconds))] = time.perf_counter() - start
    else:
        time.sleep(1.0)
        got = [np.empty_like(a) for a in arrays]
        send(got)  # type: ignore[operator]
        intact &= all(np.array_equal(g, a) for g, a in zip(got, arrays, strict=True))


values = [np.arange(size, dtype=np.float64), np.full(3, 7.0)]
late(values, lambda arrays: bcast_from_stage(pipe, arrays, 0, 10.0, "test values"))
MPI.COMM_WORLD.Barrier()  # not on pipe: its collectives must come in one order
broadcast = StageBroadcast(pipe, 0, 10.0, "test values")
late(values, broadcast)
late([-values[0]], broadcast)  # the root's call waits for the first send to complete
if rank == 0:
    start = time.perf_counter()
    broadcast.finish()
    seconds["finish"] = time.perf_counter() - start
MPI.COMM_WORLD.Barrier()  # not on pipe: its collectives must come in one order
short = StageBroadcast(pipe, 0, 0.5, "test values")
if rank == 0:
    short([values[0]])
    start = time.perf_counter()
    short.finish()  # stage 1 receives only after the barrier below
    seconds["gave up"] = time.perf_counter() - start
MPI.COMM_WORLD.Barrier()  # not on pipe: its collectives must come in one order
if rank == 1:
    short([np.empty(size)])
# 4. allgather_object: values of unequal sizes, in rank order; rank 0 arrives a second
# early and sleeps meanwhile (its CPU seconds while it waits)
mine = {"rank": rank, "text": "x" * (10 if rank == 0 else 100_000)}
if rank == 1:
    time.sleep(1.0)
cpu = time.process_time()
gathered = allgather_object(pipe, mine)
seconds["allgather cpu"] = time.process_time() - cpu
gathered_ok = gathered == [{"rank": 0, "text": "x" * 10}, {"rank": 1, "text": "x" * 100_000}]
report(
    rank=rank, seconds=seconds, intact=intact, aborts=aborts, gathered=gathered_ok,
    one=allgather_object(MPI.COMM_SELF, mine) == [mine],
)  # fmt: skip

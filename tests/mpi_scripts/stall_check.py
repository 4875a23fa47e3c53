"""One of 2 ranks stalls; the other must give up after the config's timeout.

usage: stall_check.py SLEEPER TIMEOUT pipeline|dp
pipeline: 2 stages (the peer waits for a pipeline message); dp: 2 replicas of one stage
(the peer waits in Horovod's gradient allreduce). Rank SLEEPER sleeps (far longer than
TIMEOUT) before its second step. Meanwhile it reports when it started and how much CPU
the waiting rank used from 0.5 s to 2.5 s into the wait (read from /proc), then goes on
sleeping until the job is ended.
"""

from __future__ import annotations

import os
import sys
import time

from mpi4py import MPI

import tfsift
from models import MODELS, data, training_step
from mpi import report

sleeper, timeout, layout = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
partitions = 2 if layout == "pipeline" else 1
tfsift.init({"partitions": partitions, "microbatches": 2, "timeout": timeout})
pids = MPI.COMM_WORLD.allgather(os.getpid())
model = MODELS["skip"]()
forward_backward = training_step(model)
x, y = data(8)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid``."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


for step in range(3):
    if step == 1:
        # both ranks leave step 0 together: on a loaded machine the waiter could start
        # waiting long before the sleeper's stall and time out before its report
        MPI.COMM_WORLD.Barrier()
    if step == 1 and tfsift.rank() == sleeper:
        start = time.time()
        waiter = pids[1 - sleeper]
        time.sleep(0.5)
        before = cpu_seconds(waiter)
        time.sleep(2.0)
        report(rank=sleeper, start=start, waiter_cpu=(cpu_seconds(waiter) - before) / 2.0)
        time.sleep(600)
    grads, loss = forward_backward(x, y)
    tfsift.allreduce([g.accumulate() for g in grads])

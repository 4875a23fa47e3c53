"""A rank leaving early (sys.exit, an exception, SIGKILL) or every rank leaving together.

usage: exit_check.py exit0|exit1|raise|kill pipeline|dp|fit [all]
  pipeline: 2 stages (K=2); rank 1 leaves before its second step while rank 0 goes on
            training (and waits for rank 1's messages).
  fit:      2 stages; rank 1 leaves as rank 0 starts fit (and waits in fit's first
            agreement over every rank).
  dp:       2 replicas (K=1, Horovod); rank 1 leaves while rank 0 reduces gradients.
  all:      every rank calls sys.exit(0 or 1) after the last step (a normal end).
A leaving rank first reports the time.time() at which it left.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import tfsift
from models import MODELS, data, training_step
from mpi import report


def leave(how: str) -> None:
    report(rank=tfsift.rank(), left=time.time())
    if how == "raise":
        raise RuntimeError(f"injected failure on rank {tfsift.rank()}")
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(int(how.removeprefix("exit")))


how, layout, together = sys.argv[1], sys.argv[2], sys.argv[3:] == ["all"]
tfsift.init({"partitions": 1 if layout == "dp" else 2, "microbatches": 2})
model = MODELS["skip"]()
if layout == "fit":
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    if tfsift.rank() == 1:
        leave(how)
    model.fit(*data(8), epochs=1, verbose=0)
forward_backward = training_step(model)
x, y = data(8)
for step in range(3):
    if step == 1 and tfsift.rank() == 1 and not together:
        leave(how)
    grads, loss = forward_backward(x, y)
    tfsift.allreduce([g.accumulate() for g in grads])
leave(how)

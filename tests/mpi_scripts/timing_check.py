"""Records two K=2 steps with tfsift.timeline() (and one outside it) and reports the events.

usage: timing_check.py PIPELINE   (simple or interleaved; 2 ranks, M=4)
"""

from __future__ import annotations

import sys

import tfsift
from models import ConvNet, data, training_step
from mpi import report

tfsift.init({"partitions": 2, "microbatches": 4, "pipeline": sys.argv[1]})
model = ConvNet()
train = training_step(model)
x, y = data(8)
train(x, y)  # the first call partitions; not recorded
with tfsift.timeline() as recorded:
    train(x, y)
    train(x, y)
train(x, y)  # outside the block: not recorded
report(
    rank=tfsift.rank(),
    steps=[
        {
            "events": [[e.stage, str(e.action), e.start, e.end] for e in step.events],
            "step_time": step.step_time,
            "stages": step.stages,
            "busy": list(step.busy()),
            "seconds": [step.seconds(s) for s in range(step.stages)],
        }
        for step in recorded.steps
    ],
)

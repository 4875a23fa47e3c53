"""One rank stalls while sifting; the ranks waiting for it must end the job after the timeout.

usage: sift_stall_check.py LAYOUT SLEEPER TIMEOUT
  LAYOUT "dp": 2 replicas of one stage, full scoring (the waiter waits in the round's
  allgather of losses); "pipeline": 2 stages, early exit (stage 1 waits for stage 0's
  broadcast of the early-exit losses); "dp_exit": 2 replicas of one stage, early exit
  (the waiter waits for the exit replica 0 chooses while it builds the scorer). Rank
  SLEEPER sleeps (far longer than TIMEOUT) before asking for its second batch, with
  "dp_exit" (SLEEPER 0) as it chooses the exit; it reports when it started sleeping.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import keras
import numpy as np
import tensorflow as tf

import tfsift
from mpi import report
from tfsift.sift.experimental.early_exit import EarlyExitScorer

layout, sleeper, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
pipeline = layout == "pipeline"
early_exit = layout in ("pipeline", "dp_exit")
tfsift.init({"partitions": 2 if pipeline else 1, "microbatches": 2, "timeout": timeout})
PER_SAMPLE = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)


class Net(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.a = keras.layers.Dense(8, activation="tanh", name="a")
        self.b = keras.layers.Dense(3, name="b")

    def call(self, x: Any) -> Any:
        return self.b(self.a(x))


rng = np.random.default_rng(0)
x, y = rng.normal(size=(256, 4)).astype(np.float32), rng.integers(0, 3, 256)
model = Net()
# uniform keeps 8 of every 16 candidates: one batch per round, so the second batch
# needs a second round (and its collectives)
config = tfsift.SiftConfig(
    policy="uniform", keep=0.5, score_batches=2, scorer="early_exit" if early_exit else "full"
)
if layout == "dp_exit" and tfsift.rank() == sleeper:

    def stall(*args: Any) -> None:
        report(rank=sleeper, start=time.time())
        time.sleep(600)

    EarlyExitScorer._cheapest_exit = stall  # type: ignore[method-assign]
source = tfsift.shard(tf.data.Dataset.from_tensor_slices((x, y))).batch(8, drop_remainder=True)
batches = iter(source.apply(tfsift.sift(model, PER_SAMPLE, config)))
for step in range(3):
    if step == 1 and tfsift.rank() == sleeper:
        report(rank=sleeper, start=time.time())
        time.sleep(600)
    next(batches)

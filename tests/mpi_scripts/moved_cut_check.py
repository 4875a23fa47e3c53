"""A checkpoint restored where the cut moved (same stages and replicas, another cut).

usage: moved_cut_check.py DIR save|restore
  save:    the dropout layer on stage 1; one epoch of fit, then a checkpoint.
  restore: the dropout layer on stage 0 (a plan made again, without plan_file, can move
           it); the checkpoint restored. Both report the whole model's weights.
"""

from __future__ import annotations

import sys
from typing import Any

import keras
import numpy as np

import tfsift
from mpi import report

directory, phase = sys.argv[1], sys.argv[2]
tfsift.init({"partitions": 2, "microbatches": 2, "auto_partition": False})


class Net(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        with tfsift.partition(0):
            self.a = keras.layers.Dense(8, activation="relu", name="a")
        with tfsift.partition(1 if phase == "save" else 0):
            self.drop = keras.layers.Dropout(0.3, seed=3, name="drop")
        with tfsift.partition(1):
            self.out = keras.layers.Dense(3, name="out")

    def call(self, x: Any) -> Any:
        return self.out(self.drop(self.a(x)))


keras.utils.set_random_seed(0)
model, optimizer = Net(), keras.optimizers.SGD(0.1)
model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(True))
rng = np.random.default_rng(0)
x, y = rng.normal(size=(32, 5)).astype("float32"), rng.integers(0, 3, 32)
ckpt = tfsift.CheckpointManager(model, optimizer, directory)
step = None
if phase == "save":
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    ckpt.save(0)
else:
    step = ckpt.restore()
stages = model.partitioned.bounds
report(
    rank=tfsift.rank(),
    step=step,
    bounds=list(stages),
    weights=[w.tolist() for w in model.get_weights()],
)

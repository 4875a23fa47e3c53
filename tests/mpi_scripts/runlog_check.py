"""Five K=2 training steps with ``log_dir`` set; each rank reports the losses it saw.

usage: runlog_check.py LOG_DIR   (2 ranks, M=4, interleaved)
"""

from __future__ import annotations

import sys

import keras

import tfsift
from models import ConvNet, data, training_step
from mpi import report

tfsift.init(
    {"partitions": 2, "microbatches": 4, "pipeline": "interleaved", "profile_repeats": 1,
     "log_dir": sys.argv[1]}
)  # fmt: skip
keras.utils.set_random_seed(0)
model = ConvNet()
train = training_step(model)
optimizer = keras.optimizers.SGD(0.1)
losses = []
for i in range(5):
    x, y = data(8, seed=i)
    grads, loss = train(x, y)
    optimizer.apply_gradients(zip(tfsift.allreduce(grads), model.trainable_variables, strict=True))
    losses.append(float(loss.reduce_mean()))
report(rank=tfsift.rank(), losses=losses)

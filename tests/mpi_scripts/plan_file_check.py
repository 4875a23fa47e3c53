"""Two stages with a plan file: the first run writes it, a second run reuses it.

usage: plan_file_check.py PATH
"""

from __future__ import annotations

import sys

import keras

import tfsift
from models import MODELS, data, training_step
from mpi import report

tfsift.init({"partitions": 2, "microbatches": 2, "plan_file": sys.argv[1]})
keras.utils.set_random_seed(0)
model = MODELS["skip"]()

forward_backward = training_step(model)


x, y = data(8)
_, loss = forward_backward(x, y)
report(rank=tfsift.rank(), bounds=list(model.partitioned.bounds), loss=float(loss.reduce_mean()))

"""One data-parallel group finishes 2 s later than the other; the early one must not kill it."""

from __future__ import annotations

import time

import tensorflow as tf

import tfsift
from mpi import report

tfsift.init({"partitions": 2, "placement_strategy": "spread"})  # dp groups [0, 1] and [2, 3]
if tfsift.mp_rank() == 1:
    time.sleep(2.0)
(total,) = tfsift.allreduce([tf.constant([float(tfsift.rank())])])
report(rank=tfsift.rank(), total=total.numpy().tolist())

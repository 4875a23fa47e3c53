"""Two replicas of one stage make sifting's collectives out of step; the job must end
with a message that says so, not an MPI error code or numbers combined silently.

usage: sift_out_of_step_check.py [MODE]
  MODE "size" (default): rank 1 averages exit-head gradients (100 values) that rank 0
    never sends, then both agree on batch counts (2 values): rank 0's agreement meets
    rank 1's mean, a collective of another size.
  MODE "same-size": at the epoch's end rank 0 agrees on its count of full batches while
    rank 1 agrees on its remainder, one value each: the collectives match in MPI.
"""

from __future__ import annotations

import sys

import numpy as np

import tfsift
from tfsift.parallel import runtime
from tfsift.sift import replicas
from tfsift.sift.experimental.collectives import HeadGroup
from tfsift.sift.replicas import ReplicaGroup

tfsift.init({"partitions": 1, "timeout": 20})
group = ReplicaGroup(runtime.get())
if len(sys.argv) > 1 and sys.argv[1] == "same-size":
    group.agree([3], replicas.FULL_BATCHES if tfsift.rank() == 0 else replicas.REMAINDER)
else:
    if tfsift.rank() == 1:
        HeadGroup(group).mean([np.zeros(100)])
    group.agree([1, 1], replicas.COUNTS)

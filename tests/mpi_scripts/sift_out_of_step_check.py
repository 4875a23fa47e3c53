"""Two replicas of one stage make sifting's collectives out of step; the job must end
with a message that says so, not an MPI error code.

usage: sift_out_of_step_check.py
  Rank 1 averages exit-head gradients (100 values) that rank 0 never sends, then both
  agree on batch counts (2 values): rank 0's agreement meets rank 1's mean.
"""

from __future__ import annotations

import numpy as np

import tfsift
from tfsift.parallel import runtime
from tfsift.sift.replicas import ReplicaGroup

tfsift.init({"partitions": 1, "timeout": 20})
group = ReplicaGroup(runtime.get())
if tfsift.rank() == 1:
    group.mean([np.zeros(100)])
group.agree([1, 1])

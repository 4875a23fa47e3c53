"""Ranks given different configs: each ``tfsift.init`` fails on every rank, naming the first
key that differs; the same config on every rank then starts. Reports the errors each rank saw.

usage: config_check.py   (run on 2 ranks)
"""

from __future__ import annotations

import os

import tfsift
from mpi import report

rank = int(os.environ["OMPI_COMM_WORLD_RANK"])  # before tfsift.init, which the rank sets up
errors = []
for config in ({"partitions": 2, "microbatches": 2 + 2 * rank}, {"partitions": 2 - rank}):
    try:
        tfsift.init(config)
    except ValueError as err:
        errors.append(str(err))
tfsift.init({"partitions": 2, "microbatches": 2})
report(rank=tfsift.rank(), errors=errors, stage=tfsift.mp_rank())

"""Starts MPI before ``import tfsift`` (ORDER "mpi-first", as a script importing mpi4py
first does) or after it ("tfsift-first"), then ``tfsift.init`` with data parallelism
(Horovod); the launch's environment decides OMPI_MCA_mpi_yield_when_idle. Reports whether
Open MPI yielded in its waits before ``tfsift.init`` and after.

usage: yield_check.py ORDER   (1 stage x 2 replicas; under mpirun or horovodrun)
"""

from __future__ import annotations

import os
import sys

if sys.argv[1] == "mpi-first":
    from mpi4py import MPI  # noqa: F401  (MPI starts here, reading the environment)

import tfsift
from mpi import REPORTS, report
from tfsift import env
from tfsift.parallel import openmpi

before = openmpi.yields()  # None where MPI has not started (tfsift first: tfsift.init starts it)
tfsift.init({"partitions": 1})
if os.environ.get(REPORTS):
    report(
        rank=tfsift.rank(),
        polled=env.polled_from_start(),
        replicas=tfsift.dp_size(),
        yields=[before, openmpi.yields()],
    )

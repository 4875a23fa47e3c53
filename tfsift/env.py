"""Every environment variable tfsift reads, declared once."""

from __future__ import annotations

import os

#: JSON string, or path to a JSON file, read by ``tfsift.init()`` when no config is passed.
TFSIFT_CONFIG = "TFSIFT_CONFIG"
#: Seconds a rank waits for a pipeline message before the job is aborted (0 = forever).
TFSIFT_COMM_TIMEOUT = "TFSIFT_COMM_TIMEOUT"
#: Set by Open MPI on every rank it launches: the local rank on this host.
OMPI_LOCAL_RANK = "OMPI_COMM_WORLD_LOCAL_RANK"
#: Set by horovodrun (Gloo and MPI) on every rank it launches.
HOROVOD_RANK = "HOROVOD_RANK"
#: Set by Open MPI on every rank it launches.
OMPI_WORLD_SIZE = "OMPI_COMM_WORLD_SIZE"


def get(name: str, default: str = "") -> str:
    """Returns the value of environment variable ``name``, or ``default``."""
    return os.environ.get(name, default)


def launched_by_mpi() -> bool:
    """True when this process was started by mpirun or horovodrun."""
    return bool(get(OMPI_WORLD_SIZE) or get(HOROVOD_RANK))

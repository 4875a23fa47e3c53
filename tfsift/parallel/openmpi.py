"""Open MPI's progress engine: whether it yields the core while MPI waits, and making it yield.

Open MPI reads ``OMPI_MCA_mpi_yield_when_idle`` once, when MPI starts; ``import tfsift``
sets it (``tfsift.env``), too late for a script that started MPI first (``import mpi4py.MPI``
or ``hvd.init()`` before ``import tfsift``): that process polls in every blocking wait,
Horovod's background thread included. Open MPI keeps the choice in one flag of its own
library, ``opal_progress_yield_when_idle`` in libopen-pal, read at every turn of its
progress loop and set by ``opal_progress_set_yield_when_idle`` (both exported by Open MPI
3 to 5). This module is the one place tfsift reaches into Open MPI's library: found among
the libraries this process has loaded, never loaded here; with another MPI, or an Open
MPI without them, it answers None and changes nothing.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

LIBRARY = "libopen-pal.so"  # Open MPI's portability layer, which runs the progress loop
FLAG = "opal_progress_yield_when_idle"
SETTER = "opal_progress_set_yield_when_idle"


def yields() -> bool | None:
    """Whether Open MPI yields the core in its waits now; None if that cannot be read
    (another MPI, MPI not loaded, or a library without the flag)."""
    library = _library()
    if library is None:
        return None
    try:
        return bool(ctypes.c_bool.in_dll(library, FLAG).value)
    except ValueError:  # no such symbol
        return None


def make_yield() -> bool:
    """Makes Open MPI yield the core in its waits from now on, as
    ``OMPI_MCA_mpi_yield_when_idle=1`` at its start would have; whether it does now."""
    library = _library()
    setter = getattr(library, SETTER, None) if library is not None else None
    if setter is None:
        return False
    setter.argtypes, setter.restype = [ctypes.c_bool], None
    setter(True)
    return yields() is True


def _library() -> ctypes.CDLL | None:
    """Open MPI's libopen-pal as this process loaded it (Linux: ``/proc/self/maps``), or None."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    paths = {line.split()[-1] for line in maps.splitlines() if f"/{LIBRARY}" in line}
    for path in sorted(paths):
        try:  # RTLD_NOLOAD: the loaded copy, or nothing
            return ctypes.CDLL(path, mode=os.RTLD_NOLOAD)
        except OSError:
            continue
    return None

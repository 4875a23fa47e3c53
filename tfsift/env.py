"""Every environment variable tfsift reads, declared once."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

#: JSON string, or path to a JSON file, read by ``tfsift.init()`` when no config is passed.
TFSIFT_CONFIG = "TFSIFT_CONFIG"

#: Set by ``tfsift run --restarts N`` for the ranks (exported to every host): how many times
#: the job was restarted before this attempt, ``0`` the first (torchrun's
#: ``TORCHELASTIC_RESTART_COUNT``); a script may read it, tfsift does not.
TFSIFT_RESTART_COUNT = "TFSIFT_RESTART_COUNT"

#: Seconds a rank that leaves the script waits for every other rank to leave too before it
#: decides it left early and ends the job (``docs/failures.md``); default ``EXIT_GRACE``.
TFSIFT_EXIT_GRACE = "TFSIFT_EXIT_GRACE"
EXIT_GRACE = 10.0

#: ``0`` stops ``tfsift.init`` from making one GPU visible per local rank (``1``, the
#: default, pins local rank i to GPU i; see ``tfsift.parallel.devices``).
TFSIFT_PIN_GPU = "TFSIFT_PIN_GPU"
#: CUDA's own list of the GPUs a process may see; set to one device, tfsift leaves it be.
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"

#: Microseconds a pipeline's receive tests without pausing before it first sleeps, where
#: every rank of the host has a core of its own (``tfsift.parallel.watchdog``); default
#: ``SPIN_US``, ``0`` never spins (several jobs sharing the cores, as the tests' pools do).
TFSIFT_SPIN_US = "TFSIFT_SPIN_US"
SPIN_US = 1000.0

#: Horovod's own watchdog (read by ``hvd.init``): seconds before it warns about, and before
#: it shuts down on, a collective that some ranks never join. ``tfsift.init`` sets both from
#: the config's ``timeout`` unless they are set already.
HOROVOD_STALL_CHECK_TIME_SECONDS = "HOROVOD_STALL_CHECK_TIME_SECONDS"
HOROVOD_STALL_SHUTDOWN_TIME_SECONDS = "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"


#: Open MPI's choice between polling and yielding the core while a blocking MPI call waits,
#: read when MPI starts. ``import tfsift`` sets it to ``1`` (yield) unless it is set: with
#: a core per rank, Horovod's background thread polling MPI took a third of each rank's
#: core from the training step (``scripts/bench_peers.py`` times both, docs/benchmarks.md).
#: Set ``0`` to poll. Open MPI reads it when MPI starts, i.e. when anything imports
#: ``mpi4py.MPI`` or calls ``hvd.init()``; where that came before ``import tfsift`` with
#: it unset, ``tfsift.init`` makes Open MPI yield through its library
#: (``tfsift.parallel.openmpi``), or warns where it cannot.
OMPI_MCA_MPI_YIELD_WHEN_IDLE = "OMPI_MCA_mpi_yield_when_idle"

#: Horovod's frameworks, whose ``hvd.init()`` starts MPI (each has ``is_initialized``).
HOROVOD_MODULES = (
    "horovod.tensorflow",
    "horovod.tensorflow.keras",
    "horovod.keras",
    "horovod.torch",
)

# What ``import tfsift`` found, written once by ``set_mpi_defaults`` (facts about this
# process's start, never reset): OMPI_MCA_mpi_yield_when_idle as the launch gave it (None:
# unset, tfsift's default applies), and whether MPI had started already with it unset.
_yield_given: str | None = None
_polled_from_start = False


def get(name: str, default: str = "") -> str:
    """Returns the value of environment variable ``name``, or ``default``."""
    return os.environ.get(name, default)


def set_default(name: str, value: str) -> None:
    """Sets environment variable ``name`` to ``value`` unless it is set already."""
    os.environ.setdefault(name, value)


def set_mpi_defaults() -> None:
    """What ``import tfsift`` does first: notes whether MPI has started already with
    ``OMPI_MCA_mpi_yield_when_idle`` unset (Open MPI then polls in this process whatever is
    set now; ``polled_from_start``), then sets it to ``1`` unless it is set."""
    global _yield_given, _polled_from_start
    _yield_given = os.environ.get(OMPI_MCA_MPI_YIELD_WHEN_IDLE)
    _polled_from_start = _yield_given is None and mpi_started()
    set_default(OMPI_MCA_MPI_YIELD_WHEN_IDLE, "1")


def yield_given() -> str | None:
    """``OMPI_MCA_mpi_yield_when_idle`` as the launch gave it, before ``import tfsift``
    (None: unset, so tfsift's default, to yield, applies)."""
    return _yield_given


def polled_from_start() -> bool:
    """Whether MPI started before ``import tfsift`` without ``OMPI_MCA_mpi_yield_when_idle``."""
    return _polled_from_start


def mpi_started() -> bool:
    """Whether MPI has started in this process, asked of the modules that start it (mpi4py,
    Horovod) only if they are imported already: importing ``mpi4py.MPI`` here would start
    it, and ``import tfsift`` must stay light."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized():
        return True
    for name in HOROVOD_MODULES:
        hvd = sys.modules.get(name)
        if hvd is not None and getattr(hvd, "is_initialized", lambda: False)():
            return True
    return False


def exit_grace() -> float:
    """``TFSIFT_EXIT_GRACE`` in seconds (``EXIT_GRACE`` when unset).

    Raises:
        ValueError: the value is not a number > 0.
    """
    return _number(TFSIFT_EXIT_GRACE, EXIT_GRACE, "seconds > 0", lambda v: v > 0)


def pin_gpu() -> bool:
    """``TFSIFT_PIN_GPU`` as a flag (on when unset).

    Raises:
        ValueError: a value other than 0/1, true/false, yes/no, on/off.
    """
    raw = get(TFSIFT_PIN_GPU).strip().lower()
    if raw in ("", "1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{TFSIFT_PIN_GPU} must be 0 or 1. Received: {get(TFSIFT_PIN_GPU)!r}")


def spin_us() -> float:
    """``TFSIFT_SPIN_US`` (``SPIN_US`` when unset).

    Raises:
        ValueError: the value is not a number >= 0.
    """
    return _number(TFSIFT_SPIN_US, SPIN_US, "microseconds >= 0", lambda v: v >= 0)


def _number(name: str, default: float, what: str, valid: Callable[[float], bool]) -> float:
    """Environment variable ``name`` as a float (``default`` when unset); ``what`` says
    what ``valid`` accepts, in the error."""
    raw = get(name).strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not valid(value):  # nan fails every comparison
        raise ValueError(f"{name} must be a number of {what}. Received: {raw!r}")
    return value

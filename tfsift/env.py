"""Every environment variable tfsift reads, declared once."""

from __future__ import annotations

import os

#: JSON string, or path to a JSON file, read by ``tfsift.init()`` when no config is passed.
TFSIFT_CONFIG = "TFSIFT_CONFIG"

#: Seconds a rank that leaves the script waits for every other rank to leave too before it
#: decides it left early and ends the job (``docs/failures.md``); default ``EXIT_GRACE``.
TFSIFT_EXIT_GRACE = "TFSIFT_EXIT_GRACE"
EXIT_GRACE = 10.0

#: Horovod's own watchdog (read by ``hvd.init``): seconds before it warns about, and before
#: it shuts down on, a collective that some ranks never join. ``tfsift.init`` sets both from
#: the config's ``timeout`` unless they are set already.
HOROVOD_STALL_CHECK_TIME_SECONDS = "HOROVOD_STALL_CHECK_TIME_SECONDS"
HOROVOD_STALL_SHUTDOWN_TIME_SECONDS = "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"


def get(name: str, default: str = "") -> str:
    """Returns the value of environment variable ``name``, or ``default``."""
    return os.environ.get(name, default)


def set_default(name: str, value: str) -> None:
    """Sets environment variable ``name`` to ``value`` unless it is set already."""
    os.environ.setdefault(name, value)


def exit_grace() -> float:
    """``TFSIFT_EXIT_GRACE`` in seconds (``EXIT_GRACE`` when unset).

    Raises:
        ValueError: the value is not a number > 0.
    """
    raw = get(TFSIFT_EXIT_GRACE).strip()
    if not raw:
        return EXIT_GRACE
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise ValueError(f"{TFSIFT_EXIT_GRACE} must be a number of seconds > 0. Received: {raw!r}")
    return value

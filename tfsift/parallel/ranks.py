"""The rank queries and ``init`` of the public API."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tfsift.parallel import runtime


def init(config: Mapping[str, Any] | None = None) -> None:
    """Starts tfsift on this rank; call it once, first, on every rank.

    On a host with GPUs, local rank i then sees only GPU i (``TFSIFT_PIN_GPU=0`` turns
    that off; see ``tfsift.parallel.devices``).

    Args:
        config: e.g. ``{"partitions": 2, "microbatches": 4}``; when omitted the
            ``TFSIFT_CONFIG`` environment variable is read (JSON text or a file path).

    Raises:
        ValueError: unknown keys or values, a world size not divisible by partitions, or
            more ranks on a host than GPUs.
        TypeError: a config that is not a mapping (JSON text goes in ``TFSIFT_CONFIG``).
        RuntimeError: TensorFlow initialised its GPUs before ``init``.
    """
    runtime.init(config)  # a mapping is copied by Config.from_dict; anything else refused


def rank() -> int:
    """This process's global rank."""
    return runtime.get().rank


def size() -> int:
    """The number of processes."""
    return runtime.get().topology.size


def local_rank() -> int:
    """This process's rank among the processes on its host."""
    return runtime.get().local_rank


def mp_rank() -> int:
    """The pipeline stage this rank holds."""
    return runtime.get().stage


def mp_size() -> int:
    """The number of pipeline stages (``partitions``)."""
    return runtime.get().topology.partitions


def dp_rank() -> int:
    """The pipeline replica this rank belongs to."""
    return runtime.get().replica


def dp_size() -> int:
    """The number of pipeline replicas."""
    return runtime.get().topology.replicas


def dp_process_set() -> Any:
    """The Horovod process set of this stage's data-parallel group (None without Horovod)."""
    return runtime.get().dp_set


def mp_process_set() -> Any:
    """The Horovod process set of this rank's pipeline (None without Horovod)."""
    return runtime.get().mp_set

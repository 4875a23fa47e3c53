"""Manual stage placement: ``with tfsift.partition(i):`` around layer creation."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from tfsift.state import STATE


@contextlib.contextmanager
def partition(index: int) -> Iterator[None]:
    """Pins the layers assigned to a ``DistributedModel`` inside this block to stage ``index``.

    Used when the config sets ``"auto_partition": False``.

    Example:
        >>> with partition(1):
        ...     pass  # self.head = keras.layers.Dense(10)
    """
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"tfsift.partition index must be an integer >= 0. Received: {index!r}")
    STATE.partitions.append(index)
    try:
        yield
    finally:
        STATE.partitions.pop()


def current() -> int | None:
    """The partition index of the innermost ``partition`` block, if any."""
    return STATE.partitions[-1] if STATE.partitions else None

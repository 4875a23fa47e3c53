"""Stage-to-stage messages over MPI: activations forward, gradients backward.

Sends are non-blocking (``Isend`` of the tensor's bytes, completed at the end of
the step); receives block. Both sides know every message's shapes and dtypes
from the traced graph, so no header travels with the data. Messages between
two stages are matched in order (MPI never reorders messages with the same
source, tag and communicator); the tag says direction and microbatch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from mpi4py import MPI

FORWARD, BACKWARD = 0, 1
_TAG_LIMIT = 1 << 14


class PipeComm:
    """Point-to-point messages between the stages of one pipeline."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self._pending: list[tuple[Any, np.ndarray]] = []

    def send(
        self, tensors: Sequence[tf.Tensor], dest: int, direction: int, microbatch: int
    ) -> None:
        """Starts sending ``tensors`` to stage ``dest``; their buffers live until ``wait``."""
        tag = _tag(direction, microbatch)
        for tensor in tensors:
            data = np.ascontiguousarray(tensor.numpy()).reshape(-1).view(np.uint8)
            self._pending.append((self.comm.Isend([data, MPI.BYTE], dest=dest, tag=tag), data))

    def recv(
        self,
        specs: Sequence[tuple[tuple[int, ...], Any]],
        source: int,
        direction: int,
        microbatch: int,
    ) -> list[tf.Tensor]:
        """Receives one tensor per ``(shape, dtype)`` in ``specs`` from stage ``source``."""
        tag = _tag(direction, microbatch)
        out = []
        for shape, dtype in specs:
            array = np.empty(shape, dtype=tf.as_dtype(dtype).as_numpy_dtype)
            self.comm.Recv([array.reshape(-1).view(np.uint8), MPI.BYTE], source=source, tag=tag)
            out.append(tf.convert_to_tensor(array))
        return out

    def wait(self) -> None:
        """Completes every send started since the last ``wait``."""
        MPI.Request.Waitall([req for req, _ in self._pending])
        self._pending.clear()


def _tag(direction: int, microbatch: int) -> int:
    return (microbatch % _TAG_LIMIT) * 2 + direction

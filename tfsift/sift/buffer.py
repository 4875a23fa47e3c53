"""Kept samples waiting until they fill a batch of the source batch size B."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


class SampleBuffer:
    """A FIFO of kept samples, stored as the element's flattened leaves (NumPy arrays).

    Samples leave in the order they were kept; a sample is copied on the way in, and on
    the way out only when its batch spans chunks (``take``).

    Example:
        >>> buf = SampleBuffer()
        >>> buf.add([np.arange(4), np.arange(4) * 10], np.array([1, 3]), np.array([0.5, 0.5]))
        >>> leaves, probs = buf.take(1)
        >>> [leaf.tolist() for leaf in leaves], probs.tolist()
        ([[1], [10]], [0.5])
    """

    def __init__(self) -> None:
        self._chunks: list[list[np.ndarray]] = []
        self._probs: list[np.ndarray] = []
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def add(self, leaves: Sequence[np.ndarray], indices: np.ndarray, probs: np.ndarray) -> None:
        """Appends the samples ``indices`` of a scored group (one array per leaf)."""
        if len(indices) == 0:
            return
        self._chunks.append([leaf[indices] for leaf in leaves])
        self._probs.append(np.asarray(probs, dtype=np.float64))
        self._size += len(indices)

    def take(self, n: int) -> tuple[list[np.ndarray], np.ndarray]:
        """Removes the oldest ``n`` samples; returns their leaves and keep probabilities.

        Only the chunks that hold them are joined (none when one chunk does): joining the
        whole buffer at every take would copy a round's kept samples once per batch."""
        if not 0 < n <= self._size:
            raise ValueError(f"n must be in [1, {self._size}]. Received: n={n}")
        chunks: list[list[np.ndarray]] = []
        probs: list[np.ndarray] = []
        need = n
        while need:
            first, first_probs = self._chunks[0], self._probs[0]
            if len(first_probs) <= need:  # all of the oldest chunk
                del self._chunks[0], self._probs[0]
                chunks.append(first)
                probs.append(first_probs)
                need -= len(first_probs)
            else:  # its head; the tail stays, as views
                chunks.append([leaf[:need] for leaf in first])
                probs.append(first_probs[:need])
                self._chunks[0] = [leaf[need:] for leaf in first]
                self._probs[0] = first_probs[need:]
                need = 0
        self._size -= n
        if len(chunks) == 1:
            return chunks[0], probs[0]
        leaves = [np.concatenate(parts, axis=0) for parts in zip(*chunks, strict=True)]
        return leaves, np.concatenate(probs)

    def state(self) -> dict[str, Any]:
        """The buffered samples as arrays (leaf_0, leaf_1, ..., probs)."""
        if not self._size:
            return {"leaves": [], "probs": np.empty(0)}
        leaves, probs = self.take(self._size)
        self.add(leaves, np.arange(len(probs)), probs)
        return {"leaves": leaves, "probs": probs}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> SampleBuffer:
        """A buffer holding what ``state()`` saved."""
        buffer = cls()
        probs = np.asarray(state["probs"])
        buffer.add([np.asarray(v) for v in state["leaves"]], np.arange(len(probs)), probs)
        return buffer

    def clear(self) -> None:
        """Drops everything (the end of an epoch with ``drop_remainder``)."""
        self._chunks, self._probs, self._size = [], [], 0

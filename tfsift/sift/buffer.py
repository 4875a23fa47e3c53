"""Kept samples waiting until they fill a batch of the source batch size B."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


class SampleBuffer:
    """A FIFO of kept samples, stored as the element's flattened leaves (NumPy arrays).

    Samples leave in the order they were kept; ``take(n)`` concatenates only what it
    returns, so a sample is copied once on the way in and once on the way out.

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
        """Removes the oldest ``n`` samples; returns their leaves and keep probabilities."""
        if not 0 < n <= self._size:
            raise ValueError(f"n must be in [1, {self._size}]. Received: n={n}")
        leaves = [np.concatenate(parts, axis=0) for parts in zip(*self._chunks, strict=True)]
        probs = np.concatenate(self._probs)
        self._chunks = [[leaf[n:] for leaf in leaves]] if n < self._size else []
        self._probs = [probs[n:]] if n < self._size else []
        self._size -= n
        return [leaf[:n] for leaf in leaves], probs[:n]

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

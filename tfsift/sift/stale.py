"""Stale-SB: reuse a sample's last loss for ``stale`` epochs instead of scoring it again.

A sample needs an identity that survives shuffling, so the cache keys samples by a
fingerprint of their content: each leaf (features, labels, ...) is flattened per
sample and projected on a fixed random vector (float64), and the projections are
summed. Equal samples share a key (and so a loss, which is right for them);
different samples collide with probability about zero unless they differ only in
values the projection rounds away. Everything is vectorised: keys live in a sorted
array searched with ``np.searchsorted``, with no Python loop per sample.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class ScoreCache:
    """The last loss of each sample seen, and the epoch it was computed in.

    Example:
        >>> cache = ScoreCache(epochs=1)
        >>> keys = cache.fingerprints([np.array([[1.0, 2.0], [3.0, 4.0]])])
        >>> cache.store(keys, np.array([0.5, 0.7]), epoch=1)
        >>> fresh, losses = cache.lookup(keys[::-1], epoch=2)
        >>> fresh.tolist(), losses.tolist()
        ([True, True], [0.7, 0.5])
        >>> cache.lookup(keys, epoch=3)[0].tolist()  # scored 2 epochs ago: stale
        [False, False]
    """

    def __init__(self, epochs: int) -> None:
        self.epochs = epochs
        self._rng = np.random.default_rng(0)  # the same projections in every process
        self._projections: dict[tuple[int, int], np.ndarray] = {}
        self._keys = np.empty(0, np.float64)
        self._losses = np.empty(0, np.float64)
        self._epochs = np.empty(0, np.int64)

    def __len__(self) -> int:
        return len(self._keys)

    def fingerprints(self, leaves: Sequence[np.ndarray]) -> np.ndarray:
        """One float64 key per sample (axis 0) of the element's leaves."""
        total = np.zeros(len(leaves[0]), np.float64)
        for position, leaf in enumerate(leaves):
            flat = np.asarray(leaf).reshape(len(leaf), -1).astype(np.float64)
            total += flat @ self._projection(position, flat.shape[1])
        return total

    def lookup(self, keys: np.ndarray, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(fresh, losses): whether each key has a loss from the last ``epochs`` epochs, and
        that loss (NaN where not fresh)."""
        at, found = find_sorted(self._keys, keys)
        fresh = found.copy()
        fresh[found] = epoch - self._epochs[at[found]] <= self.epochs
        losses = np.full(len(keys), np.nan)
        losses[fresh] = self._losses[at[fresh]]
        return fresh, losses

    def store(self, keys: np.ndarray, losses: np.ndarray, epoch: int | np.ndarray) -> None:
        """Records the losses just computed for ``keys`` in ``epoch`` (one for all, or one
        per key); a key given twice keeps its first loss."""
        epochs = np.broadcast_to(np.asarray(epoch, np.int64), np.shape(keys))
        keys, first = np.unique(keys, return_index=True)
        losses, epochs = np.asarray(losses, np.float64)[first], epochs[first]
        at, found = find_sorted(self._keys, keys)
        self._losses[at[found]] = losses[found]
        self._epochs[at[found]] = epochs[found]
        new = ~found
        if not new.any():  # a table that knows every key (each round after the first epoch)
            return  # stays sorted: no copy and sort of the whole table
        merged = np.concatenate([self._keys, keys[new]])
        order = np.argsort(merged, kind="stable")
        self._keys = merged[order]
        self._losses = np.concatenate([self._losses, losses[new]])[order]
        self._epochs = np.concatenate([self._epochs, epochs[new]])[order]

    def table(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """Every key cached and its loss, NaN where it is not fresh in ``epoch``."""
        fresh = self.fresh(epoch)
        return self._keys.copy(), np.where(fresh, self._losses, np.nan)

    def fresh(self, epoch: int) -> np.ndarray:
        """Whether each key of ``table(epoch)`` has a loss from the last ``epochs`` epochs
        (a NaN recorded is fresh too: told apart from a loss never recorded)."""
        fresh: np.ndarray = epoch - self._epochs <= self.epochs
        return fresh

    def state(self) -> dict[str, np.ndarray]:
        """The cached keys, losses and epochs."""
        return {"keys": self._keys, "losses": self._losses, "epochs": self._epochs}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Restores ``state()``."""
        self._keys = np.asarray(state["keys"], np.float64)
        self._losses = np.asarray(state["losses"], np.float64)
        self._epochs = np.asarray(state["epochs"], np.int64)

    def _projection(self, position: int, width: int) -> np.ndarray:
        key = (position, width)
        if key not in self._projections:
            self._projections[key] = self._rng.standard_normal(width)
        return self._projections[key]


def find_sorted(table: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(at, found): where each key is in the sorted ``table`` (0 where it is not), and
    whether it is; a binary search per key, with no sort of the table."""
    at = np.searchsorted(table, keys)
    inside = at < len(table)
    found = np.zeros(len(keys), bool)
    found[inside] = table[at[inside]] == keys[inside]
    return np.where(inside, at, 0), found

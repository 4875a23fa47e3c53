"""Reads a batched source for the sifter: a few batches at a time, as NumPy arrays.

A sifted step needs 1/kept source batches, and every ``next()`` on a tf.data iterator
has a fixed cost that shows on small models (docs/benchmarks-log.md). So, when every
source batch has the same static size B, the reader asks tf.data for g of them at once
(``source.batch(g)``: one call, the copy done in C++) and hands out views of that block;
rounds never cross two blocks. The next block's ``next()`` and conversion run ahead on a
thread of the reader's own (source data only: scoring never runs ahead), so that they
overlap the rank's waits for its peers instead of sitting on every stage's critical path.
A source whose batch size is unknown (a last partial batch is possible) is read one
batch at a time and concatenated, as any size may then come.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import tensorflow as tf
from keras import tree

from tfsift.parallel.shard import prompt_end


class SourceReader:
    """Hands out the next ``k`` source batches as one array per leaf.

    Example:
        >>> source = tf.data.Dataset.range(10).batch(2, drop_remainder=True)
        >>> reader = SourceReader(source, batch_size=2, group=3)
        >>> [leaves[0].tolist() for leaves, _ in iter(lambda: reader.read(2), None)]
        [[0, 1, 2, 3], [4, 5], [6, 7, 8, 9]]
    """

    def __init__(self, source: tf.data.Dataset, batch_size: int | None, group: int) -> None:
        self.batch_size = batch_size
        self._grouped = batch_size is not None and group > 1
        # the next block is assembled while the current one is sifted and trained on; the
        # epoch ends without waiting for tf.data's autotuner
        source = prompt_end(source)
        grouped = source.batch(group).prefetch(1) if self._grouped else source
        self._upstream: Iterator[Any] = iter(grouped)
        self._ahead: Future[Any] | None = None  # the next block, read on the thread
        self._thread: ThreadPoolExecutor | None = None
        self._block: list[np.ndarray] = []  # the current block of grouped batches
        self._at = 0  # batches of the block already handed out
        self._blocks = 0  # batches in the block
        self.first_size: int | None = batch_size  # the first batch's size, once read

    def read(self, k: int) -> tuple[list[np.ndarray], int] | None:
        """Up to ``k`` batches (fewer at the end of a block or of the source) and how
        many they are; ``None`` when the source has ended."""
        if not self._grouped:
            return self._read_single(k)
        B = self.batch_size or 0
        if self._at == self._blocks:
            block = self._next_block()
            if block is None:
                return None
            self._block, self._blocks, self._at = block, int(block[0].shape[0]) // B, 0
        n = min(k, self._blocks - self._at)
        rows = slice(self._at * B, (self._at + n) * B)
        self._at += n
        return [leaf[rows] for leaf in self._block], n

    def _next_block(self) -> list[np.ndarray] | None:
        """The next block's leaves, each of its batches' rows one after another (``None``
        at the end); the one after it is read on the reader's thread meanwhile. An error
        upstream is raised here, in order."""
        if self._ahead is None:
            block = self._fetch()
        else:
            ahead, self._ahead = self._ahead, None
            block = ahead.result()
        if block is None:
            self.close()
            return None
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="tfsift-sift-reader")
        self._ahead = self._thread.submit(self._fetch)
        return block

    def _fetch(self) -> list[np.ndarray] | None:
        # converted on the thread too: the conversion of a block that has just come
        # costs the caller's thread time as well, and the round waits for that thread
        element = next(self._upstream, None)
        if element is None:
            return None
        grouped = [np.asarray(leaf) for leaf in tree.flatten(element)]
        return [g.reshape(-1, *g.shape[2:]) for g in grouped]

    def close(self) -> None:
        """Ends the reader's thread (after the ``next()`` it runs, if any)."""
        if self._thread is not None:
            self._thread.shutdown(wait=False, cancel_futures=True)
            self._thread = None

    def _read_single(self, k: int) -> tuple[list[np.ndarray], int] | None:
        parts = []
        for _ in range(k):
            element = next(self._upstream, None)
            if element is None:
                break
            parts.append([np.asarray(leaf) for leaf in tree.flatten(element)])
            if self.first_size is None:
                self.first_size = int(parts[0][0].shape[0])
        if not parts:
            return None
        if len(parts) == 1:
            return parts[0], 1
        return [np.concatenate(p, axis=0) for p in zip(*parts, strict=True)], len(parts)

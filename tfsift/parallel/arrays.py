"""In-memory arrays as a sharded, batched dataset whose samples are known by their index.

``tfsift.from_arrays((x, y), B)`` is what ``tfsift.shard(from_tensor_slices((x, y)),
n).batch(B, drop_remainder=True)`` gives, with two differences that matter for small
models and for sifting:

- A batch is gathered with one NumPy fancy index per array (``x[rows]``), not sample by
  sample through tf.data's shuffle and batch, which costs a few microseconds per sample
  (about 0.65 ms per batch of 128 on ``scripts/bench_sifting.py``'s MNIST-1D, a quarter
  of its training step).
- Every sample has a stable key, its row, so a sifting policy that decides per epoch
  (InfoBatch) can leave the pruned rows out of the epoch's order: they are never read,
  as in the reference implementation's sampler (``tfsift.sift.indexed``).

Order: epoch e (1 the first) permutes the rows with ``default_rng([seed, e])`` (no
permutation with ``shuffle=False``) and deals them round-robin to the R data-parallel
replicas, each keeping ``n // R`` (the rest is left out of that epoch); every rank of
a pipeline computes the same order, with no message. Each iteration is the next epoch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import tensorflow as tf
from keras import tree

from tfsift.parallel import runtime
from tfsift.parallel.pydataset import PythonDataset


class ArrayDataset(PythonDataset):
    """The dataset ``tfsift.from_arrays`` returns. Iterated in Python (``for x, y in
    ds``) it gathers batches with NumPy; any tf.data transformation of it, ``fit`` or
    ``tf.function`` reads the same batches through ``from_generator``."""

    def __init__(
        self, data: Any, batch_size: int, shuffle: bool, seed: int, what: str = "from_arrays"
    ) -> None:
        rt = runtime.get()
        self.data = tree.map_structure(np.asarray, data)
        self.leaves: list[np.ndarray] = tree.flatten(self.data)
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.replicas, self.replica = rt.topology.replicas, rt.replica
        self.rows = _rows(self.leaves, what)
        self.share = self.rows // self.replicas  # rows per replica and epoch
        _check_batching(batch_size, self.share, rt.config.microbatches, self.replicas, what)
        self.epochs = 0  # epochs begun
        spec = tree.map_structure(
            lambda a: tf.TensorSpec((batch_size, *a.shape[1:]), tf.as_dtype(a.dtype)), self.data
        )
        super().__init__(spec, cardinality=self.share // batch_size)

    def order(self, epoch: int, rows: np.ndarray | None = None) -> np.ndarray:
        """This replica's rows of epoch ``epoch``: ``rows`` (default: all), permuted with
        ``default_rng([seed, epoch])`` unless ``shuffle=False``, dealt round-robin to the
        replicas, ``len(rows) // R`` each."""
        rows = np.arange(self.rows) if rows is None else np.asarray(rows, np.int64)
        if self.shuffle:
            rows = np.random.default_rng([self.seed, epoch]).permutation(rows)
        share = len(rows) // self.replicas
        mine: np.ndarray = rows[self.replica :: self.replicas][:share]
        return mine

    def gather(self, rows: np.ndarray) -> Any:
        """The samples at ``rows``, as the data's structure of NumPy arrays."""
        return tree.pack_sequence_as(self.data, [leaf[rows] for leaf in self.leaves])

    def _elements(self) -> Iterator[Any]:
        self.epochs += 1
        rows, B = self.order(self.epochs), self.batch_size
        for start in range(0, len(rows) - B + 1, B):
            yield self.gather(rows[start : start + B])


def from_arrays(data: Any, batch_size: int, *, shuffle: bool = True, seed: int = 0) -> ArrayDataset:
    """In-memory arrays as this replica's shard of batches, gathered by row.

    The same batches as ``tfsift.shard(tf.data.Dataset.from_tensor_slices(data),
    n).batch(batch_size, drop_remainder=True)`` would give (up to the order), for less:
    a batch is one NumPy gather per array, and each sample keeps its row as its key, so
    ``tfsift.sift`` with ``policy="infobatch"`` leaves pruned samples out of the epoch
    without reading them. Each pass over it is the next epoch: epoch e permutes the rows
    with ``default_rng([seed, e])``, then deals them to the replicas (``n // R`` each);
    every replica yields ``n // R // batch_size`` batches.

    Example:
        >>> train = tfsift.from_arrays((x_train, y_train), batch_size=128)
        >>> for x, y in train:                           # doctest: +SKIP
        ...     grads, loss = forward_backward(x, y)

    Args:
        data: an array, or a tuple or dict of arrays (NumPy, or anything ``np.asarray``
            takes), one sample per row, all with the same number of rows.
        batch_size: B, divisible by the config's ``microbatches``.
        shuffle: permute the rows at each epoch (False: row order, dealt to replicas).
        seed: the permutations' seed.

    Raises:
        ValueError: arrays of unequal lengths or without rows, a batch size that is not a
            positive multiple of ``microbatches``, or fewer rows per replica than a batch.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
        raise TypeError(
            f"from_arrays: batch_size must be an int. Received: {type(batch_size).__name__}"
        )
    return ArrayDataset(data, int(batch_size), bool(shuffle), int(seed))


def _rows(leaves: list[np.ndarray], what: str) -> int:
    lengths = [len(leaf) if leaf.ndim else None for leaf in leaves]
    if not leaves or None in lengths or len(set(lengths)) != 1:
        raise ValueError(
            f"{what} needs arrays with one sample per row, all with the same number of "
            f"rows. Received: {'no arrays' if not leaves else f'row counts {lengths}'}"
        )
    return int(lengths[0] or 0)


def _check_batching(B: int, share: int, M: int, replicas: int, what: str) -> None:
    if B < 1 or B % M:
        raise ValueError(
            f"{what}: batch_size must be a positive multiple of microbatches={M}, since "
            f"every batch splits into {M} microbatches. Received: batch_size={B}"
        )
    if share < B:
        raise ValueError(
            f"{what}: each of the {replicas} replica(s) gets {share} rows per epoch, "
            f"fewer than one batch. Received: batch_size={B}"
        )

"""In-memory arrays (or samples read by index) as a sharded, batched dataset whose samples
are known by their index.

``tfsift.from_arrays((x, y), B)`` is what ``tfsift.shard(from_tensor_slices((x, y)),
n).batch(B, drop_remainder=True)`` gives, with two differences that matter for small
models and for sifting:

- A batch is gathered with one NumPy fancy index per array (``x[rows]``), not sample by
  sample through tf.data's shuffle and batch, which costs a few microseconds per sample
  (about 0.65 ms per batch of 128 on ``scripts/bench_sifting_epochs.py``'s MNIST-1D, a
  quarter of its training step).
- Every sample has a stable key, its row, so a sifting policy that decides per epoch
  (InfoBatch) can leave the pruned rows out of the epoch's order: they are never read,
  as in the reference implementation's sampler (``tfsift.sift.indexed``).

``tfsift.from_rows(load, n, B)`` is the same dataset for data read by index (files, a
record store): each batch is ``load(rows)``, so that a pruned row is never read there either.

Order: epoch e (1 the first) permutes the rows with ``default_rng([seed, e])`` (no
permutation with ``shuffle=False``) and deals them round-robin to the R data-parallel
replicas, each keeping ``n // R`` (the rest is left out of that epoch); every rank of
a pipeline computes the same order, with no message. Each iteration is the next epoch:
``epochs`` counts the passes begun in this process, and a run resumed after d epochs sets
it to d (``fit`` does, from its ``initial_epoch``) to go on in the uninterrupted run's order.

Global batches: step t of an epoch takes replica r's rows ``r + R i`` of the permutation,
``i`` in ``[t B, (t + 1) B)``, so the R replicas together take its rows ``[t G, (t + 1)
G)``, G = R B, whatever R is. With ``global_batch_size=G`` (each replica takes B = G / R),
a job relaunched on fewer replicas trains the same samples at the same step, and an epoch
has ``n // G`` steps on any layout: a step number is a position in the data that every
layout shares (``RowDataset.start_at``)::

    permutation:  p0 p1 p2 p3 | p4 p5 p6 p7 | ...     G = 4
    R = 2, B = 2: r0 p0 p2, r1 p1 p3 | r0 p4 p6, r1 p5 p7 | ...
    R = 1, B = 4: r0 p0 p1 p2 p3     | r0 p4 p5 p6 p7     | ...
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import tensorflow as tf
from keras import tree

from tfsift.parallel import runtime
from tfsift.parallel.pydataset import PythonDataset


class RowDataset(PythonDataset):
    """Batches of samples known by their row: the epochs' order and deal over the replicas
    that ``from_arrays`` and ``from_rows`` share; a subclass reads a batch's rows
    (``gather``). Iterated in Python (``for x, y in ds``) it gathers batches with NumPy;
    any tf.data transformation of it, ``fit`` or ``tf.function`` reads the same batches
    through ``from_generator``."""

    maker = ""  # the function that makes one, for messages

    def __init__(
        self, rows: int, batch_size: int, shuffle: bool, seed: int, spec: Any, rest: int = 0
    ) -> None:
        rt = runtime.get()
        self.rows = rows
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.replicas, self.replica = rt.topology.replicas, rt.replica
        self.share = rows // self.replicas  # rows per replica and epoch
        # rows each replica takes after its whole batches, as one last partial batch of
        # each epoch (0: none; fit's arrays, as Keras' fit trains every sample: ArrayDataset)
        self.rest = rest
        self.epochs = 0  # epochs begun: the next pass is epoch epochs + 1 (a resume sets it)
        self._skip = 0  # batches the next epoch leaves out at its start (start_at)
        super().__init__(spec, cardinality=self.share // batch_size + bool(rest))

    @property
    def global_batch(self) -> int:
        """G, the samples a step takes over all replicas: R times the batch size."""
        return self.batch_size * self.replicas

    def start_at(self, step: int) -> None:
        """Makes the next pass over the dataset start at step ``step``, counted from the
        first epoch's first batch: epoch ``step // S + 1`` (S batches per epoch), at its
        batch ``step % S``; each pass after it is the next epoch, as before.

        For a custom loop resuming from a checkpoint: ``train.start_at(ckpt.restore() or
        0)``. With ``global_batch_size``, S and each step's samples are the same on any
        number of replicas, so a job relaunched on fewer hosts takes up the epoch where
        the saved one stopped, no sample trained twice or left out. (A dataset sifted by
        row keeps its position in its own checkpointed state instead.)

        Example:
            >>> train = tfsift.from_arrays((x, y), global_batch_size=256)  # doctest: +SKIP
            >>> train.start_at(ckpt.restore() or 0)                         # doctest: +SKIP

        Raises:
            ValueError: ``step`` is negative.
        """
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise ValueError(f"start_at: step must be an int >= 0. Received: {step!r}")
        per_epoch = self.share // self.batch_size + bool(self.rest)
        self.epochs, self._skip = int(step) // per_epoch, int(step) % per_epoch

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

    @abc.abstractmethod
    def gather(self, rows: np.ndarray) -> Any:
        """The samples at ``rows``, as the data's structure of NumPy arrays."""

    def _elements(self) -> Iterator[Any]:
        self.epochs += 1
        rows, B = self.order(self.epochs), self.batch_size
        first, self._skip = self._skip * B, 0
        for start in range(first, len(rows) - B + 1, B):
            yield self.gather(rows[start : start + B])
        if self.rest:  # the rows after the whole batches, as many as split (ArrayDataset)
            start = len(rows) // B * B
            yield self.gather(rows[start : start + self.rest])


class ArrayDataset(RowDataset):
    """The dataset ``tfsift.from_arrays`` returns: each batch one NumPy gather per array."""

    maker = "from_arrays"

    def __init__(
        self,
        data: Any,
        batch_size: int,
        shuffle: bool,
        seed: int,
        what: str = "from_arrays",
        partial: bool = False,
        any_size: bool = False,
    ) -> None:
        """``partial`` (fit's and the evaluations' arrays): each epoch ends with a last batch
        of the rows each replica has left after its whole batches (the step pads one that
        does not split into the microbatches); ``any_size`` (an evaluation's, which pads
        every batch that does not): a batch size need not split."""
        # a memory map stays one, unread; lists become tuples, as Keras' fit makes them (a
        # list in tf.data is one tensor): e.g. the targets of a model's outputs, [y1, y2];
        # a list of numbers (nested or not) is one array, as np.asarray makes it
        self.data = tree.map_structure(np.asarray, tree.lists_to_tuples(numbers_as_arrays(data)))
        self.leaves: list[np.ndarray] = tree.flatten(self.data)
        rows = _rows(self.leaves, what)
        rest = _check_batching(batch_size, rows, what, partial, any_size)
        spec = _spec(self.data, None if rest else batch_size)
        super().__init__(rows, batch_size, shuffle, seed, spec, rest)

    def gather(self, rows: np.ndarray) -> Any:
        return tree.pack_sequence_as(self.data, [leaf[rows] for leaf in self.leaves])


def numbers_as_arrays(data: Any) -> Any:
    """``data`` with each Python list of numbers (``[1, 2]``, ``[[1, 2], [3, 4]]``) made
    one array: ``lists_to_tuples`` would make its numbers leaves, single values."""
    if isinstance(data, list) and _numbers(data):
        return np.asarray(data)
    if isinstance(data, (list, tuple)):
        return type(data)(numbers_as_arrays(part) for part in data)
    if isinstance(data, dict):
        return {key: numbers_as_arrays(part) for key, part in data.items()}
    return data


def _numbers(values: list[Any]) -> bool:
    """Whether a list holds numbers, or lists of them, to its first leaf."""
    first: Any = values
    while isinstance(first, list) and first:
        first = first[0]
    return isinstance(first, (bool, int, float, np.number))


def from_arrays(
    data: Any,
    batch_size: int | None = None,
    *,
    global_batch_size: int | None = None,
    shuffle: bool = True,
    seed: int = 0,
) -> ArrayDataset:
    """In-memory arrays as this replica's shard of batches, gathered by row.

    The same batches as ``tfsift.shard(tf.data.Dataset.from_tensor_slices(data),
    n).batch(batch_size, drop_remainder=True)`` would give (up to the order), for less:
    a batch is one NumPy gather per array, and each sample keeps its row as its key, so
    ``tfsift.sift`` with ``policy="infobatch"`` leaves pruned samples out of the epoch
    without reading them. Each pass over it is the next epoch: epoch e permutes the rows
    with ``default_rng([seed, e])``, then deals them to the replicas (``n // R`` each);
    every replica yields ``n // R // batch_size`` batches. ``global_batch_size=G`` in
    place of ``batch_size`` gives each replica ``G / R``: the same samples at every step
    on any number of replicas, for a job that may be relaunched on fewer hosts
    (``tfsift run --min-np``, docs/cluster.md); ``train.start_at(step)`` makes the next
    pass start at step ``step`` counted from the run's first batch (epoch ``step // S + 1``
    of S batches, at its batch ``step % S``), for a custom loop that resumes from a
    checkpoint.
    Its ``epochs`` attribute counts the passes begun; a loop resumed after d whole epochs
    sets ``train.epochs = d`` to take the uninterrupted run's orders (``fit`` does this from
    its ``initial_epoch``).

    Example:
        >>> train = tfsift.from_arrays((x_train, y_train), batch_size=128)
        >>> for x, y in train:                           # doctest: +SKIP
        ...     grads, loss = forward_backward(x, y)

    Args:
        data: an array, or a tuple or dict of arrays (NumPy, or anything ``np.asarray``
            takes), one sample per row, all with the same number of rows.
        batch_size: B, each replica's batch, divisible by the config's ``microbatches``.
        global_batch_size: G, the batch of a step over all R replicas, in place of
            ``batch_size``: each replica takes G / R, divisible by ``microbatches``.
        shuffle: permute the rows at each epoch (False: row order, dealt to replicas).
        seed: the permutations' seed.

    Raises:
        TypeError: a batch size that is not an int.
        ValueError: arrays of unequal lengths or without rows, neither or both batch
            sizes, a batch size that is not a positive multiple of ``microbatches`` (a
            global one: of R times ``microbatches``), or fewer rows per replica than a batch.
    """
    B = _batch_size("from_arrays", batch_size, global_batch_size)
    return ArrayDataset(data, B, bool(shuffle), int(seed))


class RowsDataset(RowDataset):
    """The dataset ``tfsift.from_rows`` returns: each batch read by the caller's
    ``load(rows)`` and checked against the layout of the first batch (or of the
    ``element_spec`` given)."""

    maker = "from_rows"

    def __init__(
        self, load: Callable[[np.ndarray], Any], rows: int, batch_size: int, shuffle: bool,
        seed: int, spec: Any,
    ) -> None:  # fmt: skip
        self.load = load
        _check_batching(batch_size, rows, "from_rows")
        if spec is None:  # the first batch's rows, read once, give the layout
            example = self._read(np.arange(batch_size))
            self.layout, self.expected = _layout(example), "the first batch"
            spec = _spec(example, batch_size)
        else:
            self.layout, self.expected = _layout(spec), "element_spec"
        super().__init__(rows, batch_size, shuffle, seed, spec)

    def _read(self, rows: np.ndarray) -> Any:
        # a list is a tuple, as Keras' data adapters take it (tf.data would refuse it)
        batch = tree.map_structure(np.asarray, tree.lists_to_tuples(self.load(rows)))
        leaves = tree.flatten(batch)
        if not leaves or any(a.ndim == 0 or len(a) != len(rows) for a in leaves):
            raise ValueError(
                f"from_rows: load(rows) must return one row per index of rows. Received: "
                f"{[a.shape for a in leaves]} for {len(rows)} rows"
            )
        return batch

    def gather(self, rows: np.ndarray) -> Any:
        batch = self._read(rows)
        layout = _layout(batch)
        if layout != self.layout:
            raise ValueError(
                f"from_rows: load(rows) must return the same structure, dtypes and row "
                f"shapes at every call. Received: {layout}; {self.expected}: {self.layout}"
            )
        return batch


def from_rows(
    load: Callable[[np.ndarray], Any],
    rows: int,
    batch_size: int | None = None,
    *,
    global_batch_size: int | None = None,
    shuffle: bool = True,
    seed: int = 0,
    element_spec: Any = None,
) -> RowsDataset:
    """Samples read by row, by your ``load``, as this replica's shard of batches.

    ``tfsift.from_arrays`` for data that is not in memory: files, a record store, anything
    that reads a set of samples by index. The order, the deal to the replicas and the
    batches are ``from_arrays``'s, and each batch is ``load(rows)``, ``rows`` a 1-D int64
    NumPy array of ``batch_size`` sample indices in ``[0, rows)``, in the epoch's order.
    Sifted with ``policy="infobatch"``, a pruned sample is never read: ``load`` sees only
    the rows the epoch trains on. (A memory-mapped NumPy array needs no ``load``:
    ``from_arrays`` reads only the rows of each batch from it.)

    Example:
        >>> def load(rows):                                   # doctest: +SKIP
        ...     images = np.stack([decode(paths[i]) for i in rows])
        ...     return images, labels[rows]
        >>> train = tfsift.from_rows(load, len(paths), 128)  # doctest: +SKIP

    Args:
        load: reads the samples at ``rows``: returns an array, or a tuple (a list is
            taken as one) or dict of arrays (NumPy, or anything ``np.asarray`` takes),
            with row ``i`` holding sample ``rows[i]`` (the order matters: sifting's
            scores and weights follow it), and the same structure, dtypes and row
            shapes at every call. Without
            ``element_spec`` it is called once when the dataset is made, on rows
            ``0 .. batch_size - 1``, to learn them.
        rows: how many samples there are.
        batch_size: B, each replica's batch, divisible by the config's ``microbatches``.
        global_batch_size: G, the batch of a step over all R replicas, in place of
            ``batch_size`` (as ``from_arrays``'s).
        shuffle: permute the rows at each epoch (False: row order, dealt to replicas).
        seed: the permutations' seed.
        element_spec: a batch's structure of ``tf.TensorSpec``, as ``tf.data`` would
            give it (first dimension ``batch_size`` or None, the rest fully defined), in
            place of that first read: ``load`` is then called only for the batches
            trained, and each result is checked against it.

    Raises:
        TypeError: ``load`` is not callable, ``rows`` or ``batch_size`` is not an int, or
            ``element_spec`` is not made of ``tf.TensorSpec``.
        ValueError: ``rows`` < 1, neither or both batch sizes, a batch size that is not
            a positive multiple of ``microbatches`` (a global one: of R times
            ``microbatches``), fewer rows per replica than a batch, an ``element_spec``
            shape that is not a batch's, or a ``load`` whose result has not one row per
            index (or changes structure, dtypes or row shapes between calls, or differs
            from ``element_spec``).
    """
    if not callable(load):
        raise TypeError(
            f"from_rows: load must be a function of the rows to read. Received: "
            f"{type(load).__name__}"
        )
    _check_int("from_rows", "rows", rows)
    B = _batch_size("from_rows", batch_size, global_batch_size)
    if rows < 1:
        raise ValueError(f"from_rows: rows must be at least 1. Received: rows={rows}")
    spec = None if element_spec is None else _batch_spec(element_spec, B)
    return RowsDataset(load, int(rows), B, bool(shuffle), int(seed), spec)


def _layout(batch: Any) -> Any:
    """``batch``'s structure with each array (or ``tf.TensorSpec``) as its dtype and row
    shape: ``float32[28, 28]``. TensorFlow's dtype names, which a NumPy array and the
    spec it becomes share (a NumPy string of any width is ``string``)."""
    return tree.map_structure(lambda a: f"{tf.as_dtype(a.dtype).name}{list(a.shape[1:])}", batch)


def _spec(example: Any, batch_size: int | None) -> Any:
    return tree.map_structure(
        lambda a: tf.TensorSpec((batch_size, *a.shape[1:]), tf.as_dtype(a.dtype)), example
    )


def _batch_spec(spec: Any, batch_size: int) -> Any:
    """``element_spec`` checked to describe a batch, with its first dimension ``batch_size``."""
    leaves = tree.flatten(spec)
    if not leaves or not all(isinstance(s, tf.TensorSpec) for s in leaves):
        raise TypeError(
            f"from_rows: element_spec must be a tf.TensorSpec, or a tuple or dict of them. "
            f"Received: {spec!r}"
        )
    for s in leaves:
        shape = s.shape
        if (
            shape.rank is None
            or shape.rank < 1
            or shape[0] not in (None, batch_size)
            or (not shape[1:].is_fully_defined())
        ):
            raise ValueError(
                f"from_rows: element_spec must describe a batch: each shape "
                f"(batch_size={batch_size} or None, then the row shape, fully defined). "
                f"Received: {s}"
            )
    return _spec(spec, batch_size)  # its first dimension batch_size


def _batch_size(what: str, batch_size: Any, global_batch_size: Any) -> int:
    """Each replica's batch: ``batch_size``, or ``global_batch_size`` shared by the R
    replicas (which R times ``microbatches`` must divide)."""
    if (batch_size is None) == (global_batch_size is None):
        raise ValueError(
            f"{what} takes batch_size (each replica's) or global_batch_size (all replicas' "
            f"together), one of them. Received: batch_size={batch_size!r}, "
            f"global_batch_size={global_batch_size!r}"
        )
    if batch_size is not None:
        _check_int(what, "batch_size", batch_size)
        return int(batch_size)
    _check_int(what, "global_batch_size", global_batch_size)
    rt = runtime.get()
    R, M = rt.topology.replicas, rt.config.microbatches
    if global_batch_size < 1 or global_batch_size % (R * M):
        raise ValueError(
            f"{what}: global_batch_size must be a positive multiple of replicas x "
            f"microbatches = {R} x {M}, since each of the {R} replica(s) takes an equal "
            f"share, split into {M} microbatches. Received: global_batch_size="
            f"{global_batch_size}"
        )
    return int(global_batch_size) // R


def _check_int(what: str, name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what}: {name} must be an int. Received: {type(value).__name__}")


def _rows(leaves: list[np.ndarray], what: str) -> int:
    lengths = [len(leaf) if leaf.ndim else None for leaf in leaves]
    if not leaves or None in lengths or len(set(lengths)) != 1:
        raise ValueError(
            f"{what} needs arrays with one sample per row, all with the same number of "
            f"rows. Received: {'no arrays' if not leaves else f'row counts {lengths}'}"
        )
    return int(lengths[0] or 0)


def _check_batching(
    B: int, rows: int, what: str, partial: bool = False, any_size: bool = False
) -> int:
    """The rows of each replica's last partial batch (with ``partial``, those left after
    its whole batches; else 0), after checking that the batches split into the microbatches
    (unless ``any_size``) and that each replica has one to train."""
    rt = runtime.get()
    M, replicas = rt.config.microbatches, rt.topology.replicas
    if any_size and B < 1:
        raise ValueError(f"{what}: batch_size must be a positive integer. Received: batch_size={B}")
    if B < 1 or (B % M and not any_size):
        raise ValueError(
            f"{what}: batch_size must be a positive multiple of microbatches={M}, since "
            f"every batch splits into {M} microbatches. Received: batch_size={B}"
        )
    left = rows // replicas % B
    rest = left if partial else 0
    if rows // replicas < B and not rest:
        raise ValueError(
            f"{what}: each of the {replicas} replica(s) gets {rows // replicas} rows per "
            f"epoch, fewer than one batch. Received: batch_size={B}"
        )
    return rest

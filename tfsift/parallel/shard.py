"""Input pipelines for data-parallel replicas: equal shards, the same on every stage."""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

import numpy as np
import tensorflow as tf
from mpi4py import MPI

from tfsift.parallel import collectives, runtime
from tfsift.parallel.pydataset import PythonDataset

log = logging.getLogger("tfsift")


def shard(dataset: tf.data.Dataset, shuffle_buffer: int = 0, seed: int = 0) -> tf.data.Dataset:
    """Gives each data-parallel replica its own shard; every stage of a pipeline gets the same one.

    Every replica gets the same number of elements, so every replica runs the same
    number of steps and none waits forever in the gradient allreduce at the end of an
    epoch: of ``n`` elements, replica ``r`` keeps elements ``r, r + R, r + 2R, ...``,
    ``n // R`` of them (up to ``R - 1`` elements are left out). When the dataset's
    cardinality is unknown (after ``filter``, from a generator or from files), each rank
    counts its shard once, here (one pass over the data, logged), and every replica
    keeps the smallest count. Declare the cardinality to skip that pass:
    ``dataset.apply(tf.data.experimental.assert_cardinality(n))``, or
    ``tf.data.INFINITE_CARDINALITY`` for an endless generator (whose count would never
    end). An infinite dataset (``repeat()``) is sharded as it is.

    Call it on every rank, in the same order: with an unknown cardinality the counts
    are agreed between the ranks.

    The dataset it returns has tf.data's autotuner off unless the dataset's options set
    it (``prompt_end``): with it on, TensorFlow 2.21 can end an epoch's loop with a wait
    of up to the epoch's length.

    The dataset it returns checks its own ``.batch(B)`` against the config's
    ``microbatches`` M: every batch a step takes splits into M equal microbatches, so a
    ``B`` that M does not divide, or (without ``drop_remainder=True``) a last batch that it
    does not, is refused there, when the shard's size is known, rather than at the
    epoch's last step.

    Example:
        >>> for x, y in tfsift.shard(dataset).batch(32, drop_remainder=True):  # doctest: +SKIP
        ...     grads, loss = forward_backward(x, y)

    Args:
        dataset: unbatched or batched dataset; sharding is by element.
        shuffle_buffer: if positive, shuffle each shard with this buffer and the seed
            ``seed + dp_rank``.
        seed: base shuffle seed.

    Raises:
        TypeError: ``dataset`` is not a ``tf.data.Dataset`` (arrays, a tuple of them).
    """
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(
            "tfsift.shard deals a tf.data.Dataset of samples to the replicas (for arrays: "
            "tfsift.shard(tf.data.Dataset.from_tensor_slices((x, y))), or "
            f"tfsift.from_arrays((x, y), batch_size)). Received: {type(dataset).__name__}"
        )
    rt = runtime.get()
    replicas, replica = rt.topology.replicas, rt.replica
    out = dataset
    count: int | None = int(dataset.cardinality())
    if replicas > 1:
        out = dataset.shard(replicas, replica)
        count = _equal_count(dataset, out, rt)
        if count is not None:
            out = out.take(count)
    if count == 0 and rt.rank == 0:  # a loop over it would train nothing, silently
        total = int(dataset.cardinality())
        log.warning(
            "tfsift.shard: every replica's shard is empty, so every epoch over it yields "
            "nothing. Received: a dataset of %s for %d replica(s)",
            f"{total} element(s)" if total >= 0 else "unknown cardinality, counted empty",
            replicas,
        )
    if shuffle_buffer > 0:
        out = out.shuffle(shuffle_buffer, seed=seed + replica, reshuffle_each_iteration=True)
    return _checked_batching(prompt_end(out), rt.config.microbatches)


def prompt_end(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """``dataset`` with tf.data's autotuner off, unless its options already say.

    TensorFlow 2.21 can delete an autotuned iterator (at the end of every ``for`` loop
    over a dataset) only once the autotuner's thread wakes up (whether it waits is a
    race, more often lost on busy cores), and that thread sleeps for a period that
    doubles from 10 ms to 60 s while the iterator lives: an epoch of ``t`` seconds then
    ends with a wait of up to ``t``, 9.9 s after a 10-s epoch on this machine, and every
    other rank waits too (docs/failures.md). Off, ``AUTOTUNE`` parallelism
    is the number of cores. The options propagate to the datasets made from it;
    ``options.autotune.enabled = True``, set by the user on the dataset or after, turns
    the autotuner back on. A ``PythonDataset`` (``from_arrays``, a sifted dataset) is
    returned as it is: iterated in Python, it makes no tf.data iterator.
    """
    if isinstance(dataset, PythonDataset) or dataset.options().autotune.enabled is not None:
        return dataset
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


def _checked_batching(dataset: tf.data.Dataset, M: int) -> tf.data.Dataset:
    """``dataset``, whose ``.batch`` refuses batches that would not split into ``M``.

    The step sees tensors, never the dataset they came from, so the shard is the last
    place that knows its size: the README loop batches it directly.
    """
    n = int(dataset.cardinality())
    if n < 0:  # unknown or endless: every batch is B, or nothing can be said
        return dataset
    plain = dataset.batch

    @functools.wraps(plain)
    def batch(batch_size: Any, drop_remainder: bool = False, *args: Any, **kwargs: Any) -> Any:
        B = tf.get_static_value(batch_size)
        if B is not None and int(B) > 0:
            _check_batching(int(B), n, M, bool(drop_remainder))
        return plain(batch_size, drop_remainder, *args, **kwargs)

    dataset.batch = batch  # this instance only: what it returns is an ordinary dataset
    return dataset


def _check_batching(B: int, n: int, M: int, drop_remainder: bool) -> None:
    """Refuses ``.batch(B)`` of ``n`` elements whose batches do not all split into ``M``, or
    that drops every element (fewer than B with ``drop_remainder``)."""
    if drop_remainder and 0 < n < B:
        raise ValueError(
            f"tfsift.shard(...).batch({B}, drop_remainder=True): this shard has {n} "
            "elements, fewer than one batch, so every epoch over it would yield no batch and "
            f"train nothing. Use a smaller batch. Received: {n} elements, B={B}"
        )
    if B % M:
        raise ValueError(
            f"tfsift.shard(...).batch({B}): every batch a step takes splits into "
            f"microbatches={M} equal parts, so B must be a multiple of {M}. Received: B={B}"
        )
    last = n % B
    if last % M and not drop_remainder:
        raise ValueError(
            f"tfsift.shard(...).batch({B}): this shard's {n} elements end in a batch of "
            f"{last}, which does not split into microbatches={M}, so the epoch's last step "
            f"would fail. Use .batch({B}, drop_remainder=True). Received: {n} elements, B={B}"
        )


def _equal_count(
    dataset: tf.data.Dataset, mine: tf.data.Dataset, rt: runtime.Runtime
) -> int | None:
    """Elements every replica keeps: the smallest shard's size; None for an infinite dataset."""
    total = int(dataset.cardinality())
    if total == tf.data.INFINITE_CARDINALITY:
        return None
    if total >= 0:
        return total // rt.topology.replicas
    if rt.rank == 0:
        log.warning(
            "tfsift.shard: the dataset's cardinality is unknown; counting every shard (one "
            "pass over the data) so that every replica gets as many elements. Declare it with "
            "tf.data.experimental.assert_cardinality to skip this."
        )
    start = time.perf_counter()
    count = int(mine.reduce(np.int64(0), _plus_one))
    least = _smallest(count, rt)
    if rt.rank == 0:
        log.warning(
            "tfsift.shard: counted in %.1f s; every replica keeps %d elements (rank 0 had %d)",
            time.perf_counter() - start,
            least,
            count,
        )
    return least


def _plus_one(count: tf.Tensor, *_: object) -> tf.Tensor:
    return count + 1


def _smallest(count: int, rt: runtime.Runtime) -> int:
    """The minimum of ``count`` over every rank (bounded by the config's ``timeout``)."""
    mine, least = np.array([count], np.int64), np.zeros(1, np.int64)
    collectives.control_wait(
        rt.control_comm.Iallreduce(mine, least, op=MPI.MIN),
        "in tfsift.shard for the other ranks to count their shards of a dataset of unknown "
        "cardinality (is one of them endless? or not calling tfsift.shard?)",
    )
    return int(least[0])

"""Datasets for ``fit``: checked to split into whole microbatches, elements unpacked."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from keras import tree

from tfsift.parallel.shard import shard

DEFAULT_BATCH = 32  # Keras' default batch size


def training_data(
    x: Any, y: Any, sample_weight: Any, batch_size: int | None, M: int, what: str, shuffle: bool
) -> tf.data.Dataset:
    """A dataset as it is (checked), or arrays made into this replica's shard of batches.

    Arrays are sharded over the replicas (``tfsift.shard``) and batched with
    ``drop_remainder=True``, so up to a batch per replica is left out of an epoch.
    """
    if isinstance(x, tf.data.Dataset):
        if y is not None or sample_weight is not None:
            raise ValueError(
                f"{what}: y and sample_weight come from the dataset. Received: y, x a dataset"
            )
        return checked(x, M, what)
    if y is None:
        raise ValueError(f"{what} needs targets: pass y with array inputs. Received: y=None")
    elements = (x, y) if sample_weight is None else (x, y, sample_weight)
    n = len(tree.flatten(x)[0])
    dataset = shard(tf.data.Dataset.from_tensor_slices(elements), n if shuffle else 0)
    batch = batch_size or DEFAULT_BATCH
    return checked(dataset.batch(batch, drop_remainder=True), M, what)


def validation(data: Any, batch_size: int | None, M: int) -> tf.data.Dataset:
    """``validation_data``: a dataset, or a tuple ``(x, y)`` or ``(x, y, sample_weight)``
    of arrays, batched as the training arrays (Keras' default ``validation_batch_size``)."""
    if isinstance(data, tf.data.Dataset):
        return checked(data, M, "fit's validation_data")
    if isinstance(data, (tuple, list)) and len(data) in (2, 3):
        x, y, weight = (*data, None)[:3]
        return training_data(x, y, weight, batch_size, M, "fit's validation_data", False)
    raise TypeError(
        "validation_data must be a batched tf.data.Dataset or a tuple (x, y) or "
        f"(x, y, sample_weight). Received: {type(data).__name__}"
    )


def prediction_data(x: Any, batch_size: int | None, M: int) -> tuple[tf.data.Dataset, int | None]:
    """``predict``'s batches and, for arrays, how many rows to keep of the predictions.

    Arrays are not sharded (every rank predicts all of them); the last rows are repeated up
    to a multiple of ``M`` so that the last batch splits, and their predictions dropped.
    """
    if isinstance(x, tf.data.Dataset):
        return checked(x, M, "predict"), None
    batch = batch_size or DEFAULT_BATCH
    if batch % M:
        raise ValueError(
            f"predict's batch_size must be divisible by microbatches={M}. "
            f"Received: batch_size={batch}"
        )
    n = len(tree.flatten(x)[0])
    pad = (-n) % M
    padded = tree.map_structure(lambda a: np.concatenate([a, np.repeat(a[-1:], pad, 0)]), x)
    return tf.data.Dataset.from_tensor_slices(padded).batch(batch), n


def checked(dataset: Any, M: int, what: str) -> tf.data.Dataset:
    """``dataset`` if it is a batched ``tf.data.Dataset`` whose batches split into ``M``.

    Raises:
        TypeError: not a ``tf.data.Dataset``.
        ValueError: unbatched, or a batch size that is not static or not divisible by ``M``.
    """
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(
            f"{what} takes a batched tf.data.Dataset of (x, y) or (x, y, sample_weight) "
            "(e.g. tfsift.shard(ds).batch(B, drop_remainder=True)). "
            f"Received: {type(dataset).__name__}"
        )
    leaves = tree.flatten(dataset.element_spec)
    if not leaves or any(len(spec.shape) == 0 for spec in leaves):
        raise ValueError(
            f"{what} needs a batched dataset (call .batch(B, drop_remainder=True)). "
            f"Received: element_spec={dataset.element_spec}"
        )
    batch = leaves[0].shape[0]
    if M > 1 and (batch is None or batch % M):
        raise ValueError(
            f"{what} needs every batch to split into microbatches={M} equal parts: batch "
            f"the dataset with .batch(B, drop_remainder=True), B a multiple of {M}. "
            f"Received: batch size {batch}"
        )
    return dataset


def batches(dataset: tf.data.Dataset, steps: int | None) -> Iterator[tuple[Any, Any, Any]]:
    """``(x, y, sample_weight)`` of each batch (``y``, ``sample_weight`` None if absent)."""
    for n, element in enumerate(dataset):
        if steps is not None and n >= steps:
            return
        yield keras.utils.unpack_x_y_sample_weight(element)


def step_count(dataset: tf.data.Dataset, steps: int | None) -> int | None:
    """Batches per epoch for the progress bar: ``steps``, else the cardinality if known."""
    if steps is not None:
        return steps
    n = int(dataset.cardinality())
    return n if n >= 0 else None

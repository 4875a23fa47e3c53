"""Data that does not split evenly over the replicas: every replica must run as many steps.

usage: uneven_check.py shard|by_hand PARTITIONS
  shard:   tfsift.shard; run on 4 ranks with PARTITIONS=2 (2 stages x 2 replicas). 255
           samples in batches of 32 would give one replica 4 batches (128 samples) and
           the other 3 (127); the 191 of 239 samples kept by a filter (unknown
           cardinality) would give 3 (96 samples) and 2 (95).
  by_hand: Horovod's habit, ``dataset.shard(dp_size, dp_rank)``, on the 255 samples: the
           replica with 3 batches leaves while the other waits in its 4th allreduce.
Each step reduces gradients over the replicas, so a replica with a batch more waits.
Each rank reports the time.time() at which it finished.
"""

from __future__ import annotations

import sys
import time

import keras
import tensorflow as tf

import tfsift
from models import MODELS, data, training_step
from mpi import report

how, partitions = sys.argv[1], int(sys.argv[2])
tfsift.init({"partitions": partitions, "microbatches": 2})
model = MODELS["skip"]()
forward_backward = training_step(model)
optimizer = keras.optimizers.SGD(0.01)
x, y = data(255)
known = tf.data.Dataset.from_tensor_slices((x, y))
unknown = (
    tf.data.Dataset.range(239)
    .filter(lambda i: i % 5 != 0)
    .map(lambda i: (tf.gather(x, i), tf.gather(y, i)))
)


def shard(dataset: tf.data.Dataset) -> tf.data.Dataset:
    if how == "shard":
        return tfsift.shard(dataset)
    return dataset.shard(tfsift.dp_size(), tfsift.dp_rank())


def epoch(dataset: tf.data.Dataset) -> list[int]:
    """Trains on every batch of this replica's shard; returns each batch's first label."""
    seen = []
    for images, labels in shard(dataset).batch(32, drop_remainder=True):
        grads, _ = forward_backward(images, labels)
        grads = tfsift.allreduce([g.accumulate() for g in grads])
        if grads:
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        seen.append(int(labels[0]))
    return seen


if how == "by_hand":
    report(rank=tfsift.rank(), known=epoch(known), left=time.time())
    sys.exit()
report(
    rank=tfsift.rank(),
    replica=tfsift.dp_rank(),
    known=epoch(known),
    unknown=epoch(unknown),
    elements=[
        len(list(shard(known))),
        len(list(shard(unknown))),
        len(list(shard(known.repeat()).take(200))),
    ],
    left=time.time(),
)

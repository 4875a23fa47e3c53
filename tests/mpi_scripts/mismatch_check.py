"""Two stages fed different batches by a common habit; the job must fail with the reason.

usage: mismatch_check.py MODE   (unseeded: shuffle without a seed; shard: ds.shard(size, rank))
"""

from __future__ import annotations

import sys
from typing import Any

import keras
import numpy as np
import tensorflow as tf

import tfsift

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


class Net(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.a = keras.layers.Dense(8, activation="relu")
        self.b = keras.layers.Dense(3)

    def call(self, x: Any) -> Any:
        return self.b(self.a(x))


def main() -> None:
    tfsift.init({"partitions": 2, "microbatches": 2, "profile_repeats": 1})
    rng = np.random.default_rng(0)
    ds = tf.data.Dataset.from_tensor_slices(
        (rng.normal(size=(256, 4)).astype("float32"), rng.integers(0, 3, 256))
    )
    if sys.argv[1] == "unseeded":
        ds = tfsift.shard(ds).shuffle(256)
    else:
        ds = ds.shard(tfsift.size(), tfsift.rank())
    model = Net()

    @tfsift.step
    def train(x: tf.Tensor, y: tf.Tensor) -> Any:
        loss = LOSS(y, model(x, training=True))
        return tfsift.gradients(loss, model.trainable_variables), loss

    for x, y in ds.batch(16, drop_remainder=True):
        train(x, y)


if __name__ == "__main__":
    main()

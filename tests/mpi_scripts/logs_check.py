"""Every rank: ``evaluate`` on 2 data-parallel replicas, each its shard, with metrics whose
value is not the mean of the replicas' (AUC, precision), against one process's Keras
``evaluate`` of the whole data with the same weights.

usage: logs_check.py
  The labels follow the features on the even rows (replica 0's shard) and not on the odd
  ones (replica 1's), so each replica's AUC is far from the whole data's.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

import tfsift
from mpi import computed_once, report

N, B = 64, 8  # samples, each replica's batch
METRICS = ("auc", "precision", "accuracy")


def layers() -> list[keras.layers.Layer]:
    return [keras.layers.Dense(1, "sigmoid", kernel_initializer=keras.initializers.Ones())]


class Net(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        (self.head,) = layers()

    def call(self, x: Any) -> Any:
        return self.head(x)


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, 2)).astype(np.float32)
    y = np.where(np.arange(N) % 2 == 0, x.sum(axis=1) > 0, rng.random(N) > 0.5)
    return x, y.astype(np.float32)[:, None]


def compiled(model: keras.Model) -> keras.Model:
    model.compile(
        loss="binary_crossentropy",
        metrics=[
            keras.metrics.AUC(name="auc"),
            keras.metrics.Precision(name="precision"),
            "accuracy",
        ],
    )
    return model


def reference() -> dict[str, float]:
    model = compiled(keras.Sequential([keras.Input((2,)), *layers()]))
    return model.evaluate(*data(), batch_size=2 * B, verbose=0, return_dict=True)


def main() -> None:
    tfsift.init({"partitions": 1})
    want = computed_once("logs-reference", reference)
    model = compiled(Net())
    shard = tfsift.shard(tf.data.Dataset.from_tensor_slices(data())).batch(B)
    got = model.evaluate(shard, verbose=0, return_dict=True)
    report(rank=tfsift.rank(), got=got, want=want)


if __name__ == "__main__":
    main()

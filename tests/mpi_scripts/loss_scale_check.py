"""Every rank: ``fit`` under ``mixed_float16`` with a dynamic loss scale (quick to grow, so
that it overflows often), ``global_clipnorm`` and gradient accumulation, against one
process's Keras on the same global batches: the loss scale and the steps it applies,
batch by batch, and the weights.

usage: loss_scale_check.py K    (partitions; the world's other factor is replicas)
"""

from __future__ import annotations

import sys
from typing import Any

import keras
import numpy as np
import tensorflow as tf

import tfsift
from mpi import computed_once, report

N, B, M, EPOCHS = 256, 16, 2, 2  # samples, each replica's batch, microbatches


def layers() -> list[keras.layers.Layer]:
    init = keras.initializers.GlorotUniform
    return [
        keras.layers.Dense(16, "tanh", kernel_initializer=init(1)),
        keras.layers.Dense(16, "tanh", kernel_initializer=init(2)),
        keras.layers.Dense(16, "relu", kernel_initializer=init(3)),
        keras.layers.Dense(4, kernel_initializer=init(4)),
    ]


class Net(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c, self.d = layers()

    def call(self, x: Any) -> Any:
        return self.d(self.c(self.b(self.a(x))))


class Scales(keras.callbacks.Callback):  # type: ignore[misc]
    """(the optimizer's iterations, its loss scale) after each batch."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[int, float]] = []

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        optimizer = self.model.optimizer
        self.seen.append((int(optimizer.iterations), float(optimizer.dynamic_scale)))


def run(model: keras.Model, data: tf.data.Dataset) -> dict[str, Any]:
    inner = keras.optimizers.Adam(1e-2, gradient_accumulation_steps=2, global_clipnorm=0.1)
    optimizer = keras.optimizers.LossScaleOptimizer(inner, dynamic_growth_steps=3)
    model.compile(
        optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    scales = Scales()
    model.fit(data, epochs=EPOCHS, verbose=0, callbacks=[scales])
    return {"scales": scales.seen, "weights": model.get_weights()}


def samples() -> tf.data.Dataset:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, 6)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, rng.integers(0, 4, N).astype("int32")))


def main() -> None:
    tfsift.init({"partitions": int(sys.argv[1]), "microbatches": M, "profile_repeats": 1})
    R = tfsift.dp_size()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:  # the job's other scenarios run in this process
        reference = keras.Sequential([keras.Input((6,)), *layers()])
        want = computed_once(
            f"loss-scale-{R}", lambda: run(reference, samples().batch(B * R, drop_remainder=True))
        )
        got = run(Net(), tfsift.shard(samples()).batch(B, drop_remainder=True))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    error = max(
        float(np.max(np.abs(a - b))) for a, b in zip(got["weights"], want["weights"], strict=True)
    )
    report(rank=tfsift.rank(), scales=[got["scales"], want["scales"]], weights=error)


if __name__ == "__main__":
    main()

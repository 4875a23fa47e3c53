"""The model, data and loop of the checkpoint jobs (checkpoint_train.py, chaos.sh, the tests).

The model's four groups of layers go to stage g * K // 4 (manual placement), so every run
with K stages has the same plan and a resumed run computes exactly what an uninterrupted
one does; with v virtual stages, to chunk g * K v // 4.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import keras
import numpy as np
import tensorflow as tf

import tfsift

B, M, FEATURES, CLASSES, SAMPLES, SEED = 8, 2, 12, 4, 256, 11
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
PER_SAMPLE = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)


class CheckpointNet(tfsift.DistributedModel):
    """Dense layers with dropout and batch normalisation (non-trainable state)."""

    def __init__(self, partitions: int) -> None:
        super().__init__()
        with tfsift.partition(0):
            self.d1 = keras.layers.Dense(16, activation="relu")
        with tfsift.partition(partitions // 4):
            self.drop1 = keras.layers.Dropout(0.3)
            self.d2 = keras.layers.Dense(16, activation="relu")
        with tfsift.partition(2 * partitions // 4):
            self.norm = keras.layers.BatchNormalization()
            self.d3 = keras.layers.Dense(16, activation="tanh")
        with tfsift.partition(3 * partitions // 4):
            self.drop2 = keras.layers.Dropout(0.2)
            self.out = keras.layers.Dense(CLASSES)

    def call(self, x: Any) -> Any:
        h = self.d2(self.drop1(self.d1(x)))
        return self.out(self.drop2(self.d3(self.norm(h))))


def start(
    partitions: int,
    placement: str = "cluster",
    timeout: float | None = None,
    virtual_stages: int | None = None,
) -> tuple[CheckpointNet, Any, Any]:
    """``tfsift.init`` (``timeout``: its stall timeout, if given), the seeded model, its
    optimizer and its training step."""
    config: dict[str, Any] = {
        "partitions": partitions,
        "microbatches": M,
        "auto_partition": False,
        "placement_strategy": placement,
    }
    if timeout is not None:
        config["timeout"] = timeout
    if virtual_stages is not None:
        config["virtual_stages"] = virtual_stages
    tfsift.init(config)
    keras.utils.set_random_seed(SEED)
    model = CheckpointNet(partitions * (virtual_stages or 1))
    optimizer = keras.optimizers.Adam(0.01)

    @tfsift.step
    def forward_backward(x: tf.Tensor, y: tf.Tensor) -> Any:
        loss = LOSS(y, model(x, training=True))
        return tfsift.gradients(loss, model.trainable_variables), loss

    return model, optimizer, forward_backward


def train_step(model: Any, optimizer: Any, forward_backward: Any, x: Any, y: Any) -> float:
    grads, loss = forward_backward(x, y)
    grads = tfsift.allreduce([g.accumulate() for g in grads])
    if grads:
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    return float(loss.reduce_mean())


def samples() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(SEED)
    x = rng.normal(size=(SAMPLES, FEATURES)).astype(np.float32)
    return x, (np.abs(x[:, :CLASSES]).argmax(axis=1) + rng.integers(0, 2, SAMPLES)) % CLASSES


def batch(step: int) -> tuple[tf.Tensor, tf.Tensor]:
    """This replica's batch of step ``step`` (the same in every run)."""
    x, y = samples()
    R, r = tfsift.dp_size(), tfsift.dp_rank()
    start = (step * B * R + r * B) % (SAMPLES - B)
    return tf.constant(x[start : start + B]), tf.constant(y[start : start + B])


def sifted(model: Any) -> Any:
    """This replica's shard, sifted (relative rule, after a delay of two batches)."""
    source = tfsift.shard(tf.data.Dataset.from_tensor_slices(samples())).batch(
        B, drop_remainder=True
    )
    config = tfsift.SiftConfig(policy="relative", beta=1.0, history=64, delay=2, seed=3)
    return source.apply(tfsift.sift(model, PER_SAMPLE, config))


def forever(dataset: Any) -> Iterator[Any]:
    """The dataset's elements, epoch after epoch."""
    while True:
        yield from dataset

"""Trains the README's ConvNet as a pipeline (and data-parallel replicas) on handwritten digits.

Run on 2 processes, one stage each:

    horovodrun -np 2 -H localhost:2 python examples/mnist_pipeline.py

Offline it uses scikit-learn's 8x8 digits (shipped with the package); with network
access, ``--dataset mnist`` loads MNIST through tensorflow-datasets instead.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Any

import keras
import numpy as np
import tensorflow as tf

import tfsift


class ConvNet(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.conv = keras.layers.Conv2D(32, 3, activation="relu")
        self.flatten = keras.layers.Flatten()
        self.dense1 = keras.layers.Dense(128, activation="relu")
        self.dense2 = keras.layers.Dense(10)

    def call(self, x: Any) -> Any:
        return self.dense2(self.dense1(self.flatten(self.conv(x))))


def load(name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test) as float32 NHWC images in [0, 1] and int32 labels."""
    if name == "mnist":
        import tensorflow_datasets as tfds

        train, test = tfds.as_numpy(
            tfds.load("mnist", split=["train", "test"], as_supervised=True, batch_size=-1)
        )
        return (
            (train[0] / 255.0).astype("float32"),
            train[1].astype("int32"),
            (test[0] / 255.0).astype("float32"),
            test[1].astype("int32"),
        )
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images / 16.0).astype("float32")[..., None]
    y = digits.target.astype("int32")
    order = np.random.default_rng(0).permutation(len(x))
    test, train = order[:320], order[320:]
    return x[train], y[train], x[test], y[test]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=["digits", "mnist"], default="digits")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32, help="per replica")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--pipeline", default="auto")
    parser.add_argument("--optimize", default="speed")
    parser.add_argument("--lr", type=float, default=2e-3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    tfsift.init(
        {
            "partitions": args.partitions,
            "microbatches": args.microbatches,
            "pipeline": args.pipeline,
            "optimize": args.optimize,
        }
    )
    keras.utils.set_random_seed(0)
    x_train, y_train, x_test, y_test = load(args.dataset)
    train = tfsift.shard(tf.data.Dataset.from_tensor_slices((x_train, y_train)), 4096, seed=0)
    train = train.batch(args.batch_size, drop_remainder=True).prefetch(2)
    model = ConvNet()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer = keras.optimizers.Adam(args.lr)
    # the update in one compiled call: eagerly Keras updates each variable in Python
    update = tfsift.compiled_update(optimizer, model)

    @tfsift.step
    def train_step(images: tf.Tensor, labels: tf.Tensor) -> Any:
        loss = loss_fn(labels, model(images, training=True))
        return tfsift.gradients(loss, model.trainable_variables), loss

    @tfsift.step
    def predict(images: tf.Tensor) -> Any:
        return model(images, training=False)

    def accuracy() -> float:
        n = len(x_test) - len(x_test) % (args.microbatches * 8)
        logits = np.concatenate(
            [predict(x_test[i : i + 64]).concat().numpy() for i in range(0, n, 64) if i + 64 <= n]
        )
        return float(np.mean(np.argmax(logits, axis=1) == y_test[: len(logits)]))

    say = logging.getLogger("example").info if tfsift.rank() == 0 else (lambda *a: None)
    say(
        f"{tfsift.size()} ranks: {tfsift.mp_size()} stages x {tfsift.dp_size()} replicas, "
        f"{args.dataset}: {len(x_train)} train / {len(x_test)} test"
    )
    for epoch in range(args.epochs):
        start, losses = time.perf_counter(), []
        for images, labels in train:
            grads, loss = train_step(images, labels)
            grads = tfsift.allreduce([g.accumulate() for g in grads])
            update(grads)  # every rank, a stage without variables too (update([]))
            losses.append(float(loss.reduce_mean()))
        say(
            f"epoch {epoch + 1}/{args.epochs}  loss {np.mean(losses):.4f}  "
            f"({time.perf_counter() - start:.1f}s)"
        )
    say(f"test accuracy: {accuracy():.4f}")


if __name__ == "__main__":
    main()

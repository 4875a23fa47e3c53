"""Keras' compile/fit/evaluate/predict on a 2-stage pipeline, on scikit-learn's 8x8 digits.

Run on 2 processes, one stage each (4 processes: 2 stages x 2 data-parallel replicas):

    mpirun -np 2 python examples/fit_pipeline.py

Offline: the digits ship with scikit-learn. Rank 0 shows Keras' progress bar; every
rank gets the same History.
"""

from __future__ import annotations

import argparse
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

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


def datasets(batch: int) -> tuple[tf.data.Dataset, tf.data.Dataset]:
    """(train, test): each replica's shard, in batches that split into microbatches."""
    digits = load_digits()
    x = (digits.images / 16.0).astype("float32")[..., None]
    y = digits.target.astype("int32")
    order = np.random.default_rng(0).permutation(len(x))
    test, train = order[:320], order[320:]
    make = tf.data.Dataset.from_tensor_slices
    train_ds = tfsift.shard(make((x[train], y[train])), shuffle_buffer=2048, seed=0)
    test_ds = tfsift.shard(make((x[test], y[test])))
    return (
        train_ds.batch(batch, drop_remainder=True),
        test_ds.batch(batch, drop_remainder=True),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32, help="per replica")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--sift", action="store_true", help="train on the samples that matter")
    args = parser.parse_args()
    tfsift.init({"partitions": args.partitions, "microbatches": args.microbatches})
    keras.utils.set_random_seed(0)
    train, test = datasets(args.batch_size)
    model = ConvNet()
    model.compile(
        optimizer=keras.optimizers.Adam(2e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    history = model.fit(
        train,
        epochs=args.epochs,
        validation_data=test,
        callbacks=[keras.callbacks.EarlyStopping(monitor="val_loss", patience=2)],
        sift=tfsift.SiftConfig(policy="relative", beta=1.0, delay=10) if args.sift else None,
    )
    loss, accuracy = model.evaluate(test, verbose=0)
    predicted = model.predict(test, verbose=0).argmax(axis=1)
    if tfsift.rank() == 0:
        print(f"epochs run: {len(history.history['loss'])}")
        print(f"test loss: {loss:.4f}, test accuracy: {accuracy:.4f}")
        print(f"first predictions: {predicted[:10].tolist()}")


if __name__ == "__main__":
    main()

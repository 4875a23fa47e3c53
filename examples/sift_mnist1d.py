"""Sifted training of a 1-D ConvNet on MNIST-1D, as a pipeline and data-parallel replicas.

MNIST-1D (Greydanus, 2020) is generated locally by the ``mnist1d`` package: 40-sample
signals of the ten digits, harder than MNIST for a small model. Run

    horovodrun -np 2 -H localhost:2 python examples/sift_mnist1d.py               # 2 stages
    horovodrun -np 4 -H localhost:4 python examples/sift_mnist1d.py               # 2 x 2
    horovodrun -np 2 -H localhost:2 python examples/sift_mnist1d.py --policy none # baseline
    horovodrun -np 2 -H localhost:2 python examples/sift_mnist1d.py --scorer early_exit \
        --overlap --leftover keep     # score on stage 0 while it waits; keep what no wait scored

Every rank scores candidate batches with a forward-only pass through the pipeline,
keeps samples by the Selective-Backprop relative rule (``--beta``), refills batches of
``--batch`` and trains on those; every epoch rank 0 prints the kept fraction, the
training loss and the held-out accuracy. ``--scorer early_exit`` scores with stage 0's
layers and a small head instead (``tfsift.SiftConfig``), ``--overlap`` while stage 0 waits
for gradients, and ``--leftover keep`` keeps unscored what no wait had room to score.
"""

from __future__ import annotations

import argparse
import logging
import time
from typing import Any

import keras
import numpy as np
import tensorflow as tf

import tfsift


class ConvNet1D(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.reshape = keras.layers.Reshape((40, 1))
        self.conv1 = keras.layers.Conv1D(32, 5, padding="same", activation="relu")
        self.conv2 = keras.layers.Conv1D(32, 5, padding="same", activation="relu")
        self.flatten = keras.layers.Flatten()
        self.dense1 = keras.layers.Dense(128, activation="relu")
        self.dense2 = keras.layers.Dense(10)

    def call(self, x: Any) -> Any:
        h = self.conv2(self.conv1(self.reshape(x)))
        return self.dense2(self.dense1(self.flatten(h)))


def load(samples: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test); 80% train, 20% test, generated offline."""
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples, args.seed = samples, seed
    data = make_dataset(args)
    return (
        data["x"].astype(np.float32),
        data["y"].astype(np.int32),
        data["x_test"].astype(np.float32),
        data["y_test"].astype(np.int32),
    )


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20000, help="generated, 80%% train")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch", type=int, default=64, help="B, per replica")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--policy", default="relative", help="a SiftConfig policy, or none")
    parser.add_argument("--beta", type=float, default=1.0)
    parser.add_argument("--delay", type=int, default=10, help="source batches unsifted")
    parser.add_argument("--scorer", default="full", choices=["full", "early_exit"])
    parser.add_argument("--overlap", action="store_true", help="early exit in stage 0's waits")
    parser.add_argument("--leftover", default="score", choices=["score", "keep"])
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def main() -> None:
    args = parse()
    logging.basicConfig(level=logging.WARNING)
    tfsift.init({"partitions": args.partitions, "microbatches": args.microbatches})
    keras.utils.set_random_seed(args.seed)
    x, y, x_test, y_test = load(args.samples, args.seed)
    model = ConvNet1D()
    per_sample = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    optimizer = keras.optimizers.Adam(args.lr)
    # the update in one compiled call: eagerly Keras updates each variable in Python
    update = tfsift.compiled_update(optimizer, model)

    @tfsift.step
    def train_step(images: tf.Tensor, labels: tf.Tensor) -> Any:
        loss = keras.ops.mean(per_sample(labels, model(images, training=True)))
        return tfsift.gradients(loss, model.trainable_variables), loss

    @tfsift.step
    def predict(images: tf.Tensor) -> Any:
        return model(images, training=False)

    source = tfsift.shard(tf.data.Dataset.from_tensor_slices((x, y)), 4096, args.seed)
    train = source.batch(args.batch, drop_remainder=True)
    if args.policy != "none":
        config = tfsift.SiftConfig(
            policy=args.policy, beta=args.beta, delay=args.delay, seed=args.seed,
            scorer=args.scorer, overlap=args.overlap, leftover=args.leftover,
        )  # fmt: skip
        train = train.apply(tfsift.sift(model, per_sample, config))
    start = time.perf_counter()
    for epoch in range(args.epochs):
        losses = []
        for images, labels in train:
            grads, loss = train_step(images, labels)
            grads = tfsift.allreduce(grads)
            if grads:
                update(grads)
            losses.append(float(loss.reduce_mean()))
        accuracy = evaluate(predict, x_test, y_test, args.batch * 4)
        metrics = tfsift.sift_metrics()
        kept, unscored = metrics.get("kept_fraction", 1.0), metrics.get("samples_unscored", 0)
        if tfsift.rank() == 0:
            print(
                f"epoch {epoch + 1}: kept {kept:.3f}, loss {np.mean(losses):.4f}, "
                f"held-out accuracy {accuracy:.4f}, {time.perf_counter() - start:.1f} s"
                + (f", kept unscored {unscored}" if args.leftover == "keep" else ""),
                flush=True,
            )


def evaluate(predict: Any, x: np.ndarray, y: np.ndarray, batch: int) -> float:
    """Held-out accuracy; every rank runs the forward-only step on the same batches."""
    correct = 0
    usable = len(x) - len(x) % batch
    for i in range(0, usable, batch):
        logits = predict(tf.constant(x[i : i + batch])).concat()
        correct += int(np.sum(np.argmax(logits.numpy(), axis=-1) == y[i : i + batch]))
    return correct / usable


if __name__ == "__main__":
    main()

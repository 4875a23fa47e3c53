"""Sifted training of a 1-D ConvNet on MNIST-1D, as a pipeline and data-parallel replicas.

MNIST-1D (Greydanus, 2020) is generated locally by the ``mnist1d`` package: 40-sample
signals of the ten digits, harder than MNIST for a small model. Run

    horovodrun -np 2 -H localhost:2 python examples/sift_mnist1d.py               # 2 stages
    horovodrun -np 4 -H localhost:4 python examples/sift_mnist1d.py               # 2 x 2
    horovodrun -np 2 -H localhost:2 python examples/sift_mnist1d.py --policy none # baseline
    horovodrun -np 2 -H localhost:2 python examples/sift_mnist1d.py --policy relative
    horovodrun -np 2 -H localhost:2 python examples/sift_mnist1d.py --policy relative \
        --scorer early_exit --overlap --leftover keep   # score on stage 0 while it waits

By default InfoBatch (``SiftConfig(policy="infobatch", epochs=...)``, the method that
pays: docs/sifting.md) prunes part of the well-learnt samples at each epoch's start; the
arrays are read by ``tfsift.from_arrays``, so a pruned sample is never read, and each
step hands its per-sample losses back as the samples' scores. Any other ``--policy``
scores candidate batches with a forward-only pass through the pipeline and keeps samples
by that rule (``relative``: Selective-Backprop, ``--beta``); ``--scorer early_exit``
scores with stage 0's layers and a small head instead, ``--overlap`` while stage 0 waits
for gradients, and ``--leftover keep`` keeps unscored what no wait had room to score.
Every epoch rank 0 prints the epoch's kept fraction, the training loss and the held-out
accuracy.
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
    parser.add_argument("--policy", default="infobatch", help="a SiftConfig policy, or none")
    parser.add_argument("--beta", type=float, default=1.0, help="relative only")
    parser.add_argument("--delay", type=int, default=10, help="forward scores: batches unsifted")
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
    def weighted_step(images: tf.Tensor, labels: tf.Tensor, weights: tf.Tensor) -> Any:
        losses = per_sample(labels, model(images, training=True))  # one per sample
        grads = tfsift.gradients(keras.ops.mean(weights * losses), model.trainable_variables)
        return grads, losses  # unweighted: the samples' scores

    @tfsift.step
    def predict(images: tf.Tensor) -> Any:
        return model(images, training=False)

    train = sifted(args, model, per_sample, x, y)
    start = time.perf_counter()
    for epoch in range(args.epochs):
        losses = []
        for batch in train:
            if args.policy == "infobatch":
                grads, loss = weighted_step(*batch)
                train.record(loss)  # this batch's losses: its samples' scores next epoch
                losses.append(float(np.mean(loss.concat())))
            else:
                grads, loss = train_step(*batch)
                losses.append(float(loss.reduce_mean()))
            grads = tfsift.allreduce(grads)
            update(grads)  # every rank, a stage without variables too (update([]))
        accuracy = evaluate(predict, x_test, y_test, args.batch * 4)
        metrics = tfsift.sift_metrics(epoch=True)
        kept, unscored = metrics.get("kept_fraction", 1.0), metrics.get("samples_unscored", 0)
        if tfsift.rank() == 0:
            print(
                f"epoch {epoch + 1}: kept {kept:.3f}, loss {np.mean(losses):.4f}, "
                f"held-out accuracy {accuracy:.4f}, {time.perf_counter() - start:.1f} s"
                + (f", kept unscored {unscored}" if args.leftover == "keep" else ""),
                flush=True,
            )


def sifted(
    args: argparse.Namespace, model: Any, per_sample: Any, x: np.ndarray, y: np.ndarray
) -> Any:
    """The training batches: InfoBatch on the arrays by row, or a tf.data input sifted by a
    forward-scored policy, or (``--policy none``) not sifted."""
    if args.policy == "infobatch":
        config = tfsift.SiftConfig(policy="infobatch", epochs=args.epochs, seed=args.seed)
        train = tfsift.from_arrays((x, y), args.batch, seed=args.seed)
        return train.apply(tfsift.sift(config=config))
    source = tfsift.shard(tf.data.Dataset.from_tensor_slices((x, y)), 4096, args.seed)
    train = source.batch(args.batch, drop_remainder=True)
    if args.policy == "none":
        return train
    config = tfsift.SiftConfig(
        policy=args.policy, beta=args.beta, delay=args.delay, seed=args.seed,
        scorer=args.scorer, overlap=args.overlap, leftover=args.leftover,
    )  # fmt: skip
    return train.apply(tfsift.sift(model, per_sample, config))


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

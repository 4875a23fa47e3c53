"""Trains a residual CNN with BatchNormalization as a pipeline whose cut a skip connection crosses.

Run on 2 processes, one stage each (4 processes: 2 stages x 2 data-parallel replicas):

    mpirun -np 2 python examples/resnet_skip.py

Offline: scikit-learn's 8x8 digits. Every conv, BatchNormalization, ReLU and ``x +
shortcut`` of the residual blocks is a node of the traced model, so a cut can fall inside
a block; the block's shortcut is then sent to the next stage beside the main branch, and
its gradient comes back the same way. Rank 0 prints the tensors that cross each cut,
marking the skip connections. ``--cut auto`` lets the partitioner choose the cut;
the default, ``--cut block``, pins it (``tfsift.partition``) inside the downsampling
block so that its projected shortcut crosses it.

BatchNormalization normalises each microbatch (B / M samples) in training, as GPipe does;
its moving statistics live on the stage that holds the layer and are updated once per
microbatch; the test accuracy uses them (``training=False``). With several replicas,
each replica keeps its own statistics (only gradients are averaged).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import time
from collections.abc import Iterator
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

import tfsift

WIDTHS = (16, 16, 32, 32)  # output channels of the stem and of each residual block
DOWNSAMPLE = 2  # this block halves the image (stride 2) and projects its shortcut
CUT_BLOCK = DOWNSAMPLE  # --cut block: stage 1 starts at this block's second convolution
MOMENTUM = 0.9  # of the moving statistics: 0.99 lags behind after one epoch of 46 steps
LAYERS = ("conv1", "bn1", "conv2", "bn2")  # a block's layers, model attributes block<b>_<name>


class ResidualCNN(tfsift.DistributedModel):
    """A stem, residual blocks ``relu(shortcut + bn(conv(relu(bn(conv(x))))))``, then a head.

    The blocks' layers are attributes of the model itself (not of a block layer), so that
    each is its own node in the traced graph and a cut may fall between two of them.
    ``cut_at`` (None: the partitioner chooses) puts the layers from that block's second
    convolution on in ``tfsift.partition(1)``, the rest in ``tfsift.partition(0)``.
    """

    def __init__(self, cut_at: int | None = None) -> None:
        super().__init__()
        with _stage(cut_at, 0):
            self.stem = keras.layers.Conv2D(
                WIDTHS[0], 3, padding="same", use_bias=False, name="stem"
            )
            self.stem_bn = keras.layers.BatchNormalization(momentum=MOMENTUM, name="stem_bn")
            self.project = keras.layers.Conv2D(
                WIDTHS[DOWNSAMPLE], 1, strides=2, use_bias=False, name="shortcut_conv"
            )
            self.project_bn = keras.layers.BatchNormalization(momentum=MOMENTUM, name="shortcut_bn")
        for b in range(1, len(WIDTHS)):
            with _stage(cut_at, int(cut_at is not None and b > cut_at)):
                self._add_layers(b, "conv1", "bn1", strides=2 if b == DOWNSAMPLE else 1)
            with _stage(cut_at, int(cut_at is not None and b >= cut_at)):
                self._add_layers(b, "conv2", "bn2", strides=1)
        with _stage(cut_at, int(cut_at is not None)):
            self.pool = keras.layers.GlobalAveragePooling2D(name="pool")
            self.out = keras.layers.Dense(10, name="logits")

    def _add_layers(self, b: int, conv: str, bn: str, strides: int) -> None:
        name = f"block{b}_{conv}"
        layer = keras.layers.Conv2D(WIDTHS[b], 3, strides, "same", use_bias=False, name=name)
        setattr(self, name, layer)
        norm = keras.layers.BatchNormalization(momentum=MOMENTUM, name=f"block{b}_{bn}")
        setattr(self, f"block{b}_{bn}", norm)

    def call(self, x: Any) -> Any:
        h = keras.ops.relu(self.stem_bn(self.stem(x)))
        for b in range(1, len(WIDTHS)):
            conv1, bn1, conv2, bn2 = (getattr(self, f"block{b}_{n}") for n in LAYERS)
            shortcut = self.project_bn(self.project(h)) if b == DOWNSAMPLE else h
            y = bn2(conv2(keras.ops.relu(bn1(conv1(h)))))
            h = keras.ops.relu(keras.ops.add(shortcut, y))
        return self.out(self.pool(h))


@contextlib.contextmanager
def _stage(cut_at: int | None, index: int) -> Iterator[None]:
    """``tfsift.partition(index)`` when the cut is pinned, else nothing."""
    if cut_at is None:
        yield
        return
    with tfsift.partition(index):
        yield


def crossings(model: tfsift.DistributedModel) -> list[str]:
    """One line per cut of the partitioned model, then one per tensor sent across it: its
    producer, shape and readers; a tensor the far side reads only in a residual add is a
    skip connection."""
    part = model.partitioned
    assert part is not None, "call after the first step"
    graph, nodes = part.graph, part.graph.nodes
    producer = {t: gn.name for gn in nodes for t in gn.outputs}
    lines = []
    for cut in part.bounds[1:-1]:
        lines.append(f"cut before node {cut} ({nodes[cut].name}) carries:")
        for t in graph.live(cut):
            readers = [gn for gn in nodes[cut:] if t in gn.inputs]
            skip = all(type(gn.operation).__name__ == "Add" for gn in readers)
            lines.append(
                f"  {producer.get(t, 'the model input')} {tuple(graph.tensors[t].shape[1:])}"
                f" -> {', '.join(gn.name for gn in readers)}" + ("  <- skip connection" * skip)
            )
    return lines


def load() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test): 8x8x1 float32 images in [0, 1], int32 labels."""
    digits = load_digits()
    x = (digits.images / 16.0).astype("float32")[..., None]
    y = digits.target.astype("int32")
    order = np.random.default_rng(0).permutation(len(x))
    test, train = order[:320], order[320:]
    return x[train], y[train], x[test], y[test]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32, help="per replica")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--pipeline", default="auto")
    parser.add_argument("--optimize", default="speed")
    parser.add_argument(
        "--cut",
        choices=["block", "auto"],
        default="block",
        help="block: inside the downsampling block (2 stages); auto: the partitioner's",
    )
    parser.add_argument("--lr", type=float, default=2e-3)
    args = parser.parse_args()
    if args.cut == "block" and args.partitions != 2:
        parser.error(f"--cut block makes 2 stages; use --cut auto for {args.partitions}")
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    tfsift.init(
        {
            "partitions": args.partitions,
            "microbatches": args.microbatches,
            "pipeline": args.pipeline,
            "optimize": args.optimize,
            "auto_partition": args.cut == "auto",
        }
    )
    keras.utils.set_random_seed(0)
    x_train, y_train, x_test, y_test = load()
    train = tfsift.shard(tf.data.Dataset.from_tensor_slices((x_train, y_train)), 4096, seed=0)
    train = train.batch(args.batch_size, drop_remainder=True).prefetch(2)
    model = ResidualCNN(CUT_BLOCK if args.cut == "block" else None)
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
        return model(images, training=False)  # BatchNorm's moving statistics

    def accuracy() -> float:
        batch = 8 * args.microbatches
        n = len(x_test) - len(x_test) % batch
        logits = np.concatenate(
            [predict(x_test[i : i + batch]).concat().numpy() for i in range(0, n, batch)]
        )
        return float(np.mean(np.argmax(logits, axis=1) == y_test[:n]))

    say = logging.getLogger("example").info if tfsift.rank() == 0 else (lambda *a: None)
    say(
        f"{tfsift.size()} ranks: {tfsift.mp_size()} stages x {tfsift.dp_size()} replicas, "
        f"digits: {len(x_train)} train / {len(x_test)} test"
    )
    for epoch in range(args.epochs):
        start, losses = time.perf_counter(), []
        for images, labels in train:
            grads, loss = train_step(images, labels)
            grads = tfsift.allreduce(grads)
            update(grads)  # every rank, a stage without variables too (update([]))
            losses.append(float(loss.reduce_mean()))
        if epoch == 0:
            for line in crossings(model):
                say(line)
        say(
            f"epoch {epoch + 1}/{args.epochs}  loss {np.mean(losses):.4f}  "
            f"({time.perf_counter() - start:.1f}s)"
        )
    say(f"test accuracy: {accuracy():.4f}")


if __name__ == "__main__":
    main()

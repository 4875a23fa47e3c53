"""Trains a 2-stage MLP on arrays sifted by row with InfoBatch, on as many replicas as it is
launched with, checkpointing and resuming: the job ``tfsift run --min-np`` shrinks.

usage: elastic_train.py DIR STEPS EVERY [--progress PATH] [--pace SECONDS]
  The data: ``from_arrays`` with a global batch of G samples (G / R a replica), permuted
  each epoch, sifted with InfoBatch on training scores (epoch 2 of 3 prunes). Saves after
  every EVERY-th step and after the last; resumes from the newest checkpoint, which may
  come from another number of replicas. After every step, each stage-0 rank appends
  "<attempt> <step> <rows...>" (the rows its replica trained) to DIR/rows-r<rank>, and with
  --progress writes PATH/rank<r> ("<pid> <step>"); --pace sleeps that long after every step.
  Reports the first step it ran and the replicas it had.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

import tfsift
from mpi import REPORTS, report

G, M, ROWS, FEATURES, CLASSES, SEED = 16, 2, 256, 12, 4, 11
PER_SAMPLE = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
SIFT = tfsift.SiftConfig(
    policy="infobatch", prune=0.5, anneal=0.34, epochs=3, scores="training", stale=3,
    rescale="unbiased", seed=3,
)  # fmt: skip


class Net(tfsift.DistributedModel):
    """Dense layers, no dropout or batch statistics: what a step computes depends on its
    samples only, not on how they are split between replicas."""

    def __init__(self) -> None:
        super().__init__()
        with tfsift.partition(0):
            self.d1 = keras.layers.Dense(16, activation="relu")
            self.d2 = keras.layers.Dense(16, activation="relu")
        with tfsift.partition(1):
            self.d3 = keras.layers.Dense(16, activation="tanh")
            self.out = keras.layers.Dense(CLASSES)

    def call(self, x: Any) -> Any:
        return self.out(self.d3(self.d2(self.d1(x))))


def samples() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(SEED)
    x = rng.normal(size=(ROWS, FEATURES)).astype(np.float32)
    y = (np.abs(x[:, :CLASSES]).argmax(axis=1) + rng.integers(0, 2, ROWS)) % CLASSES
    return x, y, np.arange(ROWS)


def forever(dataset: Any) -> Iterator[Any]:
    while True:
        yield from dataset


def main() -> None:
    directory, steps, every = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    flags = sys.argv[4:]
    progress = Path(flags[flags.index("--progress") + 1]) if "--progress" in flags else None
    pace = float(flags[flags.index("--pace") + 1]) if "--pace" in flags else 0.0
    attempt = os.environ.get("TFSIFT_RESTART_COUNT", "0")
    tfsift.init({"partitions": 2, "microbatches": M, "auto_partition": False, "timeout": 3})
    keras.utils.set_random_seed(SEED)
    model, optimizer = Net(), keras.optimizers.Adam(0.01)
    train = tfsift.from_arrays(samples(), global_batch_size=G, seed=5)
    train = train.apply(tfsift.sift(config=SIFT))

    @tfsift.step
    def forward_backward(x: tf.Tensor, y: tf.Tensor, w: tf.Tensor) -> Any:
        losses = PER_SAMPLE(y, model(x, training=True))
        loss = tf.reduce_mean(w * losses)
        return tfsift.gradients(loss, model.trainable_variables), losses

    ckpt = tfsift.CheckpointManager(model, optimizer, directory, max_to_keep=2, sift=train)
    first = ckpt.restore() or 0
    log = directory / f"rows-r{tfsift.rank()}"
    directory.mkdir(parents=True, exist_ok=True)
    for step, (x, y, rows, w) in zip(range(first, steps), forever(train), strict=False):
        grads, losses = forward_backward(x, y, w)
        grads = tfsift.allreduce([g.accumulate() for g in grads])
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        train.record(losses)
        if tfsift.mp_rank() == 0:
            with log.open("a") as out:
                out.write(" ".join(map(str, [attempt, step, *np.asarray(rows).tolist()])) + "\n")
        if (step + 1) % every == 0 or step == steps - 1:
            ckpt.save(step)
        if progress is not None:
            partial = progress / f".rank{tfsift.rank()}"
            partial.write_text(f"{os.getpid()} {step}\n")
            os.replace(partial, progress / f"rank{tfsift.rank()}")
        time.sleep(pace)
    if os.environ.get(REPORTS):
        report(rank=tfsift.rank(), replicas=tfsift.dp_size(), first=first)


if __name__ == "__main__":
    main()

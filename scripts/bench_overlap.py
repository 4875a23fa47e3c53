"""Seconds per optimizer step on a 2-stage pipeline: plain, sifted (full / early exit), overlap.

Run on 2 processes (partitions=2, microbatches=4):

    mpirun -np 2 python scripts/bench_overlap.py --repeats 5

Each variant trains the same 1-D ConvNet on MNIST-1D for ``--steps`` optimizer steps
(after ``--warmup`` steps that trace and warm up), and the time per step counts
everything the training loop waits for: reading and sifting the data, the step, the
gradient allreduce and the update. Variants run in rotating order ``--repeats`` times
in one job, and the table shows the median, so drift on a noisy machine hits all of
them alike. Rank 0 prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import keras
import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
from sift_mnist1d import ConvNet1D, load

import tfsift

VARIANTS = {
    "no sifting": None,
    "relative beta=1, full scoring": {"scorer": "full"},
    "relative beta=1, early exit": {"scorer": "early_exit"},
    "relative beta=1, early exit + overlap": {"scorer": "early_exit", "overlap": True},
}


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--samples", type=int, default=40000)
    parser.add_argument("--score-batches", type=int, default=8, help="g of SiftConfig")
    return parser.parse_args()


def time_variant(name: str, x: np.ndarray, y: np.ndarray, args: argparse.Namespace) -> float:
    """Seconds per optimizer step of one variant (after its warm-up steps)."""
    keras.utils.set_random_seed(0)
    model = ConvNet1D()
    per_sample = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    optimizer = keras.optimizers.Adam(1e-3)

    @tf.function  # an eager Adam update costs more than this model's step
    def apply(grads: list[tf.Tensor]) -> None:
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))

    @tfsift.step
    def train_step(images: tf.Tensor, labels: tf.Tensor) -> Any:
        loss = keras.ops.mean(per_sample(labels, model(images, training=True)))
        return tfsift.gradients(loss, model.trainable_variables), loss

    train = tf.data.Dataset.from_tensor_slices((x, y)).repeat()
    train = train.batch(args.batch, drop_remainder=True).prefetch(4)
    options = VARIANTS[name]
    if options is not None:
        config = tfsift.SiftConfig(
            policy="relative",
            beta=1.0,
            exit_after="conv1",
            score_batches=args.score_batches,
            **options,
        )
        train = train.apply(tfsift.sift(model, per_sample, config))
    batches = iter(train)
    stamps = []
    for _ in range(args.warmup + args.steps):
        images, labels = next(batches)
        grads, _ = train_step(images, labels)
        grads = tfsift.allreduce(grads)
        if grads:
            apply(grads)
        stamps.append(time.perf_counter())
    return (stamps[-1] - stamps[args.warmup - 1]) / args.steps


def main() -> None:
    args = parse()
    tfsift.init({"partitions": 2, "microbatches": 4, "profile_repeats": 3})
    x, y, _, _ = load(args.samples, 0)
    names = list(VARIANTS)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(args.repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            times[name].append(time_variant(name, x, y, args))
            if tfsift.rank() == 0:
                print(f"repeat {r + 1}: {name}: {times[name][-1] * 1e3:.1f} ms/step", flush=True)
    if tfsift.rank() == 0:
        base = statistics.median(times["no sifting"])
        print("\n| variant | ms per step (median) | range | vs no sifting |")
        print("| --- | --- | --- | --- |")
        for name in names:
            med = statistics.median(times[name])
            lo, hi = min(times[name]) * 1e3, max(times[name]) * 1e3
            print(f"| {name} | {med * 1e3:.1f} | {lo:.1f} to {hi:.1f} | {med / base:.2f}x |")


if __name__ == "__main__":
    main()

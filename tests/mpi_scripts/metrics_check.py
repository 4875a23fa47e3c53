"""Keras metrics updated inside @tfsift.step functions, against one process over all replicas.

usage: metrics_check.py K M STEPS

A training step updates a SparseCategoricalAccuracy and a Mean of the loss after
tfsift.gradients; a forward-only step updates another accuracy; a third step updates a
metric whose variable cannot be combined over replicas (aggregation="none"). Every rank
reports the results; the reference computes them in one process on every replica's data.
"""

from __future__ import annotations

import sys
from typing import Any

import keras
import numpy as np
import tensorflow as tf

import tfsift
from models import LOSS, MODELS, copy_stage_weights, data
from mpi import report

B, SEED, LR = 8, 3, 0.05


class Last(keras.metrics.Metric):  # type: ignore[misc]
    """The last value seen: a state replicas cannot add up."""

    def __init__(self) -> None:
        super().__init__(name="last")
        self.value = self.add_variable((), "zeros", aggregation="none", name="value")

    def update_state(self, value: Any) -> None:
        self.value.assign(value)

    def result(self) -> Any:
        return self.value.value


def reference(K: int, M: int, R: int, steps: int) -> tuple[keras.Model, dict[int, Any], dict]:
    """One process: the same model and updates, every replica's microbatches in turn."""
    keras.utils.set_random_seed(SEED)
    model = MODELS["skip"]()
    inputs = keras.Input((8, 8, 1))
    functional = keras.Model(inputs, model.call(inputs))
    init = {id(v): v.numpy() for v in model.variables}
    optimizer = keras.optimizers.SGD(LR)
    acc, mean = keras.metrics.SparseCategoricalAccuracy(), keras.metrics.Mean()
    for t in range(steps):
        x, y = data(B * R, seed=t)
        with tf.GradientTape() as tape:
            predictions = functional(x, training=True)
            loss = LOSS(y, predictions)
        for r in range(R):
            for m in range(M):
                at = slice(r * B + m * (B // M), r * B + (m + 1) * (B // M))
                acc.update_state(y[at], predictions[at])
                mean.update_state(LOSS(y[at], predictions[at]))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    x, y = data(B * R, seed=100)
    eval_acc = keras.metrics.SparseCategoricalAccuracy()
    eval_acc.update_state(y, functional(x))
    want = {
        "acc": [float(acc.total.numpy()), float(acc.count.numpy())],
        "mean": [float(mean.total.numpy()), float(mean.count.numpy())],
        "eval_acc": [float(eval_acc.total.numpy()), float(eval_acc.count.numpy())],
    }
    return model, init, want


def main() -> None:
    K, M, steps = (int(a) for a in sys.argv[1:4])
    tfsift.init({"partitions": K, "microbatches": M})
    R, r = tfsift.dp_size(), tfsift.dp_rank()
    ref, init, want = reference(K, M, R, steps)
    keras.utils.set_random_seed(SEED)
    model = MODELS["skip"]()
    optimizer = keras.optimizers.SGD(LR)
    acc, mean = keras.metrics.SparseCategoricalAccuracy(), keras.metrics.Mean()
    eval_acc, last = keras.metrics.SparseCategoricalAccuracy(name="eval_acc"), Last()

    @tfsift.step
    def train(images: tf.Tensor, labels: tf.Tensor) -> Any:
        predictions = model(images, training=True)
        loss = LOSS(labels, predictions)
        grads = tfsift.gradients(loss, model.trainable_variables)
        acc.update_state(labels, predictions)
        mean.update_state(loss)
        return grads, loss

    @tfsift.step
    def evaluate(images: tf.Tensor, labels: tf.Tensor) -> Any:
        eval_acc.update_state(labels, model(images, training=False))
        return 0.0

    @tfsift.step
    def track_last(images: tf.Tensor, labels: tf.Tensor) -> Any:
        loss = LOSS(labels, model(images, training=False))
        last.update_state(loss)
        return loss

    model.partition_model([data(B)[0][: B // M]])
    copy_stage_weights(ref, init, model)
    mine = slice(r * B, (r + 1) * B)
    for t in range(steps):
        x, y = data(B * R, seed=t)
        grads, _ = train(x[mine], y[mine])
        grads = tfsift.allreduce(grads)
        if grads:
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    x, y = data(B * R, seed=100)
    evaluate(x[mine], y[mine])
    try:
        track_last(x[mine], y[mine])
        error = ""
    except RuntimeError as failure:
        error = str(failure)
    report(
        rank=tfsift.rank(),
        stage=tfsift.mp_rank(),
        replica=r,
        acc=[float(acc.total.numpy()), float(acc.count.numpy())],
        mean=[float(mean.total.numpy()), float(mean.count.numpy())],
        eval_acc=[float(eval_acc.total.numpy()), float(eval_acc.count.numpy())],
        results=[float(m.result()) for m in (acc, mean, eval_acc)],
        want=want,
        want_results=[want["acc"][0] / want["acc"][1], want["mean"][0] / want["mean"][1],
                      want["eval_acc"][0] / want["eval_acc"][1]],
        error=error,
        last=float(np.asarray(last.result())),
    )  # fmt: skip


if __name__ == "__main__":
    main()

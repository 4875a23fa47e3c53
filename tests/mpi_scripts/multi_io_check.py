"""Every rank: a dict-input, two-output model pipelined; gradients against a full-model tape.

usage: multi_io_check.py K M
"""

from __future__ import annotations

import sys
from typing import Any

import keras
import numpy as np
import tensorflow as tf

import tfsift
from mpi import report

CE = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
MSE = keras.losses.MeanSquaredError()


class TwoInTwoOut(tfsift.DistributedModel):
    """Inputs {"a": (8,), "b": (5,)}; outputs (class logits, a regression value)."""

    def __init__(self) -> None:
        super().__init__()
        self.left = keras.layers.Dense(8, activation="tanh")
        self.right = keras.layers.Dense(8, activation="tanh")
        self.mix = keras.layers.Dense(12, activation="relu")
        self.classes = keras.layers.Dense(4)
        self.value = keras.layers.Dense(1)

    def call(self, inputs: dict[str, Any]) -> Any:
        h = keras.ops.concatenate([self.left(inputs["a"]), self.right(inputs["b"])], axis=-1)
        h = self.mix(h)
        return self.classes(h), self.value(h)


class Pair(tfsift.DistributedModel):
    """A list input unpacked inside call: ``left, right = inputs``."""

    def __init__(self) -> None:
        super().__init__()
        self.left = keras.layers.Dense(6)
        self.right = keras.layers.Dense(6)
        self.out = keras.layers.Dense(4)

    def call(self, inputs: list[Any]) -> Any:
        left, right = inputs
        return self.out(keras.ops.add(self.left(left), self.right(right)))


def data() -> tuple[dict[str, tf.Tensor], tf.Tensor, tf.Tensor]:
    rng = np.random.default_rng(0)
    a = tf.constant(rng.normal(size=(8, 8)), tf.float32)
    b = tf.constant(rng.normal(size=(8, 5)), tf.float32)
    return (
        {"a": a, "b": b},
        tf.constant(rng.integers(0, 4, 8)),
        tf.constant(rng.normal(size=(8, 1)), tf.float32),
    )


def loss_of(name: str, outputs: Any, y: tf.Tensor, v: tf.Tensor) -> tf.Tensor:
    if name == "dict":
        logits, value = outputs
        return CE(y, logits) + MSE(v, value)
    return CE(y, outputs)


def rel_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-12))


def check(name: str, K: int, M: int) -> dict[str, Any]:
    tfsift.init({"partitions": K, "microbatches": M, "profile_repeats": 1})
    keras.utils.set_random_seed(3)
    model = TwoInTwoOut() if name == "dict" else Pair()
    inputs, y, v = data()
    if name == "pair":
        inputs = [inputs["a"][:, :5], inputs["b"]]
    with tf.GradientTape() as tape:
        ref_loss = loss_of(name, model.call(inputs), y, v)
    ref = {
        w.path: g.numpy()
        for w, g in zip(
            model.trainable_variables,
            tape.gradient(ref_loss, model.trainable_variables),
            strict=True,
        )
    }

    @tfsift.step
    def train(inputs: Any, y: tf.Tensor, v: tf.Tensor) -> Any:
        loss = loss_of(name, model(inputs, training=True), y, v)
        return tfsift.gradients(loss, model.trainable_variables), loss

    grads, loss = train(inputs, y, v)
    errors = [
        float(
            np.max(np.abs(g.accumulate().numpy() - ref[w.path]))
            / (np.max(np.abs(ref[w.path])) + 1e-12)
        )
        for g, w in zip(grads, model.trainable_variables, strict=True)
    ]
    return {
        "grad_error": max(errors) if errors else 0.0,
        "num_grads": len(grads),
        "loss": float(loss.reduce_mean()),
        "ref_loss": float(ref_loss),
    }


def main() -> None:
    K, M = int(sys.argv[1]), int(sys.argv[2])
    results = {name: check(name, K, M) for name in ["dict", "pair"]}
    report(rank=tfsift.rank(), results=results)


if __name__ == "__main__":
    main()

"""One process, partitions=1: a step equals a plain tape, evaluation steps, request checks."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfsift

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


class Mlp(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.a = keras.layers.Dense(8, activation="relu")
        self.b = keras.layers.Dense(3)

    def call(self, x: Any) -> Any:
        return self.b(self.a(x))


def batch() -> tuple[tf.Tensor, tf.Tensor]:
    rng = np.random.default_rng(0)
    return tf.constant(rng.normal(size=(8, 5)), tf.float32), tf.constant(rng.integers(0, 3, 8))


def test_microbatched_step_equals_a_full_batch_tape_and_eval_returns_predictions() -> None:
    tfsift.init({"microbatches": 4})
    model = Mlp()
    x, y = batch()

    @tfsift.step
    def train(images: tf.Tensor, labels: tf.Tensor) -> Any:
        loss = LOSS(labels, model(images, training=True))
        return tfsift.gradients(loss, model.trainable_variables), loss

    @tfsift.step
    def evaluate(images: tf.Tensor) -> Any:
        return model(images, training=False)

    grads, loss = train(x, y)
    with tf.GradientTape() as tape:
        want_loss = LOSS(y, model.b(model.a(x)))
    want = tape.gradient(want_loss, model.trainable_variables)
    assert len(grads) == len(want) == 4
    for got, ref in zip(grads, want, strict=True):
        np.testing.assert_allclose(got.accumulate().numpy(), ref.numpy(), rtol=1e-5, atol=1e-7)
    assert abs(float(loss.reduce_mean()) - float(want_loss)) < 1e-6
    logits = evaluate(x).concat()
    np.testing.assert_allclose(logits.numpy(), model.b(model.a(x)).numpy(), rtol=1e-5)


def test_gradients_of_other_variables_are_refused_with_the_counts() -> None:
    tfsift.init({"microbatches": 2})
    model = Mlp()
    x, y = batch()

    @tfsift.step
    def train(images: tf.Tensor, labels: tf.Tensor) -> Any:
        loss = LOSS(labels, model(images, training=True))
        return tfsift.gradients(loss, model.trainable_variables[:1]), loss

    with pytest.raises(ValueError) as err:
        train(x, y)
    assert str(err.value) == (
        "tfsift.gradients must be called with model.trainable_variables (this rank's stage "
        "variables, 4 of them). Received: a list of 1 variables"
    )

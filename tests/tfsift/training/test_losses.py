"""The compiled loss as a batch mean (what a step trains on) and per sample (what sift scores)."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import pytest

from tfsift.training.losses import batch_loss, per_sample_loss

Y = np.array([0, 2, 1, 1])
LOGITS = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
WANT = keras.losses.sparse_categorical_crossentropy(Y, LOGITS, from_logits=True).numpy()


class Scaled(keras.losses.Loss):  # type: ignore[misc]
    """A subclass whose __init__ does not take its own config back."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def call(self, y_true: Any, y_pred: Any) -> Any:
        return self.scale * keras.losses.sparse_categorical_crossentropy(
            y_true, y_pred, from_logits=True
        )


def from_logits(y_true: Any, y_pred: Any) -> Any:
    return keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)


@pytest.mark.parametrize(
    ("loss", "scale"),
    [
        (keras.losses.SparseCategoricalCrossentropy(from_logits=True), 1.0),
        (from_logits, 1.0),
        (Scaled(2.0), 2.0),
    ],
    ids=["object", "function", "subclass"],
)
def test_batch_loss_is_the_mean_of_the_per_sample_losses(loss: Any, scale: float) -> None:
    mean = batch_loss(loss)
    np.testing.assert_allclose(mean(Y, LOGITS).numpy(), scale * WANT.mean(), rtol=1e-6)
    np.testing.assert_allclose(per_sample_loss(mean)(Y, LOGITS).numpy(), scale * WANT, rtol=1e-6)


def test_a_loss_name_resolves_through_keras() -> None:
    probs = keras.ops.softmax(LOGITS).numpy()
    want = keras.losses.sparse_categorical_crossentropy(Y, probs).numpy()
    for name in ("sparse_categorical_crossentropy", "SparseCategoricalCrossentropy"):
        mean = batch_loss(name)
        np.testing.assert_allclose(per_sample_loss(mean)(Y, probs).numpy(), want, rtol=1e-6)


def test_no_loss_says_to_compile_with_one() -> None:
    with pytest.raises(ValueError, match=r"model.compile\(loss=...\). Received: None"):
        batch_loss(None)

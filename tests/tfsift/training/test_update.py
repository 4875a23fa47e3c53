"""One process: ``tfsift.compiled_update`` applies the same update as the eager
``apply_gradients``, in one compiled call; its errors. ``fit`` updates through it, so the
multi-rank side (a stage's own variables) is fit's (tests/mpi_scripts/fit_check.py)."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfsift

B, SEED = 16, 5


class Mlp(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.a = keras.layers.Dense(8, activation="relu")
        self.b = keras.layers.Dense(3)

    def call(self, x: Any) -> Any:
        return self.b(self.a(x))


class CountingAdam(keras.optimizers.Adam):
    """Adam counting the Python runs of its per-variable update."""

    runs = 0

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        CountingAdam.runs += 1
        super().update_step(gradient, variable, learning_rate)


def train(compiled: bool, steps: int = 6) -> tuple[list[np.ndarray], keras.optimizers.Adam]:
    """The README's loop with Adam, one update a step either way; its weights at the end."""
    tfsift.init({"microbatches": 2})
    keras.utils.set_random_seed(SEED)
    model, optimizer = Mlp(), CountingAdam(0.01)
    loss_obj = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    update = tfsift.compiled_update(optimizer, model)

    @tfsift.step
    def forward_backward(x: tf.Tensor, y: tf.Tensor) -> Any:
        loss = loss_obj(y, model(x, training=True))
        return tfsift.gradients(loss, model.trainable_variables), loss

    rng = np.random.default_rng(0)
    CountingAdam.runs = 0
    for _ in range(steps):
        x = rng.normal(size=(B, 5)).astype(np.float32)
        y = rng.integers(0, 3, size=B)
        grads = tfsift.allreduce(forward_backward(x, y)[0])
        if compiled:
            update(grads)
        else:
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    return [v.numpy() for v in model.trainable_variables], optimizer


def test_the_update_equals_apply_gradients_in_one_compiled_call() -> None:
    want, eager = train(compiled=False)
    assert CountingAdam.runs == 6 * 4  # eagerly: each variable's update in Python, each step
    got, optimizer = train(compiled=True)
    assert CountingAdam.runs == 4  # compiled: only while tracing, once
    assert int(optimizer.iterations.numpy()) == int(eager.iterations.numpy()) == 6
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def built_model(trainable: bool = True) -> Mlp:
    tfsift.init({"microbatches": 1})
    model = Mlp()
    model.trainable = trainable
    tfsift.step(lambda x: model(x))(np.zeros((2, 5), np.float32))  # built and partitioned
    return model


def test_a_stage_without_trainable_variables_updates_nothing() -> None:
    model = built_model(trainable=False)
    assert model.trainable_variables == []
    optimizer = keras.optimizers.Adam()
    tfsift.compiled_update(optimizer, model)([])
    assert not optimizer.built


def test_bad_arguments_say_what_was_expected_and_received() -> None:
    model = built_model()
    with pytest.raises(TypeError) as error:
        tfsift.compiled_update("adam", model)
    assert str(error.value) == (
        "compiled_update(optimizer, model) expects a keras.optimizers.Optimizer. Received: str"
    )
    with pytest.raises(TypeError) as error:
        tfsift.compiled_update(keras.optimizers.SGD(), [model])
    assert str(error.value) == (
        "compiled_update(optimizer, model) expects a keras.Model (a tfsift.DistributedModel). "
        "Received: list"
    )
    update = tfsift.compiled_update(keras.optimizers.SGD(), model)
    with pytest.raises(ValueError) as error:
        update([tf.zeros((5, 8))])
    assert str(error.value) == (
        f"update(grads) expects one gradient per trainable variable of this rank's stage of "
        f"{model.name!r}, in their order (4). Received: 1 gradients"
    )

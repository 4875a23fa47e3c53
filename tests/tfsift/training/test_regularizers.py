"""One process: ``fit`` and ``evaluate`` add the regularized weights' penalties as Keras'
do (weights and losses equal to a Keras model's, a loss scale and ``loss_weights`` too),
and refuse an ``activity_regularizer``; tests/mpi_scripts/update_check.py runs a
pipeline's. ``fit`` ends with an EMA optimizer's averages, as Keras' does."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import pytest

import tfsift

N, B = 64, 16
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def layers(activity: bool = False) -> list[keras.layers.Layer]:
    """The same initial weights in every model made of them: an L2 kernel, an L1 bias."""
    return [
        keras.layers.Dense(
            8,
            "relu",
            name="hidden",
            kernel_initializer=keras.initializers.GlorotUniform(1),
            kernel_regularizer=keras.regularizers.L2(0.1),
            activity_regularizer=keras.regularizers.L1(0.01) if activity else None,
        ),
        keras.layers.Dense(
            3,
            name="head",
            kernel_initializer=keras.initializers.GlorotUniform(2),
            bias_initializer="ones",
            bias_regularizer=keras.regularizers.L1(0.05),
        ),
    ]


class Net(tfsift.DistributedModel):
    def __init__(self, activity: bool = False) -> None:
        super().__init__()
        self.a, self.b = layers(activity)

    def call(self, x: Any) -> Any:
        return self.b(self.a(x))


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(N, 5)).astype(np.float32), rng.integers(0, 3, N)


def trained(model: keras.Model, optimizer: keras.optimizers.Optimizer) -> tuple[Any, float]:
    model.compile(optimizer=optimizer, loss=LOSS)
    history = model.fit(*data(), batch_size=B, epochs=2, shuffle=False, verbose=0)
    return history.history["loss"], model.evaluate(*data(), batch_size=B, verbose=0)


@pytest.mark.parametrize(
    "optimizer",
    [
        lambda: keras.optimizers.SGD(0.5),
        lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.5)),
    ],
    ids=["sgd", "loss_scale"],
)
def test_fit_and_evaluate_add_the_weights_penalties_as_keras_does(
    optimizer: Callable[[], keras.optimizers.Optimizer],
) -> None:
    keras_model = keras.Sequential([keras.Input((5,)), *layers()])
    want = trained(keras_model, optimizer())
    tfsift.init({"microbatches": 2})
    model = Net()
    got = trained(model, optimizer())
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)  # History's loss, each epoch
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6)  # evaluate's
    for g, w in zip(model.get_weights(), keras_model.get_weights(), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)
    # the penalties weigh: left out, losses and weights would differ far beyond rounding
    assert float(sum(keras_model.losses)) > 0.1


def test_an_activity_regularizer_is_refused_at_compile() -> None:
    tfsift.init({"microbatches": 2})
    with pytest.raises(ValueError) as err:
        Net(activity=True).compile(optimizer="sgd", loss=LOSS)
    assert str(err.value) == (
        "tfsift's fit adds the penalties of regularized weights (kernel_regularizer, "
        "bias_regularizer, ...) to the loss as Keras does, but not an activity_regularizer, "
        "which depends on each microbatch's activations on its stage. Add the penalty to the "
        "loss in a @tfsift.step loop, or regularize the weights. Received: layer 'hidden' "
        "with activity_regularizer=L1"
    )


def test_evaluate_before_any_fit_adds_them_too() -> None:
    keras_model = keras.Sequential([keras.Input((5,)), *layers()])
    keras_model.compile(optimizer="sgd", loss=LOSS)
    tfsift.init({"microbatches": 2})
    model = Net()
    model.compile(optimizer="sgd", loss=LOSS)
    got = model.evaluate(*data(), batch_size=B, verbose=0)  # the model cut by this call
    np.testing.assert_allclose(got, keras_model.evaluate(*data(), batch_size=B, verbose=0))


class Penalized(keras.layers.Layer):
    def call(self, x: Any) -> Any:
        self.add_loss(keras.ops.mean(x**2))
        return x


class AddsLoss(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.a = keras.layers.Dense(3)
        self.penalized = Penalized(name="penalized")

    def call(self, x: Any) -> Any:
        return self.penalized(self.a(x))


def test_a_layer_that_adds_a_loss_is_refused_at_the_first_step() -> None:
    tfsift.init({"microbatches": 2})
    model = AddsLoss()
    model.compile(optimizer="sgd", loss=LOSS)
    with pytest.raises(ValueError, match=r"\(add_loss\).*Received: add_loss in layer 'penalized'"):
        model.fit(*data(), batch_size=B, epochs=1, verbose=0)


def test_the_loop_adds_them_with_add_weight_penalties_under_a_loss_scale() -> None:
    keras_model = keras.Sequential([keras.Input((5,)), *layers()])
    trained(keras_model, keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.5)))
    tfsift.init({"microbatches": 2})
    model = Net()
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.5))
    update = tfsift.compiled_update(optimizer, model)

    @tfsift.step
    def train(x: Any, y: Any) -> Any:
        loss = LOSS(y, model(x, training=True))
        return tfsift.gradients(optimizer.scale_loss(loss), model.trainable_variables), loss

    x, y = data()
    for _ in range(2):
        for i in range(0, N, B):
            grads, _ = train(x[i : i + B], y[i : i + B])
            grads, penalty = tfsift.add_weight_penalties(tfsift.allreduce(grads), model, optimizer)
            update(grads)
    assert penalty > 0.1  # the value at the last step, before its update
    for g, w in zip(model.get_weights(), keras_model.get_weights(), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError) as err:
        tfsift.add_weight_penalties(grads[:1], model)
    assert str(err.value) == (
        "add_weight_penalties(grads, model) expects one gradient per trainable variable of "
        f"this rank's stage of {model.name!r} (4). Received: 1 gradients"
    )


def test_loss_weights_scale_the_loss_as_keras_does_with_the_penalties() -> None:
    # Keras scales the loss by them (0.5 halves it) and adds the penalties unscaled
    def trained_half(model: keras.Model) -> tuple[Any, float]:
        model.compile(optimizer=keras.optimizers.SGD(0.5), loss=LOSS, loss_weights=0.5)
        history = model.fit(*data(), batch_size=B, epochs=2, shuffle=False, verbose=0)
        return history.history, model.evaluate(*data(), batch_size=B, verbose=0)

    keras_model = keras.Sequential([keras.Input((5,)), *layers()])
    want = trained_half(keras_model)
    tfsift.init({"microbatches": 2})
    model = Net()
    got = trained_half(model)
    assert sorted(got[0]) == sorted(want[0]) == ["loss"]
    np.testing.assert_allclose(got[0]["loss"], want[0]["loss"], rtol=1e-6)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6)
    for g, w in zip(model.get_weights(), keras_model.get_weights(), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)


def test_fit_ends_with_the_moving_averages_of_an_optimizer_with_ema_as_keras_does() -> None:
    # Keras' fit ends by giving the weights their moving averages (use_ema=True); fit left
    # the last step's weights (0.23 from Keras' after 4 epochs of Adam)
    tfsift.init({"microbatches": 2})
    x, y = data()
    ref = keras.Sequential([keras.Input((5,)), *layers()])
    model = Net()
    model.predict(x[:2], verbose=0)
    model.set_weights(ref.get_weights())
    for m in (ref, model):
        m.compile(optimizer=keras.optimizers.Adam(0.05, use_ema=True, ema_momentum=0.9), loss=LOSS)
        m.fit(x, y, batch_size=B, epochs=2, shuffle=False, verbose=0)
    for a, b in zip(ref.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_allclose(b, a, atol=1e-6)

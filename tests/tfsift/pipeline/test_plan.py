"""A step function's plan is made once; calls it cannot run are refused with the reason."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfsift
from tfsift.pipeline.plan import describe_arguments

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


class Mlp(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.a = keras.layers.Dense(4)

    def call(self, x: Any) -> Any:
        return self.a(x)


def make_step(model: Mlp) -> Any:
    @tfsift.step
    def train(x: tf.Tensor, y: tf.Tensor, scale: float = 1.0) -> Any:
        loss = scale * LOSS(y, model(x, training=True))
        return tfsift.gradients(loss, model.trainable_variables), loss

    return train


def data() -> tuple[tf.Tensor, tf.Tensor]:
    return tf.ones((8, 3)), tf.constant(np.arange(8) % 4)


def test_a_step_planned_before_a_second_init_is_refused_with_both_configs() -> None:
    tfsift.init({"microbatches": 4})
    train = make_step(Mlp())
    train(*data())
    tfsift.init({"microbatches": 2, "pipeline": "simple"})
    with pytest.raises(RuntimeError) as err:
        train(*data())
    assert str(err.value) == (
        "tfsift.init was called again after this @tfsift.step function was planned for "
        "partitions=1, microbatches=4, pipeline='interleaved', optimize='speed'; a plan cannot "
        "follow a new configuration, so create the model and its @tfsift.step functions after "
        "the last tfsift.init. Received: partitions=1, microbatches=2, pipeline='simple', "
        "optimize='speed'"
    )


def test_the_same_config_again_keeps_the_plan() -> None:
    tfsift.init({"microbatches": 4})
    train = make_step(Mlp())
    first = float(train(*data())[1].reduce_mean())
    tfsift.init({"microbatches": 4})
    assert float(train(*data())[1].reduce_mean()) == pytest.approx(first, rel=1e-6)


def test_arguments_of_another_structure_are_refused() -> None:
    tfsift.init({"microbatches": 2})
    train = make_step(Mlp())
    x, y = data()
    train(x, y)
    train(x[:4], y[:4], 2.0)  # sizes and Python values may change: same structure
    with pytest.raises(ValueError) as err:
        train(x, tf.reshape(y, (8, 1)), scale=2.0)
    assert str(err.value) == (
        "a @tfsift.step function must be called with arguments of the same structure every "
        "time (its plan was made for (args[0]: tensor(rank 2), args[1]: tensor(rank 1))). "
        "Received: (args[0]: tensor(rank 2), args[1]: tensor(rank 2))"
    )


def test_arguments_are_described_by_nesting_and_kind() -> None:
    text = describe_arguments(
        ({"a": tf.ones((2, 3))}, [np.zeros(2), None]), {"t": 0.5, "w": tf.ones((2,))}
    )
    assert text == "(args[0]['a']: tensor(rank 2), args[1][0]: tensor(rank 1), w: tensor(rank 1))"


def test_a_model_partitioned_before_init_changed_its_cut_is_refused() -> None:
    tfsift.init({"microbatches": 2})
    model = Mlp()
    make_step(model)(*data())
    tfsift.init({"microbatches": 2, "optimize": "memory"})
    with pytest.raises(RuntimeError) as err:
        make_step(model)(*data())
    assert str(err.value) == (
        "this DistributedModel was partitioned under optimize='speed' and tfsift.init was "
        "called again since; create the model after the last tfsift.init. Received: "
        "optimize='memory'"
    )


def test_a_model_called_twice_in_one_step_is_refused() -> None:
    tfsift.init({"microbatches": 2})
    model = Mlp()

    @tfsift.step
    def twice(x: tf.Tensor) -> Any:
        return model(x, training=False) + model(3 * x, training=False)

    with pytest.raises(RuntimeError) as err:
        twice(tf.ones((8, 3)))
    assert str(err.value) == (
        f"a @tfsift.step function may call its DistributedModel once per step; {model.name!r} "
        "was called 2 times. Combine the inputs into one call (e.g. concatenate them along "
        "the batch axis and split the outputs)"
    )


def test_a_step_calling_two_models_is_refused_naming_them() -> None:
    tfsift.init({"microbatches": 2})
    first, second = Mlp(), Mlp()

    @tfsift.step
    def both(x: tf.Tensor) -> Any:
        return first(x, training=False) + second(x, training=False)

    with pytest.raises(RuntimeError) as err:
        both(tf.ones((8, 3)))
    assert str(err.value) == (
        "a @tfsift.step function may call only one DistributedModel: call each in a "
        "@tfsift.step function of its own (feeding one's outputs to the other), or write one "
        f"DistributedModel whose call runs both. Received: calls of {first.name!r} and "
        f"{second.name!r}"
    )


def test_a_gradient_tape_inside_a_step_is_refused_at_the_first_call() -> None:
    tfsift.init({"microbatches": 2})
    model = Mlp()

    @tfsift.step
    def train(x: tf.Tensor, y: tf.Tensor) -> Any:
        with tf.GradientTape() as tape:
            loss = LOSS(y, model(x, training=True))
        return tape.gradient(loss, model.trainable_variables), loss

    with pytest.raises(ValueError) as err:
        train(*data())
    assert str(err.value) == (
        "do not use tf.GradientTape inside a @tfsift.step function: the model's layers run "
        "on other ranks, so a tape here sees none of them. Return "
        "tfsift.gradients(loss, model.trainable_variables) instead"
    )

"""The step context: what a model call and ``tfsift.gradients`` do inside and outside a step."""

from __future__ import annotations

from typing import Any

import keras
import pytest
import tensorflow as tf

import tfsift
from tfsift.pipeline import context
from tfsift.pipeline.context import GradientList, StepContext


class Net(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__(name="net")
        self.dense = keras.layers.Dense(2)

    def call(self, x: Any) -> Any:
        return self.dense(x)


def no_model(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    raise AssertionError("the model is not called in this test")


def test_gradients_outside_a_step_raises() -> None:
    with pytest.raises(RuntimeError) as err:
        tfsift.gradients(tf.constant(1.0), [])
    assert str(err.value) == (
        "tfsift.gradients() can only be called inside a @tfsift.step function"
    )


def test_gradients_inside_a_step_records_one_request_of_placeholders() -> None:
    ctx = StepContext(no_model)
    loss, variables = tf.constant(2.0), [tf.Variable(1.0), tf.Variable(3.0)]
    with context.active(ctx):
        grads = tfsift.gradients(loss, variables)
    assert isinstance(grads, GradientList)
    assert ctx.requests == [grads] and ctx.requests[0] is grads
    assert list(grads) == [None, None]  # filled in by the backward pass, not here
    assert grads.loss is loss
    assert [id(v) for v in grads.variables] == [id(v) for v in variables]


def test_active_contexts_nest_and_restore_the_outer_one() -> None:
    outer, inner = StepContext(no_model), StepContext(no_model)
    assert context.current() is None
    with context.active(outer):
        assert context.current() is outer
        with context.active(inner):
            assert context.current() is inner
        assert context.current() is outer
    assert context.current() is None


def test_an_exception_inside_a_context_still_restores_the_outer_one() -> None:
    outer, inner = StepContext(no_model), StepContext(no_model)
    with context.active(outer):
        with pytest.raises(KeyError), context.active(inner):
            raise KeyError("inside the step")
        assert context.current() is outer
    assert context.current() is None


def test_calling_a_distributed_model_outside_a_step_raises_with_its_name() -> None:
    with pytest.raises(RuntimeError) as err:
        Net()(tf.ones((1, 3)))
    assert str(err.value) == (
        "DistributedModel 'net' can only be called inside a @tfsift.step function (its layers "
        "run on the ranks of the pipeline); to compute its outputs for data, call "
        "model.predict(x) on every rank"
    )


def test_a_model_call_inside_a_step_goes_to_the_context_hook() -> None:
    calls: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []

    def model_call(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        calls.append((model, args, kwargs))
        return "hooked"

    net, x = Net(), tf.ones((1, 3))
    with context.active(StepContext(model_call)):
        assert net(x, training=True) == "hooked"
    assert len(calls) == 1
    assert calls[0][0] is net and calls[0][1] == (x,) and calls[0][2] == {"training": True}


def test_a_model_call_traced_by_someone_else_raises() -> None:
    net = Net()

    traced = tf.function(lambda x: net(x))
    with context.active(StepContext(no_model)), pytest.raises(RuntimeError) as err:
        traced(tf.ones((1, 3)))
    assert str(err.value).rstrip().endswith(context.GRAPH_MODE_ERROR)

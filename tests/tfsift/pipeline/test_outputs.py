"""StepOutput reductions over microbatches."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from tfsift.pipeline import outputs
from tfsift.pipeline.outputs import GradientOutput, StepGradients, StepOutput


def test_reductions_over_microbatches() -> None:
    out = StepOutput([tf.constant([[1.0, 2.0]]), tf.constant([[3.0, 6.0]])])
    np.testing.assert_array_equal(out.reduce_mean().numpy(), [[2.0, 4.0]])
    np.testing.assert_array_equal(out.reduce_sum().numpy(), [[4.0, 8.0]])
    np.testing.assert_array_equal(out.accumulate().numpy(), [[2.0, 4.0]])
    np.testing.assert_array_equal(out.concat().numpy(), [[1.0, 2.0], [3.0, 6.0]])
    np.testing.assert_array_equal(out.merge().numpy(), out.concat().numpy())
    assert out.stack().shape == (2, 1, 2)
    assert len(out) == 2


def test_gradient_output_keeps_only_the_sum() -> None:
    out = GradientOutput(tf.constant([4.0, 8.0]), 4)
    np.testing.assert_array_equal(out.accumulate().numpy(), [1.0, 2.0])
    np.testing.assert_array_equal(out.reduce_mean().numpy(), [1.0, 2.0])
    np.testing.assert_array_equal(out.reduce_sum().numpy(), [4.0, 8.0])
    assert len(out) == 4
    with pytest.raises(RuntimeError, match="per-microbatch gradients are not kept"):
        out.concat()


def test_a_steps_gradients_are_divided_together_exactly_as_one_by_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = np.random.default_rng(0)
    totals = [tf.constant(rng.normal(size=shape).astype("float32")) for shape in [(3, 5), (5,)]]
    totals.append(tf.constant([1.0, 2.0], tf.float64))  # each in its own dtype
    calls: list[int] = []
    divide = outputs._DIVIDE
    monkeypatch.setattr(outputs, "_DIVIDE", lambda ts, M: calls.append(int(M)) or divide(ts, M))
    grads = StepGradients(totals, 3).outputs
    means = [g.accumulate() for g in grads]
    assert calls == [3]  # one compiled call for the step, not two operations a gradient
    for mean, total in zip(means, totals, strict=True):
        assert mean.dtype == total.dtype
        np.testing.assert_array_equal(mean.numpy(), (total / tf.cast(3, total.dtype)).numpy())
    assert [g.reduce_sum() is t for g, t in zip(grads, totals, strict=True)] == [True] * 3


def test_a_steps_gradients_are_freed_without_a_garbage_collection() -> None:
    total = tf.constant([4.0, 8.0]) * 1.0
    watch = weakref.ref(total)
    grads = StepGradients([total], 2).outputs
    grads[0].accumulate()
    gc.disable()
    try:
        del grads, total
        assert watch() is None  # no reference cycle holds the step's tensors
    finally:
        gc.enable()


@pytest.mark.parametrize(
    ("outputs", "error", "message"),
    [
        # a tensor's rows would have been taken for microbatches, silently
        (tf.constant([1.0, 3.0]), TypeError, "Received: EagerTensor"),
        (np.array([1.0, 3.0]), TypeError, "Received: ndarray"),
        ("ab", TypeError, "Received: str"),
        ([], ValueError, "at least one. Received: []"),  # its mean was NaN
    ],
)
def test_a_step_output_is_a_list_of_one_value_per_microbatch(
    outputs: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as raised:
        StepOutput(outputs)
    assert str(raised.value).startswith("StepOutput expects ")
    assert str(raised.value).endswith(message)


def test_a_step_output_of_a_tuple_of_values_is_taken() -> None:
    assert float(StepOutput((tf.constant(1.0), 3.0)).reduce_sum()) == 4.0

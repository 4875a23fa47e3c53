"""tfsift.pipeline.compiled: tf.function dispatch through concrete functions keyed by signature."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from tfsift.pipeline.compiled import RETRACE_WARNING, Compiled, flat_tensors, signature


def counting(fn: Any) -> tuple[Compiled, list[int]]:
    """``Compiled(fn)`` and a list that grows by one each time ``fn``'s Python body runs."""
    calls: list[int] = []

    def body(*args: Any) -> Any:
        calls.append(1)
        return fn(*args)

    return Compiled(body), calls


def test_same_signature_traces_once_and_reuses_the_concrete_function() -> None:
    scale, calls = counting(lambda x, k: x * k)
    for value in range(3):
        out = scale(tf.fill((2, 3), float(value)), 2.0)
        np.testing.assert_array_equal(out.numpy(), np.full((2, 3), 2.0 * value, np.float32))
    assert (len(calls), scale.traces) == (1, 1)


def test_a_new_shape_or_python_value_gets_its_own_trace() -> None:
    scale, calls = counting(lambda x, k: x * k)
    assert float(scale(tf.ones((2,)), 2.0)[0]) == 2.0
    assert float(scale(tf.ones((2,)), 3.0)[0]) == 3.0  # the Python value is baked in
    assert tuple(scale(tf.ones((5,)), 3.0).shape) == (5,)
    assert scale.traces == 3
    assert len(calls) == 3


def test_nested_arguments_are_keyed_by_structure() -> None:
    total, _ = counting(lambda xs, d: xs[0] + xs[1] + d["b"])
    out = total([tf.ones((2,)), tf.ones((2,))], {"b": tf.ones((2,))})
    np.testing.assert_array_equal(out.numpy(), [3.0, 3.0])
    assert total.traces == 1


def test_unkeyable_arguments_fall_back_to_tf_function() -> None:
    total, _ = counting(lambda x, a: x + a)
    out = total(tf.ones((2,)), np.array([1.0, 2.0], np.float32))  # an array is unhashable
    np.testing.assert_array_equal(out.numpy(), [2.0, 3.0])
    assert total.traces == 0
    ragged = tf.ragged.constant([[1.0], [2.0, 3.0]])
    assert signature((ragged,)) is None


def test_gradients_flow_through_a_compiled_call() -> None:
    square, _ = counting(lambda x: x * x)
    x = tf.constant([1.0, 3.0])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = square(x)
    np.testing.assert_array_equal(tape.gradient(y, x).numpy(), [2.0, 6.0])


def test_signature_names_shapes_dtypes_and_values() -> None:
    x = tf.zeros((4, 2), tf.int32)
    assert signature(x) == ((4, 2), tf.int32)
    assert signature([x, None, 1]) == (
        list,
        (((4, 2), tf.int32), ("None",), ("V", int, 1)),
    )
    assert signature({"k": [1.5]}) == (dict, (("k", (list, (("V", float, 1.5),))),))


def test_many_signatures_warn_once_naming_the_latest(caplog: pytest.LogCaptureFixture) -> None:
    def scale(x: tf.Tensor, k: float) -> tf.Tensor:
        return x * k

    compiled = Compiled(scale)
    x = tf.ones((2,))
    with caplog.at_level(logging.WARNING, logger="tfsift"):
        for k in range(RETRACE_WARNING - 1):
            compiled(x, float(k))
        assert caplog.messages == []
        for k in range(RETRACE_WARNING - 1, 2 * RETRACE_WARNING):
            compiled(x, float(k))
    last = float(RETRACE_WARNING - 1)
    assert caplog.messages == [
        f"test_many_signatures_warn_once_naming_the_latest.<locals>.scale has been "
        f"traced for {RETRACE_WARNING} different argument signatures; each new shape or "
        "Python value (a number passed to the step function, say) costs a trace. Pass values "
        "that change between calls as tensors. Latest signature: "
        f"(<class 'tuple'>, (((2,), tf.float32), ('V', <class 'float'>, {last})))"
    ]


def test_new_shapes_that_share_a_relaxed_trace_do_not_warn(
    caplog: pytest.LogCaptureFixture,
) -> None:
    compiled = Compiled(lambda x: x * 2.0)
    with caplog.at_level(logging.WARNING, logger="tfsift"):
        for rows in range(1, 2 * RETRACE_WARNING):
            assert tuple(compiled(tf.ones((rows,))).shape) == (rows,)
    assert compiled.traces == 2 * RETRACE_WARNING - 1  # a signature per shape ...
    assert compiled.function.experimental_get_tracing_count() == 2  # ... two traces
    assert caplog.messages == []


def test_later_calls_hand_the_tensors_over_flat_in_tf_nest_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a dict's keys out of order, None and a Python value among the tensors: the flat
    # list must be TensorFlow's own (sorted keys, no None, no Python value)
    def body(xs: Any, d: Any, none: Any, k: float) -> Any:
        assert none is None
        return xs[0] * d["z"] - xs[1] * d["a"] + k

    total = Compiled(body)
    args = ([tf.fill((2,), 3.0), tf.fill((2,), 5.0)], {"z": tf.fill((2,), 7.0), "a": tf.ones((2,))})
    assert float(total(*args, None, 0.5)[0]) == 3 * 7 - 5 + 0.5
    ((concrete, flat),) = total._concrete.values()
    assert flat is True
    flat_calls: list[int] = []
    call_flat = type(concrete)._call_flat

    def counted(self: Any, tensors: Any, captured: Any) -> Any:
        flat_calls.append(len(tensors))
        return call_flat(self, tensors, captured)

    monkeypatch.setattr(type(concrete), "_call_flat", counted)
    again = (
        [tf.fill((2,), 2.0), tf.fill((2,), 1.0)],
        {"z": tf.fill((2,), 4.0), "a": tf.ones((2,))},
    )
    assert float(total(*again, None, 0.5)[0]) == 2 * 4 - 1 + 0.5
    assert flat_calls == [4]  # two list items and two dict values, nothing else


def test_a_signature_whose_flat_tensors_differ_from_tensorflows_binds_every_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tfsift.pipeline import compiled

    monkeypatch.setattr(compiled, "flat_tensors", lambda value: [])  # a flattening gone wrong
    double = Compiled(lambda x: 2 * x)
    assert float(double(tf.ones(()))) == 2.0
    assert [flat for _, flat in double._concrete.values()] == [False]
    assert float(double(tf.fill((), 3.0))) == 6.0  # through the concrete function's binding


def test_gradients_flow_through_a_flat_call() -> None:
    square = Compiled(lambda x: x * x)
    square(tf.constant(1.0))  # the first call binds; the next goes flat
    x = tf.constant(3.0)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = square(x)
    assert float(tape.gradient(y, x)) == 6.0


def test_a_lookups_gradient_is_keyed_by_its_parts_and_called_flat() -> None:
    # keyed as None, every call of a stage's gradient sum with an embedding's slices went
    # through tf.function's own dispatch: the decoder's step took 1.19x as long
    add = Compiled(lambda a, b: [tf.concat([a.values, b.values], 0), a.indices + b.indices])
    a = tf.IndexedSlices(tf.ones((2, 3)), tf.constant([0, 1]), tf.constant([5, 3]))
    b = tf.IndexedSlices(tf.ones((2, 3)), tf.constant([1, 1]), tf.constant([5, 3]))
    key = signature((a, b))
    assert key is not None
    for _ in range(2):
        values, indices = add(a, b)
    assert values.shape == (4, 3) and indices.numpy().tolist() == [1, 2]
    assert add._concrete[key][1]  # its calls go flat
    parts = flat_tensors(a)
    assert len(parts) == 3 and all(
        x is y for x, y in zip(parts, (a.values, a.indices, a.dense_shape), strict=True)
    )

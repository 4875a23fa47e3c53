"""Collectives in one process without Horovod: nothing to average, tensors come back."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfsift
from tfsift.parallel import runtime
from tfsift.pipeline.outputs import GradientOutput, StepOutput


def test_one_process_needs_no_horovod() -> None:
    tfsift.init({})
    rt = runtime.get()
    assert (rt.horovod, rt.topology.replicas, rt.dp_set) == (False, 1, None)


def test_allreduce_returns_every_kind_of_gradient_as_a_tensor_in_order() -> None:
    tfsift.init({})
    given = [
        tf.constant([1.0, 2.0]),
        np.array([[3.0], [4.0]], np.float32),
        StepOutput([tf.constant(1.0), tf.constant(4.0)]),  # accumulate(): the mean
        GradientOutput(tf.constant([6.0, 9.0]), 3),  # accumulate(): the sum over 3
        5.0,
    ]
    got = tfsift.allreduce(given)
    assert all(tf.is_tensor(g) for g in got)
    want = [[1.0, 2.0], [[3.0], [4.0]], 2.5, [2.0, 3.0], 5.0]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g.numpy(), np.array(w, np.float32))


def test_allreduce_in_one_process_copies_nothing() -> None:
    tfsift.init({})
    t = tf.constant([1.0, -1.0])
    (got,) = tfsift.allreduce([t])
    assert got is t


def test_allreduce_of_nothing_is_an_empty_list() -> None:
    tfsift.init({})
    assert tfsift.allreduce([]) == []


def test_allreduce_before_init_raises() -> None:
    with pytest.raises(RuntimeError) as err:
        tfsift.allreduce([tf.constant(1.0)])
    assert str(err.value) == "tfsift.init() must be called before using tfsift"


def test_broadcast_variables_leaves_the_values_as_they_are() -> None:
    tfsift.init({})
    variables = [keras.Variable([1.0, 2.0]), keras.Variable(3.0), tf.Variable([[4.0]])]
    tfsift.broadcast_variables(variables)
    for var, want in zip(variables, [[1.0, 2.0], 3.0, [[4.0]]], strict=True):
        np.testing.assert_array_equal(np.asarray(var.numpy()), np.array(want, np.float32))

"""DistributedModel outside a pipeline: call guard and manual placement."""

from __future__ import annotations

from typing import Any

import keras
import pytest
import tensorflow as tf

import tfsift
from tfsift.planning.bounds import manual_bounds
from tfsift.planning.graph import trace


class Placed(tfsift.DistributedModel):
    def __init__(self, stages: tuple[int, int, int]) -> None:
        super().__init__()
        with tfsift.partition(stages[0]):
            self.a = keras.layers.Dense(4)
        with tfsift.partition(stages[1]):
            self.b = keras.layers.Dense(4)
        with tfsift.partition(stages[2]):
            self.c = keras.layers.Dense(2)

    def call(self, x: Any) -> Any:
        return self.c(keras.ops.relu(self.b(self.a(x))))


def bounds(stages: tuple[int, int, int], K: int) -> tuple[int, ...]:
    model = Placed(stages)
    graph = trace(model, [tf.zeros((2, 3))])
    return manual_bounds(graph, model._tfsift.placements, K, 0)


def test_calling_the_model_outside_a_step_is_an_error() -> None:
    with pytest.raises(RuntimeError) as err:
        Placed((0, 0, 0))(tf.zeros((2, 3)))
    assert str(err.value).endswith("can only be called inside a @tfsift.step function")


def test_manual_placement_sets_stage_bounds_and_ops_follow_the_layer_before() -> None:
    # nodes: a, b, relu, c -- relu stays with b
    assert bounds((0, 1, 1), 2) == (0, 1, 4)
    assert bounds((0, 0, 1), 2) == (0, 3, 4)


def test_manual_placement_out_of_call_order_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"is called after a layer of partition 1"):
        bounds((1, 0, 1), 2)


def test_manual_placement_with_an_empty_partition_is_rejected() -> None:
    with pytest.raises(ValueError) as err:
        bounds((0, 0, 0), 3)
    assert str(err.value) == (
        "every partition needs at least one layer. Received: no layers in partitions [1, 2]"
    )


def test_partition_index_must_be_a_non_negative_int() -> None:
    with pytest.raises(ValueError, match=r"Received: -1"):
        with tfsift.partition(-1):
            pass

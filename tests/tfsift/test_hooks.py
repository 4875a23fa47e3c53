"""The runtime's hooks: room on stage 0 for the planner, and stage 0's waits for gradients.

The executor hands stage 0's waits to the work offered only on two or more stages:
tests/tfsift/sift/test_sift_mpi.py runs overlap there (its units scored in the waits)."""

from __future__ import annotations

import gc
from typing import Any

import keras
import tensorflow as tf

import tfsift
from partitioner.experimental.scoring import sifted_step_time
from tfsift import hooks, state


class Chain(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.a = keras.layers.Dense(8, name="a")
        self.b = keras.layers.Dense(2, name="b")

    def call(self, x: Any) -> Any:
        return self.b(self.a(x))


def test_a_reservation_is_per_model_and_goes_with_the_model_and_reset() -> None:
    one, other = Chain(), Chain()
    room = hooks.Reservation(2.0, sifted_step_time)
    hooks.reserve_stage0(one, room)
    assert hooks.stage0_reservation(one) is room
    assert hooks.stage0_reservation(other) is None
    hooks.reserve_stage0(one, None)
    assert hooks.stage0_reservation(one) is None
    hooks.reserve_stage0(other, room)
    del other
    gc.collect()
    assert len(state.STATE.reservations) == 0  # held weakly: no model kept alive
    hooks.reserve_stage0(one, room)
    hooks.offer_stage0_wait(object())
    state.reset()
    assert hooks.stage0_reservation(one) is None and hooks.stage0_wait() is None


def test_the_planner_reads_the_reservation_when_it_cuts_the_model(monkeypatch: Any) -> None:
    tfsift.init({})
    seen: list[Any] = []
    from tfsift import model as model_module
    from tfsift.planning.bounds import Layout

    def plan_bounds(graph: Any, *args: Any, reservation: Any = None, **kwargs: Any) -> Any:
        seen.append(reservation)
        return Layout((0, len(graph)), False, "interleaved")

    monkeypatch.setattr(model_module, "plan_bounds", plan_bounds)
    net = Chain()
    room = hooks.Reservation(2.0, sifted_step_time)
    hooks.reserve_stage0(net, room)
    net.partition_model([tf.zeros((4, 3))])
    assert seen == [room]

"""WaitModel: a unit of idle work starts only where it is expected to end before the message."""

from __future__ import annotations

import pytest

from tfsift.sift.experimental.overlap import BATCH, FINISH, MARGIN, SMOOTHING, UPDATE, WaitModel


def test_nothing_runs_before_a_wait_was_seen() -> None:
    waits = WaitModel()
    assert waits.batches(0, 0.0, most=8) == 0
    waits.arrived(1, 0.010, exact=True)
    assert waits.batches(0, 0.0, most=8) == 0  # per microbatch: 1's wait says nothing of 0's
    assert waits.batches(1, 0.0, most=8) == 1  # a call's cost is unknown: one batch may try


def test_a_unit_starts_only_if_it_ends_within_the_margin_of_the_expected_wait() -> None:
    waits = WaitModel()
    waits.arrived(2, 0.010, exact=True)
    waits.unit(0.003)
    room = 0.010 * MARGIN - 0.003
    assert waits.batches(2, room - 1e-6, most=1) == 1
    assert waits.batches(2, room + 1e-6, most=1) == 0


def test_a_unit_takes_as_many_batches_as_the_bounds_of_the_calls_seen_fit() -> None:
    waits = WaitModel()
    waits.arrived(0, 0.010, exact=True)  # room: 8 ms
    waits.unit(0.002)  # one batch: 2 ms, so k batches at most 2k ms
    assert [waits.cost(k) for k in (1, 2, 3)] == [0.002, 0.004, pytest.approx(0.006)]
    assert waits.batches(0, 0.0, most=8) == 3  # 8 ms is not below 0.8 x 10 ms
    assert waits.batches(0, 0.0, most=2) == 2  # no more than the round has left
    waits.unit(0.003, batches=4)  # four in one call: 3 ms (the fixed part of a call)
    assert waits.cost(2) == 0.003  # fewer batches cost no more
    assert waits.cost(8) == pytest.approx(0.006)  # more at most in proportion
    assert waits.batches(0, 0.0, most=8) == 8
    assert waits.batches(0, 0.0025, most=8) == 7  # 7 x 3 / 4 = 5.25 ms < 5.5 ms


def test_estimates_are_smoothed_and_an_overrun_counts_half_a_unit_early() -> None:
    waits = WaitModel()
    waits.unit(0.002)
    waits.unit(0.004)
    cost = waits.cost(1)
    assert cost == pytest.approx(SMOOTHING * 0.004 + (1 - SMOOTHING) * 0.002)
    waits.arrived(0, 0.010, exact=True)
    # the message came during the last unit, which ended 6 ms into the wait
    waits.arrived(0, 0.006, exact=False)
    seen = 0.006 - 0.5 * cost
    assert waits.expected[0] == pytest.approx(SMOOTHING * seen + (1 - SMOOTHING) * 0.010)


def test_an_overrun_is_corrected_by_the_last_calls_own_size() -> None:
    waits = WaitModel()
    waits.unit(0.002)
    waits.unit(0.005, batches=3)
    waits.arrived(1, 0.010, exact=False)
    assert waits.expected[1] == pytest.approx(0.010 - 0.5 * 0.005)


def test_waits_that_shrink_stop_the_units() -> None:
    waits = WaitModel()
    waits.unit(0.002)
    waits.arrived(3, 0.010, exact=True)
    assert waits.batches(3, 0.0, most=1) == 1
    for _ in range(5):  # stage 0 became the bottleneck: its gradients come at once
        waits.arrived(3, 0.0, exact=True)
    assert waits.batches(3, 0.0, most=8) == 0
    waits.arrived(3, 0.0004, exact=False)  # a unit overran: never a negative wait
    assert waits.expected[3] >= 0.0


def test_a_unit_that_also_updates_the_head_has_its_own_cost() -> None:
    waits = WaitModel()
    waits.arrived(0, 0.010, exact=True)
    waits.unit(0.002)
    waits.unit(0.007, UPDATE)  # the round's first unit: head update + a batch
    assert waits.costs == {BATCH: {1: 0.002}, UPDATE: {1: 0.007}, FINISH: {}}
    assert waits.batches(0, 0.005, most=1) == 1  # a plain batch still fits 5 ms in
    assert waits.batches(0, 0.005, most=1, kind=UPDATE) == 0  # the update does not
    # an overrun during an update unit is corrected by the update's cost
    waits.arrived(1, 0.0105, exact=False)
    assert waits.expected[1] == pytest.approx(0.0105 - 0.5 * 0.007)


def test_a_call_of_several_batches_is_timed_as_its_size_and_kind() -> None:
    waits = WaitModel()
    waits.unit(0.013, UPDATE, batches=4)  # what no wait had room for, after the update
    waits.unit(0.008, BATCH, batches=5)
    assert waits.costs == {BATCH: {5: 0.008}, UPDATE: {4: 0.013}, FINISH: {}}
    assert waits.cost(1, UPDATE) == 0.013  # no smaller call of its kind seen: a bound


def test_the_room_is_the_sum_of_every_microbatchs_expected_wait() -> None:
    waits = WaitModel()
    assert waits.room() == 0.0
    waits.arrived(0, 0.004, exact=True)
    waits.arrived(3, 0.001, exact=True)
    waits.arrived(3, 0.003, exact=True)
    assert waits.room() == pytest.approx(0.004 + SMOOTHING * 0.003 + (1 - SMOOTHING) * 0.001)


def test_a_units_cost_is_a_plain_ones_else_a_first_ones() -> None:
    waits = WaitModel()
    assert waits.unit_cost() == 0.0
    waits.unit(0.003, UPDATE)
    assert waits.unit_cost() == 0.003  # rounds of one source batch: only first units
    waits.unit(0.002)
    assert waits.unit_cost() == 0.002


def test_finishing_the_heads_gradients_has_its_own_cost() -> None:
    waits = WaitModel()
    waits.arrived(0, 0.010, exact=True)
    waits.unit(0.001)  # plain units are cheap: that says nothing of a finish
    assert waits.batches(0, 0.0, 1, FINISH) == 1  # unknown: one may try where room is left
    waits.unit(0.009, FINISH)  # it took 9 ms: more than 0.8 x the 10 ms wait
    assert waits.batches(0, 0.0, 1, FINISH) == 0
    assert waits.batches(0, 0.0, 1) == 1

import doctest

import pytest

import partitioner.experimental.scoring
from partitioner.costs import CostModel, LayerCost
from partitioner.experimental.scoring import sifted_step_time, stage_waits, unheld
from partitioner.partition import Partition
from partitioner.schedule import build
from partitioner.simulator import simulate

EQUAL = CostModel(tuple(LayerCost(f"l{i}", 1.0, 2.0, 0, 0, 0) for i in range(4)))


def test_doctests() -> None:
    assert doctest.testmod(partitioner.experimental.scoring).failed == 0


def test_stage_0_waits_before_its_backwards_on_the_1f1b_schedule() -> None:
    # stage 0 = l0 (F 1 s, B 2 s), stage 1 = l1..l3 (F 3 s, B 6 s), M = 4:
    # F0 F1 [8] B0 F2 [6] B1 F3 [6] B2 [7] B3, the time after B3 not counted
    result = simulate(EQUAL, Partition((0, 1, 4)), build("interleaved", 2, 4))
    assert stage_waits(result.events) == [0.0, 8.0, 0.0, 6.0, 0.0, 6.0, 7.0]


@pytest.mark.parametrize(
    "waits, batches, forward, call, left",
    [
        ([3.0], 2.0, 1.0, 0.5, 0.0),  # one wait holds both in one call: 0.5 + 2 * 1 <= 3
        ([2.0], 2.0, 1.0, 0.5, 1.0),  # 0.5 + 1 fits, 0.5 + 2 does not
        ([1.5, 1.5], 2.0, 1.0, 0.5, 0.0),  # one a wait, each call paying its fixed cost
        ([1.4, 1.4, 1.4], 2.0, 1.0, 0.5, 2.0),  # many short waits hold nothing
        ([0.4], 1.0, 0.0, 0.5, 1.0),  # no forward, but the call does not fit
        ([0.6], 3.0, 0.0, 0.5, 0.0),  # no forward: a call that fits holds all
        ([1.0], 2.0, 5e-324, 0.0, 0.0),  # a denormal forward: the ratio overflows, all fit
        ([9.0], 2.5, 1.0, 0.0, 0.0),  # never below zero
        ([], 2.0, 1.0, 0.0, 2.0),  # one stage: no waits
    ],
)
def test_a_wait_holds_the_source_batches_whose_call_fits_in_it(
    waits: list[float], batches: float, forward: float, call: float, left: float
) -> None:
    assert unheld(waits, batches, forward, call) == left


def test_what_no_wait_holds_is_added_with_one_call_at_most() -> None:
    # (0, 2, 4): stage 0 waits 4 s and 2 s, a source batch costs 1 s + 4 * 2 s: both of
    # 2 per step are scored between steps, in one call: 30 + 2 * 8 + 1
    assert sifted_step_time(EQUAL, Partition((0, 2, 4)), 4, pipeline="interleaved",
                            scoring=8, call=1.0) == 47.0  # fmt: skip
    # half a source batch left (scoring=2 forwards: 0.5 of one) pays half a call
    assert sifted_step_time(EQUAL, Partition((0, 2, 4)), 4, pipeline="interleaved",
                            scoring=2, call=1.0) == 30.0 + 0.5 * 8 + 0.5  # fmt: skip

"""Near-ties settle on one partition, whatever the profile's noise picked as fastest."""

from __future__ import annotations

import numpy as np
import pytest

from partitioner.costs import CostModel, LayerCost
from partitioner.partition import Partition
from partitioner.plan import make_plan
from partitioner.solver import peak_memory_estimate, solve, step_time_estimate
from partitioner.ties import NEAR_TIE, settle

# a plain CNN's chain: convolutions of about equal cost, whose outputs shrink along it
# (5 layers on 2 stages: a cut after the second or the third gives stages of 2 and 3)
TIMES = [1.0, 1.0, 1.0, 1.0, 1.0]
OUT = [4096, 4096, 1024, 256, 0]


def noisy(seed: int, spread: float = 0.01) -> CostModel:
    """The chain as one run's profile measures it: each time off by up to ``spread``."""
    rng = np.random.default_rng(seed)
    layers = tuple(
        LayerCost(f"conv{i}", t * (1 + rng.uniform(-spread, spread)), 2 * t, 4096, 512, b)
        for i, (t, b) in enumerate(zip(TIMES, OUT, strict=True))
    )
    return CostModel(layers, batch_size=8, bandwidth=1e12)


def test_identical_runs_with_noisy_profiles_get_one_plan() -> None:
    solved = {solve(noisy(seed), 2, 4).bounds for seed in range(20)}
    assert len(solved) > 1  # the noise moves the fastest cut: the case to settle
    planned = {make_plan(noisy(seed), 2, 4).bounds for seed in range(20)}
    assert planned == {(0, 3, 5)}  # the fewer bytes cross after the third


@pytest.mark.parametrize("seed", range(10))
def test_two_stages_settle_on_the_fewest_bytes_within_the_band(seed: int) -> None:
    rng = np.random.default_rng(seed)
    layers = tuple(
        LayerCost(f"l{i}", *rng.uniform(1, 2, 2), 0, 0, int(rng.integers(0, 4)) * 1000)
        for i in range(8)
    )
    costs = CostModel(layers, bandwidth=1e9)
    best = solve(costs, 2, 4)
    limit = step_time_estimate(costs, best, 4) * (1 + NEAR_TIE)
    band = [Partition((0, c, 8)) for c in range(1, 8)]
    band = [p for p in band if step_time_estimate(costs, p, 4) <= limit]
    want = min(band, key=lambda p: (int(costs.prefix.input_bytes[p.bounds[1]]), p.bounds))
    assert settle(costs, best, 4) == want  # every cut is one move away


def test_settling_keeps_stage_0s_least_end_and_what_fits() -> None:
    costs = noisy(0)
    assert settle(costs, Partition((0, 2, 5)), 4).bounds == (0, 3, 5)
    assert settle(costs, Partition((0, 2, 5)), 4, fits=lambda p: p.bounds[1] < 3).bounds == (
        0,
        2,
        5,
    )
    # three stages: settled within the band, stage 0 holding at least 2 layers
    best = solve(costs, 3, 4, first_stage_min=2)
    settled = settle(costs, best, 4, first_stage_min=2)
    assert settled.bounds[1] >= 2
    limit = step_time_estimate(costs, best, 4) * (1 + NEAR_TIE)
    assert step_time_estimate(costs, settled, 4) <= limit


def test_the_plan_keeps_the_memory_cap() -> None:
    costs = noisy(0)
    peaks = {
        bounds: max(
            peak_memory_estimate(
                costs, Partition(bounds), 4, pipeline="interleaved", recompute=False
            )
        )
        for bounds in [(0, 2, 5), (0, 3, 5)]
    }
    cap = min(peaks.values())
    plan = make_plan(costs, 2, 4, memory_cap=cap)
    assert peaks[plan.bounds] <= cap


def test_a_clear_winner_is_kept() -> None:
    layers = tuple(LayerCost(f"l{i}", 1.0, 2.0, 0, 0, 1000 * (i % 2)) for i in range(4))
    costs = CostModel(layers, bandwidth=1e9)
    assert make_plan(costs, 2, 4).bounds == solve(costs, 2, 4).bounds == (0, 2, 4)

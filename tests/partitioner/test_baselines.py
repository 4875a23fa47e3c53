import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partitioner.baselines import block_partition, by_parameters, uniform
from partitioner.costs import CostModel, LayerCost


def costs_of(times: list[float], params: list[int] | None = None) -> CostModel:
    params = params or [0] * len(times)
    return CostModel(
        tuple(
            LayerCost(f"l{i}", t, 0.0, p, 0, 0)
            for i, (t, p) in enumerate(zip(times, params, strict=True))
        )
    )


def stage_sums(values: list[float] | list[int], bounds: tuple[int, ...]) -> list[float]:
    return [sum(values[lo:hi]) for lo, hi in itertools.pairwise(bounds)]


@given(st.integers(1, 50), st.integers(1, 50))
def test_uniform_sizes_differ_by_at_most_one(L: int, K: int) -> None:
    if K > L:
        with pytest.raises(ValueError, match=f"layers: {L}, partitions: {K}"):
            uniform(L, K)
        return
    sizes = uniform(L, K).sizes()
    assert sum(sizes) == L and max(sizes) - min(sizes) <= 1


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=9), st.data())
def test_by_parameters_minimises_the_largest_stage(params: list[int], data: st.DataObject) -> None:
    K = data.draw(st.integers(1, len(params)))
    found = by_parameters(costs_of([1.0] * len(params), params), K)
    best = min(
        max(stage_sums(params, (0, *cuts, len(params))))
        for cuts in itertools.combinations(range(1, len(params)), K - 1)
    )
    assert found.num_stages == K
    assert max(stage_sums(params, found.bounds)) == best


def test_block_partition_moves_elements_towards_the_smallest_block() -> None:
    times = [2.0] * 6 + [1.0] * 6  # scaled to [0, 1]: equal counts give 6 | 0
    assert block_partition(costs_of(times), 2).bounds == (0, 3, 12)  # 3 | 3


def test_block_partition_stops_once_blocks_differ_by_one_element() -> None:
    times = [8.0] + [1.0] * 8  # scaled: 1 | 0 already differ by at most one
    assert block_partition(costs_of(times), 2).bounds == (0, 4, 9)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0, 10), min_size=1, max_size=12), st.data())
def test_block_partition_never_worsens_equal_counts_in_scaled_units(
    times: list[float], data: st.DataObject
) -> None:
    K = data.draw(st.integers(1, len(times)))
    found = block_partition(costs_of(times), K)
    assert found.num_stages == K
    spread = max(times) - min(times) or 1.0
    scaled = [(t - min(times)) / spread for t in times]
    start = uniform(len(times), K).bounds
    assert max(stage_sums(scaled, found.bounds)) <= max(stage_sums(scaled, start)) + 1e-9


def test_block_partition_stops_within_one_element_of_balance() -> None:
    times = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0, 5.0, 3.0, 5.0, 8.0]
    sums = stage_sums(times, block_partition(costs_of(times), 4).bounds)
    assert max(sums) - min(sums) <= max(times)

import itertools
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from partitioner.probe import Limit, _range_min, cheapest

values = st.one_of(st.integers(0, 4).map(float), st.floats(0, 5))


@st.composite
def instances(draw: st.DrawFn) -> tuple[int, int, np.ndarray, list[list[Limit]]]:
    L = draw(st.integers(1, 8))
    K = draw(st.integers(1, L))
    cut = np.array([0.0, *draw(st.lists(values, min_size=L - 1, max_size=L - 1)), 0.0])
    prefix = np.concatenate([[0.0], np.cumsum(draw(st.lists(values, min_size=L, max_size=L)))])
    start = np.array(draw(st.lists(values, min_size=L + 1, max_size=L + 1)))
    end = np.array(draw(st.lists(values, min_size=L + 1, max_size=L + 1)))
    bound = draw(st.floats(0, 20))
    strict = draw(st.booleans())
    limit = Limit.make(prefix, bound, start, end).with_bound(bound, strict)
    ints = np.concatenate(
        [[0], np.cumsum(draw(st.lists(st.integers(0, 9), min_size=L, max_size=L)))]
    )
    memory = Limit.make(ints.astype(np.int64), draw(st.integers(0, 30)))
    return L, K, cut, [[limit, memory] if s % 2 else [limit] for s in range(K)]


def brute_force(L: int, K: int, cut: np.ndarray, limits: list[list[Limit]]) -> float:
    best = math.inf
    for inner in itertools.combinations(range(1, L), K - 1):
        b = (0, *inner, L)
        if all(lim.allows(np.array([b[s]]), b[s + 1])[0] for s in range(K) for lim in limits[s]):
            best = min(best, sum(float(cut[i]) for i in inner))
    return best


@settings(max_examples=200, deadline=None)
@given(instances())
def test_cheapest_matches_brute_force(
    instance: tuple[int, int, np.ndarray, list[list[Limit]]],
) -> None:
    L, K, cut, limits = instance
    found = cheapest(L, K, cut, limits)
    best = brute_force(L, K, cut, limits)
    if found is None:
        assert best == math.inf
        return
    total, bounds = found
    assert math.isclose(total, best, rel_tol=1e-12, abs_tol=1e-12)
    assert math.isclose(sum(float(cut[i]) for i in bounds[1:-1]), total, abs_tol=1e-12)
    assert all(
        lim.allows(np.array([bounds[s]]), bounds[s + 1])[0] for s in range(K) for lim in limits[s]
    )


@settings(max_examples=100, deadline=None)
@given(st.lists(values, min_size=1, max_size=40), st.data())
def test_range_min_matches_slicing(items: list[float], data: st.DataObject) -> None:
    array = np.array(items)
    queries = data.draw(
        st.lists(st.tuples(st.integers(0, len(items)), st.integers(0, len(items))), min_size=1)
    )
    lo = np.array([a for a, _ in queries])
    hi = np.array([b for _, b in queries])
    expected = [min(items[a:b], default=math.inf) for a, b in queries]
    assert _range_min(array, lo, hi).tolist() == expected


def test_window_brackets_the_passing_starts() -> None:
    prefix = np.arange(6, dtype=np.float64)
    start = np.array([0.0, 0.0, 2.0, 0.0, 0.0, 0.0])
    limit = Limit.make(prefix, 3.5, start)
    possible, sure = limit.window(np.array([5]))
    assert (possible[0], sure[0]) == (2, 4)  # starts 3, 4 pass; 2 fails on its own start
    assert limit.allows(np.arange(5), 5).tolist() == [False, False, False, True, True]

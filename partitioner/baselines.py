"""Partitions other systems use, to measure the exact solvers against."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from partitioner.costs import CostModel
from partitioner.partition import Partition


def uniform(L: int, K: int) -> Partition:
    """Equal layer counts: boundaries at floor(s L / K), so sizes differ by at most one."""
    _check(L, K)
    return Partition(tuple(s * L // K for s in range(K + 1)))


def by_parameters(costs: CostModel, K: int) -> Partition:
    """Balances parameter bytes, like DeepSpeed's `partition_method="parameters"`.

    Minimises the largest stage parameter total exactly (bisection on the bottleneck
    with a greedy probe, which is exact for plain sums), filling stages front to back.
    """
    return _min_max([layer.param_bytes for layer in costs.layers], K)


def block_partition(costs: CostModel, K: int) -> Partition:
    """torchgpipe's heuristic on forward plus backward times, ignoring transfers.

    Bárány and Grinberg, "Block partitions of sequences" (Israel J. Math. 206, 2015):
    scale the times into [0, 1] (as torchgpipe does, by min and max) and start from equal
    layer counts. While the largest
    block exceeds the smallest by more than one element's worth, take a largest block
    B_p, the smallest block B_q nearest to it, and the block B_h next to B_q on the way to
    B_p; move the element of B_h that touches B_q into B_q. Keep a move only if it lowers
    (largest block, number of largest blocks); stop when no largest block has a move.
    Each kept move lowers that pair, so the loop ends; one pass is O(K^2 + L).
    """
    times = [layer.forward_time + layer.backward_time for layer in costs.layers]
    _check(len(times), K)
    low, spread = min(times), max(times) - min(times)
    scaled = [(t - low) / spread if spread > 0 else 0.0 for t in times]
    bounds = list(uniform(len(times), K).bounds)
    while True:
        sums = _block_sums(scaled, bounds)
        if max(sums) <= min(sums) + 1 or not _improve(scaled, bounds, sums):
            return Partition(tuple(bounds))


def _improve(scaled: Sequence[float], bounds: list[int], sums: list[float]) -> bool:
    """Applies the first move that lowers (max, count of max); False if none does."""
    largest = max(sums)
    score = (largest, sums.count(largest))
    smallest = min(sums)
    minimal = [q for q, size in enumerate(sums) if size == smallest]
    for p in (p for p, size in enumerate(sums) if size == largest):
        q = min(minimal, key=lambda q: abs(q - p))
        h = q + 1 if p > q else q - 1
        if bounds[h + 1] - bounds[h] < 2:
            continue
        edge = q + 1 if p > q else q  # the boundary between B_q and B_h
        saved = bounds[edge]
        bounds[edge] += 1 if p > q else -1
        new = _block_sums(scaled, bounds)
        if (max(new), new.count(max(new))) < score:
            return True
        bounds[edge] = saved
    return False


def _block_sums(values: Sequence[float], bounds: Sequence[int]) -> list[float]:
    return [sum(values[lo:hi]) for lo, hi in itertools.pairwise(bounds)]


def _min_max(weights: Sequence[int], K: int) -> Partition:
    """Exact min-max partition of nonnegative integer weights into K nonempty blocks."""
    _check(len(weights), K)
    low, high = max(weights) - 1, sum(weights)
    while high - low > 1:
        mid = (low + high) // 2
        if _greedy(weights, K, mid) is None:
            low = mid
        else:
            high = mid
    result = _greedy(weights, K, high)
    assert result is not None
    return result


def _greedy(weights: Sequence[int], K: int, cap: int) -> Partition | None:
    """Fills each stage up to `cap`, leaving one layer for each later stage."""
    L, bounds, start = len(weights), [0], 0
    for s in range(K - 1):
        end, total = start, 0
        while end < L - (K - 1 - s) and (end == start or total + weights[end] <= cap):
            total += weights[end]
            end += 1
        if total > cap:
            return None
        bounds.append(end)
        start = end
    if sum(weights[start:]) > cap:
        return None
    return Partition((*bounds, L))


def _check(L: int, K: int) -> None:
    if K < 1:
        raise ValueError(f"K (partitions) must be an integer >= 1. Received: K={K}")
    if K > L:
        raise ValueError(f"too few layers to split into partitions (layers: {L}, partitions: {K})")

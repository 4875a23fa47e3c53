"""Near-ties: of the partitions about as fast as the fastest, the one profiling noise does not pick.

A profile's layer times move by a few percent between identical runs, so two cuts whose
predicted steps are that close swap places from run to run, and with them the layers on
each stage. Among the partitions whose `step_time_estimate` T is within ``NEAR_TIE`` of
the solver's T* (and that fit the same memory cap), `settle` keeps the one with the least
of what profiling does not measure: the bytes crossing its cuts (a microbatch's, summed),
then the earliest bounds. It searches by moving one boundary at a time anywhere between
its neighbours, from the solver's partition, while that lowers the key; with 2 stages
that covers every cut, so two runs whose optimal cuts are near-tied settle on the same
one. The result is within ``NEAR_TIE`` of the optimum by construction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from partitioner.costs import CostModel
from partitioner.partition import Partition
from partitioner.solver import step_time_estimate

NEAR_TIE = 0.03  # the predicted step's relative slack treated as a tie


def first_near_fastest(steps: Sequence[float]) -> int:
    """The index of the first of ``steps`` (predicted step times, in order of preference)
    within ``NEAR_TIE`` of the shortest: how `partitioner.plan.fastest_plan` chooses a
    schedule.

    Example:
        >>> first_near_fastest([1.02, 1.0, 0.9]), first_near_fastest([0.92, 1.0, 0.9])
        (2, 0)
    """
    best = min(steps)
    return next(i for i, step in enumerate(steps) if step <= best * (1 + NEAR_TIE))


def settle(
    costs: CostModel,
    partition: Partition,
    M: int,
    fits: Callable[[Partition], bool] = lambda _: True,
    first_stage_min: int = 1,
) -> Partition:
    """The partition a near-tie with ``partition`` (the solver's fastest) settles on.

    Example:
        >>> from partitioner.costs import LayerCost
        >>> times, out = [1.0, 1.0, 1.0, 1.1, 1.0], [64, 8, 64, 64, 0]
        >>> costs = CostModel(tuple(LayerCost(f"l{i}", t, 0.0, 0, 0, b)
        ...                         for i, (t, b) in enumerate(zip(times, out))))
        >>> settle(costs, Partition((0, 3, 5)), M=4).bounds  # 2.1% slower, 8x fewer bytes
        (0, 2, 5)

    Args:
        costs: the cost model ``partition`` was solved for.
        partition: the solver's partition.
        M: microbatches.
        fits: whether a partition fits the memory cap the solver had.
        first_stage_min: the least end of stage 0 the solver had.
    """
    limit = step_time_estimate(costs, partition, M) * (1 + NEAR_TIE)
    bytes_at = costs.prefix.input_bytes

    def key(p: Partition) -> tuple[int, tuple[int, ...]]:
        return sum(int(bytes_at[b]) for b in p.bounds[1:-1]), p.bounds

    current = partition
    while True:
        near = [
            p
            for p in _moves(current, first_stage_min)
            if key(p) < key(current) and step_time_estimate(costs, p, M) <= limit and fits(p)
        ]
        if not near:
            return current
        current = min(near, key=key)


def _moves(partition: Partition, first_stage_min: int) -> Iterator[Partition]:
    """Every partition with one inner boundary moved anywhere between its neighbours."""
    b = partition.bounds
    for i in range(1, len(b) - 1):
        low = max(b[i - 1] + 1, first_stage_min if i == 1 else 0)
        for at in range(low, b[i + 1]):
            if at != b[i]:
                yield Partition((*b[:i], at, *b[i + 1 :]))

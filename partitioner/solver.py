"""Exact partition solvers: fastest step under a memory cap, or least memory.

Letters: L layers, K stages, M microbatches, s stage index. Stage s spends t_s seconds
per microbatch: its forward and backward plus its input cut (s > 0) and output cut
(s < K - 1). The step-time estimate is the pipeline formula T = sum_s t_s +
(M - 1) max_s t_s, so T trades the bottleneck B = max_s t_s against the cut costs.
Both solvers are exact: every candidate they skip is provably no better (up to a
relative float tolerance of 1e-12 on B).

Work of its own on stage 0 (sifting's early exit with overlap scores candidates there,
in its waits for gradients) makes the cut that leaves its waits room the faster one: the
speed solver then takes an ``objective`` that ranks partitions with that work
(`partitioner.experimental.scoring.sifted_step_time`) and returns, of the fastest
partitions for each end of stage 0, the one it ranks first: exact with 2 stages
(`solve_speed`).

With v virtual stages (Megatron-LM's interleaved 1F1B) the chain is cut into C = K v
contiguous chunks by the same search, exact for T over the C chunks; rank s holds chunks
s, s + K, ..., so the memory cap is per rank: the fastest cut is kept when its ranks fit
the cap, else each chunk is given 1/v of the cap (enough for its rank to fit, not
always the least cap that would).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from partitioner.costs import CostModel, format_bytes
from partitioner.partition import Partition
from partitioner.probe import Array, Limit, cheapest
from partitioner.schedule import (
    PIPELINES,
    Kind,
    build,
    check_deferred,
    check_virtual,
    splits_stage,
)
from partitioner.simulator import peak_memory

OPTIMIZE = ("speed", "memory")
_EPSILON = 1e-12
_LOW_SPLIT = 0.25
Objective = Callable[[Partition], float]  # a partition's seconds per step, work included


class InfeasibleError(ValueError):
    """No partition fits the memory cap; `smallest_cap` is the least cap that fits (with
    virtual stages, the least the solver's rule finds: each chunk 1/v of the cap)."""

    def __init__(self, cap: int, smallest_cap: int, K: int, virtual_stages: int = 1) -> None:
        self.smallest_cap = smallest_cap
        v = virtual_stages
        what = f"{K} stages" if v == 1 else f"{K} stages x {v} virtual stages"
        rule = "" if v == 1 else f"with each chunk given 1/{v} of the cap, "
        super().__init__(
            f"no partition into {what} fits the memory cap; {rule}the smallest cap that "
            f"fits is {smallest_cap} bytes ({format_bytes(smallest_cap)}). "
            f"Received: memory_cap={cap} ({format_bytes(cap)})"
        )


def in_flight(
    pipeline: str,
    K: int,
    M: int,
    *,
    recompute: bool = False,
    virtual_stages: int = 1,
    deferred: Sequence[int] | None = None,
) -> tuple[int, ...]:
    """Most microbatches a stage holds at once: M for simple (1 on its last stage, which
    runs each backward right after its forward), min(K - s, M) for 1F1B, and for the
    zero-bubble schedule min(K - s + d_s, M) on a stage that `splits_stage` (held from F
    to W; d_s = ``deferred[s]``, None: ZB-H1's s, so min(K, M)), as 1F1B elsewhere. With
    ``virtual_stages`` v > 1, per chunk (K v of them), counted on
    `partitioner.schedule.virtual`'s rows."""
    _check_choice(pipeline, PIPELINES, "pipeline")
    if virtual_stages != 1:
        return _chunks_in_flight(pipeline, K, M, virtual_stages)
    if pipeline == "simple":
        return tuple(M if s < K - 1 else 1 for s in range(K))
    if pipeline == "zero_bubble":
        d = check_deferred(K, deferred)
        return tuple(min(K - s + d[s] * splits_stage(s, recompute), M) for s in range(K))
    return tuple(min(K - s, M) for s in range(K))


def _chunks_in_flight(pipeline: str, K: int, M: int, v: int) -> tuple[int, ...]:
    held, most = [0] * (K * v), [0] * (K * v)
    for row in build(pipeline, K, M, virtual_stages=v).values():
        for a in row:
            held[a.stage] += {Kind.FORWARD: 1, Kind.BACKWARD: -1}.get(a.kind, 0)
            most[a.stage] = max(most[a.stage], held[a.stage])
    return tuple(most)


def pending_weights(
    pipeline: str,
    K: int,
    M: int,
    *,
    recompute: bool = False,
    virtual_stages: int = 1,
    deferred: Sequence[int] | None = None,
) -> tuple[int, ...]:
    """Most microbatches whose output gradients a stage keeps for a later W at once, when
    it holds `in_flight` activations: min(d_s + 1, M) where the zero-bubble schedule
    splits a stage's backward (`splits_stage`; d_s = ``deferred[s]``, None: ZB-H1's s), 0
    elsewhere (tests/partitioner/test_solver.py walks the schedules to check both maxima
    fall on one action); per chunk, all 0, with ``virtual_stages`` v > 1 (only 1F1B
    interleaves)."""
    _check_choice(pipeline, PIPELINES, "pipeline")
    if virtual_stages != 1:
        return (0,) * (K * virtual_stages)
    if pipeline != "zero_bubble":
        return (0,) * K
    d = check_deferred(K, deferred)
    return tuple(min(d[s] + 1, M) if splits_stage(s, recompute) else 0 for s in range(K))


def stage_loads(costs: CostModel, partition: Partition) -> Array:
    """t_s, the seconds stage s spends per microbatch: compute plus input and output cuts."""
    p = costs.prefix
    b = np.asarray(partition.validated(costs.num_layers).bounds)
    t: Array = p.compute[b[1:]] - p.compute[b[:-1]]
    t[1:] = t[1:] + p.cut[b[1:-1]]
    t[:-1] = t[:-1] + p.cut[b[1:-1]]
    return t


def stage_transfers(costs: CostModel, partition: Partition) -> list[float]:
    """The seconds of each stage's input and output cuts per microbatch (``stage_loads``
    less the compute).

    Example:
        >>> from partitioner.costs import LayerCost
        >>> layers = tuple(LayerCost(f"l{i}", 1.0, 2.0, 0, 0, 100) for i in range(3))
        >>> costs = CostModel(layers, bandwidth=100.0, latency=0.5)
        >>> stage_transfers(costs, Partition((0, 1, 2, 3)))
        [1.5, 3.0, 1.5]
    """
    p = costs.prefix
    b = np.asarray(partition.validated(costs.num_layers).bounds)
    loads = stage_loads(costs, partition) - (p.compute[b[1:]] - p.compute[b[:-1]])
    return [float(t) for t in loads]


def step_time_estimate(costs: CostModel, partition: Partition, M: int) -> float:
    """T = sum_s t_s + (M - 1) max_s t_s, the step time of a balanced pipeline formula.

    Example:
        >>> from partitioner.costs import LayerCost
        >>> costs = CostModel(tuple(LayerCost(f"l{i}", 1.0, 2.0, 0, 0, 0) for i in range(4)))
        >>> step_time_estimate(costs, Partition((0, 2, 4)), 4)
        30.0
    """
    _check_count(M, "M (microbatches)")
    t = stage_loads(costs, partition)
    return float(t.sum() + (M - 1) * t.max())


def peak_memory_estimate(
    costs: CostModel,
    partition: Partition,
    M: int,
    *,
    pipeline: str,
    recompute: bool,
    virtual_stages: int = 1,
    deferred: Sequence[int] | None = None,
) -> tuple[int, ...]:
    """Peak bytes per stage under `pipeline`, in closed form.

    State (weights times the optimizer multiplier) plus, for n_s = `in_flight` micro-
    batches: n_s stage activations, or with recompute n_s stage inputs and one set of
    activations; plus, for d_s = `pending_weights`, d_s sets of the output gradients a
    split backward keeps from B to W. A stage that holds a copy of shared weights
    (`CostModel.shared`) counts its state too. Equals `simulate(...).peak_memory` for
    `build(pipeline, K, M, deferred=deferred)`. With ``virtual_stages`` v > 1
    (`partition` of K v chunks), per rank: the simulator's walk of the schedule (the
    chunks' maxima fall apart).
    """
    if virtual_stages != 1:
        K = partition.num_stages // virtual_stages
        schedule = build(pipeline, K, M, virtual_stages=virtual_stages)
        return peak_memory(
            costs, partition, schedule, recompute=recompute, virtual_stages=virtual_stages
        )
    K = partition.num_stages
    n = in_flight(pipeline, K, M, recompute=recompute, deferred=deferred)
    d = pending_weights(pipeline, K, M, recompute=recompute, deferred=deferred)
    return _part_peaks(costs, partition, n, d, recompute)


def solved_deferral(pipeline: str, K: int) -> tuple[int, ...] | None:
    """The deferral the solvers fit in a memory cap: for the zero-bubble schedule no W
    deferred, the least it holds (`partitioner.plan.make_plan` then defers what still
    fits: `fit_deferred`); None for the schedules that defer nothing."""
    return (0,) * K if pipeline == "zero_bubble" else None


def fit_deferred(
    costs: CostModel, partition: Partition, M: int, limit: int, *, recompute: bool = False
) -> tuple[int, ...]:
    """The W's each stage of `zero_bubble` defers on `partition`: on stage s the most, up
    to ZB-H1's s, whose peak (`peak_memory_estimate`) stays within ``limit`` bytes, or 0
    where none does (a stage's peak grows with its own deferral alone).

    Example:
        >>> from partitioner.costs import LayerCost
        >>> costs = CostModel(tuple(LayerCost(f"l{i}", 1.0, 2.0, 10, 10, 10) for i in range(3)))
        >>> fit_deferred(costs, Partition((0, 1, 2, 3)), 4, 70)  # 1F1B's peak
        (0, 0, 0)
        >>> fit_deferred(costs, Partition((0, 1, 2, 3)), 4, 80)
        (0, 0, 1)
    """
    K = partition.num_stages
    found = [0] * K
    for s in range(1, K):
        for d in range(1, s + 1):
            trial = (*found[:s], d, *found[s + 1 :])
            peak = peak_memory_estimate(
                costs, partition, M, pipeline="zero_bubble", recompute=recompute, deferred=trial
            )
            if peak[s] > limit:
                break
            found[s] = d
    return tuple(found)


def _part_peaks(
    costs: CostModel,
    partition: Partition,
    n: tuple[int, ...],
    d: tuple[int, ...],
    recompute: bool,
) -> tuple[int, ...]:
    """Each part's state plus n (and d) of what it holds per microbatch (see
    `peak_memory_estimate`)."""
    p = costs.prefix
    b = np.asarray(partition.validated(costs.num_layers).bounds)
    held_n = np.asarray(n, dtype=np.int64)
    held_d = np.asarray(d, dtype=np.int64)
    state = p.state_bytes[b[1:]] - p.state_bytes[b[:-1]]
    state = state + np.array([costs.copy_bytes(lo, hi) for lo, hi in itertools.pairwise(b)])
    acts = p.activation_bytes[b[1:]] - p.activation_bytes[b[:-1]]
    grads = p.weight_grad_bytes[b[1:]] - p.weight_grad_bytes[b[:-1]]
    held = held_n * p.input_bytes[b[:-1]] + acts if recompute else held_n * acts + held_d * grads
    return tuple(int(x) for x in state + held)


def solve(
    costs: CostModel,
    K: int,
    M: int,
    *,
    optimize: str = "speed",
    pipeline: str = "interleaved",
    memory_cap: int | None = None,
    objective: Objective | None = None,
    first_stage_min: int = 1,
    virtual_stages: int = 1,
) -> Partition:
    """`solve_speed` under `memory_cap`, or `solve_memory` checked against it.

    With optimize="memory" the cap applies to the recompute peak of the least-memory
    partition, and InfeasibleError names that peak if it does not fit. ``objective``
    (work of its own on stage 0) applies to optimize="speed" only. With
    ``virtual_stages`` v the partition holds K v chunks (rank s runs s, s + K, ...).
    """
    _check_choice(optimize, OPTIMIZE, "optimize")
    if memory_cap is not None:
        _check_count(memory_cap, "memory_cap", minimum=0)
    if optimize == "speed":
        return solve_speed(
            costs,
            K,
            M,
            pipeline=pipeline,
            memory_cap=memory_cap,
            objective=objective,
            first_stage_min=first_stage_min,
            virtual_stages=virtual_stages,
        )
    if objective is not None:
        raise ValueError(
            "an objective (work of its own on stage 0) ranks partitions by speed; "
            "optimize='memory' minimises memory. Received: optimize='memory' with an objective"
        )
    v = virtual_stages
    partition = solve_memory(
        costs, K, M, pipeline=pipeline, first_stage_min=first_stage_min, virtual_stages=v
    )
    peak = max(
        peak_memory_estimate(
            costs, partition, M, pipeline=pipeline, recompute=True, virtual_stages=v
        )
    )
    if memory_cap is not None and peak > memory_cap:
        raise InfeasibleError(memory_cap, peak, K, v)
    return partition


def solve_speed(
    costs: CostModel,
    K: int,
    M: int,
    *,
    pipeline: str = "interleaved",
    memory_cap: int | None = None,
    objective: Objective | None = None,
    first_stage_min: int = 1,
    virtual_stages: int = 1,
) -> Partition:
    """The partition with the least `step_time_estimate` whose stages fit `memory_cap`
    (with ``objective``: the one it ranks first of the fastest for each end of stage 0).

    Branch and bound over the bottleneck B: a probe minimises the total cut cost among
    partitions with max_s t_s <= B (or < B) by an exact DP, and intervals of B are split
    until T = W + 2 cuts + (M - 1) B cannot beat the best partition found. A probe is
    O(K (L log L + band)), where the band holds the starts whose pass depends on their
    own cut cost; realistic chains need a few dozen probes.

    With an ``objective`` it takes, for each end b_1 of stage 0, the fastest partition
    (least T) that ends stage 0 there, and returns the one of these the objective ranks
    first: L - K + 1 searches and objectives. Work on stage 0 (sifting's scoring,
    `partitioner.experimental.scoring`) depends on the other stages only through stage
    0's waits, which the fastest rest of the chain keeps long; with K = 2 the rest is one
    stage and the result is exact.

    Example:
        >>> from partitioner.costs import LayerCost
        >>> costs = CostModel(tuple(LayerCost(f"l{i}", 1.0, 2.0, 0, 0, 0) for i in range(4)))
        >>> solve_speed(costs, 2, 4).bounds
        (0, 2, 4)

    Args:
        costs: the cost model.
        K: number of stages.
        M: number of microbatches.
        pipeline: one of `partitioner.schedule.PIPELINES`, for the memory model (the
            zero-bubble schedule's deferring no W, `solved_deferral`).
        memory_cap: bytes each stage may hold without recompute, or None.
        objective: a partition's seconds per step with stage 0's own work, e.g.
            ``functools.partial(sifted_step_time, costs, M=M, ...)`` of the partition.
        first_stage_min: stage 0 holds at least this many layers (its end boundary is at
            least this), e.g. so that an exit at stage 0's end follows a learnt layer.
        virtual_stages: v; with v > 1, K v chunks for `partitioner.schedule.virtual`:
            the fastest cut of the chain into K v parts if its ranks fit `memory_cap`,
            else the fastest whose chunks each fit 1/v of it (no ``objective``).

    Returns:
        An optimal partition.

    Raises:
        ValueError: on K < 1, M < 1, K > L, an unknown pipeline or a first_stage_min
            that leaves fewer than K - 1 layers to the other stages.
        InfeasibleError: if no partition fits the cap.
    """
    chain = _Chain.make(costs, K, M, pipeline, first_stage_min, virtual_stages)
    if memory_cap is not None:
        _check_count(memory_cap, "memory_cap", minimum=0)
    if virtual_stages != 1:
        return _fastest_virtual(chain, memory_cap, objective)
    memory = chain.memory(memory_cap, recompute=False)
    if objective is not None:
        best = _fastest_ranked(chain, memory, objective)
    else:
        best = _fastest(chain, memory)
    if best is None:
        assert memory_cap is not None
        raise InfeasibleError(memory_cap, _smallest_cap(chain, recompute=False), K)
    return best


def solve_memory(
    costs: CostModel,
    K: int,
    M: int,
    *,
    pipeline: str = "interleaved",
    first_stage_min: int = 1,
    virtual_stages: int = 1,
) -> Partition:
    """The partition with the least peak memory under recompute, then the fastest.

    Bisection on the byte cap Z with the DP as feasibility probe (each feasible probe
    snaps Z down to the peak it found), then `solve_speed`'s search under cap Z. Each
    probe is O(K (L log L + band)); the bisection needs O(log of the peak) probes. With
    ``virtual_stages`` v > 1, the K v chunks with the least largest chunk peak.

    Raises:
        ValueError: on K < 1, M < 1, K > L or an unknown pipeline.
    """
    chain = _Chain.make(costs, K, M, pipeline, first_stage_min, virtual_stages)
    cap = _smallest_cap(chain, recompute=True)
    best = _fastest(chain, chain.memory(cap, recompute=True))
    assert best is not None, "the smallest cap admits a partition by construction"
    return best


@dataclass(frozen=True)
class _Chain:
    """A solve's inputs and the limits it builds from them."""

    costs: CostModel
    K: int  # parts: stages, or with virtual stages K v chunks
    M: int
    pipeline: str
    first_min: int = 1  # least end boundary of stage 0
    virtual: int = 1  # v, the chunks each rank runs

    @classmethod
    def make(
        cls, costs: CostModel, K: int, M: int, pipeline: str, first_min: int = 1, virtual: int = 1
    ) -> _Chain:
        _check_count(K, "K (partitions)")
        _check_count(M, "M (microbatches)")
        _check_choice(pipeline, PIPELINES, "pipeline")
        check_virtual(pipeline, virtual)
        if virtual != 1:
            in_flight(pipeline, K, M, virtual_stages=virtual)  # K >= 2, M fits its rounds
        parts = K * virtual
        if parts > costs.num_layers:
            chunks = "" if virtual == 1 else f" x virtual_stages: {virtual} = {parts} chunks"
            raise ValueError(
                f"too few layers to split into partitions (layers: {costs.num_layers}, "
                f"partitions: {K}{chunks})"
            )
        _check_count(first_min, "first_stage_min")
        if first_min > costs.num_layers - parts + 1:
            raise ValueError(
                f"first_stage_min leaves the other {parts - 1} stages fewer layers than stages: "
                f"at most {costs.num_layers - parts + 1} of {costs.num_layers} layers can be on "
                f"stage 0. Received: first_stage_min={first_min}"
            )
        return cls(costs, parts, M, pipeline, first_min, virtual)

    @property
    def ranks(self) -> int:
        """K, the ranks of the pipeline (``self.K`` counts the chunks)."""
        return self.K // self.virtual

    def peaks(self, partition: Partition, *, recompute: bool) -> tuple[int, ...]:
        """Each part's peak bytes in closed form: a stage's (`peak_memory_estimate`), or
        with virtual stages a chunk's alone (its state and its most microbatches held)."""
        if self.virtual == 1:
            return peak_memory_estimate(
                self.costs,
                partition,
                self.M,
                pipeline=self.pipeline,
                recompute=recompute,
                deferred=self.deferred,
            )
        n = in_flight(self.pipeline, self.ranks, self.M, virtual_stages=self.virtual)
        return _part_peaks(self.costs, partition, n, (0,) * self.K, recompute)

    @property
    def L(self) -> int:
        return self.costs.num_layers

    @property
    def deferred(self) -> tuple[int, ...] | None:
        """`solved_deferral` (one chunk a rank: only 1F1B interleaves)."""
        return solved_deferral(self.pipeline, self.K) if self.virtual == 1 else None

    @cached_property
    def state(self) -> Array:
        """Prefix sums of the state a stage holds, a copy of shared weights counted at every
        later call (`CostModel.shared`): the copies a stage holds, exactly when the calls
        fall on different stages, as a tied embedding's do; more than it holds when two
        calls share a stage, so a partition found under a cap always fits it."""
        costs = self.costs
        copies = np.zeros(costs.num_layers, dtype=np.int64)
        for group in costs.shared:
            first = costs.prefix.state_bytes[group[0] + 1] - costs.prefix.state_bytes[group[0]]
            copies[list(group[1:])] += first
        state: Array = costs.prefix.state_bytes + np.concatenate([[0], np.cumsum(copies)])
        return state

    def memory(self, cap: int | None, *, recompute: bool) -> list[list[Limit]]:
        """Per-stage memory limits at `cap` bytes (no limits if cap is None)."""
        if cap is None:
            return [[] for _ in range(self.K)]
        p, v = self.costs.prefix, self.virtual
        pipeline, K, M, least = self.pipeline, self.ranks, self.M, self.deferred
        held = in_flight(pipeline, K, M, recompute=recompute, virtual_stages=v, deferred=least)
        pending = pending_weights(
            pipeline, K, M, recompute=recompute, virtual_stages=v, deferred=least
        )
        limits = []
        for s, (n, d) in enumerate(zip(held, pending, strict=True)):
            if recompute:
                start = n * p.input_bytes if s > 0 else None
                prefix = self.state + p.activation_bytes
                limits.append([Limit.make(prefix, cap, start)])
            else:
                prefix = self.state + n * p.activation_bytes + d * p.weight_grad_bytes
                limits.append([Limit.make(prefix, cap)])
        return limits

    @cached_property
    def _time(self) -> list[Limit]:
        p, K = self.costs.prefix, self.K
        return [
            Limit.make(p.compute, math.inf, p.cut if s > 0 else None, p.cut if s < K - 1 else None)
            for s in range(K)
        ]

    def time(self, bound: float, strict: bool) -> list[Limit]:
        """Per-stage limits t_s <= bound (or < bound)."""
        return [limit.with_bound(bound, strict) for limit in self._time]

    def spans(self, prefix: Array, bound: float) -> list[tuple[int, int]]:
        """End boundaries allowed when every stage spends at least its prefix difference."""
        if not math.isfinite(bound):
            return [(self.first_min, self.L)] + [(0, self.L)] * (self.K - 1)
        room = bound * (1 + 1e-9)
        stages = np.arange(self.K)
        lows = np.searchsorted(prefix, prefix[-1] - (self.K - 1 - stages) * room, side="left")
        lows[0] = max(int(lows[0]), self.first_min)
        highs = np.searchsorted(prefix, (stages + 1) * room, side="right") - 1
        return [(int(lo), int(hi)) for lo, hi in zip(lows, highs, strict=True)]


def _fastest(chain: _Chain, memory: list[list[Limit]]) -> Partition | None:
    """The partition with the least T under `memory`; None if none meets it."""
    search = _Search(chain, memory)
    first = search.probe(math.inf, strict=False)
    if first is None or chain.M == 1 or chain.K == 1:
        return None if first is None else first.partition
    search.run(first)
    return search.best


def _fastest_ranked(
    chain: _Chain, memory: list[list[Limit]], objective: Objective
) -> Partition | None:
    """The fastest partition for each end of stage 0, then the least ``objective``."""
    index = np.arange(chain.L + 1, dtype=np.float64)  # a limit on where stage 0 ends
    best: Partition | None = None
    best_time = math.inf
    for end in range(chain.first_min, chain.L - chain.K + 2):
        at = dataclasses.replace(chain, first_min=end)
        found = _fastest(at, [[*memory[0], Limit.make(index, float(end))], *memory[1:]])
        if found is None:
            continue  # no partition with that end fits the memory cap
        value = objective(found)
        if value < best_time:
            best, best_time = found, value
    return best


def _fastest_virtual(chain: _Chain, cap: int | None, objective: Objective | None) -> Partition:
    """`solve_speed` with virtual stages: the fastest chunks if their ranks fit ``cap``,
    else the fastest whose chunks each fit 1/v of it."""
    if objective is not None:
        raise ValueError(
            "an objective (work of its own on stage 0) is planned for one chunk per rank: "
            f"solve with virtual_stages=1, or without it. Received: virtual_stages="
            f"{chain.virtual} with an objective"
        )
    best = _fastest(chain, chain.memory(None, recompute=False))
    assert best is not None, "without a cap every chain of K v layers or more has a partition"
    if cap is None or max(_rank_peaks(chain, best)) <= cap:
        return best
    found = _fastest(chain, chain.memory(cap // chain.virtual, recompute=False))
    if found is None:
        smallest = chain.virtual * _smallest_cap(chain, recompute=False)
        raise InfeasibleError(cap, smallest, chain.ranks, chain.virtual)
    return found


def _rank_peaks(chain: _Chain, partition: Partition) -> tuple[int, ...]:
    return peak_memory_estimate(
        chain.costs,
        partition,
        chain.M,
        pipeline=chain.pipeline,
        recompute=False,
        virtual_stages=chain.virtual,
    )


@dataclass(frozen=True)
class _Found:
    """A probe's answer: the least total cut time C among partitions with t_s <= B."""

    cuts: float
    partition: Partition
    bottleneck: float


class _Search:
    """Branch and bound over the bottleneck B for the least T = W + 2 C + (M - 1) B.

    C(B), the least cut total with max_s t_s <= B, is a nonincreasing step function, and
    a node (x, y) stands for the partitions with bottleneck in (x, y). The probe "t_s < y"
    finds the cheapest of them, whose bottleneck b ends a flat step [b, y); the rest,
    (x, b), costs at least W + 2 C(b-) + (M - 1) x and is split at a probe "t_s <= mid".
    Nodes are expanded best bound first and dropped once they cannot beat the incumbent.
    """

    def __init__(self, chain: _Chain, memory: list[list[Limit]]) -> None:
        self.chain, self.memory = chain, memory
        self.work = float(chain.costs.prefix.compute[-1])
        self.best: Partition | None = None
        self.best_time = math.inf

    def probe(self, bound: float, *, strict: bool) -> _Found | None:
        """Cheapest cuts with every t_s <= bound (< bound if strict); keeps the best T."""
        chain, p = self.chain, self.chain.costs.prefix
        limits = [[*m, t] for m, t in zip(self.memory, chain.time(bound, strict), strict=True)]
        found = cheapest(chain.L, chain.K, p.cut, limits, chain.spans(p.compute, bound))
        if found is None:
            return None
        partition = Partition(found[1])
        value = step_time_estimate(chain.costs, partition, chain.M)
        if value < self.best_time:
            self.best, self.best_time = partition, value
        return _Found(found[0], partition, float(stage_loads(chain.costs, partition).max()))

    def lower(self, cuts: float, x: float) -> float:
        """Least T of a partition with cut total >= cuts and bottleneck >= x."""
        return self.work + 2 * cuts + (self.chain.M - 1) * x

    def run(self, first: _Found) -> None:
        x = self.floor()
        # (lower bound on T, x, C(x) or inf if unknown, y, C(y))
        heap = [(self.lower(first.cuts, x), x, math.inf, first.bottleneck, first.cuts)]
        eps = _EPSILON * max(first.bottleneck, 1e-300)
        while heap:
            bound, x, cuts_x, y, _ = heapq.heappop(heap)
            if bound >= self.best_time:
                return
            below = self.probe(y, strict=True)
            if below is None or below.bottleneck - x <= eps or below.cuts == cuts_x:
                continue
            if self.lower(below.cuts, x) >= self.best_time:
                continue
            b = below.bottleneck
            mid = x + (b - x) * (_LOW_SPLIT if cuts_x == math.inf else 0.5)
            at_mid = self.probe(mid, strict=False)
            cuts_mid = math.inf if at_mid is None else at_mid.cuts
            heapq.heappush(heap, (self.lower(below.cuts, mid), mid, cuts_mid, b, below.cuts))
            if at_mid is not None:
                heapq.heappush(
                    heap, (self.lower(at_mid.cuts, x), x, cuts_x, at_mid.bottleneck, at_mid.cuts)
                )

    def floor(self) -> float:
        """Strictly below every bottleneck: the mean t_s, or the widest layer plus a cut."""
        p, K = self.chain.costs.prefix, self.chain.K
        cheapest_cut = float(p.cut[1:-1].min())
        widest = float(np.diff(p.compute).max())
        floor = max((self.work + 2 * (K - 1) * cheapest_cut) / K, widest + cheapest_cut)
        return floor * (1 - 1e-9) - 1e-300


def _smallest_cap(chain: _Chain, *, recompute: bool) -> int:
    """The least per-stage byte cap any partition fits (bisection with snapping)."""
    costs, K = chain.costs, chain.K

    def peak(partition: Partition) -> int:
        return max(chain.peaks(partition, recompute=recompute))

    p = costs.prefix
    total = p.state_bytes + p.activation_bytes
    # an even split, its first cut moved to stage 0's least end if that is later
    even = [max(s * chain.L // K, chain.first_min + s - 1) for s in range(1, K)]
    high = peak(Partition((0, *even, chain.L)))
    low = max(-1, -(-int(total[-1]) // K) - 1)  # every stage holds its own state and acts
    while high - low > 1:
        mid = (low + high) // 2
        found = cheapest(
            chain.L, K, p.cut, chain.memory(mid, recompute=recompute), chain.spans(total, mid)
        )
        if found is None:
            low = mid
        else:
            high = peak(Partition(found[1]))
    return high


def _check_count(value: int, name: str, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}. Received: {name}={value!r}")


def _check_choice(value: str, allowed: tuple[str, ...], name: str) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)}. Received: {name}={value!r}")

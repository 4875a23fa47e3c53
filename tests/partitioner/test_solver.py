import doctest
import itertools
import math
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import partitioner.solver
from partitioner.costs import CostModel, LayerCost
from partitioner.experimental.scoring import sifted_step_time
from partitioner.partition import Partition
from partitioner.schedule import build
from partitioner.simulator import simulate
from partitioner.solver import (
    InfeasibleError,
    Objective,
    fit_deferred,
    in_flight,
    peak_memory_estimate,
    pending_weights,
    solve,
    solve_memory,
    solve_speed,
    stage_loads,
    step_time_estimate,
)

# Small integers make ties, which is where exactness bugs hide; floats cover the rest.
times = st.one_of(st.integers(0, 6).map(float), st.floats(0, 10, allow_nan=False))
sizes = st.one_of(st.integers(0, 4).map(lambda x: 100 * x), st.integers(0, 1000))
pipelines = st.sampled_from(["simple", "interleaved", "zero_bubble"])


@st.composite
def cost_models(draw: st.DrawFn, max_layers: int = 9) -> CostModel:
    """Chains of 1..max_layers layers, with transfer costs or without."""
    L = draw(st.integers(1, max_layers))
    layers = tuple(
        LayerCost(f"l{i}", draw(times), draw(times), draw(sizes), draw(sizes), draw(sizes))
        for i in range(L)
    )
    communicating = draw(st.booleans())
    return CostModel(
        layers,
        batch_size=draw(st.integers(1, 3)),
        optimizer_multiplier=draw(st.sampled_from([4.0, 1.0, 2.5])),
        bandwidth=draw(st.sampled_from([50.0, 300.0, 1e4])) if communicating else math.inf,
        latency=draw(st.sampled_from([0.0, 0.5])) if communicating else 0.0,
    )


@st.composite
def problems(
    draw: st.DrawFn, max_layers: int = 9, max_stages: int = 4
) -> tuple[CostModel, int, int, str]:
    costs = draw(cost_models(max_layers))
    K = draw(st.integers(1, min(max_stages, costs.num_layers)))
    return costs, K, draw(st.integers(1, 6)), draw(pipelines)


def all_partitions(L: int, K: int) -> Iterator[Partition]:
    for cuts in itertools.combinations(range(1, L), K - 1):
        yield Partition((0, *cuts, L))


def peak(costs: CostModel, p: Partition, M: int, pipeline: str, recompute: bool) -> int:
    """The peak the solvers fit in a cap: the zero-bubble schedule's deferring no W."""
    least = (0,) * p.num_stages if pipeline == "zero_bubble" else None
    return max(
        peak_memory_estimate(costs, p, M, pipeline=pipeline, recompute=recompute, deferred=least)
    )


def same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


@settings(max_examples=150, deadline=None)
@given(problems(), st.floats(0.7, 1.6), st.booleans())
def test_solve_speed_matches_brute_force(
    problem: tuple[CostModel, int, int, str], slack: float, capped: bool
) -> None:
    costs, K, M, pipeline = problem
    memory = {p: peak(costs, p, M, pipeline, False) for p in all_partitions(costs.num_layers, K)}
    cap = int(min(memory.values()) * slack) if capped else None
    fits = [p for p in memory if cap is None or memory[p] <= cap]
    if not fits:
        with pytest.raises(InfeasibleError) as info:
            solve_speed(costs, K, M, pipeline=pipeline, memory_cap=cap)
        assert info.value.smallest_cap == min(memory.values())
        return
    found = solve_speed(costs, K, M, pipeline=pipeline, memory_cap=cap)
    assert cap is None or memory[found] <= cap
    best = min(step_time_estimate(costs, p, M) for p in fits)
    assert same(step_time_estimate(costs, found, M), best)


scorings = st.one_of(st.integers(1, 12).map(float), st.floats(0.01, 30))
calls = st.one_of(st.just(0.0), st.integers(1, 4).map(float), st.floats(0, 10))


def sifted(costs: CostModel, p: Partition, M: int, pipeline: str, S: float, c: float) -> float:
    return sifted_step_time(costs, p, M, pipeline=pipeline, scoring=S, call=c)


def ranked(costs: CostModel, M: int, pipeline: str, S: float, c: float) -> Objective:
    """The objective of S scoring forwards a step on stage 0 in calls of fixed cost c."""
    return lambda p: sifted(costs, p, M, pipeline, S, c)


@settings(max_examples=150, deadline=None)
@given(problems(max_stages=2), st.data(), scorings, calls, st.booleans())
def test_solve_speed_with_scoring_matches_brute_force_on_two_stages(
    problem: tuple[CostModel, int, int, str],
    data: st.DataObject,
    scoring: float,
    call: float,
    capped: bool,
) -> None:
    # with K <= 2 the end of stage 0 fixes the partition: the solver is exact
    costs, K, M, pipeline = problem
    least = data.draw(st.integers(1, costs.num_layers - K + 1))
    allowed = [p for p in all_partitions(costs.num_layers, K) if p.bounds[1] >= least]
    memory = {p: peak(costs, p, M, pipeline, False) for p in allowed}
    cap = int(sorted(memory.values())[len(memory) // 2]) if capped else None
    fits = [p for p in allowed if cap is None or memory[p] <= cap]
    found = solve_speed(
        costs, K, M, pipeline=pipeline, memory_cap=cap,
        objective=ranked(costs, M, pipeline, scoring, call), first_stage_min=least,
    )  # fmt: skip
    assert found.bounds[1] >= least and (cap is None or memory[found] <= cap)
    best = min(sifted(costs, p, M, pipeline, scoring, call) for p in fits)
    assert same(sifted(costs, found, M, pipeline, scoring, call), best)


@settings(max_examples=100, deadline=None)
@given(problems(max_layers=8), scorings, calls, st.booleans())
def test_solve_speed_with_scoring_takes_the_best_fastest_partition_per_end_of_stage_0(
    problem: tuple[CostModel, int, int, str], scoring: float, call: float, capped: bool
) -> None:
    # with K > 2: for each end of stage 0 the fastest rest (least T), and of those the
    # least sifted step; among tied rests it may take any, so it is no worse than the
    # worst of the tied ones at the best end
    costs, K, M, pipeline = problem
    memory = {p: peak(costs, p, M, pipeline, False) for p in all_partitions(costs.num_layers, K)}
    cap = int(sorted(memory.values())[len(memory) // 2]) if capped else None
    fits = [p for p in memory if cap is None or memory[p] <= cap]
    found = solve_speed(
        costs, K, M, pipeline=pipeline, memory_cap=cap,
        objective=ranked(costs, M, pipeline, scoring, call),
    )  # fmt: skip
    assert cap is None or memory[found] <= cap
    worst_of_fastest = []
    for end in {p.bounds[1] for p in fits}:
        ending = [p for p in fits if p.bounds[1] == end]
        fastest = min(step_time_estimate(costs, p, M) for p in ending)
        tied = [p for p in ending if same(step_time_estimate(costs, p, M), fastest)]
        worst_of_fastest.append(max(sifted(costs, p, M, pipeline, scoring, call) for p in tied))
        if end == found.bounds[1]:
            assert found in tied
    value = sifted(costs, found, M, pipeline, scoring, call)
    assert value <= min(worst_of_fastest) or same(value, min(worst_of_fastest))


@settings(max_examples=150, deadline=None)
@given(problems(), st.data(), st.booleans())
def test_solvers_with_a_least_first_stage_match_brute_force(
    problem: tuple[CostModel, int, int, str], data: st.DataObject, capped: bool
) -> None:
    costs, K, M, pipeline = problem
    L = costs.num_layers
    least = data.draw(st.integers(1, L - K + 1))
    allowed = [p for p in all_partitions(L, K) if p.bounds[1] >= least]
    memory = {p: peak(costs, p, M, pipeline, False) for p in allowed}
    cap = int(sorted(memory.values())[len(memory) // 2]) if capped else None
    fits = [p for p in allowed if cap is None or memory[p] <= cap]
    found = solve_speed(costs, K, M, pipeline=pipeline, memory_cap=cap, first_stage_min=least)
    assert found.bounds[1] >= least and (cap is None or memory[found] <= cap)
    best = min(step_time_estimate(costs, p, M) for p in fits)
    assert same(step_time_estimate(costs, found, M), best)
    recompute = {p: peak(costs, p, M, pipeline, True) for p in allowed}
    lightest = solve_memory(costs, K, M, pipeline=pipeline, first_stage_min=least)
    assert lightest.bounds[1] >= least
    assert recompute[lightest] == min(recompute.values())


def test_a_least_first_stage_that_leaves_too_few_layers_is_an_error() -> None:
    with pytest.raises(ValueError) as info:
        solve_speed(chain([1.0, 1.0, 1.0]), 2, 2, first_stage_min=3)
    assert str(info.value) == (
        "first_stage_min leaves the other 1 stages fewer layers than stages: at most 2 of 3 "
        "layers can be on stage 0. Received: first_stage_min=3"
    )


def test_scoring_on_stage_0_moves_layers_off_it() -> None:
    # 4 layers of forward 1 s, backward 2 s; M = 4; 8 scoring forwards per step (2 source
    # batches), a call's fixed cost 1 s. Plain: (0, 2, 4), T = 30; stage 0 waits 4 s and
    # 2 s, where a source batch (1 + 4 * 2 s) never fits: 30 + 2 * 8 + 1 = 47 s a step.
    # (0, 1, 4): 39 s, its waits (8, 6, 6, 7 s) hold both source batches (1 + 4 * 1 s).
    costs = CostModel(tuple(LayerCost(f"l{i}", 1.0, 2.0, 0, 0, 0) for i in range(4)))
    assert solve_speed(costs, 2, 4).bounds == (0, 2, 4)
    assert sifted(costs, Partition((0, 2, 4)), 4, "interleaved", 8, 1.0) == 47.0
    objective = ranked(costs, 4, "interleaved", 8, 1.0)
    assert solve_speed(costs, 2, 4, objective=objective).bounds == (0, 1, 4)
    assert sifted(costs, Partition((0, 1, 4)), 4, "interleaved", 8, 1.0) == 39.0
    assert solve(costs, 2, 4, objective=objective).bounds == (0, 1, 4)


def test_a_call_cost_that_no_wait_holds_keeps_the_fastest_cut() -> None:
    # a call of 9 s fits in no wait of either cut: all the scoring runs between steps,
    # and the fastest pipeline is best (30 + 16 + 9 = 55 s against 39 + 8 + 9 = 56 s)
    costs = CostModel(tuple(LayerCost(f"l{i}", 1.0, 2.0, 0, 0, 0) for i in range(4)))
    objective = ranked(costs, 4, "interleaved", 8, 9.0)
    assert solve_speed(costs, 2, 4, objective=objective).bounds == (0, 2, 4)
    assert sifted(costs, Partition((0, 2, 4)), 4, "interleaved", 8, 9.0) == 55.0
    assert sifted(costs, Partition((0, 1, 4)), 4, "interleaved", 8, 9.0) == 56.0


def test_an_objective_ranks_speed_alone() -> None:
    with pytest.raises(ValueError) as info:
        solve(chain([1.0, 1.0]), 2, 2, optimize="memory", objective=lambda p: 0.0)
    assert str(info.value) == (
        "an objective (work of its own on stage 0) ranks partitions by speed; "
        "optimize='memory' minimises memory. Received: optimize='memory' with an objective"
    )


@settings(max_examples=100, deadline=None)
@given(problems())
def test_solve_memory_matches_brute_force(problem: tuple[CostModel, int, int, str]) -> None:
    costs, K, M, pipeline = problem
    memory = {p: peak(costs, p, M, pipeline, True) for p in all_partitions(costs.num_layers, K)}
    least = min(memory.values())
    found = solve_memory(costs, K, M, pipeline=pipeline)
    assert memory[found] == least
    best = min(step_time_estimate(costs, p, M) for p in memory if memory[p] == least)
    assert same(step_time_estimate(costs, found, M), best)


def pareto_optimum(costs: CostModel, K: int, M: int, cap: int | None, pipeline: str) -> float:
    """Least T by a Pareto DP over (bottleneck, cut total): exact, another algorithm."""
    L, p = costs.num_layers, costs.prefix
    # simple: M microbatches in flight, but 1 on the last stage (its B follows its F);
    # zero_bubble, solved deferring no W (make_plan defers what then fits): 1F1B's
    # min(K - s, M) from F to W, and from B to W the output gradients of one microbatch
    # where the stage splits its backward (s > 0)
    n = {
        "simple": [M if s < K - 1 else 1 for s in range(K)],
        "interleaved": [min(K - s, M) for s in range(K)],
        "zero_bubble": [min(K - s, M) for s in range(K)],
    }[pipeline]
    d = [1 if pipeline == "zero_bubble" and s > 0 else 0 for s in range(K)]
    fronts: list[dict[int, list[tuple[float, float]]]] = [{0: [(0.0, 0.0)]}]
    for s in range(K):
        nxt: dict[int, list[tuple[float, float]]] = {}
        for i, front in fronts[-1].items():
            for j in range(i + 1, L - (K - 1 - s) + 1):
                if s == K - 1 and j != L:
                    continue
                state = p.state_bytes[j] - p.state_bytes[i]
                acts = p.activation_bytes[j] - p.activation_bytes[i]
                grads = p.weight_grad_bytes[j] - p.weight_grad_bytes[i]
                if cap is not None and state + n[s] * acts + d[s] * grads > cap:
                    continue
                t = (
                    (p.compute[j] - p.compute[i])
                    + (p.cut[i] if s else 0)
                    + (p.cut[j] if s < K - 1 else 0)
                )
                for b, c in front:
                    nxt.setdefault(j, []).append((max(b, t), c + (p.cut[i] if s else 0.0)))
        fronts.append({j: prune(f) for j, f in nxt.items()})
    final = fronts[-1].get(L, [])
    work = float(p.compute[-1])
    return min((work + 2 * c + (M - 1) * b for b, c in final), default=math.inf)


def prune(front: list[tuple[float, float]]) -> list[tuple[float, float]]:
    kept: list[tuple[float, float]] = []
    for b, c in sorted(front):
        if not kept or c < kept[-1][1]:
            kept.append((b, c))
    return kept


@settings(max_examples=25, deadline=None)
@given(
    st.integers(10, 40),
    st.integers(2, 6),
    st.integers(1, 16),
    pipelines,
    st.integers(0, 2**31),
    st.booleans(),
)
def test_solve_speed_matches_a_pareto_dp_on_longer_chains(
    L: int, K: int, M: int, pipeline: str, seed: int, capped: bool
) -> None:
    rng = np.random.default_rng(seed)
    layers = tuple(
        LayerCost(
            f"l{i}",
            float(rng.exponential()),
            float(rng.exponential()),
            int(rng.integers(0, 1000)),
            int(rng.integers(0, 100)),
            int(rng.integers(0, 3000)),
        )
        for i in range(L)
    )
    costs = CostModel(layers, bandwidth=1000.0, latency=0.1)
    cap = None
    if capped:
        cap = int(
            1.3
            * max(
                peak_memory_estimate(
                    costs,
                    Partition.from_sizes([L // K] * (K - 1) + [L - (K - 1) * (L // K)]),
                    M,
                    pipeline=pipeline,
                    recompute=False,
                )
            )
        )
    found = solve_speed(costs, K, M, pipeline=pipeline, memory_cap=cap)
    assert same(step_time_estimate(costs, found, M), pareto_optimum(costs, K, M, cap, pipeline))


@settings(max_examples=60, deadline=None)
@given(problems(), st.booleans())
def test_peak_memory_estimate_equals_the_simulator(
    problem: tuple[CostModel, int, int, str], recompute: bool
) -> None:
    costs, K, M, pipeline = problem
    partition = next(all_partitions(costs.num_layers, K))
    simulated = simulate(costs, partition, build(pipeline, K, M), recompute=recompute)
    assert simulated.peak_memory == peak_memory_estimate(
        costs, partition, M, pipeline=pipeline, recompute=recompute
    )


@st.composite
def deferrals(draw: st.DrawFn, K: int) -> tuple[int, ...]:
    """W's deferred per stage of K: 0 <= d_s <= s."""
    return tuple(draw(st.integers(0, s)) for s in range(K))


@settings(max_examples=60, deadline=None)
@given(problems(), st.booleans(), st.data())
def test_peak_memory_estimate_of_any_deferral_equals_the_simulator(
    problem: tuple[CostModel, int, int, str], recompute: bool, data: st.DataObject
) -> None:
    costs, K, M, _ = problem
    d = data.draw(deferrals(K))
    partition = next(all_partitions(costs.num_layers, K))
    schedule = build("zero_bubble", K, M, deferred=d)
    simulated = simulate(costs, partition, schedule, recompute=recompute)
    assert simulated.peak_memory == peak_memory_estimate(
        costs, partition, M, pipeline="zero_bubble", recompute=recompute, deferred=d
    )


@settings(max_examples=80, deadline=None)
@given(problems(), st.floats(0.5, 2.0))
def test_fit_deferred_defers_the_most_that_fits_on_each_stage(
    problem: tuple[CostModel, int, int, str], slack: float
) -> None:
    # brute force over every deferral, each peak from the simulator's walk of the schedule
    costs, K, M, _ = problem
    partition = next(all_partitions(costs.num_layers, K))
    limit = int(max(peak_memory_estimate(costs, partition, M, pipeline="interleaved",
                                         recompute=False)) * slack)  # fmt: skip
    every = itertools.product(*(range(s + 1) for s in range(K)))
    peaks = {
        d: simulate(costs, partition, build("zero_bubble", K, M, deferred=d)).peak_memory
        for d in every
    }
    expected = tuple(
        max([0] + [d[s] for d, peak in peaks.items() if peak[s] <= limit]) for s in range(K)
    )
    assert fit_deferred(costs, partition, M, limit) == expected


def chain(times: list[float], cut_bytes: int = 0) -> CostModel:
    layers = tuple(LayerCost(f"l{i}", t, 2 * t, 0, 0, cut_bytes) for i, t in enumerate(times))
    return CostModel(layers, bandwidth=100.0)


def test_step_time_estimate_adds_both_cuts_of_middle_stages() -> None:
    costs = chain([1.0, 1.0, 1.0, 1.0], cut_bytes=100)  # every cut costs 1 s
    partition = Partition((0, 1, 3, 4))
    assert stage_loads(costs, partition).tolist() == [3.0 + 1, 6.0 + 2, 3.0 + 1]
    assert step_time_estimate(costs, partition, M=4) == 16.0 + 3 * 8.0


def test_solver_moves_a_cut_to_a_cheap_boundary_when_it_pays() -> None:
    layers = [LayerCost(f"l{i}", 1.0, 1.0, 0, 0, 1000) for i in range(4)]
    layers[0] = LayerCost("l0", 1.0, 1.0, 0, 0, 0)  # the only cheap boundary is after l0
    costs = CostModel(tuple(layers), bandwidth=1000.0)
    assert solve_speed(costs, 2, 1).bounds == (0, 1, 4)  # M=1: only cut costs matter
    assert solve_speed(costs, 2, 64).bounds == (0, 2, 4)  # large M: balance wins


def test_infeasible_cap_names_the_smallest_cap_that_fits() -> None:
    layers = tuple(LayerCost(f"l{i}", 1.0, 1.0, 2**20, 0, 0) for i in range(4))
    costs = CostModel(layers)  # 4 MiB of state per layer
    with pytest.raises(InfeasibleError) as info:
        solve_speed(costs, 2, 4, memory_cap=7 * 2**20)
    assert info.value.smallest_cap == 8 * 2**20
    assert str(info.value) == (
        "no partition into 2 stages fits the memory cap; the smallest cap that fits is "
        "8388608 bytes (8.00 MiB). Received: memory_cap=7340032 (7.00 MiB)"
    )
    assert solve_speed(costs, 2, 4, memory_cap=8 * 2**20).bounds == (0, 2, 4)


def test_memory_optimize_checks_the_cap_against_the_recompute_peak() -> None:
    layers = tuple(LayerCost(f"l{i}", 1.0, 1.0, 2**20, 0, 0) for i in range(4))
    costs = CostModel(layers)
    assert solve(costs, 2, 4, optimize="memory", memory_cap=8 * 2**20).bounds == (0, 2, 4)
    with pytest.raises(InfeasibleError, match="smallest cap that fits is 8388608"):
        solve(costs, 2, 4, optimize="memory", memory_cap=2**20)


def test_too_few_layers_is_an_error() -> None:
    with pytest.raises(ValueError) as info:
        solve_speed(chain([1.0, 1.0, 1.0]), 4, 2)
    assert str(info.value) == "too few layers to split into partitions (layers: 3, partitions: 4)"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(optimize="time"),
            r"optimize must be one of \['speed', 'memory'\]. Received: optimize='time'",
        ),
        (
            dict(pipeline="1f1b"),
            r"pipeline must be one of \['simple', 'interleaved', 'zero_bubble'\]",
        ),
        (dict(memory_cap=-1), "memory_cap must be an integer >= 0. Received: memory_cap=-1"),
    ],
)
def test_bad_options_list_what_is_allowed(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        solve(chain([1.0, 1.0]), 2, 2, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("K, M", [(0, 1), (1, 0)])
def test_empty_pipelines_are_errors(K: int, M: int) -> None:
    with pytest.raises(ValueError, match=f"Received: .*={min(K, M)}"):
        solve_speed(chain([1.0, 1.0]), K, M)


def test_large_chain_is_solved_and_beats_equal_layer_counts() -> None:
    rng = np.random.default_rng(0)
    layers = tuple(
        LayerCost(f"l{i}", float(t), float(2 * t), int(p), int(a), int(o))
        for i, (t, p, a, o) in enumerate(
            zip(
                rng.uniform(1e-4, 1e-3, 2000),
                rng.integers(0, 10**7, 2000),
                rng.integers(10**3, 10**6, 2000),
                rng.integers(10**3, 10**5, 2000),
                strict=True,
            )
        )
    )
    costs = CostModel(layers, batch_size=32)
    found = solve_speed(costs, 16, 8)
    equal = Partition(tuple(s * 2000 // 16 for s in range(17)))
    assert step_time_estimate(costs, found, 8) <= step_time_estimate(costs, equal, 8)
    assert solve_memory(costs, 16, 8).num_stages == 16


def test_docstring_examples_run() -> None:
    assert doctest.testmod(partitioner.solver).failed == 0


def test_a_copy_of_shared_weights_counts_against_the_cap_of_the_stage_holding_it() -> None:
    # l0 and l3 call one embedding of 2 MiB (8 MiB of state): the last stage holds a copy
    layers = [LayerCost(f"l{i}", 1.0, 1.0, 2**20 if i else 2 * 2**20, 0, 0) for i in range(4)]
    costs = CostModel(tuple(layers), shared=((0, 3),))
    for bounds in ((0, 1, 4), (0, 2, 4), (0, 3, 4)):
        peaks = peak_memory_estimate(costs, Partition(bounds), 4, pipeline="interleaved",
                                     recompute=False)  # fmt: skip
        assert peaks[1] == 4 * 2**20 * (4 - bounds[1]) + 8 * 2**20  # its layers and the copy
    # without the copy (0, 2, 4) would fit 12 MiB on both stages; with it the last needs 16
    found = solve_speed(costs, 2, 4, memory_cap=16 * 2**20)
    assert found.bounds == (0, 2, 4)
    assert max(peak_memory_estimate(costs, found, 4, pipeline="interleaved",
                                    recompute=False)) <= 16 * 2**20  # fmt: skip
    with pytest.raises(InfeasibleError) as info:
        solve_speed(costs, 2, 4, memory_cap=16 * 2**20 - 1)
    assert info.value.smallest_cap == 16 * 2**20  # (0, 2, 4) and (0, 3, 4) both need it


# ---- virtual stages ---------------------------------------------------------------------


@st.composite
def virtual_problems(draw: st.DrawFn) -> tuple[CostModel, int, int, int]:
    """(costs, K, M, v) with K v <= L and M a whole number of rounds."""
    costs = draw(cost_models(max_layers=9).filter(lambda c: c.num_layers >= 4))
    K = draw(st.integers(2, costs.num_layers // 2))
    v = draw(st.integers(2, costs.num_layers // K))
    M = draw(st.integers(1, 8).filter(lambda M: M % max(1, M // K) == 0))
    return costs, K, M, v


def test_chunks_in_flight_are_counted_on_the_schedule() -> None:
    # rank 0: 0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 ..., rank 1: 1F0 1F1 3F0 3B0 3F1 ...
    assert in_flight("interleaved", 2, 4, virtual_stages=2) == (4, 3, 2, 1)
    assert pending_weights("interleaved", 2, 4, virtual_stages=2) == (0, 0, 0, 0)


@settings(max_examples=60, deadline=None)
@given(virtual_problems())
def test_uncapped_chunks_are_the_fastest_cut_into_k_v_parts(
    problem: tuple[CostModel, int, int, int],
) -> None:
    costs, K, M, v = problem
    found = solve_speed(costs, K, M, virtual_stages=v)
    assert found == solve_speed(costs, K * v, M)
    best = min(step_time_estimate(costs, p, M) for p in all_partitions(costs.num_layers, K * v))
    assert same(step_time_estimate(costs, found, M), best)


@settings(max_examples=60, deadline=None)
@given(virtual_problems(), st.floats(0.5, 1.5), st.booleans())
def test_chunks_under_a_cap_fit_it_on_every_rank(
    problem: tuple[CostModel, int, int, int], scale: float, recompute: bool
) -> None:
    costs, K, M, v = problem
    fastest = solve_speed(costs, K, M, virtual_stages=v)
    ranks = peak_memory_estimate(
        costs, fastest, M, pipeline="interleaved", recompute=False, virtual_stages=v
    )
    cap = int(max(ranks) * scale)
    optimize = "memory" if recompute else "speed"
    try:
        found = solve(costs, K, M, optimize=optimize, memory_cap=cap, virtual_stages=v)
    except InfeasibleError as error:
        assert error.smallest_cap > cap
        return
    peaks = peak_memory_estimate(
        costs, found, M, pipeline="interleaved", recompute=recompute, virtual_stages=v
    )
    assert max(peaks) <= cap
    if not recompute and max(ranks) <= cap:  # the fastest fits: it is kept
        assert found == fastest


@settings(max_examples=60, deadline=None)
@given(virtual_problems(), st.booleans())
def test_peak_memory_estimate_on_virtual_stages_equals_the_simulator(
    problem: tuple[CostModel, int, int, int], recompute: bool
) -> None:
    costs, K, M, v = problem
    partition = next(all_partitions(costs.num_layers, K * v))
    schedule = build("interleaved", K, M, virtual_stages=v)
    simulated = simulate(costs, partition, schedule, recompute=recompute, virtual_stages=v)
    assert simulated.peak_memory == peak_memory_estimate(
        costs, partition, M, pipeline="interleaved", recompute=recompute, virtual_stages=v
    )
    assert len(simulated.peak_memory) == K


def test_an_infeasible_cap_on_virtual_stages_says_how_chunks_were_capped() -> None:
    layers = tuple(LayerCost(f"l{i}", 1.0, 1.0, 2**20, 0, 0) for i in range(4))
    costs = CostModel(layers)  # 4 MiB of state per layer: 8 MiB a rank, whatever the cut
    assert solve_speed(costs, 2, 4, memory_cap=8 * 2**20, virtual_stages=2).bounds == (
        0, 1, 2, 3, 4
    )  # fmt: skip
    with pytest.raises(InfeasibleError) as info:
        solve_speed(costs, 2, 4, memory_cap=7 * 2**20, virtual_stages=2)
    assert str(info.value) == (
        "no partition into 2 stages x 2 virtual stages fits the memory cap; with each chunk "
        "given 1/2 of the cap, the smallest cap that fits is 8388608 bytes (8.00 MiB). "
        "Received: memory_cap=7340032 (7.00 MiB)"
    )


def test_virtual_stages_need_k_v_layers_and_no_objective() -> None:
    with pytest.raises(ValueError) as info:
        solve_speed(chain([1.0, 1.0, 1.0]), 2, 2, virtual_stages=2)
    assert str(info.value) == (
        "too few layers to split into partitions (layers: 3, partitions: 2 x virtual_stages: "
        "2 = 4 chunks)"
    )
    with pytest.raises(ValueError) as info:
        solve_speed(chain([1.0] * 4), 2, 2, virtual_stages=2, objective=lambda p: 0.0)
    assert str(info.value) == (
        "an objective (work of its own on stage 0) is planned for one chunk per rank: solve "
        "with virtual_stages=1, or without it. Received: virtual_stages=2 with an objective"
    )
    with pytest.raises(ValueError, match="Received: pipeline='simple', virtual_stages=2"):
        solve(chain([1.0] * 4), 2, 2, pipeline="simple", virtual_stages=2)

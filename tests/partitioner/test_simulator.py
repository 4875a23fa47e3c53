import doctest
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import partitioner.simulator
from partitioner.costs import CostModel, LayerCost
from partitioner.partition import Partition
from partitioner.schedule import Action, Kind, Schedule, add_communication, build, forward_only
from partitioner.simulator import (
    Event,
    bubble_fraction,
    busy_seconds,
    peak_memory,
    simulate,
    simulate_plan,
    stage_memory,
    stage_times,
)


def two_layers() -> CostModel:
    """Unbalanced stages and a 1-second cut: the hand-computed examples below."""
    return CostModel(
        (
            LayerCost("a", 1.0, 2.0, param_bytes=10, activation_bytes=5, output_bytes=100),
            LayerCost("b", 2.0, 3.0, param_bytes=20, activation_bytes=7, output_bytes=0),
        ),
        bandwidth=100.0,
    )


def timeline(
    costs: CostModel, pipeline: str, recompute: bool = False
) -> list[tuple[str, float, float]]:
    result = simulate(costs, Partition((0, 1, 2)), build(pipeline, 2, 2), recompute=recompute)
    return [(str(e.action), e.start, e.end) for e in result.events]


def test_simple_unbalanced_with_transfers_matches_hand_computation() -> None:
    result = simulate(two_layers(), Partition((0, 1, 2)), build("simple", 2, 2))
    # The last stage runs each backward right after its forward, so 0B0 starts at 8, not 10.
    assert [(str(e.action), e.start, e.end) for e in result.events] == [
        ("0F0", 0.0, 1.0), ("0F1", 1.0, 2.0), ("1F0", 2.0, 4.0), ("1B0", 4.0, 7.0),
        ("1F1", 7.0, 9.0), ("0B0", 8.0, 10.0), ("1B1", 9.0, 12.0), ("0B1", 13.0, 15.0),
    ]  # fmt: skip
    assert result.step_time == 15.0
    assert result.busy == (6.0, 10.0)
    assert result.idle == (9.0, 5.0)
    assert result.bubble_fraction == pytest.approx(1 - 16 / 30)


def all_forwards_first(K: int, M: int) -> Schedule:
    """Textbook GPipe: the last stage too runs all its forwards before any backward."""
    return {
        s: [Action(s, kind, m) for kind in (Kind.FORWARD, Kind.BACKWARD) for m in range(M)]
        for s in range(K)
    }


def test_simple_keeps_one_microbatch_on_the_last_stage() -> None:
    costs, partition = two_layers(), Partition((0, 1, 2))
    ours = simulate(costs, partition, build("simple", 2, 4))
    textbook = simulate(costs, partition, all_forwards_first(2, 4))
    assert ours.peak_memory == (40 + 4 * 5, 80 + 7)
    assert textbook.peak_memory == (40 + 4 * 5, 80 + 4 * 7)


@settings(max_examples=80, deadline=None)
@given(
    st.integers(2, 5),
    st.integers(1, 8),
    st.lists(st.floats(0.1, 5.0), min_size=10, max_size=10),
    st.floats(0.0, 3.0),
)
def test_simple_is_never_slower_than_all_forwards_first(
    K: int, M: int, times: list[float], cut: float
) -> None:
    layers = tuple(LayerCost(f"l{s}", times[2 * s], times[2 * s + 1], 0, 0, 100) for s in range(K))
    costs = CostModel(layers, bandwidth=100.0 / cut if cut else math.inf)
    partition = Partition(tuple(range(K + 1)))
    ours = simulate(costs, partition, build("simple", K, M)).step_time
    assert ours <= simulate(costs, partition, all_forwards_first(K, M)).step_time + 1e-9


def test_interleaved_unbalanced_with_transfers_matches_hand_computation() -> None:
    assert timeline(two_layers(), "interleaved") == [
        ("0F0", 0.0, 1.0), ("0F1", 1.0, 2.0), ("1F0", 2.0, 4.0), ("1B0", 4.0, 7.0),
        ("1F1", 7.0, 9.0), ("0B0", 8.0, 10.0), ("1B1", 9.0, 12.0), ("0B1", 13.0, 15.0),
    ]  # fmt: skip


def test_recompute_adds_the_stage_forward_to_each_backward() -> None:
    assert timeline(two_layers(), "interleaved", recompute=True) == [
        ("0F0", 0.0, 1.0), ("0F1", 1.0, 2.0), ("1F0", 2.0, 4.0), ("1B0", 4.0, 9.0),
        ("1F1", 9.0, 11.0), ("0B0", 10.0, 13.0), ("1B1", 11.0, 16.0), ("0B1", 17.0, 20.0),
    ]  # fmt: skip


@pytest.mark.parametrize(
    "pipeline, recompute, expected",
    [
        ("simple", False, (40 + 2 * 5, 80 + 1 * 7)),
        ("interleaved", False, (40 + 2 * 5, 80 + 1 * 7)),
        ("simple", True, (40 + 5, 80 + 1 * 100 + 7)),
        ("interleaved", True, (40 + 5, 80 + 1 * 100 + 7)),
    ],
)
def test_peak_memory_counts_state_and_activations_in_flight(
    pipeline: str, recompute: bool, expected: tuple[int, int]
) -> None:
    result = simulate(
        two_layers(), Partition((0, 1, 2)), build(pipeline, 2, 2), recompute=recompute
    )
    assert result.peak_memory == expected


def test_forward_only_keeps_nothing_between_microbatches() -> None:
    costs = two_layers()
    result = simulate(costs, Partition((0, 1, 2)), forward_only(2, 3))
    assert result.peak_memory == (40 + 5, 80 + 7)
    assert result.step_time == 1 + 1 + 2 * 3  # stage 0 forward, the cut, three stage-1 forwards


def test_transfer_actions_do_not_change_the_result() -> None:
    costs, partition = two_layers(), Partition((0, 1, 2))
    schedule = build("interleaved", 2, 3)
    assert simulate(costs, partition, add_communication(schedule)) == simulate(
        costs, partition, schedule
    )


def test_stage_helpers_read_the_prefix_sums() -> None:
    costs, partition = two_layers(), Partition((0, 1, 2))
    assert stage_times(costs, partition) == ((1.0, 2.0), (2.0, 3.0))
    assert stage_memory(costs, partition, 1) == (80, 7, 100)
    assert peak_memory(costs, partition, build("simple", 2, 1)) == (45, 87)


@settings(max_examples=80, deadline=None)
@given(
    st.integers(1, 6),
    st.integers(1, 10),
    st.sampled_from(["simple", "interleaved"]),
    st.floats(0.1, 5.0),
    st.floats(0.1, 5.0),
)
def test_balanced_stages_without_transfers_give_the_textbook_bubble(
    K: int, M: int, pipeline: str, forward: float, backward: float
) -> None:
    layers = tuple(LayerCost(f"l{s}", forward, backward, 0, 0, 10) for s in range(K))
    costs = CostModel(layers, bandwidth=math.inf)
    result = simulate(costs, Partition(tuple(range(K + 1))), build(pipeline, K, M))
    assert result.step_time == pytest.approx((M + K - 1) * (forward + backward))
    assert result.bubble_fraction == pytest.approx((K - 1) / (M + K - 1), abs=1e-9)


def test_partition_must_fit_costs_and_schedule() -> None:
    costs = two_layers()
    with pytest.raises(ValueError, match="cover all 2 layers"):
        simulate(costs, Partition((0, 1)), build("simple", 1, 1))
    with pytest.raises(ValueError, match=r"one row per stage \(2\)\. Received: rows=3"):
        simulate(costs, Partition((0, 1, 2)), build("simple", 3, 1))


def test_docstring_examples_run() -> None:
    assert doctest.testmod(partitioner.simulator).failed == 0


def test_busy_seconds_counts_only_forwards_and_backwards_per_stage() -> None:
    events = [
        Event(0, Action.parse("0F0"), 0.0, 2.0),
        Event(0, Action.parse("0SF0"), 2.0, 2.5),  # a transfer: not computing
        Event(1, Action.parse("1RF0"), 0.0, 2.5),
        Event(1, Action.parse("1F0"), 2.5, 3.0),
        Event(1, Action.parse("1B0"), 3.0, 4.0),
        Event(0, Action.parse("0B0"), 4.0, 7.0),
    ]
    busy = busy_seconds(events, 2)
    assert busy == (5.0, 1.5)
    assert bubble_fraction(busy, 7.0) == pytest.approx(1 - 6.5 / 14)
    assert bubble_fraction((0.0, 0.0), 0.0) == 0.0


def test_the_runtimes_cost_per_action_lengthens_every_forward_and_backward() -> None:
    layers = tuple(LayerCost(f"l{i}", 1.0, 2.0, 0, 0, 0) for i in range(2))
    plain = simulate(CostModel(layers), Partition((0, 1, 2)), build("interleaved", 2, 4))
    costs = CostModel(layers, action_overhead=0.5)
    charged = simulate(costs, Partition((0, 1, 2)), build("interleaved", 2, 4))
    assert (plain.step_time, charged.step_time) == (15.0, 20.0)  # (M + K - 1) x (F + B)
    assert stage_times(costs, Partition((0, 1, 2))) == ((1.5, 2.5), (1.5, 2.5))
    assert CostModel.from_json(costs.to_json()) == costs


def test_a_recomputing_backward_pays_the_forwards_compute_but_not_its_overhead() -> None:
    # the recomputed forward runs inside the backward's call: one action's overhead, not two
    layers = tuple(LayerCost(f"l{i}", 1.0, 2.0, 0, 0, 0) for i in range(2))
    costs = CostModel(layers, action_overhead=0.5)
    recomputed = simulate(costs, Partition((0, 1, 2)), build("interleaved", 2, 4), recompute=True)
    assert recomputed.step_time == 25.0  # (M + K - 1) x (F 1.5 + B 2.5 + the forward's 1.0)


def test_shared_weights_add_their_copy_and_one_gradient_exchange_a_training_step() -> None:
    # a and b call the same weights (10 bytes at a): stage 1 holds a copy of a's state
    tied = CostModel(two_layers().layers, bandwidth=100.0, latency=0.25, shared=((0, 1),))
    plain = CostModel(two_layers().layers, bandwidth=100.0, latency=0.25)
    partition, schedule = Partition((0, 1, 2)), build("interleaved", 2, 2)
    assert stage_memory(tied, partition, 1)[0] == stage_memory(plain, partition, 1)[0] + 4 * 10
    assert stage_memory(tied, partition, 0) == stage_memory(plain, partition, 0)
    trained, untied = simulate(tied, partition, schedule), simulate(plain, partition, schedule)
    assert trained.step_time == untied.step_time + 0.25 + 10 / 100.0
    assert trained.peak_memory == (untied.peak_memory[0], untied.peak_memory[1] + 40)
    forward = forward_only(2, 2)  # no backward: nothing to exchange
    assert simulate(tied, partition, forward).step_time == simulate(plain, partition,
                                                                     forward).step_time  # fmt: skip
    one_stage = Partition((0, 2))
    assert stage_memory(tied, one_stage, 0)[0] == stage_memory(plain, one_stage, 0)[0]


def test_zero_bubble_unbalanced_with_transfers_matches_hand_computation() -> None:
    # stage 1 splits b's backward (3 s) into B and W of 1.5 s each and sends its input
    # gradients after B; stage 0's B is its whole backward and its W empty
    assert timeline(two_layers(), "zero_bubble") == [
        ("0F0", 0.0, 1.0), ("0F1", 1.0, 2.0), ("1F0", 2.0, 4.0), ("1B0", 4.0, 5.5),
        ("1F1", 5.5, 7.5), ("0B0", 6.5, 8.5), ("1B1", 7.5, 9.0), ("0W0", 8.5, 8.5),
        ("1W0", 9.0, 10.5), ("0B1", 10.0, 12.0), ("1W1", 10.5, 12.0), ("0W1", 12.0, 12.0),
    ]  # fmt: skip
    assert simulate(two_layers(), Partition((0, 1, 2)), build("interleaved", 2, 2)).step_time == 15


def test_zero_bubble_recomputing_runs_as_1f1b() -> None:
    steps = [
        [(a, s, e) for a, s, e in timeline(two_layers(), pipeline, recompute=True) if "W" not in a]
        for pipeline in ("zero_bubble", "interleaved")
    ]
    assert steps[0] == steps[1]


@pytest.mark.parametrize(
    "recompute, expected",
    # stage 1 keeps 2 microbatches' activations (7) until W, and the output gradients of
    # its layer with weights (3) from B to W; stage 0 and a recomputing stage 1 as 1F1B
    [(False, (40 + 2 * 5, 80 + 2 * 7 + 2 * 3)), (True, (40 + 5, 80 + 1 * 100 + 7))],
)
def test_a_split_backward_keeps_activations_and_output_gradients_until_w(
    recompute: bool, expected: tuple[int, int]
) -> None:
    first = two_layers().layers[0]
    costs = CostModel((first, LayerCost("b", 2.0, 3.0, 20, 7, 3)), bandwidth=100.0)
    result = simulate(costs, Partition((0, 1, 2)), build("zero_bubble", 2, 2), recompute=recompute)
    assert result.peak_memory == expected


# ---- virtual stages ---------------------------------------------------------------------


def four_chunks(shared: tuple[tuple[int, ...], ...] = ()) -> CostModel:
    """Four layers, each a chunk on 2 stages x 2 virtual stages: F 1 s, B 2 s, a 0.5 s cut."""
    layers = tuple(LayerCost(f"l{i}", 1.0, 2.0, 10 * (i + 1), i + 1, 50) for i in range(4))
    return CostModel(layers, bandwidth=100.0, shared=shared)


def test_virtual_stages_charge_a_transfer_at_every_chunk_boundary() -> None:
    costs = four_chunks()
    result = simulate_plan(costs, Partition((0, 1, 2, 3, 4)), 1, pipeline="interleaved",
                           virtual_stages=2)  # fmt: skip
    # each event's stage is its rank, each action's the chunk: 0 and 2 on rank 0
    assert [(str(e.action), e.stage, e.start, e.end) for e in result.events] == [
        ("0F0", 0, 0.0, 1.0), ("1F0", 1, 1.5, 2.5), ("2F0", 0, 3.0, 4.0), ("3F0", 1, 4.5, 5.5),
        ("3B0", 1, 5.5, 7.5), ("2B0", 0, 8.0, 10.0), ("1B0", 1, 10.5, 12.5),
        ("0B0", 0, 13.0, 15.0),
    ]  # fmt: skip
    # three cuts each way against one for 1F1B on two stages of two layers
    one_chunk = simulate_plan(costs, Partition((0, 2, 4)), 1, pipeline="interleaved")
    assert (result.step_time, one_chunk.step_time) == (15.0, 13.0)
    assert result.busy == one_chunk.busy == (6.0, 6.0)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 5), st.integers(2, 4), st.integers(1, 16))
def test_virtual_stages_divide_the_bubble_by_v(K: int, v: int, M: int) -> None:
    # equal chunks (F 1, B 2), no transfer time: Megatron's (K - 1)(t_f + t_b) / v of bubble
    # for a rank's t_f = v, t_b = 2 v, so a step of (v M + K - 1) 3 ticks, where M >= K
    if M < K or M % max(1, M // K):
        return
    costs = CostModel(tuple(LayerCost(f"l{i}", 1.0, 2.0, 0, 0, 0) for i in range(K * v)))
    partition = Partition(tuple(range(K * v + 1)))
    result = simulate_plan(costs, partition, M, pipeline="interleaved", virtual_stages=v)
    assert result.step_time == 3 * (v * M + K - 1)
    assert result.bubble_fraction == pytest.approx((K - 1) / (v * M + K - 1))


def test_a_rank_holds_its_chunks_state_and_their_microbatches_in_flight() -> None:
    result = simulate_plan(four_chunks(), Partition((0, 1, 2, 3, 4)), 2, pipeline="interleaved",
                           virtual_stages=2)  # fmt: skip
    # rank 0: 0F0 0F1 2F0 2F1 2B0 ..., two microbatches of chunks 0 and 2 at 2F1; rank 1:
    # 1F0 1F1 3F0 3B0 ..., two of chunk 1 and one of chunk 3; state: 4 x param bytes
    assert result.peak_memory == (4 * (10 + 30) + 2 * 1 + 2 * 3, 4 * (20 + 40) + 2 * 2 + 4)


def test_a_shared_weight_is_one_copy_per_rank_however_many_of_its_chunks_call_it() -> None:
    partition = Partition((0, 1, 2, 3, 4))
    plain = simulate_plan(four_chunks(), partition, 2, pipeline="interleaved", virtual_stages=2)
    # layers 0 and 2 are chunks 0 and 2, both on rank 0: no copy, nothing to exchange
    same = simulate_plan(four_chunks(((0, 2),)), partition, 2, pipeline="interleaved",
                         virtual_stages=2)  # fmt: skip
    assert (same.peak_memory, same.step_time) == (plain.peak_memory, plain.step_time)
    # layers 0 and 1: rank 1 holds a copy of layer 0's state, and the gradients cross
    apart = simulate_plan(four_chunks(((0, 1),)), partition, 2, pipeline="interleaved",
                          virtual_stages=2)  # fmt: skip
    assert apart.peak_memory == (plain.peak_memory[0], plain.peak_memory[1] + 4 * 10)
    assert apart.step_time == pytest.approx(plain.step_time + 10 / 100.0)


def test_the_partition_holds_k_v_chunks_for_k_rows() -> None:
    costs, schedule = four_chunks(), build("interleaved", 2, 2, virtual_stages=2)
    with pytest.raises(ValueError, match=r"one row per stage \(4\)\. Received: rows=2"):
        simulate(costs, Partition((0, 1, 2, 3, 4)), schedule)
    with pytest.raises(ValueError, match=r"\(3\) over 2 virtual stages\. Received: rows=2"):
        simulate(costs, Partition((0, 1, 2, 4)), schedule, virtual_stages=2)

import doctest

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import partitioner.schedule
from partitioner.schedule import (
    Action,
    Kind,
    Schedule,
    ScheduleError,
    add_communication,
    build,
    format_schedule,
    forward_only,
    interleaved,
    rounds_of,
    simple,
    splits_backward,
    splits_stage,
    validate,
    virtual,
    zero_bubble,
)


def rows(schedule: Schedule) -> list[list[str]]:
    return [[str(a) for a in schedule[s]] for s in sorted(schedule)]


def parse(*rows: str) -> Schedule:
    return {s: [Action.parse(a) for a in row.split()] for s, row in enumerate(rows)}


def test_action_prints_stage_kind_microbatch() -> None:
    assert str(Action(1, Kind.FORWARD, 3)) == "1F3"
    assert str(Action(0, Kind.WEIGHT, 2)) == "0W2"
    assert str(Action(2, Kind.SEND_B, 0)) == "2SB0"
    assert str(Action(10, Kind.RECV_F, 12)) == "10RF12"


@given(st.integers(0, 99), st.sampled_from(list(Kind)), st.integers(0, 999))
def test_parse_round_trips(stage: int, kind: Kind, microbatch: int) -> None:
    action = Action(stage, kind, microbatch)
    assert Action.parse(str(action)) == action


@pytest.mark.parametrize("text", ["", "1X3", "F3", "1F", "-1F0", "1 F 3", "1F3x"])
def test_parse_rejects_bad_strings_naming_them(text: str) -> None:
    with pytest.raises(ValueError, match=f"Received: text={text!r}"):
        Action.parse(text)


def test_action_rejects_negative_indices() -> None:
    with pytest.raises(ValueError, match="Received: stage=-1, microbatch=0"):
        Action(-1, Kind.FORWARD, 0)


def test_simple_reference_k2_m3() -> None:
    # the last stage runs each backward right after its forward
    assert rows(simple(2, 3)) == [
        ["0F0", "0F1", "0F2", "0B0", "0B1", "0B2"],
        ["1F0", "1B0", "1F1", "1B1", "1F2", "1B2"],
    ]


def test_interleaved_reference_k2_m3() -> None:
    assert rows(interleaved(2, 3)) == [
        ["0F0", "0F1", "0B0", "0F2", "0B1", "0B2"],
        ["1F0", "1B0", "1F1", "1B1", "1F2", "1B2"],
    ]


def test_interleaved_reference_k3_m4() -> None:
    assert rows(interleaved(3, 4)) == [
        ["0F0", "0F1", "0F2", "0B0", "0F3", "0B1", "0B2", "0B3"],
        ["1F0", "1F1", "1B0", "1F2", "1B1", "1F3", "1B2", "1B3"],
        ["2F0", "2B0", "2F1", "2B1", "2F2", "2B2", "2F3", "2B3"],
    ]


def test_zero_bubble_reference_k2_m3() -> None:
    # stage 1 defers each W by one B; stage 0's W follows its B at once
    assert rows(zero_bubble(2, 3)) == [
        ["0F0", "0F1", "0B0", "0W0", "0F2", "0B1", "0W1", "0B2", "0W2"],
        ["1F0", "1B0", "1F1", "1B1", "1W0", "1F2", "1B2", "1W1", "1W2"],
    ]


def test_zero_bubble_reference_k3_m4() -> None:
    assert rows(zero_bubble(3, 4)) == [
        ["0F0", "0F1", "0F2", "0B0", "0W0", "0F3", "0B1", "0W1", "0B2", "0W2", "0B3", "0W3"],
        ["1F0", "1F1", "1B0", "1F2", "1B1", "1W0", "1F3", "1B2", "1W1", "1B3", "1W2", "1W3"],
        ["2F0", "2B0", "2F1", "2B1", "2F2", "2B2", "2W0", "2F3", "2B3", "2W1", "2W2", "2W3"],
    ]


def test_zero_bubble_reference_k4_m2() -> None:
    # fewer microbatches than stages: the later stages' W's all wait for the end
    assert rows(zero_bubble(4, 2)) == [
        ["0F0", "0F1", "0B0", "0W0", "0B1", "0W1"],
        ["1F0", "1F1", "1B0", "1B1", "1W0", "1W1"],
        ["2F0", "2F1", "2B0", "2B1", "2W0", "2W1"],
        ["3F0", "3B0", "3F1", "3B1", "3W0", "3W1"],
    ]


def test_zero_bubble_with_communication_reference_k2_m3() -> None:
    # a W sends and receives nothing
    assert rows(add_communication(zero_bubble(2, 3))) == [
        ["0F0", "0SF0", "0F1", "0SF1", "0RB0", "0B0", "0W0", "0F2", "0SF2",
         "0RB1", "0B1", "0W1", "0RB2", "0B2", "0W2"],
        ["1RF0", "1F0", "1B0", "1SB0", "1RF1", "1F1", "1B1", "1SB1", "1W0",
         "1RF2", "1F2", "1B2", "1SB2", "1W1", "1W2"],
    ]  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 8), st.integers(1, 12))
def test_zero_bubble_runs_1f1bs_forwards_and_backwards_and_defers_w_by_s(K: int, M: int) -> None:
    for s, row in zero_bubble(K, M).items():
        assert [a for a in row if a.kind is not Kind.WEIGHT] == interleaved(K, M)[s]
        weights = [a.microbatch for a in row if a.kind is Kind.WEIGHT]
        assert weights == list(range(M))
        for m in range(M - s):  # W of m right after the B of m + s
            at = row.index(Action(s, Kind.BACKWARD, m + s))
            assert row[at + 1] == Action(s, Kind.WEIGHT, m)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 8), st.integers(1, 12))
def test_zero_bubble_holds_at_most_min_k_m_from_forward_to_weights(K: int, M: int) -> None:
    for row in zero_bubble(K, M).values():
        held = peak = 0
        for a in row:
            held += {Kind.FORWARD: 1, Kind.WEIGHT: -1}.get(a.kind, 0)
            peak = max(peak, held)
        assert peak == min(K, M)


def test_zero_bubble_reference_k3_m4_deferring_one_w_on_the_last_stage() -> None:
    # stage 1 runs each W right after its B, as 1F1B's backward but with its input
    # gradients sent first; stage 2 defers one W, as ZB-H1's stage 1
    assert rows(zero_bubble(3, 4, deferred=(0, 0, 1))) == [
        ["0F0", "0F1", "0F2", "0B0", "0W0", "0F3", "0B1", "0W1", "0B2", "0W2", "0B3", "0W3"],
        ["1F0", "1F1", "1B0", "1W0", "1F2", "1B1", "1W1", "1F3", "1B2", "1W2", "1B3", "1W3"],
        ["2F0", "2B0", "2F1", "2B1", "2W0", "2F2", "2B2", "2W1", "2F3", "2B3", "2W2", "2W3"],
    ]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 10), st.data())
def test_zero_bubble_defers_each_stages_w_by_its_own_count_and_holds_k_minus_s_plus_it(
    K: int, M: int, data: st.DataObject
) -> None:
    deferred = tuple(data.draw(st.integers(0, s)) for s in range(K))
    schedule = zero_bubble(K, M, deferred)
    validate(schedule, M)
    for s, row in schedule.items():
        d = deferred[s]
        assert [a for a in row if a.kind is not Kind.WEIGHT] == interleaved(K, M)[s]
        assert [a.microbatch for a in row if a.kind is Kind.WEIGHT] == list(range(M))
        for m in range(M - d):  # W of m right after the B of m + d
            assert row[row.index(Action(s, Kind.BACKWARD, m + d)) + 1] == Action(s, Kind.WEIGHT, m)
        held = peak = 0
        for a in row:
            held += {Kind.FORWARD: 1, Kind.WEIGHT: -1}.get(a.kind, 0)
            peak = max(peak, held)
        assert peak == min(K - s + d, M)


@pytest.mark.parametrize(
    "deferred, received",
    [
        ((0, 2), "[0, 2]"),  # more than s
        ((0, -1), "[0, -1]"),
        ((0,), "[0]"),  # one per stage
        ((0, True), "[0, True]"),
    ],
)
def test_a_deferral_beyond_zb_h1_or_of_another_length_is_refused(
    deferred: tuple[int, ...], received: str
) -> None:
    message = (
        "deferred must list the W's each of the 2 stages defers, an integer from 0 to s on "
        f"stage s (ZB-H1: [0, 1]). Received: deferred={received}"
    )
    with pytest.raises(ValueError) as info:
        zero_bubble(2, 4, deferred)
    assert str(info.value) == message


def test_only_the_zero_bubble_schedule_takes_a_deferral() -> None:
    assert build("zero_bubble", 2, 2, deferred=(0, 1)) == zero_bubble(2, 2)
    with pytest.raises(ValueError) as info:
        build("interleaved", 2, 2, deferred=(0, 0))
    assert str(info.value) == (
        "deferred (the W's each stage defers) shapes the zero-bubble schedule only. "
        "Received: pipeline='interleaved', deferred=[0, 0]"
    )


def test_which_stages_split_their_backward() -> None:
    assert splits_backward(zero_bubble(2, 2)) and not splits_backward(interleaved(2, 2))
    assert [splits_stage(s, recompute=False) for s in range(3)] == [False, True, True]
    assert not splits_stage(1, recompute=True)


def test_simple_reference_k3_m4() -> None:
    assert rows(simple(3, 4)) == [
        [f"{s}F{m}" for m in range(4)] + [f"{s}B{m}" for m in range(4)] for s in range(2)
    ] + [["2F0", "2B0", "2F1", "2B1", "2F2", "2B2", "2F3", "2B3"]]


def test_interleaved_with_fewer_microbatches_than_stages_warms_up_all() -> None:
    assert rows(interleaved(4, 2))[0] == ["0F0", "0F1", "0B0", "0B1"]


def test_simple_with_communication_reference_k2_m3() -> None:
    assert rows(add_communication(simple(2, 3))) == [
        ["0F0", "0SF0", "0F1", "0SF1", "0F2", "0SF2",
         "0RB0", "0B0", "0RB1", "0B1", "0RB2", "0B2"],
        ["1RF0", "1F0", "1B0", "1SB0", "1RF1", "1F1", "1B1", "1SB1",
         "1RF2", "1F2", "1B2", "1SB2"],
    ]  # fmt: skip


def test_interleaved_with_communication_reference_k2_m3() -> None:
    assert rows(add_communication(interleaved(2, 3))) == [
        ["0F0", "0SF0", "0F1", "0SF1", "0RB0", "0B0", "0F2", "0SF2",
         "0RB1", "0B1", "0RB2", "0B2"],
        ["1RF0", "1F0", "1B0", "1SB0", "1RF1", "1F1", "1B1", "1SB1",
         "1RF2", "1F2", "1B2", "1SB2"],
    ]  # fmt: skip


def test_interleaved_with_communication_reference_k3_m4() -> None:
    assert rows(add_communication(interleaved(3, 4))) == [
        ["0F0", "0SF0", "0F1", "0SF1", "0F2", "0SF2", "0RB0", "0B0", "0F3", "0SF3",
         "0RB1", "0B1", "0RB2", "0B2", "0RB3", "0B3"],
        ["1RF0", "1F0", "1SF0", "1RF1", "1F1", "1SF1", "1RB0", "1B0", "1SB0",
         "1RF2", "1F2", "1SF2", "1RB1", "1B1", "1SB1", "1RF3", "1F3", "1SF3",
         "1RB2", "1B2", "1SB2", "1RB3", "1B3", "1SB3"],
        ["2RF0", "2F0", "2B0", "2SB0", "2RF1", "2F1", "2B1", "2SB1",
         "2RF2", "2F2", "2B2", "2SB2", "2RF3", "2F3", "2B3", "2SB3"],
    ]  # fmt: skip


def test_simple_with_communication_reference_k3_m4() -> None:
    middle = rows(add_communication(simple(3, 4)))[1]
    assert middle == (
        [x for m in range(4) for x in (f"1RF{m}", f"1F{m}", f"1SF{m}")]
        + [x for m in range(4) for x in (f"1RB{m}", f"1B{m}", f"1SB{m}")]
    )


def test_forward_only_runs_forwards_in_order() -> None:
    assert rows(forward_only(2, 3)) == [["0F0", "0F1", "0F2"], ["1F0", "1F1", "1F2"]]
    assert rows(add_communication(forward_only(2, 2))) == [
        ["0F0", "0SF0", "0F1", "0SF1"],
        ["1RF0", "1F0", "1RF1", "1F1"],
    ]


def test_build_dispatches_and_lists_allowed_pipelines() -> None:
    assert build("simple", 2, 3) == simple(2, 3)
    assert build("interleaved", 2, 3) == interleaved(2, 3)
    assert build("zero_bubble", 2, 3) == zero_bubble(2, 3)
    assert build("interleaved", 2, 3, forward_only=True) == forward_only(2, 3)
    assert build("zero_bubble", 2, 3, forward_only=True) == forward_only(2, 3)
    with pytest.raises(
        ValueError,
        match=r"one of \['simple', 'interleaved', 'zero_bubble'\]. Received: pipeline='1f1b'",
    ):
        build("1f1b", 2, 3)


def test_builders_reject_empty_pipelines() -> None:
    with pytest.raises(ValueError, match="Received: K=0, M=3"):
        simple(0, 3)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 6),
    st.integers(1, 8),
    st.sampled_from(["simple", "interleaved", "zero_bubble"]),
    st.booleans(),
    st.booleans(),
)
def test_built_schedules_validate(
    K: int, M: int, pipeline: str, only_forward: bool, communicate: bool
) -> None:
    schedule = build(pipeline, K, M, forward_only=only_forward)
    validate(add_communication(schedule) if communicate else schedule, M)


# ---- virtual stages: Megatron-LM's interleaved 1F1B ------------------------------------


def test_interleaved_on_virtual_stages_reference_k2_v2_m4() -> None:
    # rank 0 runs chunks 0 and 2, rank 1 chunks 1 and 3; each chunk takes P = 2
    # microbatches in turn, forwards in chunk order and backwards in reverse; rank 0 warms
    # up with (v - 1) P + 2 (K - 1) = 4 forwards, rank 1 with 2
    assert rows(interleaved(2, 4, 2)) == [
        ["0F0", "0F1", "2F0", "2F1", "0F2", "2B0", "0F3", "2B1",
         "2F2", "0B0", "2F3", "0B1", "2B2", "2B3", "0B2", "0B3"],
        ["1F0", "1F1", "3F0", "3B0", "3F1", "3B1", "1F2", "1B0",
         "1F3", "1B1", "3F2", "3B2", "3F3", "3B3", "1B2", "1B3"],
    ]  # fmt: skip


def test_interleaved_on_virtual_stages_reference_k4_v2_m4() -> None:
    # M = K: one round, so rank 0's warm-up (v - 1) 4 + 2 x 3 = 10 is capped at all 8
    assert rows(interleaved(4, 4, 2)) == [
        ["0F0", "0F1", "0F2", "0F3", "4F0", "4F1", "4F2", "4F3",
         "4B0", "4B1", "4B2", "4B3", "0B0", "0B1", "0B2", "0B3"],
        ["1F0", "1F1", "1F2", "1F3", "5F0", "5F1", "5F2", "5F3",
         "5B0", "5B1", "5B2", "5B3", "1B0", "1B1", "1B2", "1B3"],
        ["2F0", "2F1", "2F2", "2F3", "6F0", "6F1", "6F2", "6B0",
         "6F3", "6B1", "6B2", "6B3", "2B0", "2B1", "2B2", "2B3"],
        ["3F0", "3F1", "3F2", "3F3", "7F0", "7B0", "7F1", "7B1",
         "7F2", "7B2", "7F3", "7B3", "3B0", "3B1", "3B2", "3B3"],
    ]  # fmt: skip


def test_interleaved_on_virtual_stages_reference_k2_v2_m3() -> None:
    # M not a multiple of K (torch's flexible rounds): max(1, 3 // 2) = 1 round of 3
    assert rows(interleaved(2, 3, 2)) == [
        ["0F0", "0F1", "0F2", "2F0", "2F1", "2F2", "2B0", "2B1", "2B2", "0B0", "0B1", "0B2"],
        ["1F0", "1F1", "1F2", "3F0", "3B0", "3F1", "3B1", "3F2", "3B2", "1B0", "1B1", "1B2"],
    ]


def test_interleaved_on_virtual_stages_with_communication_reference_k2_v2_m2() -> None:
    # rank 1's chunk 1 sends to chunk 2 on rank 0, which sends to chunk 3 on rank 1; the
    # last chunk receives no gradients and chunk 0 sends none
    assert rows(add_communication(interleaved(2, 2, 2), virtual_stages=2)) == [
        ["0F0", "0SF0", "0F1", "0SF1", "2RF0", "2F0", "2SF0", "2RF1", "2F1", "2SF1",
         "2RB0", "2B0", "2SB0", "2RB1", "2B1", "2SB1", "0RB0", "0B0", "0RB1", "0B1"],
        ["1RF0", "1F0", "1SF0", "1RF1", "1F1", "1SF1", "3RF0", "3F0", "3B0", "3SB0",
         "3RF1", "3F1", "3B1", "3SB1", "1RB0", "1B0", "1SB0", "1RB1", "1B1", "1SB1"],
    ]  # fmt: skip


def megatron(K: int, v: int, M: int) -> Schedule:
    """Megatron-LM's interleaved 1F1B as its paper and code state it, for M a multiple of
    K: virtual microbatch k of a rank runs model chunk (k mod K v) // K forward (reversed
    backward) on microbatch K (k // K v) + k mod K; rank r warms up with
    2 (K - r - 1) + (v - 1) K forwards (at most all v M), then one forward per backward."""
    schedule: Schedule = {}
    for r in range(K):

        def action(k: int, kind: Kind, r: int = r) -> Action:
            chunk = (k % (K * v)) // K
            if kind is Kind.BACKWARD:
                chunk = v - 1 - chunk
            return Action(r + K * chunk, kind, K * (k // (K * v)) + k % K)

        warmup = min(2 * (K - r - 1) + (v - 1) * K, v * M)
        row = [action(k, Kind.FORWARD) for k in range(warmup)]
        for k in range(v * M - warmup):
            row += [action(warmup + k, Kind.FORWARD), action(k, Kind.BACKWARD)]
        schedule[r] = row + [action(k, Kind.BACKWARD) for k in range(v * M - warmup, v * M)]
    return schedule


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 6), st.integers(2, 4), st.integers(1, 4))
def test_interleaved_on_virtual_stages_is_megatrons_where_m_is_a_multiple_of_k(
    K: int, v: int, rounds: int
) -> None:
    assert interleaved(K, K * rounds, v) == megatron(K, v, K * rounds)


@settings(max_examples=80, deadline=None)
@given(st.integers(2, 6), st.integers(2, 4), st.integers(1, 16), st.booleans())
def test_virtual_schedules_validate_and_the_last_chunk_fuses(
    K: int, v: int, M: int, only_forward: bool
) -> None:
    if M % max(1, M // K):
        with pytest.raises(ValueError, match=f"Received: K={K}, M={M}, virtual_stages={v}"):
            build("interleaved", K, M, virtual_stages=v)
        return
    schedule = build("interleaved", K, M, forward_only=only_forward, virtual_stages=v)
    validate(schedule, M, virtual_stages=v)
    validate(add_communication(schedule, virtual_stages=v), M, virtual_stages=v)
    last, row = K * v - 1, schedule[K - 1]
    for m in range(M):  # the runtime runs the last chunk's backward with its forward
        at = row.index(Action(last, Kind.FORWARD, m))
        assert only_forward or row[at + 1] == Action(last, Kind.BACKWARD, m)


def test_virtual_forward_only_runs_the_interleaved_forwards() -> None:
    assert rows(forward_only(2, 4, 2)) == [
        ["0F0", "0F1", "2F0", "2F1", "0F2", "0F3", "2F2", "2F3"],
        ["1F0", "1F1", "3F0", "3F1", "1F2", "1F3", "3F2", "3F3"],
    ]


def test_virtual_stages_need_two_stages_two_chunks_and_whole_rounds() -> None:
    assert rounds_of(2, 8, 2) == 2 and rounds_of(4, 10, 2) == 5 and rounds_of(4, 3, 2) == 3
    with pytest.raises(ValueError, match="Received: K=1, virtual_stages=2"):
        virtual(1, 4, 2)
    with pytest.raises(ValueError, match="Received: K=2, virtual_stages=1"):
        virtual(2, 4, 1)
    with pytest.raises(
        ValueError, match=r"a multiple of its rounds, max\(1, M // K\) = 2 .* Received: K=4, M=9"
    ):
        interleaved(4, 9, 2)


@pytest.mark.parametrize("pipeline", ["simple", "zero_bubble"])
def test_only_interleaved_runs_on_virtual_stages(pipeline: str) -> None:
    with pytest.raises(
        ValueError,
        match=f"interleaved 1F1B, pipeline='interleaved'; {pipeline!r} runs one chunk per rank "
        rf"\(virtual_stages=1\). Received: pipeline={pipeline!r}, virtual_stages=2",
    ):
        build(pipeline, 2, 4, virtual_stages=2)
    with pytest.raises(ValueError, match="Received: virtual_stages=0"):
        build("interleaved", 2, 4, virtual_stages=0)


def test_validate_checks_every_chunk_of_a_rank() -> None:
    with pytest.raises(ScheduleError, match=r"every action on rank 0 must have one of the chunks "
                       r"\[0, 2\] and microbatch in \[0, 1\). Received: 1F0"):  # fmt: skip
        validate(parse("0F0 1F0", "1F0"), 1, virtual_stages=2)
    with pytest.raises(ScheduleError, match="stage 3 has no forward 3F0"):
        validate(parse("0F0 2F0", "1F0"), 1, virtual_stages=2)
    # chunk 2 on rank 0 waits for chunk 1 on rank 1, which waits for chunk 2's output
    with pytest.raises(ScheduleError) as info:
        validate(parse("0F0 2F0", "3F0 1F0"), 1, virtual_stages=2)
    assert str(info.value) == (
        "deadlock: ranks 0, 1 wait on receives that never come\n"
        "rank 0: 0F0  0SF0 2RF0 <-- ERROR HERE (waits for 1SF0)\n"
        "rank 1: 3RF0 <-- ERROR HERE (waits for 2SF0)"
    )


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 8), st.integers(1, 10))
def test_interleaved_keeps_at_most_k_minus_s_in_flight(K: int, M: int) -> None:
    for s, row in interleaved(K, M).items():
        in_flight = peak = 0
        for a in row:
            in_flight += 1 if a.kind is Kind.FORWARD else -1
            peak = max(peak, in_flight)
        assert peak == min(K - s, M)


def test_format_schedule_aligns_columns() -> None:
    text = format_schedule(add_communication(simple(2, 1)))
    assert text == "stage 0: 0F0  0SF0 0RB0 0B0\nstage 1: 1RF0 1F0  1B0  1SB0"


def test_add_communication_rejects_a_schedule_with_transfers() -> None:
    with pytest.raises(ScheduleError, match=r"compute-only schedule\. Received: action 0SF0"):
        add_communication(add_communication(simple(2, 1)))


@pytest.mark.parametrize(
    "schedule, M, message",
    [
        (parse("0F0 0B0", "1F0"), 1, "stage 1 has no backward 1B0 while other stages train"),
        (parse("0F0 0F0 0B0"), 1, "duplicate action 0F0"),
        (parse("0F0"), 2, "stage 0 has no forward 0F1"),
        (parse("0B0 0F0"), 1, "backward 0B0 before its forward"),
        (parse("0F0 0F1"), 1, "microbatch in \\[0, 1\\). Received: 0F1"),
        (parse("1F0"), 1, "must have stage=0"),
        (parse("0F0 0W0 0B0"), 1, "weight gradients 0W0 before its backward"),
        (parse("0F0 0B0 0W0 0W0"), 1, "duplicate action 0W0"),
        (
            parse("0F0 0B0 0W0", "1F0 1B0"),
            1,
            "stage 1 has no weight gradients 1W0 while other stages split their backward",
        ),
    ],
)
def test_validate_rejects_inconsistent_stages(schedule: Schedule, M: int, message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        validate(schedule, M)


@pytest.mark.parametrize(
    "schedule, message",
    [
        (parse("0F0 0SF0", "1F0"), "0SF0 has no matching 1RF0"),
        (parse("0F0", "1RF0 1F0"), "1RF0 has no matching 0SF0"),
        (parse("0F0 0SF0", "1F0 1RF0"), "1F0 needs 1RF0 earlier"),
        (parse("0SF0 0F0", "1RF0 1F0"), "0SF0 needs 0F0 earlier"),
        (parse("0F0 0SF0 0SB0", "1RF0 1F0"), "0SB0 has no neighbouring stage"),
        (parse("0F0 0SF0 0SF0", "1RF0 1F0"), "duplicate action 0SF0"),
    ],
)
def test_validate_rejects_unmatched_or_misplaced_transfers(
    schedule: Schedule, message: str
) -> None:
    with pytest.raises(ScheduleError, match=message):
        validate(schedule, 1)


def test_deadlock_shows_the_stuck_actions() -> None:
    schedule = parse("0F0 0B0 0F1 0B1", "1F1 1F0 1B0 1B1")
    with pytest.raises(ScheduleError) as info:
        validate(schedule, 2)
    assert str(info.value) == (
        "deadlock: stages 0, 1 wait on receives that never come\n"
        "stage 0: 0F0  0SF0 0RB0 <-- ERROR HERE (waits for 1SB0)\n"
        "stage 1: 1RF1 <-- ERROR HERE (waits for 0SF1)"
    )


def test_deadlock_in_a_communicating_schedule_is_found() -> None:
    schedule = parse("0F0 0SF0 0RB0 0B0", "1RB0 1RF0 1F0 1B0 1SB0")
    with pytest.raises(ScheduleError, match="1RB0 has no neighbouring stage"):
        validate(schedule, 1)
    schedule = parse("0RB0 0F0 0SF0 0B0", "1RF0 1F0 1B0 1SB0")
    with pytest.raises(ScheduleError, match=r"0RB0 <-- ERROR HERE \(waits for 1SB0\)"):
        validate(schedule, 1)


def test_docstring_examples_run() -> None:
    assert doctest.testmod(partitioner.schedule).failed == 0

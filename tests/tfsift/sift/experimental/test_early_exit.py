"""The early-exit scorer: its head's state, and a round scored one source batch at a time
while training steps wait (overlap)."""

from __future__ import annotations

import logging
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfsift
from tfsift import hooks
from tfsift.parallel import runtime
from tfsift.planning.graph import trace
from tfsift.sift.experimental import early_exit
from tfsift.sift.experimental.early_exit import LOW_OVERLAP, EarlyExitScorer, cheap_exit, spearman
from tfsift.sift.experimental.overlap import BATCH, FINISH, UPDATE, WaitModel
from tfsift.sift.replicas import ReplicaGroup

PER_SAMPLE = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)


class Deep(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.a = keras.layers.Dense(16, activation="relu", name="a")
        self.b = keras.layers.Dense(3, name="b")

    def call(self, x: Any) -> Any:
        return self.b(self.a(x))


def unbuilt(
    overlap: bool = False, batch_size: int | None = None, leftover: str = "score"
) -> EarlyExitScorer:
    """A fresh scorer (same weights every time) that has scored nothing yet."""
    keras.utils.set_random_seed(3)
    config = tfsift.SiftConfig(
        scorer="early_exit", exit_after="a", exit_lr=0.1, overlap=overlap, leftover=leftover
    )
    out = EarlyExitScorer(Deep(), PER_SAMPLE, config, False)
    out.bind(ReplicaGroup(runtime.get()))
    out.batch_size = batch_size
    return out


def scorer(
    first: tuple[np.ndarray, np.ndarray],
    overlap: bool = False,
    batch_size: int | None = None,
    leftover: str = "score",
) -> EarlyExitScorer:
    """A fresh scorer that has scored ``first`` (which builds the model and the head)."""
    out = unbuilt(overlap, batch_size, leftover)
    out(first)
    return out


def batches() -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 8, 4)).astype(np.float32)
    return [(x[i], rng.integers(0, 3, 8)) for i in range(3)]


def test_saving_the_head_mid_run_changes_nothing_that_follows() -> None:
    tfsift.init({})
    first, second, third = batches()
    kept = np.array([0, 2, 5])
    saving, plain, frozen = scorer(first), scorer(first), scorer(first)
    for s in (saving, plain):
        s.learn(kept)
        s(second)
        s.learn(kept)
    saving.state()  # applies what is pending, computes what is queued
    after = saving(third).losses
    np.testing.assert_allclose(after, plain(third).losses, rtol=1e-6)
    # the head did learn: a scorer that never learnt scores otherwise
    assert np.abs(after - frozen(third).losses).max() > 1e-3


def test_the_spearman_check_runs_the_full_loss_on_the_rounds_first_source_batch() -> None:
    tfsift.init({})
    first, _, _ = batches()
    s = unbuilt(batch_size=4)  # two source batches per 8-sample round
    seen: list[int] = []
    full = s.full

    def recording(element: Any) -> Any:
        seen.append(len(element[0]))
        return full(element)

    s.full = recording  # type: ignore[method-assign]
    early = s(first).losses  # the first round is checked
    assert seen == [4]
    expected = spearman(early[:4], full((first[0][:4], first[1][:4])).losses)
    assert s.metrics["exit_spearman"] == pytest.approx(expected)
    for _ in range(2 * early_exit.VALIDATE_EVERY):
        s(first)
    assert len(seen) == 3  # rounds 1, 1 + VALIDATE_EVERY and 1 + 2 x VALIDATE_EVERY


def test_a_loaded_state_replaces_what_the_head_learnt_since() -> None:
    tfsift.init({})
    first, second, third = batches()
    s = scorer(first)
    saved = s.state()
    for element in (second, third, second):
        s.learn(np.arange(8))
        s(element)
    s.load_state(saved)  # the scorer is built: the head is restored at once
    fresh = scorer(first)
    np.testing.assert_allclose(s(second).losses, fresh(second).losses, rtol=1e-6)


def overlap_scorer(first: tuple[np.ndarray, np.ndarray]) -> EarlyExitScorer:
    return scorer(first, overlap=True, batch_size=4)  # two source batches per round


def test_a_round_scored_batch_by_batch_during_steps_equals_one_scored_whole() -> None:
    tfsift.init({})
    first, second, third = batches()
    kept = np.array([0, 2, 5])
    chunked, whole = overlap_scorer(first), scorer(first)
    chunked.learn(kept)
    whole.learn(kept)
    chunked.prepare(second)
    idle = hooks.stage0_wait()
    assert idle is not None
    assert idle.run(0, 0.0) is False  # no wait seen yet: nothing may run
    idle.arrived(0, 60.0, True)  # microbatch 0's gradients took a minute to come
    assert idle.run(0, 0.0) is True  # the first source batch (learning the first's)
    assert idle.run(0, 0.0) is True  # the second
    assert chunked._head.finishes_early  # the first round's gradients, all computed
    assert idle.run(0, 0.0) is True  # finished in the wait, not after the broadcast
    assert not chunked._head.finishes_early and chunked._head.applies_next
    assert idle.run(0, 0.0) is False  # nothing left
    assert list(idle.waits.costs[FINISH]) == [1]
    scores = chunked(second)
    np.testing.assert_allclose(scores.losses, whole(second).losses, rtol=1e-6)
    assert chunked.metrics["overlapped_rounds"] == 1.0
    assert chunked.metrics["overlapped_fraction"] == 1.0
    # what overlap had to work with: the waits seen (one of a minute) and a unit's cost
    assert chunked.metrics["overlap_wait_ms"] == 60e3
    assert chunked.metrics["overlap_late_fraction"] == 0.0  # no unit ran past a message
    assert chunked.metrics["overlap_unit_ms"] == 1e3 * idle.waits.unit_cost() > 0
    # the features of both batches are kept for the head to learn, as one call keeps them
    chunked.learn(kept)
    whole.learn(kept)
    # a round only half scored during steps: the rest is scored when it is sifted
    chunked.prepare(third)
    assert idle.run(0, 59.0) is False  # too late into the wait: a unit would not fit
    assert chunked._head.applies_next  # the first round's update, with the first unit
    assert idle.run(0, 0.0) is True
    assert not chunked._head.applies_next
    idle.arrived(0, 0.5, False)  # these gradients came while a unit ran: late
    np.testing.assert_allclose(chunked(third).losses, whole(third).losses, rtol=1e-6)
    assert chunked.metrics["overlapped_rounds"] == 1.0
    assert chunked.metrics["overlapped_fraction"] == 3 / 4
    assert chunked.metrics["overlap_late_fraction"] == 1 / 2  # of two receives seen


def test_a_wait_with_room_for_the_whole_round_scores_it_in_one_unit() -> None:
    tfsift.init({})
    first, second, third = batches()
    kept = np.array([0, 2, 5])
    units, whole = overlap_scorer(first), scorer(first)
    for s in (units, whole):
        s.learn(kept)
        s(second)
        s.learn(kept)
    units.prepare(third)
    idle = hooks.stage0_wait()
    assert idle is not None
    idle.arrived(0, 60.0, True)
    idle.waits.unit(0.001, UPDATE)  # a call of one source batch takes a millisecond
    assert idle.run(0, 0.0) is True  # both source batches of the round, learning both
    assert units._prepared is not None and units._prepared.done()
    assert idle.run(0, 0.0) is True  # the head's gradients of the round before, finished
    assert idle.run(0, 0.0) is False
    np.testing.assert_allclose(units(third).losses, whole(third).losses, rtol=1e-6)
    assert units.metrics["overlapped_fraction"] == 1.0
    for s in (units, whole):
        s.learn(kept)  # whole finishes here; units finished in the wait
    assert units._head._ready is not None and whole._head._ready is not None
    for a, b in zip(units._head._ready[0], whole._head._ready[0], strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7)


def test_a_unit_that_met_a_new_signature_says_nothing_about_a_units_cost() -> None:
    tfsift.init({})
    first, second, _ = batches()
    s = overlap_scorer(first)
    s.learn(np.array([0, 2, 5]))
    s.prepare(second)
    idle = hooks.stage0_wait()
    assert idle is not None
    idle.arrived(0, 60.0, True)
    assert idle.run(0, 0.0) is True  # the first call that also learns: a new signature
    assert s._idle.waits.costs == {BATCH: {}, UPDATE: {}, FINISH: {}}
    assert idle.run(0, 0.0) is True  # the same call again, timed
    assert list(s._idle.waits.costs[BATCH]) == [1] and not s._idle.waits.costs[UPDATE]


def test_a_prepared_round_not_sifted_next_is_scored_again() -> None:
    tfsift.init({})
    first, second, third = batches()
    s, fresh = overlap_scorer(first), scorer(first)
    s.prepare(second)
    assert hooks.stage0_wait() is not None
    hooks.stage0_wait().arrived(1, 60.0, True)
    assert hooks.stage0_wait().run(1, 0.0) is True
    np.testing.assert_allclose(s(third).losses, fresh(third).losses, rtol=1e-6)
    assert s.metrics["overlapped_rounds"] == 0.0
    assert hooks.stage0_wait().run(1, 0.0) is False  # the round was dropped: no work left


def score_one_batch(s: EarlyExitScorer) -> None:
    """A unit of one source batch of the prepared round, as in a short wait."""
    assert s._prepared is not None and not s._prepared.done()
    s._idle.score(s._prepared, s._prepared.next_rows(1), 1)


def test_what_no_wait_scored_is_scored_in_one_call_and_new_sizes_trace_nothing() -> None:
    tfsift.init({})
    first, second, _ = batches()
    s, whole = overlap_scorer(first), scorer(first)
    s.batch_size = 1  # eight source batches of one sample per round
    expected = whole(second).losses
    for leftover in range(9):
        s.prepare(second)
        idle = hooks.stage0_wait()
        assert idle is not None
        for _ in range(8 - leftover):
            score_one_batch(s)
        np.testing.assert_allclose(s(second).losses, expected, rtol=1e-6)
    # every leftover size 1..8 was scored once, in one call each
    assert sorted(key[1][0][0][0] for key in s._head._score._concrete) == list(range(1, 9))
    # ... but traced once, for any batch size, before the first call
    assert s._head._score.function.experimental_get_tracing_count() == 1
    # the same with the calls that also learn the round before and apply its update
    for leftover in range(9):
        s.learn(np.arange(0, 8, 2))
        s.prepare(second)
        for _ in range(8 - leftover):
            score_one_batch(s)
        s(second)
    head = s._head
    calls = [head._score, head._learn_and_score, head._apply_and_score]
    calls.append(head._apply_learn_and_score)
    assert [c.function.experimental_get_tracing_count() for c in calls] == [1, 1, 1, 1]
    assert head._learn_and_score.traces > 2 and head._apply_learn_and_score.traces == 2


def test_with_leftover_keep_what_no_wait_scored_stays_unscored() -> None:
    tfsift.init({})
    first, second, third = batches()
    s = scorer(first, overlap=True, batch_size=4, leftover="keep")  # two batches a round
    whole = scorer(first)
    s.learn(np.array([0, 2, 5]))
    # the round's one unit learns the first source batch of the round before (rows 0 to
    # 3); the head drops the rest at the round instead of learning it there
    whole.learn(np.array([0, 2]))
    s.prepare(second)
    score_one_batch(s)  # a wait had room for the first source batch only
    got, want = s(second), whole(second).losses
    assert got.scored == 4  # the first four samples; the others NaN, kept by the sifter
    np.testing.assert_allclose(got.losses[:4], want[:4], rtol=1e-6)
    assert np.isnan(got.losses[4:]).all()
    assert s.metrics["overlapped_fraction"] == 1 / 2 and s.metrics["overlapped_rounds"] == 0
    # the head learns the kept among the scored rows, whose features are all it has
    s.learn(np.array([1, 3]))
    whole.learn(np.array([1, 3]))
    np.testing.assert_allclose(s(third).losses, whole(third).losses, rtol=1e-6)
    s.learn(np.array([0]))
    s.prepare(first)  # no wait had room at all
    got = s(first)
    assert got.scored == 0 and np.isnan(got.losses).all()
    s.learn(np.array([], np.int64))
    assert s._head.applies_next  # no call ran: the update waits for the next round's first


@pytest.mark.parametrize(("units", "warned"), [(0, True), (1, False)])
def test_overlap_that_finds_no_room_in_the_waits_says_so_once(
    units: int, warned: bool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    tfsift.init({})
    monkeypatch.setattr(early_exit, "ADVICE_AFTER", 3)
    first, second, _ = batches()
    s = overlap_scorer(first)  # two source batches per round
    with caplog.at_level(logging.WARNING, logger="tfsift"):
        for _ in range(6):
            s.prepare(second)
            idle = hooks.stage0_wait()
            assert idle is not None
            idle.arrived(0, 60.0, True)
            for _ in range(units):
                assert idle.run(0, 0.0) is True
            s(second)
    expected = [
        "tfsift.sift: overlap scored 0% of the source batches of its first 3 rounds while "
        "stage 0 waited for gradients; the rest was scored between steps, where every stage "
        "waits for it. Overlap pays only where stage 0 waits, and with one stage nothing "
        "waits for gradients: put fewer layers on stage 0 (tfsift.partition with "
        "auto_partition=False) or exit earlier (exit_after). "
        "sift_metrics()['overlapped_fraction'] tracks it, and ['overlap_wait_ms'] and "
        "['overlap_unit_ms'] what it is made of."
    ]
    advice = [m for m in caplog.messages if m.startswith("tfsift.sift: overlap")]
    assert advice == (expected if warned else [])  # half in waits: no warning


def test_the_advice_on_a_pipeline_says_how_long_stage_0_waited_and_a_unit_took(
    caplog: pytest.LogCaptureFixture,
) -> None:
    waits = WaitModel()
    waits.arrived(0, 0.0012, exact=True)
    waits.arrived(3, 0.0003, exact=True)
    waits.unit(0.0011)
    with caplog.at_level(logging.WARNING, logger="tfsift"):
        early_exit._advise(0.2, 2, waits)
        early_exit._advise(LOW_OVERLAP, 2, waits)  # enough in waits: no advice
    assert caplog.messages == [
        "tfsift.sift: overlap scored 20% of the source batches of its first 50 rounds while "
        "stage 0 waited for gradients; the rest was scored between steps, where every stage "
        "waits for it. Overlap pays only where stage 0 waits, and stage 0's waits on this "
        "cut are short: it waited about 1.5 ms per step for gradients, and scoring a source "
        "batch took 1.1 ms there (it is the slowest stage, or a source batch takes longer "
        "than its waits last): put fewer layers on stage 0 (tfsift.partition with "
        "auto_partition=False) or exit earlier (exit_after). "
        "sift_metrics()['overlapped_fraction'] tracks it, and ['overlap_wait_ms'] and "
        "['overlap_unit_ms'] what it is made of."
    ]


@pytest.mark.parametrize(
    ("forward", "exit_index"),
    [
        ([0.0, 0.1, 1.2, 0.0, 0.8, 0.1], 1),  # reshape, cheap conv | costly conv, ...: the conv
        ([0.5, 0.1, 0.1, 0.3], 0),  # the first node alone is past the share: still the first
        ([1.0] * 10, 2),  # even costs: a third of the way
        ([0.0, 0.0, 0.0, 0.0, 0.0], 1),  # nothing measurable: the middle, as before
    ],
)
def test_the_one_stage_exit_ends_where_a_third_of_the_forward_time_is_spent(
    forward: list[float], exit_index: int
) -> None:
    assert cheap_exit(forward) == exit_index
    assert cheap_exit(forward) < len(forward) - 1  # never the output: that is full scoring


class HeavyMiddle(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.a = keras.layers.Dense(2048, name="a")  # 4 x 2048 weights: cheap
        self.b = keras.layers.Dense(2048, name="b")  # 2048 x 2048: nearly all the forward time
        # cheap too: were c as costly as b, a profile of a loaded machine timing c twice
        # b's time (one CI run did) would put a and b within a third of the forward time
        self.c = keras.layers.Dense(8, name="c")
        self.out = keras.layers.Dense(3, name="out")

    def call(self, x: Any) -> Any:
        return self.out(self.c(self.b(self.a(x))))


def test_with_one_stage_the_default_exit_skips_the_costly_layers() -> None:
    tfsift.init({})
    keras.utils.set_random_seed(3)
    config = tfsift.SiftConfig(scorer="early_exit")
    s = EarlyExitScorer(HeavyMiddle(), PER_SAMPLE, config, False)
    s.bind(ReplicaGroup(runtime.get()))
    x = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    s((x, np.zeros(64, np.int64)))
    # the middle of the model, the old default, was "b": scoring cost nearly all the model
    assert [gn.name for gn in s._exit_graph.nodes] == ["a"]


@pytest.mark.parametrize(
    "changes, batches",
    [({"overlap": True}, 2.0),  # relative beta=1 keeps half: 2 source batches a step
     ({"overlap": True, "beta": 3.0}, 4.0),
     ({"overlap": True, "exit_after": "a"}, 0.0),  # an exit of its own: not stage 0's end
     ({}, 0.0)],  # scoring outside the waits: nothing to leave room for
)  # fmt: skip
def test_overlap_at_stage_0s_end_asks_the_planner_for_room(
    changes: dict[str, Any], batches: float
) -> None:
    tfsift.init({})
    model = Deep()
    config = tfsift.SiftConfig(scorer="early_exit", **changes)
    tfsift.sift(model, PER_SAMPLE, config)
    reserved = hooks.stage0_reservation(model)  # what the planner reads (tfsift.hooks)
    assert (reserved.forwards if reserved else 0.0) == batches


@pytest.mark.parametrize("exit_after, measured", [(None, True), ("a", False)])
def test_overlap_at_stage_0s_end_gives_the_planner_a_calls_cost_before_any_step(
    exit_after: str | None, measured: bool
) -> None:
    # set when the transform is applied: a first step before the first round plans with it
    tfsift.init({})
    model = Deep()
    config = tfsift.SiftConfig(scorer="early_exit", overlap=True, exit_after=exit_after)
    x = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32)
    source = tf.data.Dataset.from_tensor_slices((x, np.arange(32) % 3)).batch(16)
    source.apply(tfsift.sift(model, PER_SAMPLE, config))
    reserved = hooks.stage0_reservation(model)
    call = reserved.call_seconds if reserved else None
    assert (call is not None) == measured
    if call is not None:  # rank 0 calls it with the traced model when it solves
        assert 0.0 < call(trace(model, [tf.constant(x[:4])]), 16) < 1.0


def test_overlap_with_elements_that_are_not_pairs_fails_when_applied() -> None:
    tfsift.init({})
    config = tfsift.SiftConfig(scorer="early_exit", overlap=True)
    source = tf.data.Dataset.from_tensor_slices(np.zeros((32, 4), np.float32)).batch(16)
    with pytest.raises(
        ValueError, match=r"early-exit scoring needs dataset elements that are \(x, y\) pairs"
    ):
        source.apply(tfsift.sift(Deep(), PER_SAMPLE, config))

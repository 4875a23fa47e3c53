"""The exit head learns each round's kept rows in the next round's calls, one source batch
per call, and applies their mean at the first call of the round after."""

from __future__ import annotations

import threading
from typing import Any
from unittest import mock

import keras
import numpy as np
import tensorflow as tf

import tfsift
from tfsift.parallel import runtime
from tfsift.sift.experimental.collectives import HeadGroup
from tfsift.sift.experimental.exit_head import ExitHead, call_seconds
from tfsift.sift.replicas import ReplicaGroup

PER_SAMPLE = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
LR = 0.1
FEATURES = tf.TensorSpec((None, 4), tf.float32)


def head(learn_rest: bool = True) -> ExitHead:
    """A fresh head (the same weights every time) on 4 features, 3 classes."""
    tfsift.init({})
    keras.utils.set_random_seed(5)
    group = HeadGroup(ReplicaGroup(runtime.get()))
    return ExitHead(None, FEATURES, (3,), PER_SAMPLE, LR, tf.identity, group, learn_rest)


def rounds() -> list[tuple[tf.Tensor, tf.Tensor]]:
    rng = np.random.default_rng(1)
    return [
        (
            tf.constant(rng.normal(size=(8, 4)).astype(np.float32)),
            tf.constant(rng.integers(0, 3, 8)),
        )
        for _ in range(4)
    ]


def whole(h: ExitHead, x: tf.Tensor, y: tf.Tensor, kept: np.ndarray) -> np.ndarray:
    """Scores a round in one call, then learns its ``kept`` rows."""
    features, losses, _ = h.score(x, y, None)
    h.learn([features], [y], kept, None)
    return losses.numpy()


def in_units(h: ExitHead, x: tf.Tensor, y: tf.Tensor, kept: np.ndarray) -> np.ndarray:
    """Scores a round one source batch (4 rows) per call, as overlap does, then learns."""
    calls = [h.score(x[i : i + 4], y[i : i + 4], 1) for i in (0, 4)]
    h.learn([c[0] for c in calls], [y[:4], y[4:]], kept, 4)
    return np.concatenate([c[1].numpy() for c in calls])


def test_a_rounds_kept_rows_are_applied_by_the_first_call_two_rounds_later() -> None:
    (x1, y1), (x2, y2), (x3, y3), _ = rounds()
    kept = np.array([0, 2, 5])
    h, frozen = head(), head()
    reference = keras.models.clone_model(frozen.model)
    reference.set_weights(frozen.model.get_weights())
    whole(h, x1, y1, kept)
    assert not h.applies_next
    # round 2 is scored with the head round 1 started with: its calls compute round 1's
    # gradients, nothing is applied yet
    np.testing.assert_array_equal(whole(h, x2, y2, kept), frozen.score(x2, y2, None)[1].numpy())
    assert h.applies_next
    # round 3: one Adam step on the mean loss of round 1's kept rows, at the first head
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(PER_SAMPLE(tf.gather(y1, kept), reference(tf.gather(x1, kept))))
    optimizer = keras.optimizers.Adam(LR)
    optimizer.apply(
        tape.gradient(loss, reference.trainable_variables), reference.trainable_variables
    )
    expected = PER_SAMPLE(y3, reference(x3)).numpy()
    losses = h.score(x3, y3, None)[1]
    np.testing.assert_allclose(losses.numpy(), expected, rtol=1e-5)
    assert not h.applies_next  # applied by that call, which computed round 2's gradients


def test_a_round_learnt_one_source_batch_per_call_equals_one_learnt_whole() -> None:
    batched, single = head(), head()
    kept = [np.array([0, 2, 5]), np.array([1, 7]), np.array([3, 4, 6]), np.array([0])]
    for (x, y), k in zip(rounds(), kept, strict=True):
        np.testing.assert_allclose(in_units(batched, x, y, k), whole(single, x, y, k), rtol=1e-5)
    for a, b in zip(batched.model.weights, single.model.weights, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5)


def test_a_head_saved_mid_round_continues_as_the_uninterrupted_one() -> None:
    data, kept = rounds(), np.array([1, 2, 6])
    uninterrupted, saving = head(), head()
    for x, y in data[:2]:
        whole(uninterrupted, x, y, kept)
        in_units(saving, x, y, kept)
    saved = saving.state()  # a flush: the pending update applied, round 2's gradients computed
    assert saved["sums"] is not None and saved["kept"] == 3
    loaded = head()
    loaded.load_state(saved)
    for x, y in data[2:]:
        expected = whole(uninterrupted, x, y, kept)
        np.testing.assert_allclose(in_units(saving, x, y, kept), expected, rtol=1e-5)
        np.testing.assert_allclose(whole(loaded, x, y, kept), expected, rtol=1e-5)


def test_a_state_saved_before_the_head_learnt_late_loads_with_nothing_pending() -> None:
    h = head()
    whole(h, *rounds()[0], np.arange(8))
    old = {key: value for key, value in h.state().items() if key in ("head", "optimizer")}
    loaded = head()
    loaded.load_state(old)
    assert loaded._learnt == 0 and loaded._kept == 0 and not loaded.applies_next


def test_the_gradient_is_of_the_kept_rows_summed_loss_only() -> None:
    h = head()
    x, y = rounds()[0]
    mask = np.zeros(8, np.float32)
    mask[[0, 2, 5]] = 1.0
    grads = h.grads(x, y, tf.constant(mask))
    kept = tf.constant([0, 2, 5])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(PER_SAMPLE(tf.gather(y, kept), h.model(tf.gather(x, kept))))
    expected = tape.gradient(loss, h.model.trainable_variables)
    for got, want in zip(grads, expected, strict=True):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-7)
    nothing = h.grads(x, y, tf.zeros(8))
    assert all(float(tf.reduce_max(tf.abs(g))) == 0.0 for g in nothing)


def test_a_round_that_kept_nothing_applies_a_zero_gradient() -> None:
    h = head()
    (x1, y1), (x2, y2), _, _ = rounds()
    whole(h, x1, y1, np.array([], np.int64))
    whole(h, x2, y2, np.array([0]))
    assert h._ready is not None
    sums, scale = h._ready
    assert float(scale) == 1.0  # 1 / max(kept, 1)
    assert all(float(tf.reduce_max(tf.abs(g))) == 0.0 for g in sums)


def test_a_round_learnt_whole_takes_its_features_as_they_are() -> None:
    h = head()
    x, y = rounds()[0]
    features = h.score(x, y, None)[0]
    h.learn([features], [y], np.array([1, 6]), 4)  # two chunks of 4 rows, queued
    assert len(h._queue) == 2
    chunk = h._take(None)
    assert chunk is not None and chunk[0] is features  # not sliced and joined again
    np.testing.assert_array_equal(chunk[2].numpy(), [0, 1, 0, 0, 0, 0, 1, 0])


def test_a_source_batch_of_a_round_scored_whole_is_learnt_from_the_whole_part() -> None:
    # slicing the features per call cost two eager ops (a dispatch and a copy each); the
    # call takes the whole part and masks the rows outside its bounds instead
    h = head()
    x, y = rounds()[0]
    features = h.score(x, y, None)[0]
    h.learn([features], [y], np.array([1, 6]), 4)
    part, labels, mask, bounds = h._take(1)
    assert part is features and labels is y
    np.testing.assert_array_equal(mask.numpy(), [0, 1, 0, 0, 0, 0, 1, 0])
    assert bounds.numpy().tolist() == [0, 4]
    assert h._take(1)[3].numpy().tolist() == [4, 8]


def test_a_unit_adds_the_gradients_of_the_kept_rows_inside_its_bounds_only() -> None:
    h = head()
    (x, y), (x2, y2), _, _ = rounds()
    features = h.score(x, y, None)[0]
    h.learn([features], [y], np.array([1, 6]), 4)
    h.score(x2[:4], y2[:4], 1)  # a unit: learns rows 0..3 of the round, so row 1 only
    row1 = h.grads(features[:4], y[:4], tf.constant([0.0, 1.0, 0.0, 0.0]))
    for got, want in zip(h._sums, row1, strict=True):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-7)


def test_rounds_scored_whole_then_learnt_per_source_batch_equal_rounds_learnt_whole() -> None:
    # whole rounds learnt by units of one source batch: each unit learns 4 rows of an
    # 8-row part (its bounds), the first of a round also applies the update
    mixed, single = head(), head()
    kept = [np.array([0, 2, 5]), np.array([1, 7]), np.array([3, 4, 6]), np.array([0])]
    for i, ((x, y), k) in enumerate(zip(rounds(), kept, strict=True)):
        if i % 2:
            got = in_units(mixed, x, y, k)
        else:
            got = whole(mixed, x, y, k)
        np.testing.assert_allclose(got, whole(single, x, y, k), rtol=1e-5)
    mixed.flush(), single.flush()
    for a, b in zip(mixed.model.weights, single.model.weights, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5)


def test_a_round_finished_early_learns_as_one_finished_at_the_round() -> None:
    # overlap finishes a round's gradients in a wait after its last call (finish_early);
    # learn then must not finish (or apply) anything again
    early, late = head(), head()
    kept = [np.array([0, 2, 5]), np.array([1, 7]), np.array([3, 4, 6]), np.array([0])]
    finished = []
    for (x, y), k in zip(rounds(), kept, strict=True):
        calls = [early.score(x[i : i + 4], y[i : i + 4], 1) for i in (0, 4)]
        finished.append(early.finishes_early)
        if early.finishes_early:
            early.finish_early()
            assert not early.finishes_early  # once a round
        early.learn([c[0] for c in calls], [y[:4], y[4:]], k, 4)
        losses = np.concatenate([c[1].numpy() for c in calls])
        np.testing.assert_allclose(losses, in_units(late, x, y, k), rtol=1e-5)
    # nothing learnt in the first round's calls; every later round's calls learnt one
    assert finished == [False, True, True, True]
    assert early.applies_next and late.applies_next
    for a, b in zip(early.model.weights, late.model.weights, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5)
    x, y = rounds()[0]
    np.testing.assert_allclose(
        early.score(x, y, None)[1].numpy(), late.score(x, y, None)[1].numpy(), rtol=1e-5
    )


def test_without_learn_rest_the_round_drops_what_no_call_learnt() -> None:
    # leftover="keep": round 2's only call scored (and learnt) one of two source batches
    (x1, y1), (x2, y2), (x3, y3), _ = rounds()
    dropping, reference = head(learn_rest=False), head()
    dropping.score(x1, y1, None)
    reference.score(x1, y1, None)
    features = [tf.identity(x1[:4]), tf.identity(x1[4:])]
    dropping.learn(features, [y1[:4], y1[4:]], np.array([0, 2, 5]), 4)
    reference.learn([x1], [y1], np.array([0, 2]), None)  # the rows the call will learn
    dropping.score(x2[:4], y2[:4], 1)
    reference.score(x2, y2, None)
    with mock.patch.object(dropping, "_learn", side_effect=AssertionError("a call at the round")):
        dropping.learn([tf.identity(x2[:4])], [y2[:4]], np.array([1]), 4)
    reference.learn([x2], [y2], np.array([1]), None)
    # the mean over the two kept rows learnt, not over three: the same update as learning
    # only those
    assert dropping._ready is not None and reference._ready is not None
    assert float(dropping._ready[1]) == float(reference._ready[1]) == 0.5
    np.testing.assert_allclose(
        dropping.score(x3, y3, None)[1].numpy(), reference.score(x3, y3, None)[1].numpy(), rtol=1e-5
    )
    # a round with no call at all learns nothing and keeps the pending update pending
    dropping.learn([tf.identity(x3)], [y3], np.array([0, 1]), 4)
    assert dropping.applies_next
    dropping.learn([], [], np.array([], np.int64), 4)
    assert dropping.applies_next and dropping._learnt == 0 and not dropping._queue


def test_with_replicas_the_gradients_finish_at_the_round() -> None:
    h = head()
    x, y = rounds()[0]
    h.learn([h.score(x, y, None)[0]], [y], np.arange(8), None)
    h.score(x, y, None)
    assert h.finishes_early

    class TwoReplicas:
        replicas = 2

    h.group = TwoReplicas()  # type: ignore[assignment]
    # the mean over the replicas is a collective: never inside one stage's wait
    assert not h.finishes_early


class Paired:
    """Two replicas' groups in one process: each replica runs in a thread of its own and
    ``mean`` meets the other's (a mean only one replica joins times out, not hangs)."""

    def __init__(self) -> None:
        self.barrier = threading.Barrier(2, timeout=20)
        self.given: list[list[np.ndarray]] = [[], []]
        self.means = [0, 0]

    def group(self, replica: int) -> Any:
        pair = self

        class Group:
            replicas = 2

            def mean(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
                pair.given[replica] = arrays
                pair.means[replica] += 1
                pair.barrier.wait()
                out = [(a + b) / 2 for a, b in zip(*pair.given, strict=True)]
                pair.barrier.wait()  # both read the other's before either gives again
                return [m.astype(a.dtype) for m, a in zip(out, arrays, strict=True)]

        return Group()


def paired(play: Any, heads: list[ExitHead], pair: Paired) -> None:
    """Runs ``play(head, replica)`` for each head in a thread of its own, as two replicas."""
    errors: list[BaseException] = []

    def run(h: ExitHead, replica: int) -> None:
        try:
            play(h, replica)
        except BaseException as error:  # reported by the test's thread
            errors.append(error)
            pair.barrier.abort()

    threads = [threading.Thread(target=run, args=(h, i)) for i, h in enumerate(heads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors


def test_a_replica_whose_calls_learnt_nothing_joins_the_mean_and_is_not_counted() -> None:
    # leftover="keep": replica 1's waits held no call in rounds 2 and 3, replica 0's one a
    # round. Both join each round's mean; it is replica 0's own mean (not half of it), and
    # replica 1 applies each mean at the round after, so the heads stay equal
    data, kept = rounds(), np.array([0, 2, 5])
    alone, pair = head(learn_rest=False), Paired()
    heads = [head(learn_rest=False) for _ in range(2)]
    for replica, h in enumerate(heads):
        h.group = pair.group(replica)

    def play(h: ExitHead, replica: int) -> None:
        x, y = data[0]
        h.learn([h.score(x, y, None)[0]], [y], kept, 4)  # round 1, scored at the round
        for x, y in data[1:3]:
            if replica == 0:
                h.learn([h.score(x[:4], y[:4], 1)[0]], [y[:4]], kept[:2], 4)
            else:  # the round is kept unscored: nothing to learn from
                h.learn([], [], np.array([], np.int64), 4)

    paired(play, heads, pair)
    play(alone, 0)
    assert pair.means == [3, 3]  # every round, learnt or not
    assert alone._ready is not None
    for h in heads:
        assert h._ready is not None and float(h._ready[1]) == 1.0
        for got, want in zip(h._ready[0], alone._ready[0], strict=True):
            np.testing.assert_allclose(got.numpy(), (want * alone._ready[1]).numpy(), rtol=1e-6)
    for a, b, c in zip(*(h.model.weights for h in (*heads, alone)), strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
        np.testing.assert_allclose(a.numpy(), c.numpy(), rtol=1e-6)


def test_a_mean_one_replicas_call_applied_is_applied_by_every_replica_at_the_round() -> None:
    # stale with leftover="keep", as in the 2x2 mpirun job: in round 2 replica 0 found every
    # loss fresh (no call, nothing scored), replica 1 learnt round 1 in a call. In round 3
    # replica 0's call applies that mean and has nothing to learn, while replica 1's waits
    # held no call. No replica learnt, so there is no new mean: replica 1 must still apply
    # the one replica 0 applied, or the heads differ from then on until a replica learns
    # again (at the end of a job: for good; CI at ee43bc3)
    data, kept = rounds(), np.array([0, 2, 5])
    pair = Paired()
    heads = [head(learn_rest=False) for _ in range(2)]
    for replica, h in enumerate(heads):
        h.group = pair.group(replica)

    def play(h: ExitHead, replica: int) -> None:
        (x1, y1), (x2, y2), (x3, y3), _ = data
        h.learn([h.score(x1, y1, None)[0]], [y1], kept, 4)
        if replica == 0:
            h.learn([], [], np.array([], np.int64), 4)
            h.learn([h.score(x3, y3, 1)[0]], [y3], kept, 4)
        else:
            h.learn([h.score(x2, y2, None)[0]], [y2], kept, 4)
            h.learn([], [], np.array([], np.int64), 4)

    paired(play, heads, pair)
    assert pair.means == [3, 3]
    assert not any(h.applies_next for h in heads)
    for a, b in zip(*(h.model.weights for h in heads), strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    initial = head(learn_rest=False)
    assert not np.array_equal(heads[1].model.weights[0].numpy(), initial.model.weights[0].numpy())


def test_a_state_loaded_after_a_finish_ahead_of_the_round_continues_as_saved() -> None:
    data, kept = rounds(), np.array([1, 2, 6])
    saving, loading = head(), head()
    for x, y in data[:2]:
        in_units(saving, x, y, kept)
        in_units(loading, x, y, kept)
    saved = saving.state()
    x, y = data[2]
    for i in (0, 4):
        loading.score(x[i : i + 4], y[i : i + 4], 1)
    loading.finish_early()  # then the run is restored from the state saved before
    loading.load_state(saved)
    for x, y in data[2:]:
        np.testing.assert_allclose(
            in_units(loading, x, y, kept), in_units(saving, x, y, kept), rtol=1e-5
        )


def test_a_calls_fixed_cost_is_timed_through_score_without_a_replica_group() -> None:
    # rank 0 times it alone: a collective there would wait for ranks that never join
    # (the head's group raises on any use)
    tfsift.init({})
    calls: list[int | None] = []
    score = ExitHead.score

    def counted(self: ExitHead, x: Any, y: Any, chunks: int | None) -> Any:
        calls.append(chunks)
        return score(self, x, y, chunks)

    y = np.arange(32) % 10
    with mock.patch.object(ExitHead, "score", counted):
        seconds = call_seconds(y, (10,), PER_SAMPLE, repeats=5)
    assert 0.0 < seconds < 1.0
    # one call to trace, one to warm the learning call up, five timed, each learning one
    assert calls == [None, 1, 1, 1, 1, 1, 1]

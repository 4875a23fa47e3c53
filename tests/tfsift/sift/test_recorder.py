"""Scores from the training pass (scores="training") in one process: exact selections
replayed with the pure policies, unscored samples kept, stale expiry, InfoBatch's epoch
plans, errors, and a checkpoint restored mid-epoch."""

from __future__ import annotations

import doctest
import logging
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import tfsift
import tfsift.sift.recorder
from tfsift.pipeline.outputs import StepOutput
from tfsift.sift.infobatch import infobatch_keep
from tfsift.sift.recorder import Recorder
from tfsift.sift.relative import RelativePolicy
from tfsift.sift.scorer import Scorer
from tfsift.sift.selection import Selection
from tfsift.sift.stale import ScoreCache
from tfsift.sift.transform import SiftedDataset, Sifter

N, B = 192, 16


def data(n: int = N) -> tuple[np.ndarray, np.ndarray]:
    """Features whose column 0 is the sample id / 1000, and labels."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    x[:, 0] = np.arange(n) / 1000
    return x, rng.integers(0, 3, n)


def ids(x: Any) -> list[int]:
    return [round(float(v) * 1000) for v in np.asarray(x)[:, 0]]


def source(order: np.ndarray | None = None) -> tf.data.Dataset:
    x, y = data()
    if order is not None:
        x, y = x[order], y[order]
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(B, drop_remainder=True)


def loss_of(i: int) -> float:
    """The loss sample i 'trains' with in these tests: a fixed scramble of its id."""
    return ((i * 37) % 101) / 10


def sifted(config: tfsift.SiftConfig) -> SiftedDataset:
    tfsift.init({})
    dataset = source().apply(tfsift.sift(config=config))
    assert isinstance(dataset, SiftedDataset)
    return dataset


def train(dataset: SiftedDataset, record: Any = True) -> list[list[int]]:
    """One epoch: the ids of each batch; records the batches `record` says (all, or a set
    of batch numbers) with each sample's `loss_of`."""
    batches = []
    for n, element in enumerate(dataset):
        batches.append(ids(element[0]))
        if record is True or n in record:
            dataset.record(np.array([loss_of(i) for i in batches[-1]]))
    return batches


def replay_relative(
    order: list[int], fresh: set[int], policy: RelativePolicy, rounds: int
) -> list[int]:
    """The ids a relative epoch keeps from source `order` when `fresh` have a recorded
    loss: the policy among them (history of every fresh loss, draws seeded per round), and
    every other sample unscored; rounds of one source batch."""
    kept = []
    for r in range(len(order) // B):
        batch = np.array(order[r * B : (r + 1) * B])
        scored = np.array([i in fresh for i in batch])
        losses = np.array([loss_of(i) for i in batch[scored]])
        policy.observe(losses)
        rng = np.random.default_rng([7, 0, rounds + r])
        chosen = policy.select(losses, rng) if len(losses) else Selection.empty()
        keep = np.zeros(B, bool)
        keep[np.flatnonzero(scored)[chosen.indices]] = True
        keep[~scored] = True
        kept += batch[keep].tolist()
    return kept


def flat(batches: list[list[int]]) -> list[int]:
    return [i for batch in batches for i in batch]


def relative_config(**changes: Any) -> tfsift.SiftConfig:
    # rounds of one source batch, as replay_relative replays them (training scores read 8)
    fields = {"policy": "relative", "beta": 1.0, "history": 50, "seed": 7, "stale": 1}
    fields["score_batches"] = 1
    return tfsift.SiftConfig(scores="training", **{**fields, **changes})


def test_relative_selects_by_recorded_losses_and_keeps_what_has_none() -> None:
    dataset = sifted(relative_config())
    first = train(dataset, record=set(range(0, 12, 2)))  # nothing recorded yet: all kept
    assert flat(first) == list(range(N))
    second = train(dataset)
    policy = RelativePolicy(1.0, 50)
    recorded = {i for b in range(0, 12, 2) for i in first[b]}
    want = replay_relative(list(range(N)), recorded, policy, rounds=12)
    assert flat(second) == want[: len(want) // B * B]
    metrics = tfsift.sift_metrics()
    assert metrics["samples_scored"] == 0  # no scoring forward
    assert metrics["samples_reused"] == len(recorded)
    assert metrics["samples_unscored"] == 2 * N - len(recorded)


def test_recorded_losses_expire_after_stale_epochs_and_survive_shuffling() -> None:
    dataset = sifted(relative_config())
    train(dataset)  # epoch 1: every sample recorded
    second = train(dataset, record={0, 1})  # epoch 2: only the first two batches
    order = np.random.default_rng(3).permutation(N)
    shuffled = SiftedDataset(dataset.sifter, source(order))
    third = train(shuffled)
    policy = RelativePolicy(1.0, 50)
    replay_relative(list(range(N)), set(range(N)), policy, rounds=12)
    fresh = set(second[0] + second[1])  # the rest was last trained 2 epochs ago
    want = replay_relative(order.tolist(), fresh, policy, rounds=24)
    assert flat(third) == want[: len(want) // B * B]
    assert len(fresh) == 2 * B and set(want) >= set(range(N)) - fresh  # unscored: kept


def test_infobatch_prunes_from_the_second_epoch_and_anneals_with_weights(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = tfsift.SiftConfig(
        policy="infobatch", scores="training", stale=4, epochs=4, prune=0.5, anneal=0.25,
        rescale="unbiased", seed=3,
    )  # fmt: skip
    dataset = sifted(config)
    epochs = []
    for _ in range(4):
        got = []
        for x, _, w in dataset:
            got += list(zip(ids(x), w.numpy().tolist(), strict=True))
            dataset.record(np.array([loss_of(i) for i in ids(x)]))
        epochs.append(got)
    assert epochs[0] == [(i, 1.0) for i in range(N)]  # epoch 1 never prunes
    assert epochs[3] == [(i, 1.0) for i in range(N)]  # nor the annealed last quarter
    with caplog.at_level(logging.WARNING, logger="tfsift"):
        for x, _, _ in dataset:  # a fifth epoch, past the four it was given
            dataset.record(np.array([loss_of(i) for i in ids(x)]))
    assert [m.split(":")[0] for m in caplog.messages] == [
        "policy='infobatch' was given epochs=4 and is iterated for epoch 5"
    ]
    keys = ScoreCache(1).fingerprints(list(data()))  # the keys the sifter gives samples
    by_key = np.argsort(keys)  # the table's order
    for epoch in (2, 3):
        scores = np.array([loss_of(int(i)) for i in by_key])
        kept = infobatch_keep(scores, 0.5, np.random.default_rng([3, epoch]))
        weights = dict(zip(by_key[kept.indices].tolist(), (1 / kept.probs).tolist(), strict=True))
        want = [(i, weights[i]) for i in range(N) if i in weights]
        assert epochs[epoch - 1] == want[: len(want) // B * B]
        assert len(want) < N and {w for _, w in want} == {1.0, 2.0}
    assert tfsift.sift_metrics()["samples_scored"] == 0


def test_infobatch_refuses_an_infinite_dataset() -> None:
    tfsift.init({})
    config = tfsift.SiftConfig(
        policy="infobatch", scores="training", stale=4, epochs=4, rescale="unbiased"
    )
    with pytest.raises(ValueError) as err:
        source().repeat().apply(tfsift.sift(config=config))
    assert str(err.value) == (
        "policy='infobatch' prunes at each epoch's start, so it needs a finite dataset that "
        "the loop iterates once per epoch (no .repeat()). Received: a dataset of infinite "
        "cardinality"
    )


def test_record_refuses_a_forward_scored_dataset_a_second_record_and_a_wrong_size() -> None:
    dataset = sifted(relative_config())
    with pytest.raises(RuntimeError, match="no batch was yielded since the last record"):
        dataset.record(np.zeros(B))
    batches = iter(dataset)
    next(batches)
    with pytest.raises(ValueError) as err:
        dataset.record(np.zeros(B - 1))
    assert str(err.value) == (
        f"train.record takes the step's one loss per sample (shape (B,)). Received: "
        f"shape=({B - 1},) for a batch of {B}"
    )
    dataset.record(tf.zeros(B))
    with pytest.raises(RuntimeError, match="no batch was yielded since the last record"):
        dataset.record(np.zeros(B))
    config = tfsift.SiftConfig(policy="uniform")
    forward = SiftedDataset(Sifter(source().element_spec, Scorer(), config), source())
    with pytest.raises(ValueError) as value_err:
        forward.record(np.zeros(B))
    assert str(value_err.value).endswith("Received: scores='forward'")


def test_a_step_output_of_per_sample_losses_is_recorded_joined() -> None:
    cache = ScoreCache(epochs=1)
    recorder = Recorder(cache)
    recorder.yielded(np.array([1.0, 2.0, 3.0, 4.0]))
    recorder.record(StepOutput([tf.constant([0.1, 0.2]), tf.constant([0.3, 0.4])]), epoch=1)
    recorder.merge(None)
    losses = cache.lookup(np.array([4.0, 1.0]), epoch=1)[1]
    np.testing.assert_allclose(losses, [0.4, 0.1], rtol=1e-6)


def test_a_steps_loss_tensors_are_converted_at_the_merge_not_after_each_step() -> None:
    # a record follows every training step, where NumPy calls cost most (recorder.py)
    first, second = tf.constant([0.5, 0.25]), tf.constant([2.0])
    recorder = Recorder(ScoreCache(epochs=1))
    recorder.yielded(np.array([1.0, 2.0, 3.0]))
    recorder.record(StepOutput([first, second]), epoch=1)
    recorder.yielded(np.array([4.0]))
    recorder.record(tf.constant([8.0]), epoch=1)
    assert recorder._losses[0][0] is first and recorder._losses[0][1] is second
    state = recorder.state()  # a checkpoint converts what is queued
    assert state["losses"].dtype == np.float64
    assert state["losses"].tolist() == [0.5, 0.25, 2.0, 8.0]
    assert state["epochs"].tolist() == [1.0] * 4
    cache = ScoreCache(epochs=1)
    again = Recorder(cache)
    again.load_state(state)
    again.merge(None)
    assert cache.table(1)[1].tolist() == [0.5, 0.25, 2.0, 8.0]


@pytest.mark.parametrize(
    ("losses", "received"),
    [
        (lambda: tf.zeros(3), "shape=(3,) for a batch of 4"),
        (lambda: tf.zeros((4, 1)), "shape=(4, 1) for a batch of 4"),
        (lambda: StepOutput([tf.zeros(2), tf.zeros(1)]), "shape=(3,) for a batch of 4"),
    ],
)
def test_loss_tensors_of_the_wrong_shape_fail_at_the_record(losses: Any, received: str) -> None:
    recorder = Recorder(ScoreCache(epochs=1))
    recorder.yielded(np.arange(4.0))
    with pytest.raises(ValueError) as err:
        recorder.record(losses(), epoch=1)
    assert str(err.value) == (
        f"train.record takes the step's one loss per sample (shape (B,)). Received: {received}"
    )


def test_a_key_recorded_twice_keeps_its_later_loss_and_epoch() -> None:
    cache = ScoreCache(epochs=1)
    recorder = Recorder(cache)
    for epoch, losses in ((1, [1.0, 2.0]), (2, [3.0, 4.0])):
        recorder.yielded(np.array([5.0, 6.0]))
        recorder.record(np.array(losses), epoch=epoch)
    recorder.merge(None)
    keys, scores = cache.table(3)
    assert keys.tolist() == [5.0, 6.0] and scores.tolist() == [3.0, 4.0]
    assert np.isnan(cache.table(4)[1]).all()  # recorded in epoch 2: stale in epoch 4


def test_the_recorder_state_round_trips_queued_records_and_awaited_keys() -> None:
    recorder = Recorder(ScoreCache(epochs=1))
    recorder.yielded(np.array([1.0, 2.0]))
    recorder.record(np.array([0.5, 0.25]), epoch=1)
    recorder.yielded(np.array([3.0]))
    cache = ScoreCache(epochs=1)
    again = Recorder(cache)
    again.load_state(recorder.state())
    again.record(np.array([2.0]), epoch=1)
    again.merge(None)
    assert cache.table(1)[1].tolist() == [0.5, 0.25, 2.0]


@pytest.mark.parametrize("policy", ["relative", "infobatch"])
def test_a_sifter_restored_mid_epoch_yields_what_the_uninterrupted_one_would(
    policy: str,
) -> None:
    config = relative_config(stale=2) if policy == "relative" else tfsift.SiftConfig(
        policy="infobatch", scores="training", stale=3, epochs=3, anneal=0.0, seed=1,
        rescale="unbiased",
    )  # fmt: skip
    whole = sifted(config)
    want = [train(whole) for _ in range(3)]
    first = sifted(config)
    train(first)
    stream = iter(first)
    got = []
    for _ in range(2):  # two batches of epoch 2, recorded, then a checkpoint
        got.append(ids(next(stream)[0]))
        first.record(np.array([loss_of(i) for i in got[-1]]))
    saved = first.sifter.state()
    again = sifted(config)
    again.sifter.load_state(saved)
    got += train(again)  # the rest of epoch 2
    assert got == want[1]
    assert train(again) == want[2]
    assert len(want[1]) < N // B


def test_docstring_examples_run() -> None:
    assert doctest.testmod(tfsift.sift.recorder).failed == 0


def test_batches_yielded_and_no_loss_recorded_warn_once(caplog: pytest.LogCaptureFixture) -> None:
    # a loop that never calls train.record sifted nothing (every sample unscored, kept)
    # without a word
    recorder = tfsift.sift.recorder.Recorder(tfsift.sift.recorder.ScoreCache(epochs=1))
    with caplog.at_level(logging.WARNING, logger="tfsift"):
        recorder.merge(None)  # nothing yielded yet: nothing to say
        for _ in range(2):
            recorder.yielded(np.array([1.0, 2.0]))
            recorder.yielded(np.array([3.0, 4.0]))
            recorder.merge(None)
        recorder.yielded(np.array([5.0, 6.0]))
        recorder.record(np.array([0.5, 0.25]), epoch=1)
        recorder.merge(None)
    assert [r.getMessage() for r in caplog.records] == [
        "tfsift.sift with scores='training' yielded 2 batch(es) and was handed no losses: "
        "after each step, hand its per-sample losses to train.record(losses) (fit does). "
        "Without them no sample is scored, and every one is kept: nothing is sifted"
    ]


def test_a_loop_that_records_every_batch_is_not_warned(caplog: pytest.LogCaptureFixture) -> None:
    recorder = tfsift.sift.recorder.Recorder(tfsift.sift.recorder.ScoreCache(epochs=1))
    with caplog.at_level(logging.WARNING, logger="tfsift"):
        for key in range(3):
            recorder.yielded(np.array([float(key)]))
            recorder.record(np.array([0.5]), epoch=1)
            recorder.merge(None)
    assert caplog.records == []

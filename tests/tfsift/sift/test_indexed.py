"""InfoBatch planned by row on tfsift.from_arrays and from_rows (one process): exact epoch
plans from the score table, pruned rows never read, weights, the remainder, metrics, a checkpoint
restored mid-epoch, and the other policies' fallback to the streaming transform."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import tfsift
from tfsift.sift.indexed import IndexedSiftedDataset
from tfsift.sift.infobatch import infobatch_keep
from tfsift.sift.transform import SiftedDataset

N, B, SOURCE_SEED, SEED = 192, 16, 2, 3


def data() -> tuple[np.ndarray, np.ndarray]:
    """Features whose column 0 is the row, and labels."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, 4)).astype(np.float32)
    x[:, 0] = np.arange(N)
    return x, rng.integers(0, 3, N)


def loss_of(i: int) -> float:
    return ((i * 37) % 101) / 10


def config(**changes: Any) -> tfsift.SiftConfig:
    fields = dict(
        policy="infobatch", scores="training", stale=4, epochs=4, prune=0.5, anneal=0.25,
        rescale="unbiased", seed=SEED,
    )  # fmt: skip
    return tfsift.SiftConfig(**{**fields, **changes})


def sifted(cfg: tfsift.SiftConfig, read: list[int] | None = None) -> IndexedSiftedDataset:
    """The sifted from_arrays dataset; the rows its source gathers go to ``read``."""
    source = tfsift.from_arrays(data(), B, seed=SOURCE_SEED)
    if read is not None:
        gather = source.gather
        source.gather = lambda rows: (read.extend(rows.tolist()), gather(rows))[1]  # type: ignore[method-assign]
    dataset = source.apply(tfsift.sift(config=cfg))
    assert isinstance(dataset, IndexedSiftedDataset)
    return dataset


def epoch(dataset: Any, batches: int | None = None) -> list[tuple[int, float]]:
    """(row, weight) of each sample yielded in one epoch (or its first ``batches``),
    each batch recorded with ``loss_of``."""
    got: list[tuple[int, float]] = []
    for n, (x, _, w) in enumerate(dataset):
        rows = np.asarray(x)[:, 0].astype(int).tolist()
        got += list(zip(rows, w.numpy().tolist(), strict=True))
        dataset.record(np.array([loss_of(i) for i in rows]))
        if batches is not None and n + 1 == batches:
            break
    return got


def planned(e: int, prunes: bool) -> list[tuple[int, float]]:
    """What epoch ``e`` yields: InfoBatch's plan on the losses by row, permuted as the
    source permutes epoch ``e``, in whole batches."""
    rows, weights = np.arange(N), np.ones(N)
    if prunes:
        kept = infobatch_keep([loss_of(i) for i in range(N)], 0.5, np.random.default_rng([SEED, e]))
        rows, weights = kept.indices, 1 / kept.probs
    order = np.random.default_rng([SOURCE_SEED, e]).permutation(len(rows))
    pairs = list(zip(rows[order].tolist(), weights[order].tolist(), strict=True))
    return pairs[: len(pairs) // B * B]


def test_each_epoch_is_infobatchs_plan_by_row_and_pruned_rows_are_never_read() -> None:
    tfsift.init({})
    read: list[int] = []
    dataset = sifted(config(), read)
    epochs = [epoch(dataset) for _ in range(4)]
    assert epochs[0] == planned(1, prunes=False)  # epoch 1 never prunes
    assert epochs[1] == planned(2, prunes=True) and epochs[2] == planned(3, prunes=True)
    assert epochs[3] == planned(4, prunes=False)  # nor the annealed last quarter
    assert len(epochs[1]) < N and {w for _, w in epochs[1]} == {1.0, 2.0}
    assert read == [i for e in epochs for i, _ in e]  # every row read was trained
    metrics = tfsift.sift_metrics()
    assert metrics["samples_scored"] == 0 and metrics["samples_seen"] == 4 * N
    assert metrics["samples_kept"] == sum(map(len, epochs))
    assert metrics["samples_reused"] == 3 * N and metrics["samples_unscored"] == N
    assert metrics["policy/pruned"] == 0  # the annealed epoch's plan


def test_from_rows_is_planned_by_row_and_load_reads_only_the_rows_trained() -> None:
    tfsift.init({})
    x, y = data()
    read: list[int] = []

    def load(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        read.extend(rows.tolist())
        return x[rows], y[rows]

    source = tfsift.from_rows(load, N, B, seed=SOURCE_SEED)
    dataset = source.apply(tfsift.sift(config=config()))
    assert isinstance(dataset, IndexedSiftedDataset)
    del read[:B]  # the first batch's rows, read when the dataset was made
    epochs = [epoch(dataset) for _ in range(3)]
    assert epochs == [planned(1, False), planned(2, True), planned(3, True)]  # as from_arrays
    assert read == [i for e in epochs for i, _ in e]  # a pruned row is never read
    assert len(epochs[1]) < N


def test_the_remainder_is_yielded_in_whole_microbatches_without_drop_remainder() -> None:
    tfsift.init({"microbatches": 4})
    dataset = sifted(config(drop_remainder=False))
    epoch(dataset)
    second = [len(x) for x, *_ in dataset]
    kept = len(
        infobatch_keep([loss_of(i) for i in range(N)], 0.5, np.random.default_rng([SEED, 2]))
    )
    assert second == [B] * (kept // B) + ([kept % B // 4 * 4] if kept % B >= 4 else [])


def test_a_state_restored_mid_epoch_continues_as_the_uninterrupted_run() -> None:
    tfsift.init({})
    whole = sifted(config())
    want = [epoch(whole) for _ in range(3)]
    first = sifted(config())
    epoch(first)
    head = epoch(first, batches=2)  # two batches of epoch 2, recorded, then a checkpoint
    state = first.sifter.state()
    again = sifted(config())
    again.sifter.load_state(state)
    assert head + epoch(again) == want[1]
    assert epoch(again) == want[2]


@pytest.mark.parametrize(
    ("changes", "warned"),
    [({"epochs": 1}, True), ({"anneal": 0.75}, True), ({"epochs": 2, "anneal": 0.5}, True),
     ({"epochs": 2}, False), ({}, False)],
)  # fmt: skip
def test_a_run_that_prunes_in_no_epoch_is_told_so_when_the_transform_is_applied(
    changes: dict[str, Any], warned: bool, caplog: pytest.LogCaptureFixture
) -> None:
    tfsift.init({})
    cfg = config(**changes)
    with caplog.at_level(logging.WARNING, logger="tfsift"):
        sifted(cfg)
    told = (
        "policy='infobatch' prunes in no epoch of this run: it never prunes the first epoch "
        "(which gives the samples their scores) nor the last anneal fraction, so every sample "
        f"is trained as without sifting. Received: epochs={cfg.epochs}, anneal={cfg.anneal}"
    )
    assert caplog.messages == ([told] if warned else [])


def test_an_epoch_past_the_configured_ones_is_told_once(caplog: pytest.LogCaptureFixture) -> None:
    tfsift.init({})
    dataset = sifted(config(epochs=2, stale=2))
    with caplog.at_level(logging.WARNING, logger="tfsift"):
        for _ in range(2):
            epoch(dataset)
        assert caplog.messages == []
        for _ in range(2):
            epoch(dataset)
    assert caplog.messages == [
        "policy='infobatch' was given epochs=2 and is iterated for epoch 3: it prunes in no "
        "epoch past them and stopped pruning before the run's end; give SiftConfig the epochs "
        "you train"
    ]  # once, not at epoch 4 again


def nan_every_8th(rows: list[int]) -> np.ndarray:
    return np.array([np.nan if i % 8 == 0 else loss_of(i) for i in rows])


@pytest.mark.parametrize("path", ["by row", "streaming"])
def test_nan_losses_are_counted_and_warned_once_on_every_infobatch_path(
    path: str, caplog: pytest.LogCaptureFixture
) -> None:
    tfsift.init({})
    if path == "by row":
        dataset: Any = sifted(config())
    else:
        source = tf.data.Dataset.from_tensor_slices(data()).batch(B, drop_remainder=True)
        dataset = source.apply(tfsift.sift(config=config(score_batches=1)))
    kept: list[tuple[int, float]] = []
    with caplog.at_level(logging.WARNING, logger="tfsift"):
        for e in range(2):
            for x, _, w in dataset:
                rows = np.asarray(x)[:, 0].astype(int).tolist()
                dataset.record(nan_every_8th(rows))  # epoch 1 records N / 8 NaN losses
                kept += [(i, v) for i, v in zip(rows, w.numpy().tolist(), strict=True) if e]
    metrics = tfsift.sift_metrics()
    assert metrics["nonfinite_losses"] == N // 8  # looked up once each, in epoch 2
    assert metrics["samples_reused"] == N and metrics["samples_unscored"] == N  # epoch 1's
    first = "24 of 192" if path == "by row" else "2 of 16"  # the epoch's table, or a round
    assert caplog.messages == [
        f"tfsift.sift: {first} scored samples have a NaN or infinite loss; policy='infobatch' "
        "keeps them with weight 1, as samples without a score, and they are counted in "
        "sift_metrics()['nonfinite_losses'] (NaN losses mostly come from NaN weights, a "
        "learning rate too high, or NaN in the data)"
    ]
    weights = [w for i, w in kept if i % 8 == 0]  # some may fall in the remainder dropped
    assert len(weights) > N // 16 and set(weights) == {1.0}  # kept, as if unscored


def test_an_empty_epoch_is_told_once_on_every_infobatch_path(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tfsift.init({})
    empty = tf.data.Dataset.from_tensor_slices(data()).take(0)
    with caplog.at_level(logging.WARNING, logger="tfsift"):
        streaming = tfsift.shard(empty).batch(B, drop_remainder=True)
        streaming = streaming.apply(tfsift.sift(config=config()))
        assert [len(epoch(streaming)) for _ in range(2)] == [0, 0]
    assert caplog.messages == [
        "tfsift.shard: every replica's shard is empty, so every epoch over it yields nothing. "
        "Received: a dataset of 0 element(s) for 1 replica(s)",
        "tfsift.sift: epoch 1 yielded no batch, so nothing was trained: its source dataset is "
        "empty (a .take(0), a filter that keeps nothing, a shard smaller than a batch with "
        "drop_remainder=True?)",
    ]  # once, not again in epoch 2
    caplog.clear()
    x, y = data()
    by_row = tfsift.from_arrays((x[:B], y[:B]), B).apply(tfsift.sift(config=config()))
    with caplog.at_level(logging.WARNING, logger="tfsift"):
        assert [len(epoch(by_row)) for _ in range(2)] == [B, 0]  # epoch 2 prunes: < B left
    assert caplog.messages == [
        "tfsift.sift: epoch 2 yielded no batch, so nothing was trained: policy='infobatch' "
        f"kept less than a batch of its {B} rows on this replica"
    ]


def test_a_state_of_another_kind_of_sifted_dataset_is_refused() -> None:
    tfsift.init({})
    streaming = tf.data.Dataset.from_tensor_slices(data()).batch(B, drop_remainder=True)
    stream_state = streaming.apply(tfsift.sift(config=config())).sifter.state()
    dataset = sifted(config())
    with pytest.raises(ValueError) as err:
        dataset.sifter.load_state(stream_state)
    assert str(err.value) == (
        "this sifting state was saved by another kind of sifted dataset: restore it into one "
        "made as it was (from_arrays of 192 rows, with policy='infobatch'). Received: the "
        "state of a dataset sifted as it streams"
    )
    smaller = tfsift.from_arrays(tuple(a[:100] for a in data()), B)
    with pytest.raises(ValueError, match=r"Received: the state of arrays of 192 rows$"):
        smaller.apply(tfsift.sift(config=config())).sifter.load_state(dataset.sifter.state())
    with pytest.raises(ValueError, match=r"Received: the state of a dataset sifted by row$"):
        streaming.apply(tfsift.sift(config=config())).sifter.load_state(dataset.sifter.state())


def test_other_policies_sift_a_from_arrays_dataset_as_it_streams() -> None:
    tfsift.init({})
    cfg = tfsift.SiftConfig(policy="relative", scores="training", stale=1, beta=1.0)
    dataset = tfsift.from_arrays(data(), B).apply(tfsift.sift(config=cfg))
    assert isinstance(dataset, SiftedDataset)
    assert sum(len(x) for x, _ in dataset) == N  # the first epoch has no scores: all kept

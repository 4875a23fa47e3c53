"""fit's datasets: batches that split into microbatches, predict's padded to split."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf
from autotune import record_prompt_end

import tfsift
from tfsift.training import data

X = np.arange(20, dtype=np.float32).reshape(10, 2)


def test_a_batched_dataset_divisible_by_microbatches_passes_as_it_is() -> None:
    ds = tf.data.Dataset.from_tensor_slices((X, X)).batch(4, drop_remainder=True)
    assert data.checked(ds, 2, "fit") is ds
    assert data.checked(tf.data.Dataset.from_tensor_slices(X).batch(3), 1, "fit") is not None


@pytest.mark.parametrize(
    ("dataset", "error", "match"),
    [
        (X, TypeError, r"batched tf.data.Dataset .* Received: ndarray"),
        (tf.data.Dataset.range(10), ValueError, r"batched dataset \(call \.batch\(B, drop"),
        (tf.data.Dataset.from_tensor_slices(X).batch(4).take(2), ValueError,
         "Received: batch size None"),
        (tf.data.Dataset.from_tensor_slices(X).batch(3, True), ValueError, "batch size 3"),
    ],
    ids=["arrays", "unbatched", "not_static_size_unknown", "not_divisible"],
)  # fmt: skip
def test_a_dataset_that_cannot_split_fails_with_the_received_value(
    dataset: object, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        data.checked(dataset, 2, "fit")


def test_a_predicted_batch_is_padded_to_whole_microbatches_with_its_last_row() -> None:
    batches = [b.numpy() for (b,) in data.prediction_data(X, 4)]  # (x,): one input
    assert [len(b) for b in batches] == [4, 4, 2]  # 10 rows
    last, rows = data.padded(tf.constant(batches[-1]), 4)
    assert rows == 2
    np.testing.assert_array_equal(last.numpy(), X[[8, 9, 9, 9]])
    same, rows = data.padded((tf.constant(batches[0]),), 4)
    assert rows == 4 and same[0].numpy().tolist() == batches[0].tolist()


def fit_refusal(dataset: tf.data.Dataset, M: int, ranks: tuple[int, ...] = ()) -> str:
    with pytest.raises(ValueError) as err:
        data.checked(dataset, M, "fit", ranks)
    return str(err.value)


def test_single_samples_are_refused_by_their_shapes() -> None:
    onehot = tf.data.Dataset.from_tensor_slices((X, np.eye(3, dtype=np.float32)[[0] * 10]))
    assert fit_refusal(onehot, 1) == (
        "fit needs a batched dataset (call .batch(B, drop_remainder=True)): the tensors of a "
        "batch agree on its first axis, these do not. Received: element_spec=("
        "TensorSpec(shape=(2,), dtype=tf.float32, name=None), "
        "TensorSpec(shape=(3,), dtype=tf.float32, name=None))"
    )
    features = tf.data.Dataset.from_tensor_slices(X)
    assert data.checked(features, 2, "predict") is features  # nothing to tell it apart by
    assert fit_refusal(features, 2, ranks=(2,)) == (
        "fit needs a batched dataset (call .batch(B, drop_remainder=True)): the model's "
        "inputs have 2 dimensions with the batch axis, these elements 1. "
        "Received: element_spec=TensorSpec(shape=(2,), dtype=tf.float32, name=None)"
    )
    batched = features.batch(2, drop_remainder=True)
    assert data.checked(batched, 2, "fit", ranks=(2,)) is batched


def hundred(batch: int) -> tf.data.Dataset:
    return tf.data.Dataset.range(100).map(lambda i: (tf.fill([3], i), i)).batch(batch)


def test_a_partial_last_batch_is_refused_up_front_with_the_sizes() -> None:
    assert fit_refusal(hundred(32), 8) == (
        "fit needs every batch, the last one too, to split into microbatches=8 equal parts. "
        "Received: 100 samples in batches of 32 (last batch 4); "
        "use .batch(32, drop_remainder=True)"
    )
    assert fit_refusal(hundred(30).prefetch(2).shuffle(4), 4) == (
        "fit needs every batch, the last one too, to split into microbatches=4 equal parts. "
        "Received: 100 samples in batches of 30 (last batch 10); "
        "use .batch(B, drop_remainder=True), B a multiple of 4"
    )
    endless = tf.data.Dataset.range(3).repeat().batch(6)
    assert fit_refusal(endless, 4) == (
        "fit needs every batch, the last one too, to split into microbatches=4 equal parts. "
        "Received: batches of 6; use .batch(B, drop_remainder=True), B a multiple of 4"
    )


def test_batches_that_all_split_pass_without_drop_remainder() -> None:
    for dataset, M in [(hundred(32), 4), (hundred(20).repeat(2).cache(), 4),
                       (tf.data.Dataset.range(3).repeat().batch(6), 3)]:  # fmt: skip
        assert data.checked(dataset, M, "fit") is dataset


@pytest.mark.parametrize(
    ("dataset", "sizes"),
    [(tf.data.Dataset.range(10).batch(4), (4, 10)),
     (tf.data.Dataset.range(10).padded_batch(4).map(lambda x: x).prefetch(1), (4, 10)),
     (tf.data.Dataset.range(10).batch(4, num_parallel_calls=2).repeat(), (4, 10)),
     (tf.data.Dataset.range(10).repeat().batch(4), (4, -1)),
     (tf.data.Dataset.range(10).batch(4).take(2), None),
     (tf.data.Dataset.range(10).filter(lambda x: x > 2).batch(4), None),
     (tf.data.Dataset.range(10), None)],
)  # fmt: skip
def test_batching_is_read_through_transformations_that_keep_every_batch(
    dataset: tf.data.Dataset, sizes: tuple[int, int] | None
) -> None:
    assert data.batching(dataset) == sizes


def test_fit_reads_arrays_by_row_and_names_itself_in_their_errors() -> None:
    import tfsift
    from tfsift.parallel.arrays import ArrayDataset

    tfsift.init({"microbatches": 2})
    train = data.training_data(X, X[:, 0], None, 4, 2, "fit", shuffle=False)
    assert isinstance(train, ArrayDataset)
    assert [x.numpy()[:, 0].tolist() for x, _ in train] == [[0, 2, 4, 6], [8, 10, 12, 14]]
    with pytest.raises(ValueError) as err:
        data.training_data(X, X[:9], None, 4, 2, "fit", shuffle=True)
    assert str(err.value) == (
        "fit needs arrays with one sample per row, all with the same number of rows. "
        "Received: row counts [10, 9]"
    )
    with pytest.raises(ValueError) as err:
        data.training_data(X, X, None, 3, 2, "fit", shuffle=True)
    assert str(err.value) == (
        "fit: batch_size must be a positive multiple of microbatches=2, since every batch "
        "splits into 2 microbatches. Received: batch_size=3"
    )


def test_fit_reads_a_dataset_without_the_autotuner(monkeypatch: pytest.MonkeyPatch) -> None:
    # with it, TensorFlow 2.21 can end each epoch waiting for its thread (shard.prompt_end)
    read = record_prompt_end(monkeypatch, data)
    dataset = tf.data.Dataset.from_tensor_slices((X, X[:, 0])).batch(5)
    assert [len(x) for x, _, _ in data.batches(dataset, None)] == [5, 5]
    assert read == [False]


class Batches(keras.utils.PyDataset):  # type: ignore[misc]
    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return X[i * 4 : (i + 1) * 4], X[i * 4 : (i + 1) * 4, :1]


def unread(what: str, kind: str, name: str) -> str:
    return (
        f"{what} reads a tf.data.Dataset of batches, (x, y) or (x, y, sample_weight), or "
        f"arrays; a {kind} is not read: make it a tf.data.Dataset (e.g. "
        "tf.data.Dataset.from_generator) and, with data-parallel replicas, give each its "
        f"shard with tfsift.shard. Received: x={name}"
    )


def test_a_pydataset_or_a_generator_is_refused_naming_what_fit_reads() -> None:
    # Keras reads both; fit said "needs targets: pass y" (every rank would have read all of
    # it, the replicas training on the same batches)
    tfsift.init({"microbatches": 2})
    model = Net()
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(TypeError) as err:
        model.fit(Batches(), verbose=0)
    assert str(err.value) == unread("fit", "keras.utils.PyDataset", "Batches")
    batches = ((X[:4], X[:4, :1]) for _ in range(2))
    with pytest.raises(TypeError) as err:
        data.training_data(batches, None, None, 4, 2, "evaluate", False)
    assert str(err.value) == unread("evaluate", "generator", "generator")
    with pytest.raises(TypeError) as err:
        data.prediction_data(iter([X]), 4)
    assert str(err.value) == unread("predict", "iterator", "list_iterator")


class Net(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.dense = keras.layers.Dense(1)

    def call(self, x: Any) -> Any:
        return self.dense(x)

"""fit's datasets: batches that split into microbatches, arrays padded for predict."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

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
        (tf.data.Dataset.from_tensor_slices(X).batch(4), ValueError, "Received: batch size None"),
        (tf.data.Dataset.from_tensor_slices(X).batch(3, True), ValueError, "batch size 3"),
    ],
    ids=["arrays", "unbatched", "not_static", "not_divisible"],
)
def test_a_dataset_that_cannot_split_fails_with_the_received_value(
    dataset: object, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        data.checked(dataset, 2, "fit")


def test_predict_arrays_are_padded_to_whole_microbatches_and_cut_back() -> None:
    dataset, keep = data.prediction_data(X, 4, 4)
    batches = [b.numpy() for b in dataset]
    assert keep == 10
    assert [len(b) for b in batches] == [4, 4, 4]  # 10 rows and 2 copies of the last
    np.testing.assert_array_equal(np.concatenate(batches)[:keep], X)

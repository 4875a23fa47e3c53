import numpy as np
import pytest

from tfsift.sift.selection import (
    Selection,
    check_losses,
    kept_count,
    top_k,
)


def test_selection_of_sorts_indices_and_carries_probs_along() -> None:
    selection = Selection.of([4, 0, 2], [0.4, 0.0, 0.2])
    assert selection.indices.dtype == np.int64
    assert selection.indices.tolist() == [0, 2, 4]
    assert selection.probs.tolist() == [0.0, 0.2, 0.4]
    assert len(selection) == 3


def test_selection_rejects_indices_and_probs_of_different_lengths() -> None:
    with pytest.raises(ValueError) as caught:
        Selection(np.array([0, 1]), np.array([0.5]))
    assert str(caught.value) == (
        "indices and probs must be 1-D of one length. "
        "Received: indices.shape=(2,), probs.shape=(1,)"
    )


def test_empty_selection_keeps_nothing() -> None:
    empty = Selection.empty()
    assert len(empty) == 0
    assert empty.indices.dtype == np.int64
    assert empty.probs.dtype == np.float64


def test_scalar_loss_is_rejected_with_the_fix() -> None:
    with pytest.raises(ValueError) as caught:
        check_losses(np.float32(0.3), 8)
    assert str(caught.value) == (
        "the per-sample loss must return one loss per sample (shape (B,)); it got a single "
        "value. Use a Keras loss with reduction=None. Received: shape=()"
    )


@pytest.mark.parametrize(
    ("losses", "message"),
    [
        (np.zeros(3), "Received: shape=(3,) for a batch of 8"),
        (np.zeros((8, 1)), "Received: shape=(8, 1) for a batch of 8"),
    ],
)
def test_loss_of_wrong_shape_is_rejected(losses: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        check_losses(losses, 8)
    assert str(caught.value) == (
        f"the per-sample loss must return one loss per sample (shape (B,)). {message}"
    )


def test_check_losses_returns_float64() -> None:
    losses = check_losses(np.array([1, 2], np.float16), 2)
    assert losses.dtype == np.float64
    assert losses.tolist() == [1.0, 2.0]


@pytest.mark.parametrize(
    ("keep", "B", "k"),
    [(0.5, 10, 5), (0.5, 9, 4), (0.01, 10, 1), (1.0, 7, 7), (0.29, 100, 29), (0.7, 10, 7)],
)
def test_kept_count_is_floor_of_keep_times_batch_but_at_least_one(
    keep: float, B: int, k: int
) -> None:
    assert kept_count(keep, B) == k


def test_top_k_breaks_ties_toward_the_lower_index() -> None:
    assert top_k(np.array([1.0, 3.0, 3.0, 2.0, 3.0]), 2).tolist() == [1, 2]
    assert top_k(np.array([5.0, 1.0, 5.0]), 2).tolist() == [0, 2]

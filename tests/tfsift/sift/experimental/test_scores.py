import math

import numpy as np
import pytest

from tfsift.sift.experimental.scores import (
    adaboost_alphas,
    finite_rows,
    grad_norms,
    require_logits,
    resolve_loss_kind,
    softmax,
)


def test_crossentropy_grad_norm_is_softmax_minus_one_hot() -> None:
    logits = np.array([[0.0, 0.0], [2.0, 0.0]])
    e = math.exp(2) / (math.exp(2) + 1)  # softmax([2, 0])[0]
    norms = grad_norms(logits, np.array([1, 1]))
    assert norms == pytest.approx([math.sqrt(0.5), math.sqrt(2) * e])


def test_crossentropy_accepts_labels_of_shape_b_by_one() -> None:
    norms = grad_norms(np.array([[0.0, 0.0, 0.0]]), np.array([[2]]))
    assert norms == pytest.approx([math.sqrt(2 / 9 + 4 / 9)])  # (1/3, 1/3, -2/3)


def test_one_hot_labels_with_explicit_crossentropy_are_categorical() -> None:
    norms = grad_norms(np.zeros((1, 2)), np.array([[0.0, 1.0]]), "softmax_crossentropy")
    assert norms == pytest.approx([math.sqrt(0.5)])


def test_squared_error_grad_norm_divides_by_the_output_size() -> None:
    # Keras MSE is the mean over the last axis, so the gradient is 2 (z - y) / d.
    norms = grad_norms(np.array([[3.0, 4.0], [1.0, 1.0]]), np.array([[0.0, 0.0], [1.0, 1.0]]))
    assert norms.tolist() == [5.0, 0.0]


def test_squared_error_with_one_output_accepts_flat_labels() -> None:
    norms = grad_norms(np.array([[1.5], [-1.0]]), np.array([0.5, 0.0]), "squared_error")
    assert norms.tolist() == [2.0, 2.0]


@pytest.mark.parametrize(
    ("logits_shape", "labels", "kind"),
    [
        ((4, 3), np.zeros(4, np.int64), "softmax_crossentropy"),
        ((4, 3), np.zeros((4, 1), np.int32), "softmax_crossentropy"),
        ((4, 3), np.zeros(4, np.float32), "softmax_crossentropy"),  # one fewer dimension
        ((4, 3), np.zeros((4, 3), np.float32), "squared_error"),
        ((4, 1), np.zeros(4, np.int64), "squared_error"),  # a single output is regression
        ((4,), np.zeros(4, np.float32), "squared_error"),
    ],
)
def test_auto_loss_kind_reads_the_labels(
    logits_shape: tuple[int, ...], labels: np.ndarray, kind: str
) -> None:
    assert resolve_loss_kind(np.zeros(logits_shape), labels, "auto") == kind


def test_explicit_loss_kind_wins_over_auto() -> None:
    labels = np.zeros(4, np.int64)
    assert resolve_loss_kind(np.zeros((4, 3)), labels, "squared_error") == "squared_error"


def test_unknown_loss_kind_is_rejected() -> None:
    with pytest.raises(ValueError) as caught:
        resolve_loss_kind(np.zeros((1, 2)), np.zeros(1), "hinge")
    assert str(caught.value) == (
        "loss_kind must be one of 'auto', 'softmax_crossentropy', 'squared_error'. "
        "Received: loss_kind='hinge'"
    )


def test_label_out_of_range_is_rejected() -> None:
    with pytest.raises(ValueError) as caught:
        grad_norms(np.zeros((2, 3)), np.array([0, 3]))
    assert (
        str(caught.value)
        == "labels must be class indices in [0, 3). Received: labels between 0 and 3"
    )


def test_logits_and_labels_of_different_batch_are_rejected() -> None:
    with pytest.raises(ValueError) as caught:
        grad_norms(np.zeros((2, 3)), np.array([0, 1, 2]))
    assert str(caught.value) == (
        "logits and labels must have one row per sample. "
        "Received: logits.shape=(2, 3), labels.shape=(3,)"
    )


def test_squared_error_labels_must_match_the_outputs() -> None:
    with pytest.raises(ValueError, match="squared error needs labels shaped like the outputs"):
        grad_norms(np.zeros((2, 3)), np.zeros((2, 2)))


def test_crossentropy_needs_two_dimensional_logits() -> None:
    with pytest.raises(ValueError, match="softmax cross-entropy needs logits of shape"):
        grad_norms(np.zeros((2, 3, 4)), np.zeros((2, 3), np.int64), "softmax_crossentropy")


def test_adaboost_alphas_follow_the_formula() -> None:
    losses = np.array([0.0, 1.0, 2.0])
    half = 1.0 / (2.0 + 1e-12)
    top = 1 - 1e-6
    expected = [0.0, 0.5 * math.log((1 + half) / (1 - half)), 0.5 * math.log((1 + top) / (1 - top))]
    assert adaboost_alphas(losses) == pytest.approx(expected, rel=1e-12)


def test_adaboost_clips_near_maximal_losses_to_one_weight() -> None:
    alphas = adaboost_alphas(np.array([1.9999999, 2.0]))
    assert alphas[0] == alphas[1]


def test_softmax_is_stable_for_large_scores() -> None:
    assert softmax(np.array([1000.0, 1000.0])).tolist() == [0.5, 0.5]


def test_finite_rows_takes_rows_and_checks_the_batch() -> None:
    rows = finite_rows(np.arange(8).reshape(4, 2), np.array([1, 3]), 4)
    assert rows is not None
    assert rows.tolist() == [[2, 3], [6, 7]]
    assert finite_rows(None, np.array([0]), 4) is None
    with pytest.raises(ValueError) as caught:
        finite_rows(np.zeros((3, 2)), np.array([0]), 4)
    assert str(caught.value) == (
        "logits and labels must have one row per sample. Received: shape=(3, 2) for a batch of 4"
    )


def test_require_logits_names_the_method() -> None:
    with pytest.raises(ValueError) as caught:
        require_logits("grad_norm", None, np.zeros(4))
    assert str(caught.value) == (
        "the grad_norm method needs the logits and labels of the scored samples; pass logits= "
        "and labels= to select. Received: logits=None, labels=shape (4,)"
    )

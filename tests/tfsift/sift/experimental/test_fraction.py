"""The fraction policies (``tfsift.sift.experimental.fraction``); what every policy does
alike is tested in ``tests/tfsift/sift/test_policies.py``."""

import numpy as np
import pytest

from tfsift.sift.config import METHODS
from tfsift.sift.experimental.fraction import FractionPolicy, choose, coreset_extremes
from tfsift.sift.selection import kept_count

NAN = float("nan")
INF = float("inf")
LOSSES = [0.1, 0.9, 0.5, 0.7, 0.3, 0.2, 0.8, 0.4, 0.6, 0.05]
# As (loss, index), ascending: (0.05, 9) (0.1, 0) (0.2, 5) (0.3, 4) (0.4, 7) | (0.5, 2)
# (0.6, 8) (0.7, 3) (0.8, 6) (0.9, 1). Mean 0.455, nearest: 2, 7, 8, 4, 3.


@pytest.mark.parametrize(
    ("method", "kept"),
    [
        ("big_loss", [1, 2, 3, 6, 8]),
        ("small_loss", [0, 4, 5, 7, 9]),
        ("adaboost", [1, 2, 3, 6, 8]),  # increasing in the loss
        ("coreset_extremes", [0, 1, 3, 6, 9]),  # 3 highest (1, 6, 3) and 2 lowest (9, 0)
        ("coreset_mean", [2, 3, 4, 7, 8]),
        ("uniform", [2, 3, 4, 5, 7]),  # np.random.default_rng(0).choice(10, 5, replace=False)
    ],
)
def test_fraction_policy_keeps_the_pinned_half(method: str, kept: list[int]) -> None:
    selection = FractionPolicy(method, keep=0.5).select(LOSSES, np.random.default_rng(0))
    assert selection.indices.tolist() == kept
    assert selection.indices.dtype == np.int64
    assert selection.probs.tolist() == [0.5] * 5


def test_grad_norm_keeps_the_largest_crossentropy_gradients() -> None:
    # norms: ~0, sqrt(0.5), ~sqrt(2), sqrt(2) * e^2 / (e^2 + 1) = 1.25 (label 1)
    logits = np.array([[10.0, -10.0], [0.0, 0.0], [-10.0, 10.0], [2.0, 0.0]])
    labels = np.array([0, 0, 0, 1])
    selection = FractionPolicy("grad_norm", 0.5).select(np.ones(4), None, logits, labels)
    assert selection.indices.tolist() == [2, 3]


def test_grad_norm_keeps_the_largest_squared_error_gradients() -> None:
    # gradient 2 (z - y) / 2 = z - y: norms 1, 0, 5, 2
    logits = np.array([[1.0, 0.0], [0.0, 0.0], [3.0, 4.0], [0.0, 2.0]])
    selection = FractionPolicy("grad_norm", 0.5).select(np.ones(4), None, logits, np.zeros((4, 2)))
    assert selection.indices.tolist() == [2, 3]


def test_adaboost_ties_near_maximal_losses_to_the_lower_index() -> None:
    # Both clip to l~ = 1 - 1e-6, so adaboost ties where big_loss does not.
    losses = np.array([1.9999999, 2.0, 0.5])
    assert choose("adaboost", losses, 1).tolist() == [0]
    assert choose("big_loss", losses, 1).tolist() == [1]


def test_ties_go_to_the_lower_index() -> None:
    losses = np.array([1.0, 1.0, 1.0, 1.0])
    assert choose("big_loss", losses, 2).tolist() == [0, 1]
    assert choose("small_loss", losses, 2).tolist() == [0, 1]
    assert choose("coreset_mean", losses, 2).tolist() == [0, 1]
    assert choose("adaboost", losses, 2).tolist() == [0, 1]


def test_coreset_extremes_never_keeps_a_sample_twice() -> None:
    assert coreset_extremes(np.array([1.0, 1.0]), 2).tolist() == [0, 1]
    assert coreset_extremes(np.array([3.0, 1.0, 2.0]), 3).tolist() == [0, 1, 2]
    assert coreset_extremes(np.array([3.0, 1.0, 2.0]), 1).tolist() == [0]


def test_fraction_policy_keeps_at_least_one() -> None:
    assert FractionPolicy("big_loss", 0.01).select([1.0, 3.0, 2.0]).indices.tolist() == [1]
    assert kept_count(0.01, 3) == 1


def test_non_finite_losses_are_never_kept() -> None:
    losses = [NAN, 0.9, INF, 0.1, -INF, 0.5, NAN, 0.3]
    # k = floor(0.25 * 8) = 2 of the 4 finite losses, so each is kept with 2 / 4.
    big = FractionPolicy("big_loss", 0.25).select(losses)
    assert big.indices.tolist() == [1, 5]
    assert big.probs.tolist() == [0.5, 0.5]
    everything = FractionPolicy("big_loss", 1.0).select(losses)
    assert everything.indices.tolist() == [1, 3, 5, 7]
    small = FractionPolicy("small_loss", 0.25).select(losses)
    assert small.indices.tolist() == [3, 7]
    assert small.probs.tolist() == [0.5, 0.5]


def test_unknown_fraction_method_is_rejected() -> None:
    with pytest.raises(ValueError) as caught:
        FractionPolicy("relative")
    assert str(caught.value) == (
        f"method must be one of {', '.join(map(repr, METHODS))}. Received: method='relative'"
    )


def test_uniform_needs_an_rng() -> None:
    with pytest.raises(ValueError, match="the uniform method needs an rng"):
        FractionPolicy("uniform").select(LOSSES)

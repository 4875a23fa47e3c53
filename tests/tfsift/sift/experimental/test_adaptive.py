import math

import numpy as np
import pytest

from tfsift.sift.experimental.adaptive import AdaptivePolicy, grad_norm_scores, method_scores

NAN = float("nan")


def plain_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    result: np.ndarray = e / e.sum()
    return result


def test_two_steps_match_the_rule_written_out() -> None:
    policy = AdaptivePolicy(("big_loss", "small_loss", "coreset_mean"), keep=0.5, eta=2.0, T=10.0)

    # Step 0: weights 1/3, lambda_0 = 1, so the reward is I_small.
    l0 = np.array([1.0, 2.0, 3.0, 4.0])
    h0 = l0 / 4.0
    big0, small0 = plain_softmax(h0), plain_softmax(1 - h0)
    mean0 = plain_softmax(1 - np.abs(l0 - 2.5) / 1.5)  # scores [0, 2/3, 2/3, 0]
    final0 = (big0 + small0 + mean0) / 3 + small0
    assert np.argsort(-final0, kind="stable")[:2].tolist() == [0, 1]
    assert policy.select(l0).indices.tolist() == [0, 1]
    assert policy.weights == pytest.approx({m: 1 / 3 for m in policy.methods})

    # Step 1: Delta = (2.5 - 0.9) / 2.5, c_m = I_m at step 0 summed over the kept [0, 1].
    l1 = np.array([0.5, 1.0, 2.0, 0.1])
    delta = (2.5 - 0.9) / 2.5
    shares = np.array([big0[:2].sum(), small0[:2].sum(), mean0[:2].sum()])
    raw = np.exp(2.0 * delta * shares) / 3
    weights = raw / raw.sum()  # all above the floor 0.01 / 3
    h1 = l1 / 2.0
    big1, small1 = plain_softmax(h1), plain_softmax(1 - h1)
    dev1 = np.abs(l1 - 0.9)
    mean1 = plain_softmax(1 - dev1 / dev1.max())
    lam = 10.0 / 11.0
    final1 = weights @ np.stack([big1, small1, mean1]) + lam * small1 + (1 - lam) / 4
    expected = sorted(np.argsort(-final1, kind="stable")[:2].tolist())
    assert expected == [0, 3]

    selection = policy.select(l1)
    assert selection.indices.tolist() == expected
    assert selection.probs.tolist() == [0.5, 0.5]
    assert list(policy.weights.values()) == pytest.approx(weights.tolist(), rel=1e-9)
    assert (
        policy.weights["small_loss"] > policy.weights["coreset_mean"] > policy.weights["big_loss"]
    )


def test_weights_are_floored_at_one_percent_of_uniform() -> None:
    policy = AdaptivePolicy(("big_loss", "small_loss"), keep=0.5, eta=1000.0)
    policy.select([1.0, 2.0, 3.0, 4.0])  # the curriculum keeps the small losses [0, 1]
    policy.select([0.01, 0.01, 0.01, 0.01])  # Delta ~ 1: small_loss takes almost all
    assert policy.weights == pytest.approx({"big_loss": 0.005 / 1.005, "small_loss": 1 / 1.005})
    assert policy.metrics() == pytest.approx(
        {"weight_big_loss": 0.005 / 1.005, "weight_small_loss": 1 / 1.005}
    )


def test_a_loss_jump_does_not_underflow_the_weights() -> None:
    policy = AdaptivePolicy(("big_loss", "small_loss"), keep=0.5, eta=1.0)
    policy.select([1e-12, 2e-12, 3e-12, 4e-12])
    policy.select([1.0, 2.0, 3.0, 4.0])  # Delta ~ -4e11
    weights = np.array(list(policy.weights.values()))
    assert np.isfinite(weights).all()
    assert weights.sum() == pytest.approx(1.0)
    assert weights.min() == pytest.approx(0.005 / 1.005)


def test_zero_previous_loss_leaves_the_weights_alone() -> None:
    policy = AdaptivePolicy(("big_loss", "small_loss"), keep=0.5)
    policy.select([0.0, 0.0])
    policy.select([1.0, 2.0])
    assert policy.weights == {"big_loss": 0.5, "small_loss": 0.5}


def test_curriculum_fades_from_small_losses_to_uniform() -> None:
    # big_loss alone. At step 0 (lambda = 1) the reward I_small outweighs it: sample 3
    # scores e^0.25 / S_big + e^0.75 / S_small = 0.527 against 0.507 for sample 0. At
    # step 1 with T tiny the reward is nearly uniform and the biggest loss wins.
    losses = [4.0, 3.0, 2.9, 1.0]
    early = AdaptivePolicy(("big_loss",), keep=0.25, T=1e9)
    assert early.select(losses).indices.tolist() == [3]
    late = AdaptivePolicy(("big_loss",), keep=0.25, T=1e-9)
    late.select(losses)
    assert late.select(losses).indices.tolist() == [0]


def test_method_scores_are_the_documented_values() -> None:
    losses = np.array([1.0, 3.0, 2.0, 0.0])
    big = method_scores("big_loss", losses, None)
    assert big == pytest.approx([1 / 3, 1, 2 / 3, 0])
    assert method_scores("small_loss", losses, None) == pytest.approx([2 / 3, 0, 1 / 3, 1])
    # ascending order 3, 0, 2, 1: ranks [1, 3, 2, 0]; |2 r - 3| / 3
    assert method_scores("coreset_extremes", losses, None).tolist() == [1 / 3, 1, 1 / 3, 1]
    # mean 1.5, deviations [0.5, 1.5, 0.5, 1.5]
    assert method_scores("coreset_mean", losses, None) == pytest.approx([2 / 3, 0, 2 / 3, 0])
    clipped = np.minimum(losses / 3, 1 - 1e-6)
    alphas = 0.5 * np.log((1 + clipped) / (1 - clipped))
    assert method_scores("adaboost", losses, None) == pytest.approx(alphas / alphas.max())
    uniform = method_scores("uniform", losses, np.random.default_rng(3))
    assert uniform.tolist() == np.random.default_rng(3).random(4).tolist()


def test_method_scores_degenerate_batches() -> None:
    assert method_scores("coreset_extremes", np.array([5.0]), None).tolist() == [1.0]
    assert method_scores("coreset_mean", np.array([2.0, 2.0]), None).tolist() == [1.0, 1.0]
    assert method_scores("adaboost", np.zeros(3), None).tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="needs an rng"):
        method_scores("uniform", np.zeros(3), None)


def test_grad_norm_scores_scale_into_the_unit_interval() -> None:
    crossentropy = grad_norm_scores(np.array([[0.0, 0.0], [0.0, 0.0]]), np.array([0, 1]))
    assert crossentropy == pytest.approx([0.5, 0.5])
    squared = grad_norm_scores(np.array([[3.0, 4.0], [0.0, 1.0]]), np.zeros((2, 2)))
    assert squared.tolist() == [1.0, 0.2]
    zero = grad_norm_scores(np.zeros((2, 2)), np.zeros((2, 2)))
    assert zero.tolist() == [0.0, 0.0]


def test_grad_norm_method_without_logits_is_an_error_naming_it() -> None:
    policy = AdaptivePolicy(("big_loss", "grad_norm"))
    assert policy.needs_logits
    with pytest.raises(ValueError, match="the grad_norm method needs the logits"):
        policy.select([1.0, 2.0])


def test_grad_norm_method_uses_the_logits() -> None:
    # Equal losses; only the gradient norms differ: sample 2 is confidently wrong.
    logits = np.array([[5.0, -5.0], [0.0, 0.0], [-5.0, 5.0], [5.0, -5.0]])
    policy = AdaptivePolicy(("grad_norm",), keep=0.25, T=1e-9)
    policy.select(np.ones(4), logits=logits, labels=np.zeros(4, np.int64))
    kept = policy.select(np.ones(4), logits=logits, labels=np.zeros(4, np.int64))
    assert kept.indices.tolist() == [2]


def test_non_finite_losses_are_never_kept() -> None:
    policy = AdaptivePolicy(keep=1.0)
    logits = np.zeros((5, 3))
    labels = np.zeros(5, np.int64)
    losses = [0.5, NAN, 0.2, float("inf"), 0.9]
    selection = policy.select(losses, np.random.default_rng(0), logits, labels)
    assert selection.indices.tolist() == [0, 2, 4]
    assert selection.probs.tolist() == [1.0, 1.0, 1.0]


def test_all_nan_batch_keeps_nothing_and_leaves_the_state() -> None:
    policy = AdaptivePolicy(("big_loss", "small_loss"))
    policy.select([1.0, 2.0])
    before = policy.state()
    assert len(policy.select([NAN, NAN])) == 0
    after = policy.state()
    assert after["step"] == before["step"] == 1
    assert after["previous_share"].tolist() == before["previous_share"].tolist()


def test_state_round_trips_and_continues_identically() -> None:
    draws = np.random.default_rng(1)
    batches = draws.exponential(size=(3, 8))
    first = AdaptivePolicy(("uniform", "big_loss", "coreset_extremes"), keep=0.5)
    first.select(batches[0], np.random.default_rng(0))
    first.select(batches[1], np.random.default_rng(1))
    second = AdaptivePolicy(("uniform", "big_loss", "coreset_extremes"), keep=0.5)
    second.load_state(first.state())
    a = first.select(batches[2], np.random.default_rng(2))
    b = second.select(batches[2], np.random.default_rng(2))
    assert a.indices.tolist() == b.indices.tolist()
    assert first.weights == second.weights
    state = first.state()
    assert state["step"] == 3
    assert math.isfinite(state["previous_loss"])


def test_fresh_state_is_plain_numbers() -> None:
    state = AdaptivePolicy(("big_loss",)).state()
    assert state["step"] == 0
    assert math.isnan(state["previous_loss"])
    assert state["weights"].tolist() == [1.0]
    assert state["previous_share"].tolist() == []


def test_state_for_other_methods_is_rejected() -> None:
    with pytest.raises(ValueError, match="another number of methods"):
        AdaptivePolicy(("big_loss",)).load_state(AdaptivePolicy(("big_loss", "uniform")).state())


def test_unknown_method_is_rejected() -> None:
    with pytest.raises(ValueError, match="methods must be among"):
        AdaptivePolicy(("big_loss", "largest"))


def test_a_rejected_call_leaves_the_state_unchanged() -> None:
    policy = AdaptivePolicy(("big_loss", "grad_norm"))
    labels = np.zeros(2, np.int64)
    policy.select([1.0, 2.0], logits=np.zeros((2, 2)), labels=labels)
    before = policy.state()
    with pytest.raises(ValueError, match="one row per sample"):
        policy.select([3.0, 4.0], logits=np.zeros((3, 2)), labels=labels)
    after = policy.state()
    assert after["step"] == before["step"] == 1
    assert after["weights"].tolist() == before["weights"].tolist()

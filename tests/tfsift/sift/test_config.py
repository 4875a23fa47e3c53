import dataclasses
from typing import Any

import numpy as np
import pytest

from tfsift.sift.config import (
    LOSS_KINDS,
    METHODS,
    POLICIES,
    RESCALES,
    SCORERS,
    SCORES,
    SiftConfig,
)
from tfsift.sift.experimental.options import LEFTOVERS


def test_defaults_are_the_documented_ones() -> None:
    config = SiftConfig()
    assert (config.policy, config.beta, config.history, config.delay) == ("relative", 1.0, 500, 0)
    assert (config.min_prob, config.keep, config.eta, config.curriculum_T) == (0.0, 0.5, 1.0, 1e3)
    assert config.methods == METHODS
    assert config.methods == (
        "uniform",
        "big_loss",
        "small_loss",
        "grad_norm",
        "adaboost",
        "coreset_extremes",
        "coreset_mean",
    )
    assert (config.rescale, config.score_batches, config.drop_remainder) == (None, 1, True)
    # with training scores a round computes nothing: 8 source batches pay its fixed cost once
    assert SiftConfig(scores="training", stale=1).score_batches == 8
    assert SiftConfig(scores="training", stale=1, score_batches=1).score_batches == 1
    assert (config.scorer, config.exit_after, config.exit_head, config.exit_lr) == (
        "full",
        None,
        None,
        1e-3,
    )
    assert (config.stale, config.seed, config.log_dir, config.loss_kind) == (0, 0, None, "auto")
    assert (config.overlap, config.leftover) == (False, "score")
    assert (config.scores, config.prune, config.anneal, config.epochs) == (
        "forward",
        0.5,
        0.125,
        None,
    )


def test_choices_are_module_constants() -> None:
    assert POLICIES == (
        "relative",
        "big_loss",
        "small_loss",
        "uniform",
        "grad_norm",
        "adaboost",
        "coreset_extremes",
        "coreset_mean",
        "adaptive",
        "infobatch",
    )
    assert SCORES == ("forward", "training")
    assert RESCALES == ("normalized", "unbiased")
    assert SCORERS == ("full", "early_exit")
    assert LEFTOVERS == ("score", "keep")
    assert LOSS_KINDS == ("auto", "softmax_crossentropy", "squared_error")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"beta": 0}, "beta must be > 0. Received: beta=0"),
        ({"beta": -1.5}, "beta must be > 0. Received: beta=-1.5"),
        ({"beta": "1"}, "beta must be a finite number. Received: beta='1'"),
        ({"beta": True}, "beta must be a finite number. Received: beta=True"),
        ({"eta": float("nan")}, "eta must be a finite number. Received: eta=nan"),
        ({"curriculum_T": float("inf")}, "curriculum_T must be a finite number. Received: "
         "curriculum_T=inf"),
        ({"exit_lr": 0.0}, "exit_lr must be > 0. Received: exit_lr=0.0"),
        ({"history": 0}, "history must be an integer >= 1. Received: history=0"),
        ({"history": True}, "history must be an integer >= 1. Received: history=True"),
        ({"history": 5.0}, "history must be an integer >= 1. Received: history=5.0"),
        ({"delay": -1}, "delay must be an integer >= 0. Received: delay=-1"),
        ({"score_batches": 0}, "score_batches must be an integer >= 1. Received: score_batches=0"),
        ({"stale": -2}, "stale must be an integer >= 0. Received: stale=-2"),
        ({"seed": -1}, "seed must be an integer >= 0. Received: seed=-1"),
        ({"min_prob": 1.5}, "min_prob must be in [0, 1]. Received: min_prob=1.5"),
        ({"keep": 1.5}, "keep must be in (0, 1]. Received: keep=1.5"),
        ({"keep": 0}, "keep must be in (0, 1]. Received: keep=0"),
        ({"drop_remainder": 1}, "drop_remainder must be true or false. Received: "
         "drop_remainder=1"),
        ({"scorer": "fast"}, "scorer must be one of 'full', 'early_exit'. Received: "
         "scorer='fast'"),
        ({"loss_kind": "mse"}, "loss_kind must be one of 'auto', 'softmax_crossentropy', "
         "'squared_error'. Received: loss_kind='mse'"),
        ({"rescale": "none"}, "rescale must be None or one of 'auto', 'normalized', 'unbiased'. "
         "Received: rescale='none'"),
        ({"exit_after": ""}, "exit_after must be None or a non-empty string. Received: "
         "exit_after=''"),
        ({"log_dir": 3}, "log_dir must be None or a non-empty string. Received: log_dir=3"),
        ({"exit_head": 3}, "exit_head must be None or a callable Keras layer. Received: "
         "exit_head=3"),
        ({"scorer": "early_exit", "overlap": True, "leftover": "drop"}, "leftover must be "
         "one of 'score', 'keep'. Received: leftover='drop'"),
        ({"leftover": "keep"}, "leftover decides what overlap had no wait to score; it "
         "needs overlap=True. Received: leftover='keep', overlap=False"),
        ({"scores": "backward"}, "scores must be one of 'forward', 'training'. Received: "
         "scores='backward'"),
        ({"prune": 1.0}, "prune must be in [0, 1). Received: prune=1.0"),
        ({"anneal": -0.1}, "anneal must be in [0, 1]. Received: anneal=-0.1"),
        ({"epochs": 0}, "epochs must be an integer >= 1. Received: epochs=0"),
        ({"scores": "training", "stale": 2, "scorer": "early_exit"}, "scores='training' runs "
         "no scoring pass, so it takes no scorer of its own; leave scorer='full'. Received: "
         "scores='training', scorer='early_exit'"),
        ({"scores": "training", "stale": 2, "policy": "grad_norm"}, "the grad_norm method "
         "needs the model's logits, which scores='training' does not keep. Received: "
         "scores='training', policy='grad_norm', methods=" + repr(METHODS)),
        ({"scores": "training", "stale": 2, "policy": "adaptive"}, "the grad_norm method "
         "needs the model's logits, which scores='training' does not keep. Received: "
         "scores='training', policy='adaptive', methods=" + repr(METHODS)),
        ({"scores": "training", "stale": 0}, "scores='training' uses the loss a sample had "
         "when it was last trained, an epoch or more before it comes again; stale must be "
         ">= 1 (the epochs such a loss stays usable). Received: scores='training', stale=0"),
        ({"policy": "infobatch", "epochs": 8, "scores": "forward"},
         "policy='infobatch' prunes by the loss each sample had when it was last trained; "
         "it needs scores='training'. Received: scores='forward'"),
        ({"policy": "infobatch", "epochs": 8, "rescale": None},
         "policy='infobatch' weighs the kept samples below the mean score by 1 / (1 - "
         "prune), which the training step must apply; it needs rescale='unbiased' "
         "(InfoBatch's weights) or 'normalized'. Received: rescale=None"),
        ({"policy": "infobatch", "stale": 0}, "scores='training' uses the loss a sample had "
         "when it was last trained, an epoch or more before it comes again; stale must be "
         ">= 1 (the epochs such a loss stays usable). Received: scores='training', stale=0"),
        ({"policy": "infobatch", "epochs": "8"}, "epochs must be an integer >= 1. Received: "
         "epochs='8'"),
    ],
)  # fmt: skip
def test_invalid_field_raises_with_constraint_and_value(
    changes: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError) as caught:
        SiftConfig(**changes)  # type: ignore[arg-type]
    assert str(caught.value) == message


def test_unknown_policy_lists_every_choice() -> None:
    with pytest.raises(ValueError) as caught:
        SiftConfig(policy="foo")
    assert str(caught.value) == (
        "policy must be one of 'relative', 'big_loss', 'small_loss', 'uniform', 'grad_norm', "
        "'adaboost', 'coreset_extremes', 'coreset_mean', 'adaptive', 'infobatch'. Received: "
        "policy='foo'"
    )


def test_training_scores_and_infobatch_are_accepted_with_what_they_need() -> None:
    config = SiftConfig(
        policy="infobatch", scores="training", stale=8, epochs=8, prune=0.7,
        rescale="unbiased",
    )  # fmt: skip
    assert (config.prune, config.anneal, config.epochs) == (0.7, 0.125, 8)
    assert config.expected_kept() == pytest.approx(0.65)
    relative = SiftConfig(scores="training", stale=1, beta=3.0)
    assert relative.expected_kept() == 0.25
    adaptive = SiftConfig(policy="adaptive", scores="training", stale=1, methods=("big_loss",))
    assert adaptive.methods == ("big_loss",)


def test_infobatch_implies_training_scores_its_weights_and_a_table_for_the_run() -> None:
    config = SiftConfig(policy="infobatch", epochs=10)
    assert (config.scores, config.rescale, config.stale, config.score_batches) == (
        "training",
        "unbiased",
        10,
        8,
    )
    assert (config.prune, config.anneal) == (0.5, 0.125)
    assert config == SiftConfig(
        policy="infobatch", scores="training", rescale="unbiased", stale=10, epochs=10
    )
    # what is given is kept: the other weights, a table that forgets
    given = SiftConfig(policy="infobatch", epochs=10, rescale="normalized", stale=2)
    assert (given.rescale, given.stale) == ("normalized", 2)


def test_training_scores_imply_a_table_of_one_epoch() -> None:
    config = SiftConfig(policy="relative", beta=1.0, scores="training")
    assert (config.stale, config.score_batches, config.rescale) == (1, 8, None)
    assert SiftConfig(rescale="auto").rescale is None


def test_replace_resolves_again_what_followed_from_the_others() -> None:
    config = SiftConfig(policy="infobatch")  # fit fills in its epochs
    assert config.stale == 1
    assert config.replace(epochs=20).stale == 20
    # (epochs is InfoBatch's alone: kept for relative, it would be refused)
    relative = SiftConfig(policy="infobatch", epochs=4).replace(policy="relative", epochs=None)
    assert (relative.scores, relative.rescale, relative.stale, relative.score_batches) == (
        "forward",
        None,
        0,
        1,
    )
    # a value given stays given through replace
    assert SiftConfig(policy="infobatch", epochs=4, stale=2).replace(epochs=9).stale == 2


def test_infobatch_without_epochs_is_refused_where_no_fit_gives_them() -> None:
    SiftConfig(policy="infobatch", epochs=3).check_epochs()
    SiftConfig().check_epochs()
    with pytest.raises(ValueError) as caught:
        SiftConfig(policy="infobatch").check_epochs()
    assert str(caught.value) == (
        "policy='infobatch' stops pruning for the last anneal fraction of the run; it needs "
        "epochs (how many epochs you train; fit passes its own). Received: epochs=None"
    )


def test_unknown_method_lists_every_method() -> None:
    with pytest.raises(ValueError) as caught:
        SiftConfig(methods=("foo",))
    assert str(caught.value) == (
        "methods must be among 'uniform', 'big_loss', 'small_loss', 'grad_norm', 'adaboost', "
        "'coreset_extremes', 'coreset_mean'. Received: methods=('foo',)"
    )


@pytest.mark.parametrize(
    ("methods", "message"),
    [
        ((), "methods must be a non-empty list of method names. Received: methods=()"),
        ("uniform", "methods must be a non-empty list of method names. Received: "
         "methods='uniform'"),
        (("uniform", "big_loss", "uniform"), "methods must not repeat a method. Received: "
         "methods=('uniform', 'big_loss', 'uniform')"),
    ],
)  # fmt: skip
def test_methods_must_be_a_nonempty_list_without_repeats(methods: object, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        SiftConfig(methods=methods)  # type: ignore[arg-type]
    assert str(caught.value) == message


def test_methods_given_as_a_list_are_stored_as_a_tuple() -> None:
    config = SiftConfig(policy="adaptive", methods=["big_loss", "small_loss"])  # type: ignore[arg-type]
    assert config.methods == ("big_loss", "small_loss")


def test_ints_are_accepted_for_float_fields() -> None:
    config = SiftConfig(beta=3, min_prob=0)
    assert (config.beta, config.min_prob) == (3, 0)
    config = SiftConfig(policy="adaptive", keep=1, eta=2, curriculum_T=10)
    assert (config.keep, config.eta, config.curriculum_T) == (1, 2, 10)
    assert SiftConfig(scorer="early_exit", exit_lr=1).exit_lr == 1


def test_any_callable_is_accepted_as_exit_head() -> None:
    head = SiftConfig(scorer="early_exit", exit_after="dense_1", exit_head=abs).exit_head
    assert head is abs


def test_config_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        SiftConfig().beta = 2.0  # type: ignore[misc]


def test_replace_returns_a_validated_copy() -> None:
    config = SiftConfig(policy="adaptive")
    assert config.replace(keep=0.25) == SiftConfig(policy="adaptive", keep=0.25)
    assert config.keep == 0.5
    with pytest.raises(ValueError, match="keep must be in"):
        config.replace(keep=2.0)


@pytest.mark.parametrize(
    "changes, kept",
    [({}, 0.5), ({"beta": 3.0}, 0.25),
     ({"min_prob": 0.1}, 0.1**2 + (1 - 0.1**2) / 2),  # max(0.1, p) has mean 0.505
     ({"policy": "big_loss", "keep": 0.3}, 0.3), ({"policy": "adaptive", "keep": 0.4}, 0.4)],
)  # fmt: skip
def test_expected_kept_is_the_policys_long_run_fraction(
    changes: dict[str, Any], kept: float
) -> None:
    assert SiftConfig(**changes).expected_kept() == pytest.approx(kept, rel=1e-12)


def test_expected_kept_of_the_relative_rule_matches_sampled_percentiles() -> None:
    config = SiftConfig(beta=2.0, min_prob=0.2)
    p = (np.arange(200_000) + 0.5) / 200_000
    assert config.expected_kept() == pytest.approx(np.maximum(0.2, p**2.0).mean(), rel=1e-6)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"policy": "infobatch", "keep": 0.3},
         "keep is read by the policies big_loss, small_loss, uniform, grad_norm, adaboost, "
         "coreset_extremes, coreset_mean and adaptive only; policy='infobatch' would ignore "
         "it (it reads prune, anneal, epochs): leave keep out. "
         "Received: policy='infobatch', keep=0.3"),
        ({"policy": "big_loss", "beta": 2.0},
         "beta is read by policy 'relative' only; policy='big_loss' would ignore it (it reads "
         "keep): leave beta out. Received: policy='big_loss', beta=2.0"),
        ({"policy": "relative", "prune": 0.3},
         "prune is read by policy 'infobatch' only; policy='relative' would ignore it (it "
         "reads beta, history, min_prob): leave prune out. Received: policy='relative', "
         "prune=0.3"),
        ({"epochs": 10},
         "epochs is read by policy 'infobatch' only; policy='relative' would ignore it (it "
         "reads beta, history, min_prob): leave epochs out. Received: policy='relative', "
         "epochs=10"),
        ({"policy": "uniform", "methods": ("uniform",)},
         "methods is read by policy 'adaptive' only; policy='uniform' would ignore it (it "
         "reads keep): leave methods out. Received: policy='uniform', methods=('uniform',)"),
        ({"exit_after": "dense"},
         "exit_after shapes the early-exit scoring pass; it needs scorer='early_exit'. "
         "Received: scorer='full', exit_after='dense'"),
        ({"policy": "infobatch", "exit_lr": 0.01},
         "exit_lr shapes the early-exit scoring pass; it needs scorer='early_exit'. "
         "Received: scorer='full', exit_lr=0.01"),
    ],
)  # fmt: skip
def test_a_field_the_policy_does_not_read_is_refused_not_ignored(
    fields: dict[str, Any], message: str
) -> None:
    # each was accepted and had no effect: InfoBatch given keep=0.3 pruned by prune (0.5)
    with pytest.raises(ValueError) as caught:
        SiftConfig(**fields)
    assert str(caught.value) == message


def test_a_field_left_at_its_default_or_read_by_the_policy_is_accepted() -> None:
    SiftConfig(policy="infobatch", keep=0.5, beta=1.0)  # the defaults: nothing ignored
    SiftConfig(policy="big_loss", keep=0.25)
    SiftConfig(policy="relative", beta=3.0, history=50, min_prob=0.1)
    SiftConfig(policy="infobatch", prune=0.3, anneal=0.2, epochs=4)
    SiftConfig(policy="adaptive", methods=("big_loss", "uniform"), keep=0.3, eta=2.0)
    SiftConfig(scorer="early_exit", exit_after="dense", exit_lr=0.01)


def test_numpy_numbers_are_taken_as_the_python_numbers_they_stand_for() -> None:
    # a value computed with NumPy: epochs=np.int64(3) was refused as "must be an integer"
    config = SiftConfig(policy="infobatch", epochs=np.int64(3), prune=np.float32(0.25))
    assert (config.epochs, config.prune, config.stale) == (3, 0.25, 3)
    assert type(config.epochs) is int and type(config.prune) is float
    assert SiftConfig(beta=np.float32(0.5), seed=np.int32(2)).beta == 0.5

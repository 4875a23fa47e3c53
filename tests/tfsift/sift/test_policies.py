import doctest
from types import ModuleType

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tfsift.sift.config
import tfsift.sift.experimental.adaptive
import tfsift.sift.experimental.fraction
import tfsift.sift.experimental.scores
import tfsift.sift.policies
import tfsift.sift.relative
import tfsift.sift.selection
from tfsift.sift.config import POLICIES, SiftConfig
from tfsift.sift.experimental.adaptive import AdaptivePolicy
from tfsift.sift.experimental.fraction import FractionPolicy
from tfsift.sift.policies import make_policy
from tfsift.sift.relative import RelativePolicy
from tfsift.sift.selection import kept_count

NAN = float("nan")
# infobatch decides once per epoch, by sample key, from a table of training losses
# (test_infobatch.py); the others select within each scored group
ROUND_POLICIES = tuple(p for p in POLICIES if p != "infobatch")
INF = float("inf")
LOSSES = [0.1, 0.9, 0.5, 0.7, 0.3, 0.2, 0.8, 0.4, 0.6, 0.05]
# As (loss, index), ascending: (0.05, 9) (0.1, 0) (0.2, 5) (0.3, 4) (0.4, 7) | (0.5, 2)
# (0.6, 8) (0.7, 3) (0.8, 6) (0.9, 1). Mean 0.455, nearest: 2, 7, 8, 4, 3.


def test_grad_norm_without_logits_is_an_error_naming_it() -> None:
    policy = make_policy(SiftConfig(policy="grad_norm"))
    assert policy.needs_logits
    with pytest.raises(ValueError, match="the grad_norm method needs the logits"):
        policy.select([1.0, 2.0])


@pytest.mark.parametrize("policy", ROUND_POLICIES)
def test_all_nan_batch_keeps_nothing(policy: str) -> None:
    sift = make_policy(SiftConfig(policy=policy))
    sift.observe([NAN] * 4)
    logits, labels = np.zeros((4, 3)), np.zeros(4, np.int64)
    selection = sift.select([NAN] * 4, np.random.default_rng(0), logits, labels)
    assert len(selection) == 0
    assert selection.indices.dtype == np.int64


@pytest.mark.parametrize("policy", ROUND_POLICIES)
def test_scalar_loss_is_rejected_by_every_policy(policy: str) -> None:
    with pytest.raises(ValueError, match=r"reduction=None\. Received: shape=\(\)"):
        make_policy(SiftConfig(policy=policy)).select(0.5, np.random.default_rng(0))


def test_make_policy_builds_each_kind_with_its_parameters() -> None:
    relative = make_policy(SiftConfig(beta=2.0, history=7, min_prob=0.1))
    assert isinstance(relative, RelativePolicy)
    assert (relative.beta, relative.history.length, relative.min_prob) == (2.0, 7, 0.1)
    adaptive = make_policy(
        SiftConfig(policy="adaptive", methods=("big_loss",), keep=0.25, eta=3.0, curriculum_T=9.0)
    )
    assert isinstance(adaptive, AdaptivePolicy)
    assert (adaptive.methods, adaptive.keep, adaptive.eta, adaptive.T) == (
        ("big_loss",),
        0.25,
        3.0,
        9.0,
    )
    assert not adaptive.needs_logits
    fraction = make_policy(SiftConfig(policy="grad_norm", keep=0.75, loss_kind="squared_error"))
    assert isinstance(fraction, FractionPolicy)
    assert (fraction.method, fraction.keep, fraction.loss_kind) == (
        "grad_norm",
        0.75,
        "squared_error",
    )


@pytest.mark.parametrize("policy", ROUND_POLICIES)
def test_every_policy_has_the_common_interface(policy: str) -> None:
    sift = make_policy(SiftConfig(policy=policy))
    assert sift.needs_logits == (policy in ("grad_norm", "adaptive"))
    sift.observe(LOSSES)
    sift.select(LOSSES, np.random.default_rng(0), np.zeros((10, 2)), np.zeros(10, np.int64))
    assert all(isinstance(v, float) for v in sift.metrics().values())
    sift.load_state(sift.state())


losses_with_gaps = st.lists(
    st.one_of(st.floats(0, 100), st.just(NAN), st.just(INF)), min_size=1, max_size=24
)


@settings(max_examples=40, deadline=None)
@given(
    policy=st.sampled_from(ROUND_POLICIES),
    losses=losses_with_gaps,
    keep=st.floats(0.01, 1.0),
    seed=st.integers(0, 2**16),
)
def test_selection_is_sorted_unique_finite_and_at_most_k(
    policy: str, losses: list[float], keep: float, seed: int
) -> None:
    B = len(losses)
    draws = np.random.default_rng(seed)
    logits, labels = draws.normal(size=(B, 3)), draws.integers(0, 3, size=B)
    # keep is the fraction policies' (relative keeps by beta: refused a keep it ignores)
    sift = make_policy(
        SiftConfig(policy=policy, **({} if policy == "relative" else {"keep": keep}))
    )
    finite = np.isfinite(losses)
    for _ in range(2):  # the second step exercises adaptive's weight update
        sift.observe(losses)
        selection = sift.select(losses, draws, logits, labels)
        kept = selection.indices
        assert kept.tolist() == sorted(set(kept.tolist()))
        assert finite[kept].all()
        assert len(selection.probs) == len(kept)
        assert ((selection.probs > 0) & (selection.probs <= 1)).all()
        if policy != "relative":
            assert len(kept) == min(kept_count(keep, B), int(finite.sum()))


@pytest.mark.parametrize(
    "module",
    [
        tfsift.sift.experimental.adaptive,
        tfsift.sift.experimental.fraction,
        tfsift.sift.config,
        tfsift.sift.policies,
        tfsift.sift.relative,
        tfsift.sift.experimental.scores,
        tfsift.sift.selection,
    ],
)
def test_docstring_examples_run(module: ModuleType) -> None:
    assert doctest.testmod(module).failed == 0

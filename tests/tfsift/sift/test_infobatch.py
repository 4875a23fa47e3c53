import doctest

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tfsift.sift.infobatch
from tfsift.sift.infobatch import InfoBatchPolicy, infobatch_keep, prunes

NAN = float("nan")


def reference_prune(
    scores: np.ndarray, prune: float, rng: np.random.Generator
) -> tuple[list[int], np.ndarray]:
    """``InfoBatch.prune`` of NUS-HPC-AI-Lab/InfoBatch (infobatch/infobatch.py), line for
    line, with `rng` for NumPy's global generator and no clamp of the keep ratio: the
    kept indices (sorted, where it shuffles them) and every sample's weight."""
    keep_ratio = 1.0 - prune
    well_learned_mask = scores < scores.mean()
    well_learned_indices = np.where(well_learned_mask)[0]
    remained_indices = np.where(~well_learned_mask)[0].tolist()
    selected_indices = rng.choice(
        well_learned_indices, int(keep_ratio * len(well_learned_indices)), replace=False
    )
    weights = np.ones(len(scores))
    if len(selected_indices) > 0:
        weights[selected_indices] = 1 / keep_ratio
        remained_indices.extend(selected_indices)
    return sorted(int(i) for i in remained_indices), weights


def reference_prunes(epoch: int, epochs: int, anneal: float) -> bool:
    """``IBSampler.reset`` of the reference: epoch ``iterations`` (0 the first) prunes
    unless ``iterations > num_epochs * delta``, delta = 1 - anneal; the first epoch's
    pruning keeps everything, as every score starts at 3 and none is below the mean."""
    iterations, stop_prune = epoch - 1, epochs * (1 - anneal)
    return iterations > 0 and not iterations > stop_prune


def test_infobatch_keeps_the_pinned_samples_for_a_fixed_seed() -> None:
    scores = np.array([0.1, 2.0, 0.3, 0.2, 5.0, 0.4, 0.05, 1.5, 0.6, 0.7])
    # mean 1.085: W = {0, 2, 3, 5, 6, 8, 9}, of which floor(0.5 * 7) = 3 are kept
    kept = infobatch_keep(scores, 0.5, np.random.default_rng(0))
    assert kept.indices.tolist() == [1, 4, 5, 6, 7, 9]
    assert kept.probs.tolist() == [1.0, 1.0, 0.5, 0.5, 1.0, 0.5]


@settings(max_examples=80, deadline=None)
@given(
    scores=st.lists(st.floats(0, 10), min_size=1, max_size=40),
    eighths=st.integers(0, 7),
    seed=st.integers(0, 2**16),
)
def test_infobatch_keep_is_the_reference_prune(
    scores: list[float], eighths: int, seed: int
) -> None:
    prune = eighths / 8  # exact in binary: the reference's int() and our floor agree
    array = np.asarray(scores)
    kept = infobatch_keep(array, prune, np.random.default_rng(seed))
    want, weights = reference_prune(array, prune, np.random.default_rng(seed))
    assert kept.indices.tolist() == want
    np.testing.assert_array_equal(1 / kept.probs, weights[want])


@settings(max_examples=40, deadline=None)
@given(
    scores=st.lists(st.one_of(st.floats(0, 10), st.just(NAN)), min_size=1, max_size=40),
    seed=st.integers(0, 2**16),
)
def test_samples_never_scored_are_kept_with_weight_one_and_left_out_of_the_mean(
    scores: list[float], seed: int
) -> None:
    array = np.asarray(scores)
    scored = np.flatnonzero(np.isfinite(array))
    kept = infobatch_keep(array, 0.25, np.random.default_rng(seed))
    unscored = np.flatnonzero(np.isnan(array))
    assert set(unscored.tolist()) <= set(kept.indices.tolist())
    assert (kept.probs[np.isin(kept.indices, unscored)] == 1.0).all()
    if len(scored):
        want, weights = reference_prune(array[scored], 0.25, np.random.default_rng(seed))
        among = np.isin(kept.indices, scored)
        assert kept.indices[among].tolist() == scored[want].tolist()
        np.testing.assert_array_equal(1 / kept.probs[among], weights[want])


def test_without_scores_or_below_the_mean_everything_is_kept() -> None:
    for scores in ([NAN, NAN], [1.0, 1.0, 1.0], []):
        kept = infobatch_keep(scores, 0.5, np.random.default_rng(0))
        assert kept.indices.tolist() == list(range(len(scores)))
        assert kept.probs.tolist() == [1.0] * len(scores)


@pytest.mark.parametrize("epochs", [1, 2, 7, 8, 10, 16])
@pytest.mark.parametrize("anneal", [0.0, 0.125, 0.3, 1.0])
def test_pruning_skips_the_first_epoch_and_the_annealed_tail(epochs: int, anneal: float) -> None:
    # epoch e spans [e - 1, e) of the run and prunes iff it starts before the annealed
    # tail, (1 - anneal) epochs: as the reference, but for an epoch starting right at the
    # tail, which the reference still prunes
    for e in range(1, epochs + 3):
        start, tail = e - 1, round((1 - anneal) * epochs, 9)
        assert prunes(e, epochs, anneal) == (e > 1 and start < tail)
        assert prunes(e, epochs, anneal) == (reference_prunes(e, epochs, anneal) and start != tail)


def test_the_pruning_epochs_of_a_pinned_run() -> None:
    assert [e for e in range(1, 12) if prunes(e, 10, 0.125)] == [2, 3, 4, 5, 6, 7, 8, 9]
    assert [e for e in range(1, 12) if prunes(e, 8, 0.125)] == [2, 3, 4, 5, 6, 7]


def test_the_policy_applies_the_epochs_plan_to_samples_by_key() -> None:
    scores = np.array([0.1, 2.0, 0.3, 0.2, 5.0, 0.4, 0.05, 1.5, 0.6, 0.7])
    keys = np.arange(10.0) * 3 + 0.5
    policy = InfoBatchPolicy(prune=0.5, anneal=0.125, epochs=8, seed=4)
    policy.begin_epoch(3, keys, scores)
    want = infobatch_keep(scores, 0.5, np.random.default_rng([4, 3]))
    order = np.random.default_rng(1).permutation(10)
    stream = np.concatenate([keys[order], [99.0]])  # 99: a sample never scored
    chosen = policy.select_keys(stream)
    assert sorted(order[chosen.indices[:-1]].tolist()) == want.indices.tolist()
    assert chosen.indices[-1] == 10 and chosen.probs[-1] == 1.0
    probs = dict(zip(want.indices.tolist(), want.probs.tolist(), strict=True))
    assert [probs[i] for i in order[chosen.indices[:-1]]] == chosen.probs[:-1].tolist()
    assert policy.metrics() == {"pruned": 4.0, "reweighted": 3.0}


@pytest.mark.parametrize("epoch", [1, 8])
def test_the_policy_keeps_everything_with_weight_one_where_it_does_not_prune(epoch: int) -> None:
    policy = InfoBatchPolicy(prune=0.5, anneal=0.125, epochs=8)
    policy.begin_epoch(2, np.arange(4.0), np.array([0.0, 0.0, 9.0, 9.0]))
    assert len(policy.select_keys(np.arange(4.0))) == 3
    policy.begin_epoch(epoch, np.arange(4.0), np.array([0.0, 0.0, 9.0, 9.0]))
    chosen = policy.select_keys(np.arange(4.0))
    assert chosen.indices.tolist() == [0, 1, 2, 3] and chosen.probs.tolist() == [1.0] * 4


def test_the_policy_state_round_trips_the_plan() -> None:
    policy = InfoBatchPolicy(prune=0.75, anneal=0.0, epochs=4, seed=1)
    keys, scores = np.arange(20.0), np.random.default_rng(0).exponential(size=20)
    policy.begin_epoch(2, keys, scores)
    again = InfoBatchPolicy(prune=0.75, anneal=0.0, epochs=4, seed=1)
    again.load_state(policy.state())
    a, b = policy.select_keys(keys[::-1]), again.select_keys(keys[::-1])
    assert a.indices.tolist() == b.indices.tolist() and a.probs.tolist() == b.probs.tolist()
    assert len(a) < 20


def test_docstring_examples_run() -> None:
    assert doctest.testmod(tfsift.sift.infobatch).failed == 0

"""The early-exit scorer's deferred head update: the same head, one compiled call less."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

import tfsift
from tfsift.parallel import runtime
from tfsift.sift.early_exit import EarlyExitScorer
from tfsift.sift.replicas import ReplicaGroup

PER_SAMPLE = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)


class Deep(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.a = keras.layers.Dense(16, activation="relu", name="a")
        self.b = keras.layers.Dense(3, name="b")

    def call(self, x: Any) -> Any:
        return self.b(self.a(x))


def scorer(first: tuple[np.ndarray, np.ndarray]) -> EarlyExitScorer:
    """A fresh scorer (same weights every time) that has scored ``first``."""
    keras.utils.set_random_seed(3)
    config = tfsift.SiftConfig(scorer="early_exit", exit_after="a", exit_lr=0.1)
    out = EarlyExitScorer(Deep(), PER_SAMPLE, config, False)
    out.bind(ReplicaGroup(runtime.get()))
    out(first)  # builds the model and the head, right after seeding
    return out


def batches() -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 8, 4)).astype(np.float32)
    return [(x[i], rng.integers(0, 3, 8)) for i in range(3)]


def test_the_deferred_head_update_scores_as_an_immediate_one_would() -> None:
    tfsift.init({})
    first, second, third = batches()
    kept = np.array([0, 2, 5])
    deferred, immediate, frozen = scorer(first), scorer(first), scorer(first)
    deferred.learn(kept)
    immediate.learn(kept)
    immediate._flush()  # applied now, in its own call
    assert deferred._update is not None and immediate._update is None
    after = deferred(second).losses
    np.testing.assert_allclose(after, immediate(second).losses, rtol=1e-6)
    # the update did change the head: a scorer that never learnt scores otherwise
    assert np.abs(after - frozen(second).losses).max() > 1e-3
    deferred.learn(kept)
    immediate.learn(kept)
    saved = deferred.state()  # flushes: the saved head includes the last update
    immediate._flush()
    for a, b in zip(saved["head"], immediate.state()["head"], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    np.testing.assert_allclose(deferred(third).losses, immediate(third).losses, rtol=1e-6)


def test_a_loaded_state_drops_an_update_not_yet_applied() -> None:
    tfsift.init({})
    first, second, _ = batches()
    s = scorer(first)
    saved = s.state()
    s.learn(np.arange(8))
    s.load_state(saved)
    assert s._update is None
    fresh = scorer(first)
    np.testing.assert_allclose(s(second).losses, fresh(second).losses, rtol=1e-6)

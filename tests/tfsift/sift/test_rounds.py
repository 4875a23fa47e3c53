"""One round's scoring and selection, apart from the epoch loop: no runtime, no dataset."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tfsift.sift.config import SiftConfig
from tfsift.sift.infobatch import InfoBatchPolicy
from tfsift.sift.policies import make_policy
from tfsift.sift.rounds import Rounds, _positions_in
from tfsift.sift.scorer import Scorer, Scores


class OneReplica:
    """The replica group of a single replica: every exchange returns this one's part."""

    replica, replicas = 0, 1

    def allgather(self, values: Any, *_: Any) -> list[Any]:
        return [np.asarray(values)]


class Losses(Scorer):
    """Scores a round with the first leaf's first column: a loss per sample."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, element: Any) -> Scores:
        self.calls += 1
        return Scores(np.asarray(element[0][:, 0], np.float64))


def leaves(n: int) -> list[np.ndarray]:
    x = np.stack([np.arange(n, dtype=np.float64), np.ones(n)], axis=1)
    return [x, np.arange(n) % 3]


def rounds(config: SiftConfig, scorer: Scorer | None = None) -> Rounds:
    spec = (None, None)  # packed as a pair: (x, y)
    policy = make_policy(config) if config.policy != "infobatch" else InfoBatchPolicy(0.5, 0, 4)
    return Rounds(config, scorer or Losses(), policy, spec, replica=0)


def test_a_round_keeps_what_its_policy_selects_from_the_scores() -> None:
    sifting = rounds(SiftConfig(policy="big_loss", keep=0.25))
    sifting.batch_size = 8
    sifting.metrics.begin_epoch()
    kept_leaves, kept = sifting.sift(leaves(8), OneReplica(), delayed=False)  # type: ignore[arg-type]
    assert kept.indices.tolist() == [6, 7]  # the largest losses: the rows' own numbers
    assert kept_leaves[0].shape == (8, 2) and sifting.count == 1
    metrics = sifting.metrics.as_dict()
    assert (metrics["samples_seen"], metrics["samples_scored"], metrics["samples_kept"]) == (
        8,
        8,
        2,
    )
    assert metrics["mean_loss_kept"] == 6.5


def test_a_delayed_round_keeps_everything_and_scores_nothing() -> None:
    scorer = Losses()
    sifting = rounds(SiftConfig(policy="big_loss", keep=0.25), scorer)
    _, kept = sifting.sift(leaves(8), OneReplica(), delayed=True)  # type: ignore[arg-type]
    assert kept.indices.tolist() == list(range(8)) and scorer.calls == 0
    assert sifting.count == 0  # the draws' seed counts sifted rounds only


def test_a_round_on_training_scores_selects_among_the_recorded_and_keeps_the_rest() -> None:
    sifting = rounds(SiftConfig(policy="big_loss", keep=0.5, scores="training"))
    sifting.batch_size = 4
    sifting.metrics.begin_epoch()
    group = OneReplica()
    first, kept = sifting.sift(leaves(4), group, delayed=False)  # type: ignore[arg-type]
    assert kept.indices.tolist() == [0, 1, 2, 3]  # never trained: kept unscored
    assert len(first) == 3  # the keys ride along as a last leaf, for record
    assert sifting.recorder is not None
    sifting.recorder.yielded(first[-1][:4])
    sifting.recorder.record(np.array([4.0, 1.0, 3.0, 2.0]), epoch=1)
    sifting.metrics.begin_epoch()
    _, kept = sifting.sift(leaves(4), group, delayed=False)  # type: ignore[arg-type]
    assert kept.indices.tolist() == [0, 2]  # the larger recorded losses
    assert sifting.metrics.as_dict(epoch=True)["samples_reused"] == 4


def test_kept_positions_map_to_the_rows_scored_this_round() -> None:
    scored = np.array([1, 4, 5])  # rows 0, 1, 2 of the scorer's batch
    assert _positions_in(scored, np.array([0, 4, 5, 7]), 8).tolist() == [1, 2]


@pytest.mark.parametrize("n, whole", [(8, True), (4, False)])
def test_a_round_is_scored_whole_only_with_its_g_batches(n: int, whole: bool) -> None:
    sifting = rounds(SiftConfig(score_batches=2))
    sifting.batch_size = 4
    assert sifting.scored_whole(leaves(n)) is whole

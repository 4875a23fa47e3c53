"""One sifting round: its candidates' losses (scored, reused or recorded) and the policy's choice.

Letters as in ``tfsift.sift.transform``: B the source batch size, g = ``score_batches``.
A round takes the leaves of n = g·B candidates and returns which of them the buffer
keeps, with their keep probabilities (``Selection``)::

    forward scores:  fresh losses looked up (stale) ─► the rest scored (a forward-only
                     pass) ─► allgather ─► policy.observe ─► select ─► scorer.learn
    training scores: the records merged ─► looked up ─► selected among the fresh
                     (InfoBatch: by its epoch's plan) ─► the rest kept unscored

The epoch loop around the rounds (reading, agreeing, buffering, yielding) is the
``Sifter``'s; the counters are the dataset's ``SiftMetrics``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import numpy as np
from keras import tree

from tfsift.sift.config import SiftConfig
from tfsift.sift.infobatch import InfoBatchPolicy, warn_past_the_run
from tfsift.sift.metrics import SiftMetrics, warn_nonfinite
from tfsift.sift.recorder import Recorder
from tfsift.sift.replicas import ReplicaGroup
from tfsift.sift.scorer import Scorer, Scores
from tfsift.sift.selection import Policy, Selection, check_losses
from tfsift.sift.stale import ScoreCache
from tfsift.state import STATE

log = logging.getLogger("tfsift")
Leaves = list[np.ndarray]  # a round's element, flattened: one array per leaf, g·B rows


class Rounds:
    """The rounds of one sifted dataset: what scores them (``NoScorer`` with
    ``scores="training"``), what selects (within a round, or InfoBatch by its epoch's
    plan), the score table; ``replica`` seeds the draws."""

    def __init__(
        self,
        config: SiftConfig,
        scorer: Scorer,
        policy: Policy | InfoBatchPolicy,
        element_spec: Any,
        replica: int,
    ) -> None:
        assert config.score_batches is not None  # SiftConfig resolves None
        self.config, self.scorer, self.policy = config, scorer, policy
        self.element_spec, self.replica, self.g = element_spec, replica, config.score_batches
        self.metrics = SiftMetrics()
        self.count = 0  # rounds sifted over all epochs: seeds each round's draws
        self.batch_size: int | None = None  # B, once known (the sifter reads it)
        self.cache = ScoreCache(config.stale) if config.stale else None
        # scores="training" (which needs stale >= 1): the losses the loop records
        self.recorder: Recorder | None = None
        if self.cache is not None and config.scores == "training":
            self.recorder = Recorder(self.cache)
        # with stale: the last round's first leaf, its keys, which have a fresh loss, and
        # those losses (looked up once, for overlap's decision and for the round alike)
        self._looked: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None

    def begin_epoch(self, group: ReplicaGroup) -> None:
        """With training scores: the records of the last epoch join the table, and
        InfoBatch draws this epoch's plan from it."""
        if self.recorder is None:
            return
        self.recorder.merge(group)
        if isinstance(self.policy, InfoBatchPolicy):
            epoch = self.metrics.epochs
            warn_past_the_run(epoch, self.policy.epochs)
            self.policy.begin_epoch(epoch, *self.recorder.cache.table(epoch))
            self.metrics.policy = self.policy.metrics()

    def sift(self, leaves: Leaves, group: ReplicaGroup, delayed: bool) -> tuple[Leaves, Selection]:
        """The leaves to buffer (with training scores, the samples' keys as a last leaf)
        and the samples kept of them; ``delayed``: within ``delay``, every one is."""
        if self.recorder is not None:
            return self._recorded(leaves, group, delayed)
        n = int(leaves[0].shape[0])
        self.metrics.samples_seen += n
        if delayed:
            self.scorer.warm(tree.pack_sequence_as(self.element_spec, leaves))
            self.metrics.samples_kept += n
            return leaves, Selection(np.arange(n, dtype=np.int64), np.ones(n))
        start = time.perf_counter()
        scores, scored = self._scores(leaves, n)
        scores, unscored = _scored_part(scores, n)
        scored = scored[: len(scores.losses)]
        everyone = group.allgather(scores.losses)
        selected = time.perf_counter()
        self.metrics.time_scoring += selected - start
        # no losses: no wait had room (overlap), and the whole round is kept unscored
        chosen = self._select(scores.losses, everyone, scores.logits, scores.labels)
        self._note_nonfinite(scores.losses)
        self.metrics.record(scores.losses, chosen.indices, len(scored))
        self.metrics.samples_kept += len(chosen) + len(unscored)
        self.metrics.samples_unscored += len(unscored)
        self.metrics.policy = self.policy.metrics()
        self.metrics.scorer = dict(self.scorer.metrics)
        self.metrics.time_selecting += time.perf_counter() - selected
        start = time.perf_counter()
        self.scorer.learn(_positions_in(scored, chosen.indices, n))
        self.metrics.time_scoring += time.perf_counter() - start
        return leaves, _with_unscored(chosen.indices, chosen.probs, unscored)

    def state(self) -> dict[str, Any]:
        """The policy's, the scorer's, the score table's and the counters' state."""
        recorder, cache = self.recorder, self.cache
        return {
            "policy": self.policy.state(),
            "rounds": self.count,
            "metrics": dataclasses.asdict(self.metrics),
            "cache": None if cache is None else cache.state(),
            "scorer": self.scorer.state(),
            "recorder": None if recorder is None else recorder.state(),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restores ``state()`` (the keys a ``Sifter``'s state adds are left alone)."""
        self.policy.load_state(state["policy"])
        self.count, self.metrics = int(state["rounds"]), SiftMetrics(**state["metrics"])
        if self.cache is not None and state["cache"] is not None:
            self.cache.load_state(state["cache"])
        self.scorer.load_state(state["scorer"])
        if self.recorder is not None and state.get("recorder") is not None:
            self.recorder.load_state(state["recorder"])

    def prepare(self, leaves: Leaves) -> None:
        """Offers the next round to the scorer before the steps that precede it (overlap),
        if it is scored whole."""
        if self.scored_whole(leaves):
            self.scorer.prepare(tree.pack_sequence_as(self.element_spec, leaves))

    def scored_whole(self, leaves: Leaves) -> bool:
        """Whether the round of ``leaves`` is scored whole, in one call of these very
        arrays: it has g source batches and (with ``stale``) no sample with a fresh loss.
        Only such a round is prepared for overlap, as the scorer finds a prepared round by
        its arrays: any other is scored from copies (padded, or the rows not fresh), and
        a prepared one would be scored in stage 0's waits for nothing."""
        n = int(leaves[0].shape[0])
        if n < (self.batch_size or n) * self.g:
            return False
        return self.cache is None or not self._lookup(leaves)[1].any()

    def _select(
        self, losses: np.ndarray, everyone: list[np.ndarray], logits: Any = None, labels: Any = None
    ) -> Selection:
        """The policy's choice among this replica's ``losses`` once every replica's
        (``everyone``) have joined its history; counts the round, which seeds the draws."""
        assert not isinstance(self.policy, InfoBatchPolicy)  # it selects by its epoch's plan
        self.policy.observe(np.concatenate(everyone))
        rng = np.random.default_rng([self.config.seed, self.replica, self.count])
        self.count += 1
        if not len(losses):
            return Selection.empty()
        return self.policy.select(losses, rng, logits, labels)

    def _recorded(
        self, leaves: Leaves, group: ReplicaGroup, delayed: bool
    ) -> tuple[Leaves, Selection]:
        """A round with training scores: selects by the recorded losses, no forward."""
        assert self.recorder is not None and self.cache is not None
        n, start = int(leaves[0].shape[0]), time.perf_counter()
        self.metrics.samples_seen += n
        keys = self.cache.fingerprints(leaves)
        self.recorder.merge(group)  # the steps' records since the last round
        if delayed:
            chosen = Selection(np.arange(n, dtype=np.int64), np.ones(n))
        else:
            fresh, losses = self.cache.lookup(keys, self.metrics.epochs)
            chosen = self._select_recorded(keys, fresh, losses, group)
            scored = np.flatnonzero(fresh)
            self._note_nonfinite(losses[scored])
            self.metrics.record(losses[scored], np.flatnonzero(np.isin(scored, chosen.indices)), 0)
            self.metrics.samples_reused += len(scored)
            self.metrics.samples_unscored += n - len(scored)
            self.metrics.policy = self.policy.metrics()
        self.metrics.samples_kept += len(chosen)
        self.metrics.time_selecting += time.perf_counter() - start
        return [*leaves, keys], chosen

    def _select_recorded(
        self, keys: np.ndarray, fresh: np.ndarray, losses: np.ndarray, group: ReplicaGroup
    ) -> Selection:
        """The kept samples of a round with training scores: InfoBatch's epoch plan, or the
        policy among the samples with a fresh loss plus every sample without one."""
        if isinstance(self.policy, InfoBatchPolicy):
            self.count += 1
            return self.policy.select_keys(keys)
        scored, unscored = np.flatnonzero(fresh), np.flatnonzero(~fresh)
        chosen = self._select(losses[scored], group.allgather(losses[scored]))
        return _with_unscored(scored[chosen.indices], chosen.probs, unscored)

    def _scores(self, leaves: Leaves, n: int) -> tuple[Scores, np.ndarray]:
        """The group's losses, and which positions were scored now (the rest reused)."""
        if self.scored_whole(leaves):
            scores = self._score(tree.pack_sequence_as(self.element_spec, leaves), n)
            if self.cache is not None:  # with leftover="keep", only what was scored
                keys, k = self._lookup(leaves)[0], n if scores.scored is None else scores.scored
                self.cache.store(keys[:k], scores.losses[:k], self.metrics.epochs)
            return scores, np.arange(n)
        if self.cache is None:
            # A round shorter than g batches (where the delay ends, at an epoch's end) is
            # padded with copies of its first sample to g batches: every scoring call then
            # has one shape, so nothing is traced again mid-training (a trace of a pipeline
            # stage costs seconds); the copies' losses are dropped.
            full = (self.batch_size or n) * self.g
            return self._score_rows(leaves, np.arange(n), full), np.arange(n)
        keys, fresh, losses = self._lookup(leaves)
        need = np.flatnonzero(~fresh)
        if len(need):
            # pad to whole source batches, so the scorer sees at most g batch sizes
            B = self.batch_size or len(need)
            losses[need] = self._score_rows(leaves, need, len(need) + -len(need) % B).losses
            self.cache.store(keys[need], losses[need], self.metrics.epochs)
        self.metrics.samples_reused += n - len(need)
        return Scores(losses), need

    def _lookup(self, leaves: Leaves) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The round's keys, which samples have a fresh loss, and those losses (``stale``)."""
        assert self.cache is not None
        if self._looked is not None and self._looked[0] is leaves[0]:
            return self._looked[1:]
        keys = self.cache.fingerprints(leaves)
        fresh, losses = self.cache.lookup(keys, self.metrics.epochs)
        self._looked = (leaves[0], keys, fresh, losses)
        return keys, fresh, losses

    def _score_rows(self, leaves: Leaves, rows: np.ndarray, size: int) -> Scores:
        """The scores of samples ``rows``, scored padded to ``size`` samples with copies of
        the first (a shape the scorer has seen); the copies' scores are dropped."""
        padded = np.concatenate([rows, np.repeat(rows[:1], size - len(rows))])
        element = tree.pack_sequence_as(self.element_spec, [leaf[padded] for leaf in leaves])
        return _first(self._score(element, size), len(rows))

    def _score(self, element: Any, n: int) -> Scores:
        running = STATE.running_step
        if running is not None:
            raise RuntimeError(
                "tfsift.sift: the sifted dataset was asked for a batch while the @tfsift.step "
                f"function {running!r} was running: something reads it ahead of training (a "
                ".prefetch() or a parallel .map() after tfsift.sift). Sifting scores with the "
                "current weights, so it must run in lock-step with the training loop: apply "
                "prefetch and map before tfsift.sift, or call .prefetch() on the sifted "
                "dataset itself (it then prefetches the source batches)."
            )
        scores = self.scorer(element)
        check_losses(scores.losses, n)
        return scores

    def _note_nonfinite(self, losses: np.ndarray) -> None:
        """Warns, the first time, of NaN or infinite ``losses`` (``metrics.record`` counts
        them)."""
        bad = int((~np.isfinite(losses)).sum())
        warn_nonfinite(self.metrics, bad, len(losses), isinstance(self.policy, InfoBatchPolicy))


def _scored_part(scores: Scores, n: int) -> tuple[Scores, np.ndarray]:
    """The scores of the samples that were scored, and the positions of those that were
    not (overlap with ``leftover="keep"``: the last ones of the round, kept unscored)."""
    if scores.scored is None:
        return scores, np.arange(0, dtype=np.int64)
    return _first(scores, scores.scored), np.arange(scores.scored, n, dtype=np.int64)


def _with_unscored(kept: np.ndarray, probs: np.ndarray, unscored: np.ndarray) -> Selection:
    """The selection of the ``kept`` positions (keep probabilities ``probs``) and of every
    ``unscored`` one, kept with probability 1."""
    probs = np.concatenate([probs, np.ones(len(unscored))])
    return Selection.of(np.concatenate([kept, unscored]), probs)


def _first(scores: Scores, n: int) -> Scores:
    """The scores of the first ``n`` samples."""
    logits = None if scores.logits is None else scores.logits[:n]
    labels = None if scores.labels is None else scores.labels[:n]
    return Scores(scores.losses[:n], logits, labels)


def _positions_in(scored: np.ndarray, kept: np.ndarray, n: int) -> np.ndarray:
    """Where the kept samples sit among the ones scored this round (the scorer's rows)."""
    where = np.full(n, -1)
    where[scored] = np.arange(len(scored))
    rows: np.ndarray = where[kept]
    kept_rows: np.ndarray = rows[rows >= 0]
    return kept_rows

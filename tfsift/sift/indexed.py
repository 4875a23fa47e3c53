"""InfoBatch by row: a pruned sample is left out of the epoch's order and never read.

``tfsift.sift`` of a ``tfsift.from_arrays`` dataset with ``policy="infobatch"``. The
streaming transform (``tfsift.sift.transform``) sees samples after the input pipeline's
shuffle and batch, so each pruned sample is still read, fingerprinted and dropped: on a
small model that reading costs about as much as the training it saves. InfoBatch
decides once per epoch, so here the epoch is planned whole, by row, as the reference
implementation's sampler does (``IBSampler``)::

    epoch start: merge the records (allgather) ─► plan from the score table (InfoBatch)
                 ─► the kept rows, permuted and dealt to the replicas ─► batches of B
    each batch:  gather its rows (NumPy) ─► yield ─► training step ─► record(losses)

The plan, the permutation and the deal are the same on every rank (one seed, one table),
so every replica yields ``kept // R // B`` batches with no agreement per batch, and a
pipeline's ranks yield the same batches. The score table is the streaming path's
(``ScoreCache`` and ``Recorder``), keyed by row instead of by content.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from typing import Any

import numpy as np

from tfsift.parallel import runtime
from tfsift.parallel.arrays import RowDataset
from tfsift.parallel.pydataset import PythonDataset, in_step_options
from tfsift.sift.config import SiftConfig
from tfsift.sift.elements import sifted_spec, weighted
from tfsift.sift.infobatch import InfoBatchPolicy, warn_past_the_run
from tfsift.sift.metrics import ScalarLog, SiftMetrics, warn_empty_epoch, warn_nonfinite
from tfsift.sift.recorder import Recorder
from tfsift.sift.relayout import ROWS as ROWS  # marks a saved state as this sifter's
from tfsift.sift.replicas import ReplicaGroup
from tfsift.sift.stale import ScoreCache
from tfsift.state import STATE

log = logging.getLogger("tfsift")


class IndexedSifter:
    """The state of an InfoBatch-sifted ``from_arrays`` or ``from_rows`` dataset: score table,
    plan, epoch."""

    def __init__(self, source: RowDataset, config: SiftConfig) -> None:
        # SiftConfig resolves stale, and tfsift.sift checks the epochs
        assert config.epochs is not None and config.stale is not None
        assert config.policy == "infobatch"
        rt = runtime.get()
        self.source, self.config, self.M = source, config, rt.config.microbatches
        self.policy = InfoBatchPolicy(config.prune, config.anneal, config.epochs, config.seed)
        self.recorder = Recorder(ScoreCache(config.stale))
        self.metrics = SiftMetrics()
        self.keys = np.arange(source.rows, dtype=np.float64)  # every sample's key: its row
        self.batches_read = 0  # over all epochs: counts the delay
        self.position = 0  # batches yielded in the current epoch
        self.planned: int | None = None  # the batches the current epoch yields after resume
        self._resume: int | None = None
        self._group: ReplicaGroup | None = None
        self._empty_warned = False  # an epoch that yielded no batch was told of
        log_dir = config.log_dir or rt.config.log_dir
        self._log = ScalarLog(log_dir) if log_dir and rt.rank == 0 else None

    def state(self) -> dict[str, Any]:
        """Everything needed to continue exactly from the last batch yielded."""
        return {
            "kind": ROWS,
            "policy": self.policy.state(),
            "batches_read": self.batches_read,
            "position": self.position,
            "rows": self.source.rows,
            "global_batch": self.source.global_batch,
            "metrics": dataclasses.asdict(self.metrics),
            "cache": self.recorder.cache.state(),
            "recorder": self.recorder.state(),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restores ``state()``; the next epoch resumes the saved one where it stopped.

        Raises:
            ValueError: a state of a streaming sifted dataset, or of other arrays.
        """
        if state.get("kind") != ROWS or int(state["rows"]) != self.source.rows:
            received = (
                "a dataset sifted as it streams"
                if state.get("kind") != ROWS
                else f"arrays of {int(state['rows'])} rows"
            )
            raise ValueError(
                "this sifting state was saved by another kind of sifted dataset: restore it "
                f"into one made as it was ({self.source.maker} of {self.source.rows} rows, with "
                f"policy='infobatch'). Received: the state of {received}"
            )
        self.policy.load_state(state["policy"])
        self.batches_read = int(state["batches_read"])
        self.metrics = SiftMetrics(**state["metrics"])
        self.recorder.cache.load_state(state["cache"])
        self.recorder.load_state(state["recorder"])
        self._resume = int(state["position"])
        saved = int(state.get("global_batch", self.source.global_batch))
        if saved != self.source.global_batch and self._resume:
            log.warning(
                "the sifting state was saved %d batches into its epoch by a job whose "
                "replicas took %d samples a step together, and this one's take %d: the rest "
                "of the epoch may train some samples twice and leave others out. Give "
                "from_arrays or from_rows global_batch_size, the same in every job",
                self._resume,
                saved,
                self.source.global_batch,
            )

    def start_next_epoch(self) -> None:
        """After ``load_state`` of a state saved at an epoch's end: the next pass starts
        a new epoch instead of resuming the saved one."""
        self._resume = None

    def epoch(self) -> Iterator[Any]:
        """One epoch: this replica's batches of the kept rows, as NumPy elements (with
        the weights); after ``load_state``, the rest of the saved epoch."""
        STATE.sift_metrics = self.metrics
        resume, self._resume = self._resume, None
        if resume is None:
            self.metrics.begin_epoch()
            self._begin_epoch()
        rows, probs = self._order()
        # the epoch's keys and weights made once: a batch is emitted right after a training
        # step, when each NumPy call costs several times its cost here (recorder.py)
        keys = rows.astype(np.float64)
        inverse = (1.0 / probs).astype(np.float32) if self.config.rescale else None
        bounds = self._bounds(len(rows))
        self.position = resume or 0
        self.planned = len(bounds) - 1 - self.position
        while self.position < len(bounds) - 1:
            lo, hi = bounds[self.position], bounds[self.position + 1]
            self.position += 1
            yield self._emit(rows[lo:hi], keys[lo:hi], None if inverse is None else inverse[lo:hi])
        empty = len(bounds) == 1 and resume is None
        if empty and not self._empty_warned and runtime.get().rank == 0:  # once, from rank 0
            self._empty_warned = True
            share = f"{self.source.share} rows on this replica"
            warn_empty_epoch(self.metrics.epochs, share, self.config.policy)
        if self._log is not None:
            self._log.flush()

    def record(self, losses: Any) -> None:
        """Takes the per-sample losses of the batch yielded last."""
        self.recorder.record(losses, self.metrics.epochs)

    def _begin_epoch(self) -> None:
        """Merges the last epoch's records over the replicas and draws this epoch's plan;
        no epoch prunes before ``delay`` batches have been trained."""
        if self._group is None:
            self._group = ReplicaGroup(runtime.get())
        self.recorder.merge(self._group)
        epoch = self.metrics.epochs
        warn_past_the_run(epoch, self.policy.epochs)
        keys, scores = self.recorder.cache.table(epoch)
        delayed = self.batches_read < self.config.delay
        self.policy.begin_epoch(1 if delayed else epoch, keys, scores)  # epoch 1 never prunes
        # this replica's share of the epoch's candidates (the plan is over all of them)
        fresh = self.recorder.cache.fresh(epoch)
        R, scored = self.source.replicas, int(fresh.sum())
        self.metrics.samples_seen += self.source.share
        self.metrics.samples_reused += scored // R
        self.metrics.samples_unscored += (self.source.rows - scored) // R
        # a NaN loss recorded is counted whole, not shared out: one must never round to 0
        bad = int((fresh & ~np.isfinite(scores)).sum())
        if runtime.get().rank == 0:  # every rank holds the same table: one warning
            warn_nonfinite(self.metrics, bad, scored, kept=True)
        self.metrics.nonfinite_losses += bad
        self.metrics.policy = self.policy.metrics()

    def _order(self) -> tuple[np.ndarray, np.ndarray]:
        """This replica's kept rows of the epoch in order, and their keep probabilities."""
        kept = self.policy.select_keys(self.keys)
        probs = np.ones(self.source.rows)
        probs[kept.indices] = kept.probs
        rows = self.source.order(self.metrics.epochs, kept.indices)
        return rows, probs[rows]

    def _bounds(self, n: int) -> list[int]:
        """Where the epoch's batches of ``n`` rows start and end: full batches of B, then
        (``drop_remainder=False``) what is left, cut to whole microbatches."""
        B = self.source.batch_size
        bounds = list(range(0, n - n % B + 1, B))
        left = n % B - n % B % self.M
        if not self.config.drop_remainder and left > 0:
            bounds.append(bounds[-1] + left)
        return bounds

    def _emit(self, rows: np.ndarray, keys: np.ndarray, inverse: np.ndarray | None) -> Any:
        self.recorder.yielded(keys)
        self.batches_read += 1
        self.metrics.batches_yielded += 1
        self.metrics.samples_kept += len(rows)
        if self._log is not None:
            self._log.write(self.metrics)
        element = self.source.gather(rows)
        return element if inverse is None else weighted(element, inverse, self.config.rescale)


class IndexedSiftedDataset(PythonDataset):
    """The dataset ``tfsift.sift`` returns for a ``from_arrays`` source with InfoBatch:
    iterated in Python it gathers each batch's rows with NumPy; tf.data, ``fit`` and
    ``tf.function`` read the same batches through ``from_generator``, never ahead."""

    def __init__(self, sifter: IndexedSifter) -> None:
        self.sifter = sifter
        spec = sifted_spec(sifter.source.element_spec, sifter.config.rescale)
        super().__init__(spec, options=in_step_options())

    def _elements(self) -> Iterator[Any]:
        return self.sifter.epoch()

    def record(self, losses: Any) -> None:
        """Hands back the per-sample losses of the batch this dataset yielded last
        (see ``SiftedDataset.record``)."""
        self.sifter.record(losses)

    def planned_batches(self) -> int | None:
        """The batches the epoch being iterated yields (planned at its start)."""
        return self.sifter.planned

    def prefetch(self, buffer_size: Any, name: str | None = None) -> IndexedSiftedDataset:
        """The dataset itself: its batches are gathered when asked for, from memory."""
        return self

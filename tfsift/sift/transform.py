"""``tfsift.sift``: a tf.data transform that trains only on the informative samples.

Letters: B the source batch size, g = ``score_batches`` source batches scored
together, R replicas, M microbatches. One source *round* reads g batches, scores
them in one forward-only pass through the pipeline, lets the policy keep some, and
adds the kept samples to a buffer that yields full batches of B::

    source ─► round: read g batches ─► agree [ready, more] ─► yield n full batches
                     ─► score (pipeline forward) ─► allgather losses ─► select ─► buffer

The epoch loop is the ``Sifter``'s, here; a round's scoring and selection are
``tfsift.sift.rounds``'.

Lock-step: a round's scoring runs only when the consumer asks for the next batch
and none is ready, so it always sees the weights of the last optimizer update.
Iterating the sifted dataset directly (``for x, y in train``) runs the rounds on the
consumer's own thread; ``.prefetch(n)`` on it prefetches the *source* batches instead
(scoring must not run ahead). Other transformations after it run the rounds inside
tf.data through ``from_generator`` with prefetch injection and autotuning off, one
round per request; a round that would score while a ``@tfsift.step`` runs raises.

Replicas: every replica must yield the same number of batches, or the gradient
allreduce of the one with more would wait forever. Each round starts with a MIN over
the replicas of [full batches ready, more data upstream]: every replica yields that
many, and all stop when the shortest shard ends.

Scores from training (``scores="training"``): a round runs no forward, and selects by
the losses the loop hands back after each step (``tfsift.sift.recorder``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import tensorflow as tf
from keras import tree

from tfsift.parallel import runtime
from tfsift.parallel.arrays import RowDataset
from tfsift.parallel.pydataset import PythonDataset, in_step_options
from tfsift.sift.buffer import SampleBuffer
from tfsift.sift.config import SiftConfig
from tfsift.sift.elements import sifted_spec, with_weights
from tfsift.sift.indexed import ROWS, IndexedSiftedDataset, IndexedSifter
from tfsift.sift.infobatch import InfoBatchPolicy, pruning_epochs
from tfsift.sift.metrics import ScalarLog, SiftMetrics, warn_empty_epoch
from tfsift.sift.policies import make_policy
from tfsift.sift.reader import SourceReader
from tfsift.sift.replicas import COUNTS, FULL_BATCHES, REMAINDER, ReplicaGroup
from tfsift.sift.rounds import Leaves, Rounds
from tfsift.sift.scorer import FullScorer, NoScorer, Scorer, StepScorer
from tfsift.sift.selection import Policy, Selection
from tfsift.state import STATE

log = logging.getLogger("tfsift")
# Rounds in a row that yield no batch before the one warning that sifting starves the loop:
# a policy that keeps more than 1/20 of a batch a round (g = 1) yields within 20 rounds.
STARVED_ROUNDS = 20
Element = Any


def sift(
    model_or_step: Any = None,
    per_sample_loss: Callable[..., Any] | None = None,
    config: SiftConfig | None = None,
) -> Callable[[tf.data.Dataset], tf.data.Dataset]:
    """A transform for ``tf.data.Dataset.apply`` that keeps only informative samples.

    Example:
        >>> config = tfsift.SiftConfig(policy="relative", beta=3.0, history=500, delay=10)
        >>> train = tfsift.shard(dataset).batch(64, drop_remainder=True)
        >>> train = train.apply(tfsift.sift(model, per_sample_loss, config))
        >>> for x, y in train:                      # batches of 64 kept samples
        ...     grads, loss = forward_backward(x, y)

        With ``scores="training"`` there is no scoring pass; the step returns its
        per-sample losses and the loop hands them back:

        >>> config = tfsift.SiftConfig(scores="training", stale=1, beta=1.0)
        >>> train = tfsift.shard(dataset).batch(64, drop_remainder=True)
        >>> train = train.apply(tfsift.sift(config=config))
        >>> for x, y in train:
        ...     grads, losses = forward_backward(x, y)   # losses: per sample
        ...     train.record(losses)

    Args:
        model_or_step: the ``tfsift.DistributedModel`` being trained (elements must be
            ``(x, y)`` batches), or a forward-only ``@tfsift.step`` function that takes
            an element's parts and returns one loss per sample (any element structure);
            not used, and may be left out, with ``scores="training"``.
        per_sample_loss: ``loss(y_true, y_pred)`` returning one loss per sample, e.g. a
            Keras loss with ``reduction=None``; only with a model.
        config: a ``tfsift.SiftConfig`` (default: ``SiftConfig()``).

    Returns:
        A function of a batched dataset returning a dataset with the same element
        structure and batch size B (with ``rescale``, a ``sample_weight`` is added).

    Raises:
        TypeError: arguments of the wrong kind.
        ValueError: a config the scorer cannot serve, ``policy="infobatch"`` without
            ``epochs``, or (when the transform is applied) a batch size not divisible by
            ``microbatches``, or an infinite dataset for ``policy="infobatch"``.
    """
    config = SiftConfig() if config is None else config
    if not isinstance(config, SiftConfig):
        raise TypeError(f"config must be a tfsift.SiftConfig. Received: {type(config).__name__}")
    config.check_epochs()
    if config.scores == "training":
        scorer: Scorer = NoScorer()
    else:
        scorer = _scorer(model_or_step, per_sample_loss, config)

    def apply(dataset: tf.data.Dataset) -> tf.data.Dataset:
        if config.policy == "infobatch" and dataset.cardinality() == tf.data.INFINITE_CARDINALITY:
            raise ValueError(
                "policy='infobatch' prunes at each epoch's start, so it needs a finite dataset "
                "that the loop iterates once per epoch (no .repeat()). Received: a dataset of "
                "infinite cardinality"
            )
        if config.policy == "infobatch" and not pruning_epochs(config):
            # legal (a one-epoch smoke test of a real configuration), but not what anyone wants
            log.warning(
                "policy='infobatch' prunes in no epoch of this run: it never prunes the first "
                "epoch (which gives the samples their scores) nor the last anneal fraction, so "
                "every sample is trained as without sifting. Received: epochs=%s, anneal=%s",
                config.epochs,
                config.anneal,
            )
        if isinstance(dataset, RowDataset) and config.policy == "infobatch":
            return IndexedSiftedDataset(IndexedSifter(dataset, config))  # pruned rows unread
        return SiftedDataset(Sifter(dataset.element_spec, scorer, config), dataset)

    return apply


def sift_metrics(epoch: bool = False) -> dict[str, Any]:
    """The metrics of the sifted dataset iterated last on this rank (``{}`` if none yet).

    Example:
        >>> for epoch in range(3):
        ...     for x, y in train:
        ...         ...
        ...     print(tfsift.sift_metrics(epoch=True)["kept_fraction"])   # this epoch's

    Args:
        epoch: the figures of the current epoch (the one being iterated, or the last one
            ended) instead of the totals since the dataset was made.

    Returns:
        A dict. Keys: samples_seen, samples_scored, samples_kept, samples_reused,
        samples_unscored, kept_fraction, mean_loss_scored and mean_loss_kept (None where
        no loss was scored, or with ``scores="training"`` ranked), nonfinite_losses,
        batches_yielded, epochs (the epochs begun, in both views), time_scoring,
        time_selecting, time_accumulating, and ``policy/<name>`` (e.g. adaptive's weights,
        InfoBatch's ``pruned`` and ``reweighted`` in the current epoch's plan).
    """
    metrics = STATE.sift_metrics
    return {} if metrics is None else dict(metrics.as_dict(epoch))


def _scorer(
    model_or_step: Any, per_sample_loss: Callable[..., Any] | None, config: SiftConfig
) -> Scorer:
    from tfsift.model import DistributedModel

    needs_logits = make_policy(config).needs_logits
    if isinstance(model_or_step, DistributedModel):
        if not callable(per_sample_loss):
            raise TypeError(
                "tfsift.sift(model, per_sample_loss, config) needs a per-sample loss function. "
                f"Received: per_sample_loss={per_sample_loss!r}"
            )
        if config.scorer == "early_exit":  # the experimental part, only when asked for
            from tfsift.sift.experimental.early_exit import EarlyExitScorer

            return EarlyExitScorer(model_or_step, per_sample_loss, config, needs_logits)
        return FullScorer(model_or_step, per_sample_loss, needs_logits)
    if getattr(model_or_step, "tfsift_step", False):
        if per_sample_loss is not None:
            raise TypeError(
                "tfsift.sift(score_step, config=...) takes no loss: the step returns the "
                f"per-sample losses. Received: per_sample_loss={per_sample_loss!r}"
            )
        if config.scorer == "early_exit":
            raise ValueError(
                "scorer='early_exit' needs tfsift.sift(model, per_sample_loss, config): it "
                "runs the model's first layers and a head of its own. Received: a @tfsift.step"
            )
        if needs_logits:
            raise ValueError(
                f"policy {config.policy!r} needs the model's logits, which only "
                "tfsift.sift(model, per_sample_loss, config) provides. Received: a @tfsift.step"
            )
        return StepScorer(model_or_step)
    raise TypeError(
        "tfsift.sift expects a tfsift.DistributedModel and a per-sample loss, or a "
        f"forward-only @tfsift.step function. Received: {type(model_or_step).__name__}"
    )


class Sifter:
    """The epoch loop of one sifted dataset: reads rounds of source batches, has them
    sifted (``tfsift.sift.rounds``), buffers the kept samples and yields full batches,
    in step with the other replicas."""

    def __init__(self, element_spec: Any, scorer: Scorer, config: SiftConfig) -> None:
        rt = runtime.get()
        self.config = config
        self.element_spec = element_spec
        self.M = rt.config.microbatches
        self.rounds = Rounds(config, scorer, _policy(config), element_spec, rt.replica)
        self.batch_size = _static_batch(element_spec)
        _check_divisible(self.batch_size, self.M)
        scorer.expect(element_spec)
        self.batches_read = 0  # source batches over all epochs: counts the delay
        self._group: ReplicaGroup | None = None
        self.epoch_read = 0  # source batches read in the current epoch
        self.buffer = SampleBuffer()
        self._resume: tuple[int, SampleBuffer] | None = None
        self._unsifted = 0
        self._dry = 0  # rounds since a batch was last yielded (STARVED_ROUNDS)
        self._starved_warned = False
        self._empty_warned = False  # an epoch that yielded no batch was told of
        log_dir = config.log_dir or rt.config.log_dir  # the run's, unless sifting has its own
        self._log = ScalarLog(log_dir) if log_dir and rt.rank == 0 else None

    @property
    def batch_size(self) -> int | None:
        """B, the source batch size (None until the first batch, for a dynamic one)."""
        return self.rounds.batch_size

    @batch_size.setter
    def batch_size(self, value: int | None) -> None:
        self.rounds.batch_size = value
        self.rounds.scorer.batch_size = value

    @property
    def metrics(self) -> SiftMetrics:
        """The dataset's counters (the rounds')."""
        return self.rounds.metrics

    def state(self) -> dict[str, Any]:
        """Everything needed to continue exactly from the last batch yielded: plain NumPy
        arrays, numbers and strings (for ``tfsift.CheckpointManager``)."""
        return {
            **self.rounds.state(),
            "batches_read": self.batches_read - self._unsifted,
            "batch_size": self.batch_size,
            "epoch_read": self.epoch_read - self._unsifted,
            "buffer": self.buffer.state(),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restores ``state()``; the next epoch resumes the saved one where it stopped.

        Raises:
            ValueError: the state of a dataset sifted by row (``tfsift.from_arrays``,
                ``tfsift.from_rows``).
        """
        if state.get("kind") == ROWS:
            raise ValueError(
                "this sifting state was saved by another kind of sifted dataset: restore it "
                "into one made as it was (tfsift.from_arrays or tfsift.from_rows, with "
                "policy='infobatch'). "
                "Received: the state of a dataset sifted by row"
            )
        self.batches_read, self.batch_size = int(state["batches_read"]), state["batch_size"]
        self.rounds.load_state(state)  # the scorer's after B, as B is set on it
        self._resume = (int(state["epoch_read"]), SampleBuffer.from_state(state["buffer"]))

    def start_next_epoch(self) -> None:
        """After ``load_state`` of a state saved at an epoch's end (``fit``'s callbacks save
        there, whether or not the epoch read all of its source): the next pass starts a new
        epoch, as the uninterrupted run's did, instead of resuming the saved one."""
        self._resume = None

    def epoch(self, source: tf.data.Dataset) -> Iterator[Element]:
        """One pass over ``source``: yields sifted batches as NumPy elements.

        After ``load_state``, the first call resumes the saved epoch instead: it skips
        the source batches that epoch had read and starts from the saved buffer.
        """
        STATE.sift_metrics = self.metrics
        group = self._replicas()
        resume, self._resume = self._resume, None
        yielded = self.metrics.batches_yielded
        if resume is None:
            self.metrics.begin_epoch()
            self.epoch_read, self.buffer = 0, SampleBuffer()
            self.rounds.begin_epoch(group)
        else:
            self.epoch_read, self.buffer = resume
            source = source.skip(self.epoch_read)
        buffer = self.buffer
        reader = SourceReader(source, self.batch_size, self.rounds.g)
        try:
            while True:
                leaves = self._read(reader)
                B = self.batch_size or 0
                ready = [len(buffer) // B if B else 0, int(leaves is not None)]
                n, more = group.agree(ready, COUNTS)
                if n and more and self.config.overlap and self.batches_read > self.config.delay:
                    assert leaves is not None
                    self.rounds.prepare(leaves)
                for _ in range(n):
                    yield self._emit(buffer, B)
                if not more:  # the shortest shard ended: every replica stops here
                    break
                assert leaves is not None
                delayed = self.batches_read <= self.config.delay
                self._accumulate(buffer, *self.rounds.sift(leaves, group, delayed))
                self._unsifted = 0
                self._dry = 0 if n else self._dry + 1
                if self._dry == STARVED_ROUNDS and not self._starved_warned:
                    self._warn_starved(len(buffer))
        finally:  # also when the consumer stops early: the reader's thread ends
            reader.close()
        yield from self._drain(buffer, group)
        empty = resume is None and self.metrics.batches_yielded == yielded
        if empty and not self._empty_warned and runtime.get().rank == 0:  # once, from rank 0
            self._empty_warned = True
            read = f"{self.epoch_read} source batches" if self.epoch_read else ""
            warn_empty_epoch(self.metrics.epochs, read, self.config.policy)
        if self._log is not None:  # the epoch's points, for whoever reads them now
            self._log.flush()

    def record(self, losses: Any) -> None:
        """Takes the per-sample losses of the batch yielded last (``scores="training"``)."""
        recorder = self.rounds.recorder
        if recorder is None:
            raise ValueError(
                "record hands the training step's losses back for scores='training'; this "
                "sifted dataset scores with a forward pass. "
                f"Received: scores={self.config.scores!r}"
            )
        recorder.record(losses, self.metrics.epochs)

    def _replicas(self) -> ReplicaGroup:
        if self._group is None:
            self._group = ReplicaGroup(runtime.get())
            self.rounds.scorer.bind(self._group)
        return self._group

    def _read(self, reader: SourceReader) -> list[np.ndarray] | None:
        """The next g source batches (1 during the delay) as one element's leaves."""
        g = 1 if self.batches_read < self.config.delay else self.rounds.g
        read = reader.read(g)
        if read is None:
            return None
        leaves, count = read
        if self.batch_size is None:
            self.batch_size = reader.first_size
            _check_divisible(self.batch_size, self.M)
        self.batches_read += count
        self.epoch_read += count
        self._unsifted = count  # read, not yet sifted: a saved state reads them again
        return leaves

    def _accumulate(self, buffer: SampleBuffer, leaves: Leaves, kept: Selection) -> None:
        start = time.perf_counter()
        buffer.add(leaves, kept.indices, kept.probs)
        self.metrics.time_accumulating += time.perf_counter() - start

    def _emit(self, buffer: SampleBuffer, n: int) -> Element:
        start = time.perf_counter()
        leaves, probs = buffer.take(n)
        recorder = self.rounds.recorder
        if recorder is not None:  # the keys ride along as a last leaf
            recorder.yielded(leaves.pop())
        element = tree.pack_sequence_as(self.element_spec, leaves)
        self.metrics.time_accumulating += time.perf_counter() - start
        self.metrics.batches_yielded += 1
        if self._log is not None:
            self._log.write(self.metrics)
        return with_weights(element, probs, self.config.rescale)

    def _drain(self, buffer: SampleBuffer, group: ReplicaGroup) -> Iterator[Element]:
        """The end of an epoch: the full batches every replica has, then the remainder."""
        B = self.batch_size or 0
        if B:
            (n,) = group.agree([len(buffer) // B], FULL_BATCHES)
            for _ in range(n):
                yield self._emit(buffer, B)
            if not self.config.drop_remainder:
                (left,) = group.agree([len(buffer)], REMAINDER)
                left -= left % self.M  # a partial batch must still split into M microbatches
                if left > 0:
                    yield self._emit(buffer, left)
        buffer.clear()

    def _warn_starved(self, kept: int) -> None:
        """Once: STARVED_ROUNDS rounds have yielded no batch (the training loop waits)."""
        self._starved_warned = True
        change = {
            "relative": "a smaller beta (it keeps about 1/(1+beta))",
            "infobatch": "a smaller prune",
        }.get(self.config.policy, "a larger keep")
        log.warning(
            "tfsift.sift: %d rounds of source batches in a row have yielded no batch: the "
            "policy kept %d samples since the last one, fewer than a batch of %d "
            "(policy=%r). Training waits while sifting reads on; keep more with %s, or "
            "check sift_metrics()",
            STARVED_ROUNDS,
            kept,
            self.batch_size or 0,
            self.config.policy,
            change,
        )


class SiftedDataset(PythonDataset):
    """The dataset ``tfsift.sift`` returns: a ``tf.data.Dataset`` whose Python iteration
    runs the sifting rounds on the consumer's thread (see the module docstring)."""

    def __init__(self, sifter: Sifter, source: tf.data.Dataset) -> None:
        self.sifter, self.source = sifter, source
        spec = sifted_spec(sifter.element_spec, sifter.config.rescale)
        super().__init__(spec, options=in_step_options())

    def _elements(self) -> Iterator[Any]:
        return self.sifter.epoch(self.source)

    def record(self, losses: Any) -> None:
        """Hands back the per-sample losses the training step computed for the batch this
        dataset yielded last (``SiftConfig(scores="training")``): a ``StepOutput`` of
        per-sample losses, a tensor or an array of shape (B,), unweighted, the same on
        every rank of a pipeline. They become those samples' scores for the rounds that
        follow; a batch not recorded leaves its samples unscored.

        Example:
            >>> for x, y in train:
            ...     grads, losses = forward_backward(x, y)   # losses: a StepOutput (B,)
            ...     train.record(losses)

        Raises:
            ValueError: with ``scores="forward"``, or not one loss per sample.
            RuntimeError: if no batch was yielded since the last record.
        """
        self.sifter.record(losses)

    def planned_batches(self) -> int | None:
        """None: the batches an epoch yields are known at its end (its rounds decide)."""
        return None

    def prefetch(self, buffer_size: Any, name: str | None = None) -> SiftedDataset:
        """Prefetches the source batches; the sifting rounds stay in lock-step."""
        return SiftedDataset(self.sifter, self.source.prefetch(buffer_size, name=name))


def _policy(config: SiftConfig) -> Policy | InfoBatchPolicy:
    if config.policy == "infobatch":
        assert config.epochs is not None  # SiftConfig checks it
        return InfoBatchPolicy(config.prune, config.anneal, config.epochs, config.seed)
    return make_policy(config)


def _static_batch(spec: Any) -> int | None:
    leaves = tree.flatten(spec)
    if not leaves or any(len(s.shape) == 0 for s in leaves):
        raise ValueError(
            "tfsift.sift needs a batched dataset (apply it after .batch(B)). Received: "
            f"element_spec={spec}"
        )
    dim = leaves[0].shape[0]
    return None if dim is None else int(dim)


def _check_divisible(batch: int | None, M: int) -> None:
    if batch is not None and batch % M:
        raise ValueError(
            f"the sifted dataset's batch size must be divisible by microbatches={M}, since "
            f"every sifted batch has that size. Received: batch size {batch}"
        )

"""Scores from the training pass: the per-sample losses each step hands back, by sample key.

With ``SiftConfig(scores="training")`` no scoring forward runs. The sifted dataset yields
a batch; the training loop trains on it and hands its per-sample losses back with
``train.record(losses)``; those become the samples' scores in the table that the next
rounds select from (``tfsift.sift.stale.ScoreCache``, keyed by the samples' content
fingerprints, so shuffling does not matter)::

    round: keys of the g·B candidates ─► merge the records ─► look up ─► select ─► buffer
    yield batch (its keys noted) ─► training step ─► record(losses): queued with the keys

Records are queued on each rank and merged into the table at the next round (and at
each epoch's start), after an allgather over the replicas in replica order, so every
replica holds the same table (and, as every rank of a pipeline records the same
losses, every rank does). Where one key was recorded twice, the later record wins.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import numpy as np
import tensorflow as tf

from tfsift.pipeline.outputs import StepOutput
from tfsift.sift.replicas import RECORDS, ReplicaGroup
from tfsift.sift.scorer import concat
from tfsift.sift.selection import check_losses
from tfsift.sift.stale import ScoreCache
from tfsift.state import STATE

log = logging.getLogger("tfsift")


class Recorder:
    """The losses recorded since the last merge, and the keys of the batch yielded last.

    Example:
        >>> cache = ScoreCache(epochs=1)
        >>> recorder = Recorder(cache)
        >>> recorder.yielded(np.array([7.0, 3.0]))
        >>> recorder.record(np.array([0.25, 2.0]), epoch=1)
        >>> recorder.merge(None)  # one replica: no exchange
        >>> cache.lookup(np.array([3.0, 7.0, 5.0]), epoch=2)[1].tolist()
        [2.0, 0.25, nan]
    """

    def __init__(self, cache: ScoreCache) -> None:
        self.cache = cache
        self._keys: list[np.ndarray] = []
        # each a (B,) array, or a training step's loss tensors converted at the next merge
        self._losses: list[Any] = []
        self._epochs: list[np.ndarray] = []
        self._yielded: np.ndarray | None = None
        self._unrecorded = 0  # batches yielded since the last merge, while none was recorded
        self._warned = False

    def yielded(self, keys: np.ndarray) -> None:
        """Notes the keys of the batch the sifted dataset has just yielded."""
        self._yielded = np.asarray(keys, np.float64)
        self._unrecorded += 1

    def record(self, losses: Any, epoch: int) -> None:
        """Queues the per-sample ``losses`` (a ``StepOutput``, tensor or array) of the
        batch yielded last, trained in ``epoch``.

        Raises:
            RuntimeError: if no batch was yielded since the last record.
            ValueError: if ``losses`` is not one loss per sample of that batch.
        """
        keys = self._yielded
        if keys is None:
            raise RuntimeError(
                "record takes the per-sample losses of the batch the sifted dataset yielded "
                "last, once per batch; no batch was yielded since the last record (or since "
                "the dataset was made or restored)"
            )
        self._keys.append(keys)
        self._losses.append(_deferred(losses, len(keys)))
        self._epochs.append(_filled(len(keys), epoch))
        self._yielded = None

    def merge(self, group: ReplicaGroup | None) -> None:
        """Stores every replica's queued records in the table (collective over ``group``;
        None: this replica's alone). Rank 0 warns, once, where batches were yielded since
        the last merge and none was recorded: a loop that never calls ``record`` scores no
        sample, so every one is kept, without a word."""
        if self._unrecorded and not self._keys and not self._warned:
            self._warned = True
            if STATE.runtime is None or STATE.runtime.rank == 0:
                log.warning(
                    "tfsift.sift with scores='training' yielded %d batch(es) and was handed "
                    "no losses: after each step, hand its per-sample losses to "
                    "train.record(losses) (fit does). Without them no sample is scored, and "
                    "every one is kept: nothing is sifted",
                    self._unrecorded,
                )
        self._unrecorded = 0
        mine = np.concatenate([_joined(self._keys), self._values(), _joined(self._epochs)])
        parts = [mine] if group is None else group.allgather(mine, RECORDS)
        thirds = zip(*(np.split(part, 3) for part in parts), strict=True)  # [keys, losses, epochs]
        keys, losses, epochs = (np.concatenate(third) for third in thirds)
        self._keys, self._losses, self._epochs = [], [], []
        if len(keys):  # reversed: where a key repeats, the table keeps its later loss
            self.cache.store(keys[::-1], losses[::-1], epochs[::-1].astype(np.int64))

    def _values(self) -> np.ndarray:
        """The queued losses as one float64 array, the step's tensors converted now."""
        return _joined([_converted(losses) for losses in self._losses])

    def state(self) -> dict[str, Any]:
        """The queued records and the keys awaiting a record, for a checkpoint."""
        return {
            "keys": _joined(self._keys),
            "losses": self._values(),
            "epochs": _joined(self._epochs),
            "yielded": self._yielded,
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restores ``state()``."""
        self._keys = [np.asarray(state["keys"], np.float64)]
        self._losses = [np.asarray(state["losses"], np.float64)]
        self._epochs = [np.asarray(state["epochs"], np.float64)]
        yielded = state["yielded"]
        self._yielded = None if yielded is None else np.asarray(yielded, np.float64)


def _deferred(losses: Any, batch: int) -> Any:
    """``losses`` checked as one loss for each of ``batch`` samples, and kept as they are
    where they are the step's tensors of rank 1 (a ``StepOutput`` or one tensor), to be
    converted at the next merge: a record runs after every training step, when each NumPy
    call costs several times what it does in a loop of them (the step has evicted that
    code from the caches), and tensors do not change. Anything else is converted and
    checked now, as ``check_losses`` does."""
    parts = losses.outputs if isinstance(losses, StepOutput) else [losses]
    if all(_eager_vector(p) for p in parts) and sum(int(p.shape[0]) for p in parts) == batch:
        return list(parts)
    return check_losses(concat(losses), batch, "train.record takes the step's")


def _eager_vector(value: Any) -> bool:
    """Whether ``value`` is a tensor of rank 1 with values (not a graph's placeholder,
    which fails at once, in ``concat``, as before)."""
    return (
        isinstance(value, tf.Tensor) and value.shape.rank == 1 and not tf.is_symbolic_tensor(value)
    )


def _converted(losses: Any) -> np.ndarray:
    """A queued record as a float64 array (see ``_deferred``)."""
    if isinstance(losses, np.ndarray):
        return losses
    return np.concatenate([np.asarray(p, np.float64) for p in losses])


@functools.lru_cache(maxsize=8)
def _filled(n: int, epoch: int) -> np.ndarray:
    """n copies of ``epoch``, read-only: one array for every batch of n samples recorded in
    that epoch, made once rather than after every step (see ``_deferred``); the queued
    records are only ever concatenated."""
    array = np.full(n, epoch, np.float64)
    array.flags.writeable = False
    return array


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.empty(0, np.float64)

"""Counters of a sifted dataset, with SageMaker smart sifting's meanings.

``samples_seen`` counts samples read from the source dataset (delay included),
``samples_scored`` those whose loss was computed, ``samples_reused`` those whose
loss came from the ``stale`` cache instead, ``samples_unscored`` those kept without a
loss (overlap with ``leftover="keep"``), ``samples_kept`` those that entered the
refill buffer (every sample during the delay). ``kept_fraction`` is kept / seen.
Mean losses are over the finite losses of scored samples and of the kept ones among
them (None where there are none). Times are wall-clock seconds this rank spent scoring (the
forward pass and its collectives), selecting (the policy and the replicas'
agreement) and accumulating (copying samples into and out of the buffer).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np

log = logging.getLogger("tfsift")

# The fields that count or sum samples: what each replica did (added up when a state moves
# to another number of replicas, ``tfsift.sift.relayout``)
SAMPLE_COUNTS = (
    "samples_seen",
    "samples_scored",
    "samples_kept",
    "samples_reused",
    "samples_unscored",
    "nonfinite_losses",
    "loss_sum_scored",
    "loss_sum_kept",
    "finite_scored",
    "finite_kept",
)
# The fields that add up over batches: an epoch's figure is the total less its start's.
COUNTERS = (
    *SAMPLE_COUNTS,
    "batches_yielded",
    "rounds",
    "time_scoring",
    "time_selecting",
    "time_accumulating",
)


@dataclasses.dataclass
class SiftMetrics:
    """Running totals since the sifted dataset was made (across epochs), and the totals
    at the current epoch's start (``begin_epoch``), which make an epoch's figures."""

    samples_seen: int = 0
    samples_scored: int = 0
    samples_kept: int = 0
    samples_reused: int = 0
    samples_unscored: int = 0
    nonfinite_losses: int = 0
    batches_yielded: int = 0
    rounds: int = 0
    epochs: int = 0
    loss_sum_scored: float = 0.0
    loss_sum_kept: float = 0.0
    finite_scored: int = 0
    finite_kept: int = 0
    time_scoring: float = 0.0
    time_selecting: float = 0.0
    time_accumulating: float = 0.0
    policy: dict[str, float] = dataclasses.field(default_factory=dict)
    scorer: dict[str, float] = dataclasses.field(default_factory=dict)
    at_epoch_start: dict[str, float] = dataclasses.field(default_factory=dict)

    def start_at(self, epoch: int) -> None:
        """Counts ``epoch`` epochs as begun before this process's first (a run resumed at
        fit's ``initial_epoch``): InfoBatch's schedule then counts the run's epochs."""
        self.epochs = epoch

    def begin_epoch(self) -> None:
        """Counts a new epoch, whose figures start from the totals now."""
        self.epochs += 1
        self.at_epoch_start = {name: getattr(self, name) for name in COUNTERS}

    def record(self, losses: np.ndarray, kept: np.ndarray, scored: int) -> None:
        """Adds one group: its losses, the indices kept, how many were scored (not reused)."""
        finite = np.isfinite(losses)
        self.samples_scored += scored
        self.nonfinite_losses += int((~finite).sum())
        self.finite_scored += int(finite.sum())
        self.loss_sum_scored += float(losses[finite].sum())
        self.finite_kept += len(kept)
        self.loss_sum_kept += float(losses[kept].sum())

    def as_dict(self, epoch: bool = False) -> dict[str, Any]:
        """The metrics as plain numbers (what ``tfsift.sift_metrics()`` returns): the
        totals, or with ``epoch`` the current epoch's (the one being iterated, or the last
        one ended)."""
        start = self.at_epoch_start if epoch else {}
        n = {name: getattr(self, name) - start.get(name, 0) for name in COUNTERS}
        seen, kept = n["samples_seen"], n["samples_kept"]
        out: dict[str, Any] = {
            "samples_seen": seen,
            "samples_scored": n["samples_scored"],
            "samples_kept": kept,
            "samples_reused": n["samples_reused"],
            "samples_unscored": n["samples_unscored"],
            "kept_fraction": kept / seen if seen else 0.0,
            "mean_loss_scored": _mean(n["loss_sum_scored"], n["finite_scored"]),
            "mean_loss_kept": _mean(n["loss_sum_kept"], n["finite_kept"]),
            "nonfinite_losses": n["nonfinite_losses"],
            "batches_yielded": n["batches_yielded"],
            "epochs": self.epochs,
            "time_scoring": n["time_scoring"],
            "time_selecting": n["time_selecting"],
            "time_accumulating": n["time_accumulating"],
        }
        out.update({f"policy/{k}": v for k, v in self.policy.items()})
        out.update(self.scorer)
        return out


def warn_nonfinite(metrics: SiftMetrics, bad: int, of: int, kept: bool = False) -> None:
    """Warns that ``bad`` of ``of`` losses are NaN or infinite, the first time a sifted
    dataset meets one (``metrics`` has counted none yet; the caller counts them); ``kept``:
    the policy keeps those samples (InfoBatch keeps a sample without a finite score)
    rather than dropping them."""
    if bad and metrics.nonfinite_losses == 0:
        fate = (
            "policy='infobatch' keeps them with weight 1, as samples without a score"
            if kept
            else "they are never kept (their gradient would destroy the weights)"
        )
        log.warning(
            "tfsift.sift: %d of %d scored samples have a NaN or infinite loss; %s, and they "
            "are counted in sift_metrics()['nonfinite_losses'] (NaN losses mostly come from "
            "NaN weights, a learning rate too high, or NaN in the data)",
            bad,
            of,
            fate,
        )


def warn_empty_epoch(epoch: int, candidates: str, policy: str) -> None:
    """Logs that epoch ``epoch`` of a sifted dataset yielded no batch, so nothing was
    trained: its source gave none (``candidates``, what the epoch had to sift, is ""),
    or the policy kept less than a batch of it."""
    if candidates:
        why = f"policy={policy!r} kept less than a batch of its {candidates}"
    else:
        why = (
            "its source dataset is empty (a .take(0), a filter that keeps nothing, a shard "
            "smaller than a batch with drop_remainder=True?)"
        )
    log.warning("tfsift.sift: epoch %d yielded no batch, so nothing was trained: %s", epoch, why)


def _mean(total: float, count: int) -> float | None:
    return total / count if count else None


class ScalarLog:
    """TensorBoard scalars of the metrics under ``log_dir`` (written by rank 0 only).

    A point per metric per batch yielded, buffered and written by one compiled call per
    ``runlog.FLUSH`` batches, at each epoch's end and at exit (``runlog.Scalars``):
    written eagerly, a flush per batch cost rank 0 milliseconds per sifted batch.
    """

    def __init__(self, log_dir: str) -> None:
        import atexit
        import importlib.util

        from tfsift.pipeline.runlog import Scalars

        if importlib.util.find_spec("tensorboard") is None:
            raise ValueError(
                "SiftConfig(log_dir=...) writes TensorBoard scalars, which needs the "
                "tensorboard package (pip install tensorboard). Received: "
                f"log_dir={log_dir!r} without tensorboard installed"
            )
        self._scalars = Scalars(log_dir)
        atexit.register(self._scalars.close)

    def write(self, metrics: SiftMetrics) -> None:
        """One point per numeric metric at step ``batches_yielded`` (buffered)."""
        step = metrics.batches_yielded
        for name, value in metrics.as_dict().items():
            if isinstance(value, (int, float)) and np.isfinite(value):
                self._scalars.add(f"sift/{name}", step, float(value))
        self._scalars.step_done()

    def flush(self) -> None:
        """Writes the buffered points (at the end of an epoch)."""
        self._scalars.flush()

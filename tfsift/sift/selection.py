"""The kept samples of one selection, what a policy is, and the checks every policy shares.

Letters: B samples scored in one selection, k of them kept. Non-finite losses (NaN,
inf) are never kept: a policy selects among the finite ones and maps back.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclasses.dataclass(frozen=True, eq=False)
class Selection:
    """The kept samples of a scored batch.

    Example:
        >>> selection = Selection.of(np.array([3, 1]), np.array([0.5, 0.25]))
        >>> selection.indices.tolist(), selection.probs.tolist()
        ([1, 3], [0.25, 0.5])

    Attributes:
        indices: positions of the kept samples in the scored batch, ascending (int64).
        probs: the probability with which each kept sample was kept (same length), for
            importance weights. The top-k policies have no per-sample probability and
            give k / B for every kept sample (the kept fraction, as InfoBatch rescales).
    """

    indices: IntArray
    probs: FloatArray

    def __post_init__(self) -> None:
        if self.indices.shape != self.probs.shape or self.indices.ndim != 1:
            raise ValueError(
                "indices and probs must be 1-D of one length. "
                f"Received: indices.shape={self.indices.shape}, probs.shape={self.probs.shape}"
            )

    @classmethod
    def of(cls, indices: npt.ArrayLike, probs: npt.ArrayLike) -> Selection:
        """A selection with `indices` sorted ascending and `probs` sorted along."""
        index = np.asarray(indices, dtype=np.int64).reshape(-1)
        prob = np.asarray(probs, dtype=np.float64).reshape(-1)
        order = np.argsort(index, kind="stable")
        return cls(index[order], prob[order])

    @classmethod
    def empty(cls) -> Selection:
        """The selection that keeps nothing."""
        return cls(np.zeros(0, np.int64), np.zeros(0, np.float64))

    def __len__(self) -> int:
        return len(self.indices)


class Policy:
    """What a round asks of every policy that selects within it (``tfsift.sift.policies``);
    the defaults are those of a policy that keeps no state."""

    needs_logits = False  # whether ``select`` needs the logits and labels (grad_norm does)

    def observe(self, losses: npt.ArrayLike) -> None:
        """Takes all replicas' losses of a round, before ``select`` (relative keeps them)."""

    def select(
        self,
        losses: npt.ArrayLike,
        rng: np.random.Generator | None = None,
        logits: npt.ArrayLike | None = None,
        labels: npt.ArrayLike | None = None,
    ) -> Selection:
        """The kept samples of one scored batch."""
        raise NotImplementedError

    def metrics(self) -> dict[str, float]:
        """Numbers worth logging each round."""
        return {}

    def state(self) -> dict[str, Any]:
        """Plain NumPy and numbers for a checkpoint."""
        return {}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restores what ``state`` took."""


def check_losses(
    losses: npt.ArrayLike, batch: int | None = None, what: str = "the per-sample loss must return"
) -> FloatArray:
    """The per-sample losses as a 1-D float64 array, checked against the batch size;
    ``what`` says who gave them (``"train.record takes"`` for the loop's records).

    Raises:
        ValueError: if the loss is a single value or not one loss per sample.
    """
    array = np.asarray(losses, dtype=np.float64)
    if array.ndim == 0:
        raise ValueError(
            f"{what} one loss per sample (shape (B,)); it got a single value. Use a Keras "
            "loss with reduction=None. Received: shape=()"
        )
    if array.ndim != 1 or (batch is not None and len(array) != batch):
        suffix = "" if batch is None else f" for a batch of {batch}"
        raise ValueError(
            f"{what} one loss per sample (shape (B,)). Received: shape={array.shape}{suffix}"
        )
    return array


def kept_count(keep: float, B: int) -> int:
    """k = max(1, floor(keep * B)), the samples a fraction policy keeps of B.

    The product is rounded to 9 decimals first, so that keep=0.29 keeps 29 of 100
    although 0.29 * 100 is 28.999999999999996 in floating point.
    """
    return max(1, math.floor(round(keep * B, 9)))


def top_k(scores: FloatArray, k: int) -> IntArray:
    """The k highest scores' positions, ascending; ties go to the lower index."""
    order = np.argsort(-scores, kind="stable")[:k]
    return np.sort(order).astype(np.int64)

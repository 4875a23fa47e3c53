"""Selective-Backprop's relative rule: keep a sample with a probability from its loss
percentile among recent losses (Jiang et al., 2019, "Accelerating Deep Learning by
Focusing on the Biggest Losers").

Letters: B samples scored in one selection, H the recent finite losses (at most
``history`` of them). Sample i's percentile is its mid-rank in H,

    p_i = (#{h in H : h < l_i} + 0.5 * #{h in H : h = l_i}) / |H|,

and it is kept with probability P_i = max(min_prob, p_i ** beta). For i.i.d. losses p_i
is uniform on [0, 1], so the long-run kept fraction is E[p ** beta] = 1 / (1 + beta).
Counting ties half keeps that where losses repeat (zeros of learnt samples, losses
rounded to few values): the strict count gave a history of equal losses p = 0, and
beta=1 kept nothing instead of half. It is exact in expectation for beta=1; for
beta > 1, a tie group holding a fraction q of H at mid-rank m keeps m ** beta, less
than the mean of p ** beta over the q it spans (by q ** 3 m / 4 of all samples for
beta=3: 0.125 instead of 0.25 when H holds one value only).

Order of calls per step, as in the paper (the scored losses join the history before the
percentiles are taken): ``observe(all_losses)`` then ``select(losses, ...)``. With data
parallelism every replica observes all replicas' losses of the step, concatenated in
rank order, so that all replicas hold the same history; each then selects among its own.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from tfsift.sift.selection import FloatArray, Policy, Selection, check_losses


class LossHistory:
    """A FIFO ring buffer of the last `length` finite losses.

    Example:
        >>> history = LossHistory(3)
        >>> history.extend([1.0, float("nan"), 2.0, 3.0, 4.0])
        >>> history.values().tolist()
        [2.0, 3.0, 4.0]
    """

    def __init__(self, length: int) -> None:
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ValueError(f"length must be an integer >= 1. Received: length={length!r}")
        self.length = length
        self._buffer = np.zeros(length, np.float64)
        self._next = 0  # where the next value goes; the oldest value once full
        self._count = 0

    def extend(self, values: npt.ArrayLike) -> None:
        """Appends the finite `values` in order, dropping the oldest beyond `length`."""
        array = np.asarray(values, dtype=np.float64).reshape(-1)
        array = array[np.isfinite(array)][-self.length :]
        slots = (self._next + np.arange(len(array))) % self.length
        self._buffer[slots] = array
        self._next = (self._next + len(array)) % self.length
        self._count = min(self.length, self._count + len(array))

    def values(self) -> FloatArray:
        """The stored losses, oldest first (a copy)."""
        if self._count < self.length:
            return self._buffer[: self._count].copy()
        return np.concatenate([self._buffer[self._next :], self._buffer[: self._next]])

    def __len__(self) -> int:
        return self._count

    def state(self) -> dict[str, Any]:
        """Plain NumPy and ints for a checkpoint."""
        return {"length": self.length, "values": self.values()}


def relative_probabilities(
    losses: npt.ArrayLike, history: npt.ArrayLike, beta: float, min_prob: float
) -> FloatArray:
    """P_i = max(min_prob, p_i ** beta), p_i the mid-rank of loss i in `history`: the
    fraction of `history` below it, plus half the fraction equal to it.

    An empty history gives P = 1 (no evidence yet, keep everything). A NaN loss gives
    NaN; callers never keep those.

    Example:
        >>> relative_probabilities([0.5, 2.5, 2.0], [1.0, 2.0, 3.0, 4.0], 1.0, 0.0).tolist()
        [0.0, 0.5, 0.375]
    """
    array = np.asarray(losses, dtype=np.float64)
    recent = np.sort(np.asarray(history, dtype=np.float64).reshape(-1))
    probs: FloatArray = np.ones_like(array)
    if len(recent):
        below = np.searchsorted(recent, array, side="left")
        not_above = np.searchsorted(recent, array, side="right")
        percentiles = (below + not_above) / (2 * len(recent))
        probs = np.maximum(min_prob, percentiles**beta)
    return np.where(np.isfinite(array), probs, np.nan)


class RelativePolicy(Policy):
    """Selective-Backprop: keeps sample i iff u_i < P_i, u_i uniform on [0, 1).

    Example:
        >>> policy = RelativePolicy(beta=1.0, history=4)
        >>> policy.observe([1.0, 2.0, 3.0, 4.0])
        >>> policy.select([0.5, 3.5], uniforms=[0.1, 0.1]).indices.tolist()
        [1]
    """

    def __init__(self, beta: float = 1.0, history: int = 500, min_prob: float = 0.0) -> None:
        self.beta = beta
        self.min_prob = min_prob
        self.history = LossHistory(history)

    def observe(self, losses: npt.ArrayLike) -> None:
        """Appends the step's finite losses (all replicas', in rank order) to the history."""
        self.history.extend(losses)

    def select(
        self,
        losses: npt.ArrayLike,
        rng: np.random.Generator | None = None,
        logits: npt.ArrayLike | None = None,
        labels: npt.ArrayLike | None = None,
        uniforms: npt.ArrayLike | None = None,
    ) -> Selection:
        """Keeps i iff uniforms[i] < P_i and loss i is finite; draws the uniforms from
        `rng` when they are not given. Does not change the history (see `observe`)."""
        del logits, labels  # the rule needs only the losses
        array = check_losses(losses)
        draws = _uniforms(uniforms, rng, len(array))
        probs = relative_probabilities(array, self.history.values(), self.beta, self.min_prob)
        kept = np.flatnonzero(np.isfinite(array) & (draws < np.nan_to_num(probs)))
        return Selection(kept.astype(np.int64), probs[kept])

    def state(self) -> dict[str, Any]:
        """The loss history, for a checkpoint."""
        return {"history": self.history.state()}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restores the history `state` holds, keeping this policy's history length (the
        newest values are kept if the checkpoint holds more)."""
        self.history = LossHistory(self.history.length)
        self.history.extend(state["history"]["values"])


def _uniforms(
    uniforms: npt.ArrayLike | None, rng: np.random.Generator | None, B: int
) -> FloatArray:
    if uniforms is not None:
        draws = np.asarray(uniforms, dtype=np.float64)
        if draws.shape != (B,):
            raise ValueError(
                f"uniforms must have one draw per sample. Received: shape={draws.shape} "
                f"for a batch of {B}"
            )
        return draws
    if rng is None:
        raise ValueError("the relative policy needs uniforms or an rng. Received: rng=None")
    return rng.random(B)

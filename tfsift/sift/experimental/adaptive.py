"""AdaSelection: a learned mixture of selection methods, with a curriculum toward easy
samples that fades (Dong et al., 2023, "AdaSelection: Accelerating Deep Learning
Training through Data Subsampling").

Letters: B finite samples scored in one selection, k = min(max(1, floor(keep * B0)), B)
kept (B0 the batch before non-finite losses are dropped), n methods, t the step counter
(0 at the first selection), l^_i = l_i / (max l + 1e-12). This module implements exactly
the following reading of the paper.

Each method m scores every sample with s_m in [0, 1]:

    uniform           U[0, 1) from the rng
    big_loss          l^
    small_loss        1 - l^
    grad_norm         || softmax(z) - onehot(y) ||_2 / sqrt(2)  (cross-entropy), or
                      g / max g with g the squared-error gradient norm (0 if all zero)
    adaboost          a / max a, a = 0.5 ln((1 + l~) / (1 - l~)), l~ = min(l^, 1 - 1e-6)
                      (0 when max a is 0)
    coreset_extremes  |2 rank_i - (B - 1)| / (B - 1), rank_i sample i's position in the
                      stable ascending sort of the losses (1 when B = 1)
    coreset_mean      1 - |l - mean l| / max |l - mean l|  (1 when the max is 0)

and I_m = softmax(s_m) over the B samples is its importance. Method weights w start at
1/n. At step t > 0, before selecting, with L_t the mean finite loss of the scored batch,
Delta = (L_{t-1} - L_t) / L_{t-1} (0 when L_{t-1} = 0) and c_m = sum over the samples
kept at t - 1 of I_m at t - 1 (method m's share of what was kept):

    w_m <- w_m exp(eta Delta c_m), normalised; floored at 0.01 / n; renormalised.

So the selection at t already uses the loss change it just observed. The curriculum
reward is r_i = lambda_t I_small(i) + (1 - lambda_t) / B with lambda_t = T / (T + t) and
I_small = softmax(1 - l^) (whether or not small_loss is a method). Sample i's final
importance is s_i = sum_m w_m I_m(i) + r_i, and the k highest are kept (ties to the lower
index). A batch without finite losses keeps nothing and leaves the state unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from tfsift.sift.config import METHODS, check_methods
from tfsift.sift.experimental.scores import (
    adaboost_alphas,
    finite_rows,
    grad_norms,
    normalized_losses,
    require_logits,
    resolve_loss_kind,
    softmax,
)
from tfsift.sift.selection import (
    FloatArray,
    Policy,
    Selection,
    check_losses,
    kept_count,
    top_k,
)

_FLOOR = 0.01


class AdaptivePolicy(Policy):
    """AdaSelection over `methods`; see the module docstring for the exact rule.

    Example:
        >>> policy = AdaptivePolicy(("big_loss", "small_loss"), keep=0.5)
        >>> policy.select([0.1, 0.9, 0.5, 0.7]).indices.tolist()
        [0, 2]
        >>> policy.weights
        {'big_loss': 0.5, 'small_loss': 0.5}
    """

    def __init__(
        self,
        methods: Sequence[str] = METHODS,
        keep: float = 0.5,
        eta: float = 1.0,
        T: float = 1000.0,
        loss_kind: str = "auto",
    ) -> None:
        self.methods = check_methods(methods)
        self.keep = keep
        self.eta = eta
        self.T = T
        self.loss_kind = loss_kind
        self.needs_logits = "grad_norm" in self.methods
        self._weights = np.full(len(self.methods), 1 / len(self.methods))
        self._step = 0
        self._previous_loss = math.nan  # L_{t-1}; NaN before the first selection
        self._previous_share = np.zeros(0)  # c_m; empty before the first selection

    @property
    def weights(self) -> dict[str, float]:
        """The current weight of each method."""
        return {m: float(w) for m, w in zip(self.methods, self._weights, strict=True)}

    def select(
        self,
        losses: npt.ArrayLike,
        rng: np.random.Generator | None = None,
        logits: npt.ArrayLike | None = None,
        labels: npt.ArrayLike | None = None,
    ) -> Selection:
        """Updates the method weights, keeps the k most important finite samples and
        records what the next update needs."""
        array = check_losses(losses)
        if self.needs_logits:
            require_logits("grad_norm", logits, labels)
        finite = np.flatnonzero(np.isfinite(array))
        if len(finite) == 0:
            return Selection.empty()
        scored = array[finite]
        rows = (finite_rows(logits, finite, len(array)), finite_rows(labels, finite, len(array)))
        importance = np.stack([softmax(self._scores(m, scored, rng, *rows)) for m in self.methods])
        self._update_weights(float(scored.mean()))  # after the checks: a bad call changes nothing
        k = min(kept_count(self.keep, len(array)), len(finite))
        kept = top_k(self._weights @ importance + self._curriculum(scored), k)
        self._previous_share = importance[:, kept].sum(axis=1)
        self._previous_loss = float(scored.mean())
        self._step += 1
        return Selection(finite[kept], np.full(k, k / len(finite)))

    def metrics(self) -> dict[str, float]:
        """``weight_<method>`` for each method."""
        return {f"weight_{m}": w for m, w in self.weights.items()}

    def state(self) -> dict[str, Any]:
        """Plain NumPy and numbers for a checkpoint."""
        return {
            "weights": self._weights.copy(),
            "step": self._step,
            "previous_loss": self._previous_loss,
            "previous_share": self._previous_share.copy(),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restores what `state` took, for the same methods."""
        weights = np.asarray(state["weights"], dtype=np.float64)
        if weights.shape != (len(self.methods),):
            raise ValueError(
                f"the checkpoint holds weights for another number of methods than "
                f"{len(self.methods)}. Received: weights.shape={weights.shape}"
            )
        self._weights = weights.copy()
        self._step = int(state["step"])
        self._previous_loss = float(state["previous_loss"])
        self._previous_share = np.asarray(state["previous_share"], dtype=np.float64).copy()

    def _update_weights(self, loss: float) -> None:
        if len(self._previous_share) == 0:
            return
        previous = self._previous_loss
        delta = (previous - loss) / previous if previous != 0 else 0.0
        # Multiplying then normalising is a softmax of the log-weights; this form cannot
        # underflow to all zeros when Delta is very negative.
        weights = softmax(np.log(self._weights) + self.eta * delta * self._previous_share)
        weights = np.maximum(weights, _FLOOR / len(self.methods))
        self._weights = weights / weights.sum()

    def _curriculum(self, losses: FloatArray) -> FloatArray:
        weight = self.T / (self.T + self._step)
        small = softmax(1 - normalized_losses(losses))
        reward: FloatArray = weight * small + (1 - weight) / len(losses)
        return reward

    def _scores(
        self,
        method: str,
        losses: FloatArray,
        rng: np.random.Generator | None,
        logits: npt.NDArray[Any] | None,
        labels: npt.NDArray[Any] | None,
    ) -> FloatArray:
        if method == "grad_norm":
            assert logits is not None and labels is not None  # checked in select
            return grad_norm_scores(logits, labels, self.loss_kind)
        return method_scores(method, losses, rng)


def method_scores(method: str, losses: FloatArray, rng: np.random.Generator | None) -> FloatArray:
    """s_m in [0, 1] for every loss-only method (all but grad_norm); see the module."""
    if method == "uniform":
        if rng is None:
            raise ValueError("the uniform method needs an rng. Received: rng=None")
        return rng.random(len(losses))
    if method == "big_loss":
        return normalized_losses(losses)
    if method == "small_loss":
        return 1 - normalized_losses(losses)
    if method == "adaboost":
        return _unit_max(adaboost_alphas(losses))
    if method == "coreset_extremes":
        return _extremes_scores(losses)
    if method == "coreset_mean":
        return _unit_max(np.abs(losses - losses.mean()), complement=True)
    raise ValueError(
        f"method must be one of {', '.join(map(repr, METHODS))}. Received: method={method!r}"
    )


def grad_norm_scores(
    logits: npt.NDArray[Any], labels: npt.NDArray[Any], loss_kind: str = "auto"
) -> FloatArray:
    """s_grad_norm: the cross-entropy gradient norm / sqrt(2), or the squared-error
    gradient norm / its maximum."""
    norms = grad_norms(logits, labels, loss_kind)
    if resolve_loss_kind(np.asarray(logits), np.asarray(labels), loss_kind) == "squared_error":
        return _unit_max(norms)
    result: FloatArray = norms / math.sqrt(2)
    return result


def _unit_max(values: FloatArray, complement: bool = False) -> FloatArray:
    """values / max (0 when the max is 0), or 1 - that when `complement`."""
    top = values.max()
    scaled = values / top if top > 0 else np.zeros_like(values)
    result: FloatArray = 1 - scaled if complement else scaled
    return result


def _extremes_scores(losses: FloatArray) -> FloatArray:
    B = len(losses)
    if B == 1:
        return np.ones(1)
    rank = np.empty(B, np.float64)
    rank[np.argsort(losses, kind="stable")] = np.arange(B)
    result: FloatArray = np.abs(2 * rank - (B - 1)) / (B - 1)
    return result

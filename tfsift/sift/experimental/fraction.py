"""The fraction policies: each keeps a fixed fraction of every scored group (NumPy only).

Letters: B samples scored in one selection, k = max(1, floor(keep * B)) kept by the
fraction policies (fewer when fewer than k losses are finite). Every policy keeps only
samples with a finite loss and returns their indices ascending. The fraction policies
keep the k samples with

    big_loss          the highest losses
    small_loss        the lowest losses
    uniform           k positions drawn without replacement from the rng
    grad_norm         the highest gradient norms at the logits
    adaboost          the highest a_i = 0.5 ln((1 + l~_i) / (1 - l~_i)),
                      l~ = min(l / (max l + 1e-12), 1 - 1e-6)
    coreset_extremes  the ceil(k/2) highest and the floor(k/2) lowest losses
    coreset_mean      the losses closest to the batch's mean loss

with ties to the lower index (grad_norm's and adaboost's scores are AdaSelection's:
``tfsift.sift.experimental.scores``). None showed a gain: ``uniform``, the one measured
alone, reached the target 0.50x to 0.87x as soon as no sifting, and the others were
measured only inside AdaSelection (docs/benchmarks-log.md). ``tfsift.sift.policies``
builds them when a config names one.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from tfsift.sift.config import METHODS
from tfsift.sift.selection import (
    FloatArray,
    IntArray,
    Policy,
    Selection,
    check_losses,
    kept_count,
    top_k,
)

# For the other methods: a score whose k highest are the samples the method keeps
LOSS_SCORES: dict[str, Callable[[FloatArray], FloatArray]] = {
    "big_loss": lambda losses: losses,
    "small_loss": lambda losses: -losses,
    "coreset_mean": lambda losses: -np.abs(losses - losses.mean()),
}


class FractionPolicy(Policy):
    """Keeps k = max(1, floor(keep * B)) samples of each batch by one fixed method.

    Example:
        >>> FractionPolicy("coreset_extremes", 0.5).select([0.1, 0.9, 0.5, 0.7]).indices
        array([0, 1])
    """

    def __init__(self, method: str, keep: float = 0.5, loss_kind: str = "auto") -> None:
        _check_method(method)
        self.method = method
        self.keep = keep
        self.loss_kind = loss_kind
        self.needs_logits = method == "grad_norm"

    def select(
        self,
        losses: npt.ArrayLike,
        rng: np.random.Generator | None = None,
        logits: npt.ArrayLike | None = None,
        labels: npt.ArrayLike | None = None,
    ) -> Selection:
        """The k samples `method` keeps among the finite ones; probs are k / B (B the
        finite count)."""
        array = check_losses(losses)
        finite = np.flatnonzero(np.isfinite(array))
        if self.needs_logits:  # grad_norm
            from tfsift.sift.experimental.scores import finite_rows, require_logits

            require_logits(self.method, logits, labels)
            logits, labels = (finite_rows(v, finite, len(array)) for v in (logits, labels))
        if len(finite) == 0:
            return Selection.empty()
        k = min(kept_count(self.keep, len(array)), len(finite))
        chosen = choose(self.method, array[finite], k, rng, logits, labels, self.loss_kind)
        return Selection(finite[chosen], np.full(k, k / len(finite)))


def choose(
    method: str,
    losses: FloatArray,
    k: int,
    rng: np.random.Generator | None = None,
    logits: npt.ArrayLike | None = None,
    labels: npt.ArrayLike | None = None,
    loss_kind: str = "auto",
) -> IntArray:
    """The positions (ascending) of the k samples `method` keeps; all losses finite.

    Example:
        >>> choose("coreset_mean", np.array([0.0, 0.4, 1.0, 0.6]), 2).tolist()
        [1, 3]
    """
    if method == "uniform":
        if rng is None:
            raise ValueError("the uniform method needs an rng. Received: rng=None")
        return np.sort(rng.choice(len(losses), size=k, replace=False)).astype(np.int64)
    if method in ("grad_norm", "adaboost"):  # AdaSelection's scores
        from tfsift.sift.experimental.scores import adaboost_alphas, grad_norms, require_logits

        if method == "adaboost":
            return top_k(adaboost_alphas(losses), k)
        require_logits(method, logits, labels)
        assert logits is not None and labels is not None
        return top_k(grad_norms(logits, labels, loss_kind), k)
    if method == "coreset_extremes":
        return coreset_extremes(losses, k)
    _check_method(method)
    return top_k(LOSS_SCORES[method](losses), k)


def coreset_extremes(losses: FloatArray, k: int) -> IntArray:
    """The ceil(k/2) highest losses, then the floor(k/2) lowest of the rest."""
    high = np.argsort(-losses, kind="stable")[: k - k // 2]
    ascending = np.argsort(losses, kind="stable")
    low = ascending[~np.isin(ascending, high)][: k // 2]
    return np.sort(np.concatenate([high, low])).astype(np.int64)


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(
            f"method must be one of {', '.join(map(repr, METHODS))}. Received: method={method!r}"
        )

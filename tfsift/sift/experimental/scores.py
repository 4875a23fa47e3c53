"""Per-sample scores two of AdaSelection's methods rank by: gradient norms and AdaBoost weights.

Experimental, with AdaSelection (``adaptive``): the policies ``grad_norm`` and ``adaboost``
import it when one is chosen (``tfsift.sift.experimental.fraction.choose``).

Letters: B samples, C classes, d the size of a regression output's last axis. The
gradient norms are closed forms of the per-sample loss's gradient at the logits z:

    softmax cross-entropy, label y:  || softmax(z) - onehot(y) ||_2   (in [0, sqrt 2])
    squared error (Keras MSE, the mean over the last axis):  || 2 (z - y) / d ||_2

``z`` must be the pre-activation outputs (a loss with ``from_logits=True``); a model
ending in a softmax gives probabilities, whose norm this is not.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from tfsift.sift.config import LOSS_KINDS
from tfsift.sift.selection import FloatArray, IntArray

_LOSS_FLOOR = 1e-12
_CLIP = 1 - 1e-6


def resolve_loss_kind(
    logits: npt.NDArray[np.generic], labels: npt.NDArray[np.generic], loss_kind: str
) -> str:
    """`loss_kind`, or for ``"auto"``: cross-entropy when the labels are class indices
    (integer-typed, or one fewer dimension than the logits) and there are > 1 classes,
    else squared error."""
    if loss_kind not in LOSS_KINDS:
        raise ValueError(
            f"loss_kind must be one of {', '.join(map(repr, LOSS_KINDS))}. "
            f"Received: loss_kind={loss_kind!r}"
        )
    if loss_kind != "auto":
        return loss_kind
    indices = np.issubdtype(labels.dtype, np.integer) or labels.ndim == logits.ndim - 1
    classes = logits.ndim >= 2 and logits.shape[-1] > 1
    return "softmax_crossentropy" if indices and classes else "squared_error"


def grad_norms(logits: npt.ArrayLike, labels: npt.ArrayLike, loss_kind: str = "auto") -> FloatArray:
    """Each sample's norm of the loss gradient at the logits, shape (B,).

    Example:
        >>> grad_norms(np.array([[0.0, 0.0]]), np.array([1])).round(4).tolist()
        [0.7071]

    Raises:
        ValueError: if the shapes do not fit the loss kind or a label is out of range.
    """
    z = np.asarray(logits, dtype=np.float64)
    y = np.asarray(labels)
    if z.ndim == 0 or y.ndim == 0 or len(z) != len(y):
        raise ValueError(
            "logits and labels must have one row per sample. "
            f"Received: logits.shape={z.shape}, labels.shape={y.shape}"
        )
    if resolve_loss_kind(z, y, loss_kind) == "softmax_crossentropy":
        return _crossentropy_grad_norms(z, y)
    return _squared_error_grad_norms(z, y)


def softmax(scores: FloatArray, axis: int = -1) -> FloatArray:
    """exp(s) / sum exp(s) along `axis`, shifted by the maximum for stability."""
    shifted = np.exp(scores - scores.max(axis=axis, keepdims=True))
    result: FloatArray = shifted / shifted.sum(axis=axis, keepdims=True)
    return result


def _crossentropy_grad_norms(z: FloatArray, y: npt.NDArray[np.generic]) -> FloatArray:
    if z.ndim != 2:
        raise ValueError(
            f"softmax cross-entropy needs logits of shape (B, C). Received: logits.shape={z.shape}"
        )
    if y.shape == z.shape:  # one-hot or soft labels: categorical cross-entropy
        target = y.astype(np.float64)
    else:
        target = _one_hot(y.reshape(len(z)), z.shape[1])
    norms: FloatArray = np.linalg.norm(softmax(z) - target, axis=1)
    return norms


def _one_hot(labels: npt.NDArray[np.generic], C: int) -> FloatArray:
    classes = labels.astype(np.int64)
    if classes.size and (classes.min() < 0 or classes.max() >= C):
        raise ValueError(
            f"labels must be class indices in [0, {C}). "
            f"Received: labels between {classes.min()} and {classes.max()}"
        )
    result: FloatArray = np.eye(C, dtype=np.float64)[classes]
    return result


def _squared_error_grad_norms(z: FloatArray, y: npt.NDArray[np.generic]) -> FloatArray:
    if y.size != z.size:
        raise ValueError(
            "squared error needs labels shaped like the outputs. "
            f"Received: logits.shape={z.shape}, labels.shape={y.shape}"
        )
    d = z.shape[-1] if z.ndim >= 2 else 1
    gradient = 2 * (z - y.reshape(z.shape).astype(np.float64)) / d
    norms: FloatArray = np.linalg.norm(gradient.reshape(len(z), -1), axis=1)
    return norms


def normalized_losses(losses: FloatArray) -> FloatArray:
    """l^ = l / (max l + 1e-12), in [0, 1] for non-negative losses."""
    result: FloatArray = losses / (losses.max() + _LOSS_FLOOR)
    return result


def adaboost_alphas(losses: FloatArray) -> FloatArray:
    """a_i = 0.5 ln((1 + l~_i) / (1 - l~_i)) with l~ = min(l^, 1 - 1e-6): the AdaBoost
    weight of a learner with error l~, increasing in the loss.

    Losses are assumed non-negative (as Keras losses are); l~ is also clipped at
    -(1 - 1e-6) so that a negative loss gives a finite weight.
    """
    clipped = np.clip(normalized_losses(losses), -_CLIP, _CLIP)
    result: FloatArray = 0.5 * np.log((1 + clipped) / (1 - clipped))
    return result


def finite_rows(values: npt.ArrayLike | None, finite: IntArray, B: int) -> npt.NDArray[Any] | None:
    """The rows of `values` (logits or labels, one row per sample) at `finite`."""
    if values is None:
        return None
    array = np.asarray(values)
    if array.ndim == 0 or len(array) != B:
        raise ValueError(
            f"logits and labels must have one row per sample. Received: shape={array.shape} "
            f"for a batch of {B}"
        )
    return array[finite]


def require_logits(method: str, logits: npt.ArrayLike | None, labels: npt.ArrayLike | None) -> None:
    """Raises unless the logits and labels `method` needs were given."""
    if logits is None or labels is None:
        raise ValueError(
            f"the {method} method needs the logits and labels of the scored samples; pass "
            f"logits= and labels= to select. Received: logits={_shape(logits)}, "
            f"labels={_shape(labels)}"
        )


def _shape(value: npt.ArrayLike | None) -> str:
    return "None" if value is None else f"shape {np.shape(value)}"

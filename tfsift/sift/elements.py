"""Sifted elements: the source's structure, with the importance weights ``rescale`` adds."""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf
from keras import tree


def with_weights(element: Any, probs: np.ndarray, rescale: str | None) -> Any:
    """``element`` with the importance weights 1 / ``probs`` added (``rescale``, see
    ``_added``); unchanged without ``rescale``."""
    if rescale is None:
        return element
    return weighted(element, (1.0 / probs).astype(np.float32), rescale)


def weighted(element: Any, inverse: np.ndarray, rescale: str | None) -> Any:
    """``element`` with the weights ``inverse`` (float32 1 / probs) added as
    ``with_weights`` adds them, divided by their mean where ``rescale="normalized"``."""
    return _added(element, inverse / inverse.mean() if rescale == "normalized" else inverse)


def sifted_spec(spec: Any, rescale: str | None) -> Any:
    """The spec of sifted elements of ``spec``: an unknown batch size (a partial last
    batch is possible), and with ``rescale`` the weights ``with_weights`` adds."""
    spec = tree.map_structure(lambda s: tf.TensorSpec((None, *s.shape[1:]), s.dtype), spec)
    return spec if rescale is None else _added(spec, tf.TensorSpec((None,), tf.float32))


def _added(element: Any, weights: Any) -> Any:
    """``element`` with ``weights`` added: a third tuple element, a ``"sample_weight"``
    key, or a pair."""
    if isinstance(element, tuple):
        return (*element, weights)
    if isinstance(element, dict):
        return {**element, "sample_weight": weights}
    return (element, weights)

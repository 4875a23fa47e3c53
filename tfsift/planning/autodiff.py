"""Gradient helpers shared by the profiler and the pipeline stages."""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from typing import Any

import tensorflow as tf


def gradients(
    tape: tf.GradientTape,
    targets: Any,
    sources: Sequence[Any],
    output_gradients: Sequence[tf.Tensor] | None = None,
    *,
    warn_sparse: bool = False,
    reused: Collection[int] = (),
) -> list[tf.Tensor]:
    """``tape.gradient`` with dense results and zeros for sources the targets do not reach;
    ``warn_sparse`` (a training step's): ``note_sparse`` on each but those in ``reused``."""
    grads = tape.gradient(
        targets,
        list(sources),
        output_gradients=None if output_gradients is None else list(output_gradients),
    )
    if warn_sparse:
        for x, g in zip(sources, grads, strict=True):
            note_sparse(x, g, reused)
    return [
        tf.zeros(tuple(x.shape), tf.as_dtype(x.dtype)) if g is None else tf.convert_to_tensor(g)
        for x, g in zip(sources, grads, strict=True)
    ]


_SPARSE_WARNED: set[str] = set()


def note_sparse(variable: Any, gradient: Any, reused: Collection[int] = ()) -> None:
    """Warns once per variable whose gradient comes sparse (``tf.IndexedSlices``: an
    ``Embedding`` not tied to a head), which the pipeline sums dense. Keras' optimizers
    that square the gradient (Adam, AdamW, RMSprop, Adagrad) take a row looked up twice in
    a batch as two gradients, the sum of their squares, where the dense sum gives the
    square of the sum; SGD (with momentum too) and Lion update the same. ``reused``: the
    ids of the weights of layers the model calls more than once (``Graph.reused``: a head
    tied to the embedding), whose gradient is the sum of their uses', dense in one
    process too, though a stage's use may give a sparse one."""
    path = getattr(variable, "path", None)
    if not isinstance(gradient, tf.IndexedSlices) or path is None or path in _SPARSE_WARNED:
        return
    if id(variable) in reused:
        return
    _SPARSE_WARNED.add(path)
    logging.getLogger("tfsift").warning(
        "the gradient of %r is sparse (tf.IndexedSlices, a lookup's): tfsift sums the "
        "microbatches' and replicas' gradients dense, and where a batch looks a row up more "
        "than once, Adam, AdamW, RMSprop and Adagrad update it otherwise than Keras does in "
        "one process (there, the sum of the lookups' squared gradients; here, the square of "
        "their sum): with those optimizers this layer trains differently. SGD and Lion "
        "update the same. A head tied to the embedding (keras.layers.ReversibleEmbedding) "
        "makes its gradient dense in one process too",
        path,
    )


def is_float(x: Any) -> bool:
    """Whether gradients flow through ``x`` (a tensor or a KerasTensor)."""
    return bool(tf.as_dtype(x.dtype).is_floating)


def floats(xs: Sequence[Any]) -> list[Any]:
    """The elements of ``xs`` that gradients flow through."""
    return [x for x in xs if is_float(x)]

"""Gradient helpers shared by the profiler and the pipeline stages."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf


def gradients(
    tape: tf.GradientTape,
    targets: Any,
    sources: Sequence[Any],
    output_gradients: Sequence[tf.Tensor] | None = None,
    *,
    sparse: int = 0,
) -> list[Any]:
    """``tape.gradient`` with zeros for sources the targets do not reach, dense but for the
    first ``sparse`` sources (a stage's variables): a lookup's ``tf.IndexedSlices`` stays
    as it is, one row per lookup, as one process's tape hands it to the optimizer (Keras'
    Adam squares each row, and its clipping takes their norm, where a dense sum would
    square the sum of a row looked up twice)."""
    grads = tape.gradient(
        targets,
        list(sources),
        output_gradients=None if output_gradients is None else list(output_gradients),
    )
    return [_kept(x, g, i < sparse) for i, (x, g) in enumerate(zip(sources, grads, strict=True))]


def _kept(source: Any, grad: Any, slices: bool) -> Any:
    if grad is None:
        return tf.zeros(tuple(source.shape), tf.as_dtype(source.dtype))
    return as_gradient(grad) if slices else tf.convert_to_tensor(grad)


def as_gradient(grad: Any) -> Any:
    """``grad`` as a tensor, a lookup's ``tf.IndexedSlices`` as it is (one process's
    optimizer reads its rows)."""
    return grad if isinstance(grad, tf.IndexedSlices) else tf.convert_to_tensor(grad)


def add(a: Sequence[Any], b: Sequence[Any]) -> list[Any]:
    """Elementwise sums of two gradient lists (accumulation over microbatches): two
    lookups' ``tf.IndexedSlices`` are joined, as a tape joins a batch's lookups of one
    table; a dense gradient and slices sum dense, as a tape sums them."""
    return [add_gradient(x, y) for x, y in zip(a, b, strict=True)]


def add_gradient(x: Any, y: Any) -> Any:
    """One gradient plus another, as ``add`` adds each pair."""
    if isinstance(x, tf.IndexedSlices) and isinstance(y, tf.IndexedSlices):
        return tf.IndexedSlices(
            tf.concat([x.values, y.values], 0),
            tf.concat([x.indices, tf.cast(y.indices, x.indices.dtype)], 0),
            x.dense_shape,
        )
    if isinstance(x, tf.IndexedSlices) or isinstance(y, tf.IndexedSlices):
        return tf.convert_to_tensor(x) + tf.convert_to_tensor(y)
    return x + y


def scale(gradient: Any, factor: Any) -> Any:
    """``gradient * factor``; ``tf.IndexedSlices`` stay slices (their values scaled)."""
    return elementwise(gradient, lambda v: v * tf.cast(factor, v.dtype))


def elementwise(gradient: Any, fn: Callable[[Any], Any]) -> Any:
    """``fn`` of a gradient's numbers: of a ``tf.IndexedSlices``' rows, which stay slices."""
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(fn(gradient.values), gradient.indices, gradient.dense_shape)
    return fn(gradient)


def values(gradient: Any) -> Any:
    """The numbers a gradient holds: a ``tf.IndexedSlices``' rows, as Keras' sparse ops
    read them (its global norm sums each row's squares, a row looked up twice twice)."""
    return gradient.values if isinstance(gradient, tf.IndexedSlices) else gradient


def is_float(x: Any) -> bool:
    """Whether gradients flow through ``x`` (a tensor or a KerasTensor)."""
    return bool(tf.as_dtype(x.dtype).is_floating)


def floats(xs: Sequence[Any]) -> list[Any]:
    """The elements of ``xs`` that gradients flow through."""
    return [x for x in xs if is_float(x)]

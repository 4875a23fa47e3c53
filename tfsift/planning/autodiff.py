"""Gradient helpers shared by the profiler and the pipeline stages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf


def gradients(
    tape: tf.GradientTape,
    targets: Any,
    sources: Sequence[Any],
    output_gradients: Sequence[tf.Tensor] | None = None,
) -> list[tf.Tensor]:
    """``tape.gradient`` with dense results and zeros for sources the targets do not reach."""
    grads = tape.gradient(
        targets,
        list(sources),
        output_gradients=None if output_gradients is None else list(output_gradients),
    )
    return [
        tf.zeros(tuple(x.shape), tf.as_dtype(x.dtype)) if g is None else tf.convert_to_tensor(g)
        for x, g in zip(sources, grads, strict=True)
    ]


def is_float(x: Any) -> bool:
    """Whether gradients flow through ``x`` (a tensor or a KerasTensor)."""
    return bool(tf.as_dtype(x.dtype).is_floating)


def floats(xs: Sequence[Any]) -> list[Any]:
    """The elements of ``xs`` that gradients flow through."""
    return [x for x in xs if is_float(x)]

"""Reads back the TensorBoard scalars a run wrote (``log_dir``), for tests."""

from __future__ import annotations

from pathlib import Path

import tensorflow as tf


def scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every (step, value) of every tag in the event files under ``log_dir``, in file
    order and then in the order they were written."""
    found: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(log_dir.glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                point = (event.step, float(tf.make_ndarray(value.tensor)))
                found.setdefault(value.tag, []).append(point)
    return found

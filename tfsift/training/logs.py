"""Logs for Keras callbacks: loss and metric results averaged over the replicas."""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from tfsift.parallel import collectives, runtime


def replica_mean(logs: dict[str, Any]) -> dict[str, float]:
    """Every value averaged over the data-parallel replicas: the same on every rank.

    Each rank of a pipeline already holds the last stage's values, so averaging over a
    stage's replicas gives every rank the same numbers. The values are gathered and
    averaged in NumPy in one order (rows sorted), so the result is bitwise equal
    everywhere, which a reduction over each stage's own process set would not promise.
    """
    values = {k: float(v) for k, v in logs.items()}
    rt = runtime.get()
    if not rt.horovod or rt.topology.replicas == 1 or not values:
        return values
    import horovod.tensorflow as hvd

    row = tf.constant([list(values.values())], tf.float64)
    with collectives.bounded(rt, "gather the logs"):
        rows = hvd.allgather(row, process_set=rt.dp_set).numpy()
    rows = rows[np.lexsort(rows.T[::-1])]
    mean = rows.sum(axis=0) / len(rows)
    return {k: float(v) for k, v in zip(values, mean, strict=True)}


def metric_results(metrics: Any) -> dict[str, Any]:
    """Keras' ``CompileMetrics`` results by name (``{}`` when there are none or unbuilt)."""
    if metrics is None or not metrics.built:
        return {}
    return dict(metrics.result())

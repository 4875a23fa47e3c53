"""Logs for Keras callbacks: the loss averaged over the replicas, the metrics computed from
their states summed over the replicas."""

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
    if not _replicated() or not values:
        return values
    rows = _sorted(_gathered(list(values.values())))
    mean = rows.sum(axis=0) / len(rows)
    return {k: float(v) for k, v in zip(values, mean, strict=True)}


def _replicated() -> bool:
    """Whether this rank's logs have replicas to be combined with."""
    rt = runtime.get()
    return bool(rt.horovod) and rt.topology.replicas > 1


def _gathered(row: Any) -> np.ndarray:
    """``row`` (numbers) of every replica, one row each, in replica order."""
    import horovod.tensorflow as hvd

    rt = runtime.get()
    with collectives.bounded(rt, "gather the logs"):
        rows = hvd.allgather(tf.constant([row], tf.float64), process_set=rt.dp_set)
    return np.asarray(rows.numpy())


def _sorted(rows: np.ndarray) -> np.ndarray:
    """``rows`` in one order whatever the replica: sums over them are bitwise equal."""
    return rows[np.lexsort(rows.T[::-1])]


def replica_logs(losses: dict[str, Any], metrics: Any) -> dict[str, Any]:
    """The losses (``"loss"``, and each output's) averaged over the data-parallel
    replicas, and ``metrics`` (Keras'
    ``CompileMetrics``, or None) computed from their variables combined over the replicas
    as Keras' distribution strategies combine them (by ``aggregation``: summed, averaged
    for "mean", replica 0's for "only_first_replica" and "none"): an AUC or
    a precision over every replica's samples, where the mean of each replica's would
    differ. The same on every rank (one gather, summed in one order).
    """
    if not _replicated():
        means = {k: float(v) for k, v in losses.items()}
        return {**means, **pythonified(metric_results(metrics))}
    variables = list(metrics.variables) if metrics is not None and metrics.built else []
    values = [np.asarray(v.numpy(), np.float64) for v in variables]
    own = [float(v) for v in losses.values()]
    by_replica = _gathered(np.concatenate([own, *(v.ravel() for v in values)]))
    rows = _sorted(by_replica)
    logs = {k: float(rows[:, i].sum() / len(rows)) for i, k in enumerate(losses)}
    if not variables:
        return logs
    combined, at = [], len(own)
    for var, value in zip(variables, values, strict=True):
        part = rows[:, at : at + value.size]
        at += value.size
        if var.aggregation == "mean":
            total = part.mean(axis=0)
        elif var.aggregation in ("only_first_replica", "none"):
            # replica 0's (gathered in replica order): every rank logs the same values
            total = by_replica[0, at - value.size : at]
        else:
            total = part.sum(axis=0)
        combined.append(tf.constant(total.reshape(value.shape), var.dtype))
    results = metrics.stateless_result(combined)
    return {**logs, **pythonified(results)}


def metric_results(metrics: Any) -> dict[str, Any]:
    """Keras' ``CompileMetrics`` results by name (``{}`` when there are none or unbuilt)."""
    if metrics is None or not metrics.built:
        return {}
    return dict(metrics.result())


def pythonified(results: dict[str, Any]) -> dict[str, Any]:
    """Metric results as Keras puts them in the logs: a number as a float, a result that
    is a dict merged in, anything else (``F1Score``'s one value per class) an array."""
    out: dict[str, Any] = {}
    for name, value in results.items():
        if isinstance(value, dict):
            out.update(pythonified(value))
        else:
            out[name] = float(value) if np.ndim(value) == 0 else np.asarray(value)
    return out

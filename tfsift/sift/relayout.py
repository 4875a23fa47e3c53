"""A dataset sifted by row: its sifting state carried into a job with another number of replicas.

A job relaunched on fewer hosts (``tfsift run --min-np``) restores a checkpoint saved by
R replicas into R'. The state of an InfoBatch-sifted ``from_arrays`` or ``from_rows``
dataset (``tfsift.sift.indexed``) is one plan for every replica, and what each replica
did since the epoch began::

    the same on every replica    the epoch's plan, the score table (merged over the
                                 replicas at the epoch's start), the epoch, the position
                                 in it, the batches read             -> old replica 0's
    each replica's own           the losses recorded since the epoch's start, the sample
                                 counts of its metrics               -> old replica r's
                                                                        go to new replica
                                                                        r mod R'

so the records of every old replica reach the table at the next epoch's merge, once.
The position is in steps: with ``global_batch_size`` a step takes the same samples on
any number of replicas (``tfsift.parallel.arrays``), so the resumed epoch trains the rows
the saved job had not trained, each once. Pure NumPy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tfsift.sift.metrics import SAMPLE_COUNTS

ROWS = "rows"  # the ``kind`` of a state saved by a dataset sifted by row (``indexed.ROWS``)


def carries(state: Any) -> bool:
    """Whether ``state`` (a replica's saved sifting state) can move to another layout."""
    return isinstance(state, dict) and state.get("kind") == ROWS


def carried(base: dict[str, Any], shares: list[dict[str, Any]]) -> dict[str, Any]:
    """The state a replica of the new layout loads: ``base`` (old replica 0's) with the
    records and sample counts of ``shares``, the old replicas it takes over (none when
    there are more replicas than before).

    Example:
        >>> def saved(keys, kept):
        ...     recorder = {"keys": np.array(keys, float), "losses": np.array(keys) / 10,
        ...                 "epochs": np.full(len(keys), 2.0), "yielded": None}
        ...     return {"kind": "rows", "position": 3, "recorder": recorder,
        ...             "metrics": {"samples_kept": kept, "epochs": 2}}
        >>> state = carried(saved([4, 9], 40), [saved([4, 9], 40), saved([1, 7], 38)])
        >>> state["recorder"]["keys"].tolist(), state["metrics"], state["position"]
        ([4.0, 9.0, 1.0, 7.0], {'samples_kept': 78, 'epochs': 2}, 3)
    """
    state = dict(base)
    records = [share["recorder"] for share in shares]
    state["recorder"] = {
        name: _joined([np.asarray(r[name], np.float64) for r in records])
        for name in ("keys", "losses", "epochs")
    }
    # keys awaiting a record belong to a batch of the saved job, never recorded now
    state["recorder"]["yielded"] = None
    metrics = dict(base["metrics"])
    for name in SAMPLE_COUNTS:
        if name in metrics:
            metrics[name] = type(metrics[name])(sum(share["metrics"][name] for share in shares))
    state["metrics"] = metrics
    return state


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.empty(0, np.float64)

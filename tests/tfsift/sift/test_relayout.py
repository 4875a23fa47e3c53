"""A dataset sifted by row: its state moved to another number of replicas, old replica r's
records and sample counts to new replica r mod R', the plan and position from replica 0."""

from __future__ import annotations

import doctest
import logging
from typing import Any

import numpy as np
import pytest

from tfsift.sift import relayout
from tfsift.sift.relayout import carried, carries


def saved(replica: int) -> dict[str, Any]:
    """Replica ``replica``'s state of 4 saved: the same plan, table and position, its own
    records (keys 10r, 10r + 1) and counts."""
    keys = np.array([10.0 * replica, 10.0 * replica + 1])
    return {
        "kind": "rows", "policy": {"pruned": np.array([3.0])}, "batches_read": 20,
        "position": 4, "rows": 256, "global_batch": 16, "cache": {"table": np.arange(3.0)},
        "recorder": {"keys": keys, "losses": keys / 100, "epochs": np.full(2, 2.0),
                     "yielded": keys if replica == 3 else None},
        "metrics": {"samples_seen": 128, "samples_kept": 40 + replica, "loss_sum_kept": 0.5,
                    "batches_yielded": 20, "epochs": 2, "policy": {"pruned": 60.0}},
    }  # fmt: skip


@pytest.mark.parametrize("R", [1, 2, 3, 5])
def test_every_old_replicas_records_and_counts_land_on_one_new_replica(R: int) -> None:
    old = [saved(r) for r in range(4)]
    states = [carried(old[0], [old[r] for r in range(4) if r % R == new]) for new in range(R)]
    keys = sorted(k for s in states for k in s["recorder"]["keys"].tolist())
    assert keys == sorted(k for s in old for k in s["recorder"]["keys"].tolist())  # each once
    assert sum(s["metrics"]["samples_kept"] for s in states) == 40 + 41 + 42 + 43
    assert sum(s["metrics"]["samples_seen"] for s in states) == 4 * 128
    assert sum(s["metrics"]["loss_sum_kept"] for s in states) == pytest.approx(2.0)
    for state in states:
        # one plan, one table, one place in the epoch: replica 0's
        assert state["position"] == 4 and state["batches_read"] == 20
        assert state["policy"] is old[0]["policy"] and state["cache"] is old[0]["cache"]
        assert state["metrics"]["epochs"] == 2 and state["metrics"]["batches_yielded"] == 20
        assert state["recorder"]["yielded"] is None
        assert len(state["recorder"]["keys"]) == len(state["recorder"]["losses"])
    if R == 5:  # more replicas than before: the fifth has nothing of its own yet
        assert (
            states[4]["recorder"]["keys"].tolist() == []
            and states[4]["metrics"]["samples_kept"] == 0
        )


def test_only_a_state_sifted_by_row_carries() -> None:
    assert carries(saved(0))
    assert not carries(None) and not carries({"policy": {}, "rounds": 3})


def test_docstring_examples_run() -> None:
    assert doctest.testmod(relayout).failed == 0


def test_a_position_saved_under_another_global_batch_is_said_to_misplace_the_epoch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import tfsift

    tfsift.init({})
    x, y = np.zeros((64, 2), np.float32), np.zeros(64)
    config = tfsift.SiftConfig(policy="infobatch", scores="training", stale=2, epochs=2,
                               rescale="unbiased")  # fmt: skip
    train = tfsift.from_arrays((x, y), global_batch_size=8).apply(tfsift.sift(config=config))
    state = train.sifter.state()
    assert state["global_batch"] == 8
    with caplog.at_level(logging.WARNING, logger="tfsift"):
        train.sifter.load_state({**state, "position": 2})  # the same global batch: silent
        assert caplog.records == []
        train.sifter.load_state({**state, "position": 2, "global_batch": 16})
    [record] = caplog.records
    assert record.getMessage() == (
        "the sifting state was saved 2 batches into its epoch by a job whose replicas "
        "took 16 samples a step together, and this one's take 8: the rest of the epoch may "
        "train some samples twice and leave others out. Give from_arrays or from_rows "
        "global_batch_size, the same in every job"
    )

"""Restores one checkpoint under other layouts: K=4 stages (1 replica), then K=2 spread.

usage: checkpoint_relayout.py DIR
Reports, per layout, the step restored, this rank's restored weights and optimizer
variables by key and the model's summary, then trains one step (the restored optimizer runs).
"""

from __future__ import annotations

import sys
from typing import Any

from checkpoint_models import batch, start, train_step

import tfsift
from mpi import report
from tfsift.checkpoint import optimizer as optimizer_lib
from tfsift.checkpoint import weights


def restored(directory: str, K: int, placement: str) -> dict[str, Any]:
    model, optimizer, forward_backward = start(K, placement)
    first = tfsift.CheckpointManager(model, optimizer, directory).restore()
    part = model.partitioned
    assert part is not None
    found = {
        "first": first,
        "stage": tfsift.mp_rank(),
        "replica": tfsift.dp_rank(),
        "weights": _lists(weights.values(weights.keyed(model, part))),
        "optimizer": _lists(optimizer_lib.arrays(optimizer, weights.trainable(model, part))),
    }
    lines: list[str] = []
    model.summary(print_fn=lines.append)
    found["summary"], found["params"] = lines, model.count_params()
    found["loss"] = train_step(model, optimizer, forward_backward, *batch(first or 0))
    return found


def _lists(arrays: dict[str, Any]) -> dict[str, Any]:
    return {k: v.tolist() for k, v in arrays.items()}


def main() -> None:
    directory = sys.argv[1]
    four = restored(directory, 4, "cluster")
    two = restored(directory, 2, "spread")
    report(rank=tfsift.rank(), four=four, two=two)


if __name__ == "__main__":
    main()

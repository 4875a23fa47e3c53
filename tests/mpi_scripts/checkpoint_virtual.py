"""A checkpoint saved on 2 stages x 2 virtual stages restores at 1, and the reverse.

usage: checkpoint_virtual.py DIR
A: 3 steps on 2 x 2 chunks, saving after step 1; B: a fresh 2 x 2 run resumes from it;
C: one chunk a stage restores it, runs step 2 and saves; D: 2 x 2 chunks restore C's
checkpoint. Reports, per run, the state (``state``) right after its restore, its save
and its last step, the chunks it held and the losses.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

from checkpoint_models import batch, start, train_step

import tfsift
from mpi import report
from tfsift.checkpoint import optimizer as optimizer_lib
from tfsift.checkpoint import weights
from tfsift.parallel import runtime


def run(directory: Path, v: int, steps: int, save_after: int | None = None) -> dict[str, Any]:
    """Restores from ``directory`` if it holds a checkpoint, trains to ``steps`` and saves
    after step ``save_after``."""
    model, optimizer, forward_backward = start(2, virtual_stages=v)
    ckpt = tfsift.CheckpointManager(model, optimizer, directory)
    first = ckpt.restore()
    found: dict[str, Any] = {"first": first, "losses": []}
    if first is not None:
        found["restored"] = state(model, optimizer)
    for step in range(first or 0, steps):
        found["losses"].append(train_step(model, optimizer, forward_backward, *batch(step)))
        if step == save_after:
            ckpt.save(step)
            found["saved"] = state(model, optimizer)
    found["end"] = state(model, optimizer)
    found["chunks"] = [stage.index for stage in model.partitioned.stage.stages]
    return found


def state(model: Any, optimizer: Any) -> dict[str, Any]:
    """The whole model's weights (``model.get_weights``, every rank's) and this rank's
    optimizer variables by key."""
    trainable = weights.trainable(model, model.partitioned)
    arrays = optimizer_lib.arrays(optimizer, trainable) if optimizer.built else {}
    return {
        "weights": [w.tolist() for w in model.get_weights()],
        "optimizer": {key: value.tolist() for key, value in arrays.items()},
    }


def main() -> None:
    root = Path(sys.argv[1])
    a = run(root / "a", 2, 3, save_after=1)
    b = run(root / "a", 2, 3)  # the same layout: resumes exactly
    if tfsift.rank() == 0:  # C resumes from A's checkpoint and saves beside it
        shutil.copytree(root / "a" / "ckpt-1", root / "c" / "ckpt-1")
    runtime.get().world.Barrier()
    c = run(root / "c", 1, 3, save_after=2)
    d = run(root / "c", 2, 3)
    report(rank=tfsift.rank(), a=a, b=b, c=c, d=d)


if __name__ == "__main__":
    main()

"""Trains CheckpointNet with a CheckpointManager, resuming from the newest checkpoint in DIR.

usage: checkpoint_train.py DIR K STEPS EVERY [--sift] [--export] [--progress PATH]
                           [--timeout SECONDS] [--pace SECONDS] [--kill-at STEP]
  saves after every EVERY-th step and after the last one; --sift trains on a sifted shard;
  --export writes DIR/model.keras with tfsift.save_model and reports its inputs' predictions;
  --progress writes PATH/rank<r> ("<pid> <step>") after every step, for scripts/chaos.sh;
  --timeout sets tfsift.init's stall timeout; --pace sleeps that long after every step;
  --kill-at: the last rank kills itself (SIGKILL) after step STEP, in a job's first attempt
  only (TFSIFT_RESTART_COUNT unset or 0: tfsift run --restarts sets it).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from checkpoint_models import batch, forever, samples, sifted, start, train_step

import tfsift
from mpi import REPORTS, report


def main() -> None:
    directory, K, steps, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    flags = sys.argv[5:]
    progress = Path(flags[flags.index("--progress") + 1]) if "--progress" in flags else None
    timeout = float(flags[flags.index("--timeout") + 1]) if "--timeout" in flags else None
    pace = float(flags[flags.index("--pace") + 1]) if "--pace" in flags else 0.0
    kill_at = int(flags[flags.index("--kill-at") + 1]) if "--kill-at" in flags else None
    if os.environ.get("TFSIFT_RESTART_COUNT", "0") != "0":
        kill_at = None  # a restarted attempt runs to its end
    model, optimizer, forward_backward = start(K, timeout=timeout)
    train = sifted(model) if "--sift" in flags else None
    ckpt = tfsift.CheckpointManager(model, optimizer, directory, max_to_keep=2, sift=train)
    first = ckpt.restore() or 0
    stream = forever(train) if train is not None else (batch(s) for s in range(first, steps))
    losses = []
    for step, (x, y) in zip(range(first, steps), stream, strict=False):
        losses.append(train_step(model, optimizer, forward_backward, x, y))
        if (step + 1) % every == 0 or step == steps - 1:
            ckpt.save(step)
        if progress is not None:  # renamed into place: chaos.sh never reads half a line
            partial = progress / f".rank{tfsift.rank()}"
            partial.write_text(f"{os.getpid()} {step}\n")
            os.replace(partial, progress / f"rank{tfsift.rank()}")
        if step == kill_at and tfsift.rank() == tfsift.size() - 1:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(pace)
    values: dict[str, Any] = {"rank": tfsift.rank(), "replica": tfsift.dp_rank()}
    values.update(first=first, losses=losses)
    if "--export" in flags:
        values["predictions"] = export(model, Path(directory) / "model.keras")
    if os.environ.get(REPORTS):
        report(**values)


def export(model: Any, path: Path) -> list[list[float]]:
    """Writes the .keras file; the partitioned model's predictions on its first 16 samples."""
    tfsift.save_model(model, path)

    @tfsift.step
    def predict(x: Any) -> Any:
        return model(x, training=False)

    x = samples()[0][:16]
    return np.asarray(predict(x).concat()).tolist()  # type: ignore[no-any-return]


if __name__ == "__main__":
    main()

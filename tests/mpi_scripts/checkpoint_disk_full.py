"""One process: a save that hits a file-size limit (a real EFBIG from write) must fail loudly.

usage: checkpoint_disk_full.py DIR
Saves ckpt-0, then saves ckpt-1 under RLIMIT_FSIZE; prints one JSON line: the error, what is
left in DIR, and whether a fresh run restores ckpt-0's weights.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
from pathlib import Path

import numpy as np
from checkpoint_models import batch, start, train_step

import tfsift


def main() -> None:
    directory = Path(sys.argv[1])
    model, optimizer, forward_backward = start(1)
    ckpt = tfsift.CheckpointManager(model, optimizer, directory)
    train_step(model, optimizer, forward_backward, *batch(0))
    ckpt.save(0)
    saved = [v.numpy() for v in model.variables]
    train_step(model, optimizer, forward_backward, *batch(1))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (512, hard))
    try:
        ckpt.save(1)
        error = ""
    except OSError as err:
        error = str(err)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    again, optimizer, _ = start(1)
    restored = tfsift.CheckpointManager(again, optimizer, directory).restore()
    equal = all(np.array_equal(a, v.numpy()) for a, v in zip(saved, again.variables, strict=True))
    left = sorted(os.listdir(directory))
    print(json.dumps({"error": error, "left": left, "restored": restored, "equal": equal}))


if __name__ == "__main__":
    main()

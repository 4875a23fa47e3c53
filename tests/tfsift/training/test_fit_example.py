"""examples/fit_pipeline.py runs, shortened, in one process (partitions=1): it cannot rot."""

from __future__ import annotations

import re
import subprocess
import sys

import mpi


def test_the_fit_example_trains_and_reports_test_accuracy() -> None:
    script = mpi.ROOT / "examples" / "fit_pipeline.py"
    argv = [
        sys.executable,
        str(script),
        "--partitions",
        "1",
        "--epochs",
        "2",
        "--microbatches",
        "2",
    ]
    proc = subprocess.run(
        argv, env=mpi.environment(), capture_output=True, text=True, timeout=120, cwd=mpi.ROOT
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Epoch 2/2" in proc.stdout  # Keras' own progress bar
    accuracy = re.search(r"test accuracy: ([\d.]+)", proc.stdout)
    assert accuracy is not None, proc.stdout[-2000:]
    assert float(accuracy.group(1)) > 0.5  # chance is 0.1

"""scripts/chaos.sh, shortened: a rank killed mid-run, the job restarted, the same weights."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

import mpi

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.alone]


@pytest.mark.timeout(400)
def test_a_run_killed_at_a_random_step_and_restarted_ends_like_an_uninterrupted_one(
    tmp_path: Path,
) -> None:
    args = ["--np", "2", "--partitions", "2", "--steps", "8", "--every", "2", "--kills", "1"]
    proc = subprocess.run(
        [
            "bash",
            str(mpi.ROOT / "scripts" / "chaos.sh"),
            *args,
            "--seed",
            "7",
            "--workdir",
            str(tmp_path),
        ],
        env=mpi.environment(),
        capture_output=True,
        text=True,
        timeout=380,
    )
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (ended,) = re.findall(r"the job ended ([\d.]+) s later, status (\d+)", proc.stdout)
    assert float(ended[0]) < 60 and int(ended[1]) != 0  # kill -9 ends the job, quickly
    assert "chaos: OK, final weights, optimizer and rank states equal" in proc.stdout

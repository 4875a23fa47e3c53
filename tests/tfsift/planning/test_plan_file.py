"""A plan file written by the first run is reused, unchanged, by the next."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import mpi
from partitioner.plan import Plan

pytestmark = pytest.mark.mpi


def test_second_run_reuses_the_plan_file_of_the_first(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    run = mpi.run(2, "plan_file_check.py", str(path), timeout=180)
    first = mpi.reports(run)
    # rank 0 profiled, charging the message latency its pipeline's stages 0 and 1 timed
    assert re.search(
        r"to cut them into 2 stages; a message between stages takes [0-9.]+ ms;", run.stderr
    )
    written = path.read_text()
    plan = Plan.load(path)
    second = mpi.reports(mpi.run(2, "plan_file_check.py", str(path), timeout=180))
    assert path.read_text() == written
    for rank in (0, 1):
        assert first[rank]["bounds"] == second[rank]["bounds"] == list(plan.bounds)
        assert first[rank]["loss"] == second[rank]["loss"]

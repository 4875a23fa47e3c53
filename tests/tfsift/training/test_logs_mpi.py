"""The logs of 2 data-parallel replicas, under real mpirun (tests/mpi_scripts/logs_check.py):
metrics computed from their states combined over the replicas, as one process computes
them over all the samples (an AUC and a precision are not the mean of the replicas')."""

from __future__ import annotations

import pytest

import mpi

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

JOB = mpi.TWO_REPLICAS.scenario("logs_check.py", timeout=120)


@mpi.TWO_REPLICAS.mark
def test_evaluate_on_two_replicas_gives_one_process_metrics() -> None:
    reports = JOB()
    assert sorted(reports) == [0, 1]
    for rep in reports.values():
        assert rep["got"] == pytest.approx(rep["want"], rel=1e-6), rep
    assert reports[0]["got"] == reports[1]["got"]  # bitwise, every rank

"""A loss that ignores a class, under real mpirun (tests/mpi_scripts/ignore_class_check.py):
Keras divides it by the targets it does not ignore, over the whole batch; tfsift's fit
and evaluate weigh each microbatch by its share of them, so that the average over the
microbatches and replicas is the batch's loss and trains as one process. Each
microbatch's own mean, averaged, was 1.62824 against Keras' 1.61187 after one epoch of a
small model, and its weights 0.05 apart, without a word."""

from __future__ import annotations

import pytest

import mpi

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

JOBS = {
    "2 stages": (mpi.TWO_STAGES, mpi.TWO_STAGES.scenario("ignore_class_check.py", "2")),
    "2 replicas": (mpi.TWO_REPLICAS, mpi.TWO_REPLICAS.scenario("ignore_class_check.py", "1")),
    "2 x 2": (mpi.CLUSTER_2X2, mpi.CLUSTER_2X2.scenario("ignore_class_check.py", "2")),
}


@pytest.mark.parametrize(
    "layout", [pytest.param(name, marks=job.mark) for name, (job, _) in JOBS.items()]
)
def test_a_loss_that_ignores_a_class_trains_and_evaluates_as_one_process(layout: str) -> None:
    reports = JOBS[layout][1]()
    for rep in reports.values():
        assert rep["weights"] < 1e-5, rep
        for key in ("evaluate", "loss"):
            got, want = rep[key]
            assert got == pytest.approx(want, rel=1e-5), (key, rep)

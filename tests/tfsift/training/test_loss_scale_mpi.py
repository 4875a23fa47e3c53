"""``fit`` under ``mixed_float16`` and a dynamic loss scale on microbatches and replicas,
under real mpirun (tests/mpi_scripts/loss_scale_check.py): the scale skips and halves
where one process's does, batch by batch.

A microbatch's loss is the mean over its samples, so the float16 gradients inside a
stage were the parts' count times one process's: they overflowed where one process's do
not, and the scale went its own way (halved at batch 10 on 2 replicas, at batch 13 on 2
stages at M=2; the weights 0.23 and 0.30 apart after 2 epochs), without a word. Each
part's loss is now its share of the batch's, and the averaged gradients of float16
weights are rounded to float16 as one process's sum over the batch is (which overflows
there when the parts' sums do not)."""

from __future__ import annotations

import pytest

import mpi

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

JOBS = {
    "2 stages": (mpi.TWO_STAGES, mpi.TWO_STAGES.scenario("loss_scale_check.py", "2")),
    "2 replicas": (mpi.TWO_REPLICAS, mpi.TWO_REPLICAS.scenario("loss_scale_check.py", "1")),
}
# float16's rounding, which Adam's normalized steps carry (measured 0.004 on 2 stages)
FLOAT16 = 2e-2


@pytest.mark.parametrize(
    "layout", [pytest.param(name, marks=job.mark) for name, (job, _) in JOBS.items()]
)
def test_the_loss_scale_skips_and_halves_as_in_one_process(layout: str) -> None:
    reports = JOBS[layout][1]()
    for rep in reports.values():
        got, want = rep["scales"]
        assert len(got) == 32 // (2 if layout == "2 replicas" else 1) and got == want
        assert len({scale for _, scale in want}) > 3  # it grew and halved, more than once
        assert rep["weights"] < FLOAT16, rep

"""A stage without trainable variables takes its part in the sums the other stages' update
makes over the pipeline, under real mpirun (tests/mpi_scripts/bystander_check.py): ``fit``
and the README's loop with ``global_clipnorm``, a ``LossScaleOptimizer`` and
``gradient_accumulation_steps`` train as one process does, where they used to wait for
that stage until the job's timeout."""

from __future__ import annotations

import pytest

import mpi

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

WEIGHTLESS_LAST_STAGE = mpi.TWO_STAGES.scenario("bystander_check.py", timeout=120)


@mpi.TWO_STAGES.mark
def test_a_stage_without_variables_joins_the_global_norm_and_finite_check() -> None:
    reports = WEIGHTLESS_LAST_STAGE()
    assert sorted((r["stage"], r["variables"]) for r in reports.values()) == [(0, 4), (1, 0)]
    for rep in reports.values():
        for key in ("fit_clipnorm", "fit_loss_scale", "fit_accumulated", "loop_loss_scale"):
            assert rep[key] < 1e-6, (key, rep)  # the whole model's weights, one process's

"""Models with a dict or list input and several outputs, pipelined like Keras calls them."""

from __future__ import annotations

import pytest
from mpi_scripts.multi_io_check import check

import mpi


@pytest.mark.parametrize("name", ["dict", "pair"])
def test_nested_inputs_and_two_outputs_in_one_process(name: str) -> None:
    result = check(name, 1, 2)
    assert result["grad_error"] < 1e-5
    assert result["loss"] == pytest.approx(result["ref_loss"], rel=1e-5)


ON_TWO_STAGES = mpi.TWO_STAGES.scenario("multi_io_check.py", "2", "2", timeout=240)


@pytest.mark.mpi
@pytest.mark.slow
@mpi.TWO_STAGES.mark
def test_nested_inputs_and_two_outputs_on_two_stages() -> None:
    reports = ON_TWO_STAGES()
    assert len(reports) == 2
    for rank, rep in reports.items():
        for name, result in rep["results"].items():
            assert result["grad_error"] < 1e-5, (rank, name, result)
            assert result["loss"] == pytest.approx(result["ref_loss"], rel=1e-5)
    assert sum(rep["results"]["dict"]["num_grads"] for rep in reports.values()) == 10

"""Set-up errors reach every rank before any training, and the job exits."""

from __future__ import annotations

import pytest

import mpi

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize(
    ("case", "message"),
    [
        (
            "too_many_partitions",
            "too few layers to split into partitions (layers: 1, partitions: 2)",
        ),
        (
            "memory_cap",
            "no partition into 2 stages fits the memory cap; the smallest cap that fits is ",
        ),
    ],
)
def test_bad_setup_fails_on_every_rank_before_training(case: str, message: str) -> None:
    proc = mpi.run(2, "errors_check.py", case, timeout=180)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "TRAINED" not in output
    assert message in output, output[-3000:]
    if case == "memory_cap":
        assert "Received: memory_cap=1024 (1.00 KiB)" in output

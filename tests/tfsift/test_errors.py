"""Set-up errors reach every rank before any training, and the job exits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
        (
            "other_features",
            "ValueError: the model's inputs keep the shapes of its first call, but for the "
            "batch size: expected (None, 6). Received: (4, 5)",
        ),
        (
            "synchronized_bn",
            "BatchNormalization(synchronized=True) normalizes by the statistics of every "
            "replica's batch, which tfsift's data-parallel replicas do not share (each "
            "normalizes by its own microbatches, as with synchronized=False). Pass "
            "synchronized=False, or train on one replica. Received: layer 'norm' with "
            "synchronized=True on 2 replicas",
        ),
    ],
)
def test_bad_setup_fails_on_every_rank_before_training(case: str, message: str) -> None:
    # other_features: at its step, not before training
    proc = mpi.run(2, "errors_check.py", case, timeout=180)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "TRAINED" not in output
    assert message in output, output[-3000:]
    if case == "memory_cap":
        assert "Received: memory_cap=1024 (1.00 KiB)" in output


def test_a_launch_of_the_wrong_size_says_so_once_with_the_launch_to_make(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import tfsift\ntfsift.init({'partitions': 2})\nprint('TRAINED')\n")
    # as launched from a shell (see tests/tfsift/cli/test_run.py): no MPI singleton's PMIx
    env = {k: v for k, v in mpi.environment().items() if not k.startswith(("PMIX_", "OMPI_"))}
    done = subprocess.run(
        [sys.executable, "-m", "tfsift.cli", "run", "-np", "3", "python", str(script)],
        cwd=mpi.ROOT, env=env, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode != 0 and "TRAINED" not in output
    message = (
        "tfsift.init: world size 3 is not divisible by partitions=2; launch a multiple of 2 "
        "processes, e.g. mpirun -np 2 python train.py, horovodrun -np 2 -H localhost:2 python "
        "train.py or tfsift run -np 2 train.py"
    )
    assert output.count(message) == 1, output  # rank 0's; the others raised the same
    assert "Traceback" not in output

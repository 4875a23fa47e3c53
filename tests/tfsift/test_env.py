"""tfsift.env: the environment variables tfsift reads, and the one it sets at import."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

YIELD = "OMPI_MCA_mpi_yield_when_idle"
SHOW = f"import os, tfsift, mpi4py.MPI; print(os.environ.get({YIELD!r}))"


@pytest.mark.parametrize(("given", "seen"), [(None, "1"), ("0", "0")])
def test_import_makes_mpi_yield_unless_the_user_chose(given: str | None, seen: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != YIELD}
    if given is not None:
        env[YIELD] = given
    done = subprocess.run(
        [sys.executable, "-c", SHOW], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == seen


@pytest.mark.parametrize(
    ("program", "polled"),
    [
        ("import mpi4py.MPI, tfsift", True),  # MPI started first, the variable unset
        ("import tfsift, mpi4py.MPI", False),  # tfsift first: MPI read the 1 it set
        ("import mpi4py; mpi4py.rc.initialize = False; import mpi4py.MPI, tfsift", False),
    ],
)
def test_import_notes_whether_mpi_started_before_it_without_the_yield(
    program: str, polled: bool
) -> None:
    env = {k: v for k, v in os.environ.items() if k != YIELD}
    show = f"{program}; from tfsift import env; print(env.polled_from_start())"
    done = subprocess.run(
        [sys.executable, "-c", show], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == str(polled)
    given = subprocess.run(  # the user's own choice, whatever the order
        [sys.executable, "-c", show], env={**env, YIELD: "0"}, capture_output=True, text=True
    )
    assert given.stdout.strip() == "False"


def test_tfsift_run_gives_its_ranks_the_yield_whatever_they_import_first() -> None:
    env = {k: v for k, v in os.environ.items() if k != YIELD}  # as a user's shell
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    show = f"import os, mpi4py.MPI; print(os.environ.get({YIELD!r}))"  # no tfsift import
    tfsift = Path(sys.executable).parent / "tfsift"
    done = subprocess.run(
        [str(tfsift), "run", "-np", "1", "python", "-c", show],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "1"  # tfsift run's own import of tfsift set it for mpirun

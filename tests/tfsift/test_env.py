"""tfsift.env: the environment variables tfsift reads, and the one it sets at import."""

from __future__ import annotations

import os
import subprocess
import sys

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

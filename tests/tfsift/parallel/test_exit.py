"""Ranks leaving the script: early (sys.exit, an exception, SIGKILL) the job ends, naming the
rank; together, it ends normally and at once. The printed times are in docs/failures.md."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

import mpi

pytestmark = [pytest.mark.mpi, pytest.mark.fault]


def _leave(
    how: str, layout: str, grace: str | None = None, launcher: str = "mpirun", *args: str
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Runs exit_check.py on 2 ranks; returns the job and seconds from rank 1 leaving to its end."""
    env = {"TFSIFT_EXIT_GRACE": grace} if grace else None
    proc = mpi.run(2, "exit_check.py", how, layout, *args, timeout=120, env=env, launcher=launcher)
    ended = time.time()
    left = json.loads((Path(proc.reports_dir) / "rank1.json").read_text())["left"]
    return proc, ended - left


EXITED = (
    "tfsift: rank 1 exited (sys.exit() or the end of the script) while other ranks were "
    "still running"
)


@pytest.mark.parametrize(("how", "grace"), [("exit0", None), ("exit1", "3")])
def test_a_rank_calling_sys_exit_while_others_train_ends_the_job_naming_it(
    how: str, grace: str | None
) -> None:
    proc, took = _leave(how, "pipeline", grace)
    print(
        f"sys.exit({how[-1]}) on rank 1 of a pipeline, grace {grace or 10} s: ended in {took:.1f} s"
    )
    assert proc.returncode != 0
    assert f"{EXITED}: they had not all exited {grace or 10} s later" in proc.stderr
    assert float(grace or 10) <= took < float(grace or 10) + 15, took


def test_a_rank_leaving_as_the_others_start_fit_ends_the_job_naming_it() -> None:
    # the exit check's barrier shared a communicator with fit's first agreement, matched
    # it as a collective and failed: rank 0 waited in fit forever, and rank 1's exit
    # check ended with MPI_ERR_IN_STATUS and no abort
    proc, took = _leave("exit0", "fit", "3")
    print(f"sys.exit(0) on rank 1 as rank 0 starts fit, grace 3 s: ended in {took:.1f} s")
    assert proc.returncode != 0
    assert f"{EXITED}: they had not all exited 3 s later" in proc.stderr
    assert "MPI_ERR" not in proc.stderr
    assert 3 <= took < 3 + 15, took


def test_a_replica_calling_sys_exit_ends_the_job_under_horovodrun() -> None:
    proc, took = _leave("exit0", "dp", "3", "horovodrun")
    print(f"sys.exit(0) on replica 1 under horovodrun, grace 3 s: ended in {took:.1f} s")
    assert proc.returncode != 0
    assert EXITED in proc.stdout + proc.stderr  # horovodrun prefixes and merges the streams
    assert 3 <= took < 3 + 15, took


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("raise", "tfsift: rank 1 failed, aborting the job"),
        ("kill", "exited on signal 9 (Killed)"),
    ],
)
def test_a_rank_raising_or_killed_ends_the_job_within_seconds(how: str, message: str) -> None:
    proc, took = _leave(how, "pipeline")
    print(f"{how} on rank 1 of a pipeline: ended in {took:.1f} s")
    assert proc.returncode != 0
    assert message in proc.stdout + proc.stderr
    assert took < 15, took


@pytest.mark.parametrize("code", [0, 1])
def test_ranks_calling_sys_exit_together_end_normally_and_at_once(code: int) -> None:
    proc, took = _leave(f"exit{code}", "pipeline", None, "mpirun", "all")
    print(f"sys.exit({code}) on every rank: ended in {took:.1f} s")
    assert (proc.returncode != 0) == (code != 0), proc.stderr[-3000:]
    assert "aborting the job" not in proc.stderr
    assert took < 10, took  # less than the grace: nobody waited for it (~1 s on a quiet box)

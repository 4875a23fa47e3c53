"""scripts/bench/harness.py's pure parts: a job's command and its environment."""

from __future__ import annotations

import os
import sys

import scripts_module

scripts_module.load("bench_pipeline")  # puts scripts/ on the path, as when a benchmark runs
from bench import harness  # noqa: E402


def test_a_job_runs_the_worker_on_ranks_bound_as_asked() -> None:
    python = sys.executable
    cmd = harness.launch_command(2, ["w.py", "dp"], "none", python)
    assert cmd[:5] == ["mpirun", "-np", "2", "--bind-to", "none"]
    assert cmd[-3:] == [python, "w.py", "dp"]


def test_a_job_gets_one_compute_thread_and_scripts_on_its_path() -> None:
    env = harness.environment({"TF_NUM_INTRAOP_THREADS": "2"})
    assert env["OMP_NUM_THREADS"] == env["TF_NUM_INTEROP_THREADS"] == "1"
    assert env["TF_NUM_INTRAOP_THREADS"] == "2"  # the caller's extra wins
    assert env["PYTHONPATH"].split(os.pathsep) == [str(harness.ROOT), str(harness.ROOT / "scripts")]

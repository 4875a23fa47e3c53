"""scripts/bench_launch.py's pure parts: the three launchers' commands, the environment
without the variable, the configurations and the table against the reference job."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest
import scripts_module

META = {
    "date": "2026-12-01",
    "cores": 2,
    "commit": "abc1234",
    "load_start": 0.1,
    "load_end": 0.2,
    "seconds": 60.0,
}


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return scripts_module.load("bench_launch")


def test_each_launcher_runs_the_worker_on_ranks_bound_to_cores(bench: ModuleType) -> None:
    from bench import harness

    python = sys.executable
    bin_dir = Path(python).parent
    mpirun = harness.launch_command(2, ["w.py", "dp"], "core", python, "mpirun")
    assert mpirun[:5] == ["mpirun", "-np", "2", "--bind-to", "core"]
    assert mpirun[-3:] == [python, "w.py", "dp"]
    assert harness.launch_command(2, ["w.py", "dp"], "core", python, "horovodrun") == [
        str(bin_dir / "horovodrun"), "-np", "2", "-H", "localhost:2",
        "--binding-args=--bind-to core --map-by core", python, "w.py", "dp",
    ]  # fmt: skip
    assert harness.launch_command(2, ["w.py", "dp"], "core", python, "tfsift run") == [
        str(bin_dir / "tfsift"), "run", "-np", "2", "--bind-to", "core", python, "w.py", "dp",
    ]  # fmt: skip
    with pytest.raises(ValueError, match=r"Received: 'srun'"):
        harness.launch_command(2, ["w.py"], "core", python, "srun")


def test_the_jobs_start_without_the_variable_import_tfsift_set_here(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench import harness

    monkeypatch.setenv(bench.YIELD, "1")  # as this process's import of tfsift set it
    assert harness.environment()[bench.YIELD] == "1"
    assert bench.YIELD not in harness.environment(unset=(bench.YIELD,))


def test_six_configurations_three_launchers_by_two_orders(bench: ModuleType) -> None:
    chosen = bench.configurations()
    assert next(iter(chosen)) == bench.REFERENCE == "mpirun | tfsift first"
    assert len(chosen) == 6
    assert chosen["horovodrun | mpi4py first"] == ("horovodrun", ["--mpi4py-first"])
    assert chosen["tfsift run | tfsift first"] == ("tfsift run", [])


def test_the_table_divides_each_job_by_the_reference_job_of_its_round(bench: ModuleType) -> None:
    medians = {
        "mpirun | tfsift first": [1.0, 2.0, 1.0],  # round 2 ran on a slower machine
        "mpirun | mpi4py first": [1.5, 3.0, 1.6],
        "tfsift run | mpi4py first": [1.0, 2.1, 0.98],
    }
    text = bench.render({"medians": medians}, META, bench.Settings())
    assert "3 jobs per configuration" in text
    assert "| launcher | import order | step ms | / mpirun, tfsift first | jobs |" in text
    polled = "| mpirun | mpi4py first | 1600.0 | 1.500 (1.500, 1.500, 1.600) | 1500, 3000, 1600 |"
    assert polled in text
    assert "| tfsift run | mpi4py first | 1000.0 | 1.000 (1.000, 1.050, 0.980) |" in text

"""Test markers and the helper that launches real multi-process jobs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

# pytest's own processes import Keras too: the jobs' lean start-up (see its sitecustomize.py)
_LEAN = Path(__file__).resolve().parent / "lean_site" / "sitecustomize.py"
_spec = importlib.util.spec_from_file_location("tfsift_tests_lean_site", _LEAN)
assert _spec is not None and _spec.loader is not None
_spec.loader.exec_module(importlib.util.module_from_spec(_spec))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "mpi: launches real mpirun/horovodrun jobs (multi-process)")
    config.addinivalue_line("markers", "slow: takes more than ~20 seconds")
    config.addinivalue_line(
        "markers",
        "alone: a test that asserts how long its job (or a wait) takes, or whose outcome "
        "depends on how long ranks wait: scripts/test.sh runs it with no other job beside it",
    )
    config.addinivalue_line(
        "markers",
        "hosts: runs its job on simulated hosts (network namespaces, scripts/simhosts.sh); "
        "skipped, with the reason, where the machine cannot make them",
    )
    config.addinivalue_line(
        "markers",
        "fault: a multi-process test whose job ends on purpose (a rank exits, stalls or fails) "
        "and that times the end from that event, with seconds of slack: scripts/test.sh runs "
        "three of these at a time, and none beside the CPU-bound jobs but those on the "
        "simulated hosts (also marked hosts), which run with the others on those hosts",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The multi-process tests first, the slow ones first among them, otherwise in
    collection order: pytest-xdist hands tests out in this order, so the long jobs start
    early and the one-process tests fill the cores to the end of the stage, instead of a
    long job started last keeping one worker busy alone."""

    def rank(item: pytest.Item) -> int:
        mpi, slow = item.get_closest_marker("mpi"), item.get_closest_marker("slow")
        return 0 if mpi and slow else 1 if mpi else 2

    items.sort(key=rank)  # stable


@pytest.fixture(autouse=True)
def fresh_tfsift_state() -> object:
    """Every test starts without a runtime, open timelines or partition blocks."""
    from tfsift import logs, state

    state.reset()
    logs.reset()  # tfsift.init configures the tfsift logger (INFO on rank 0)
    yield
    state.reset()
    logs.reset()


@pytest.fixture(scope="session")
def two_hosts() -> object:
    """Two simulated hosts (``scripts/simhosts.sh up 2``), removed at the end of the session.

    Tests that use them are marked ``xdist_group("simhosts")``: one pytest worker makes
    and removes them, and no two jobs use them at once.
    """
    import subprocess

    import mpi

    check = subprocess.run(["bash", str(mpi.SIMHOSTS), "check"], capture_output=True, text=True)
    if check.returncode != 0:
        pytest.skip(f"no simulated hosts here: {(check.stdout + check.stderr).strip()}")
    subprocess.run(["bash", str(mpi.SIMHOSTS), "up", "2"], check=True, capture_output=True)
    yield 2
    subprocess.run(["bash", str(mpi.SIMHOSTS), "down"], check=True, capture_output=True)

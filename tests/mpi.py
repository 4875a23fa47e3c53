"""Launches a script under real mpirun (or horovodrun) and parses what each rank reports."""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tfsift.parallel.launch import mpirun_command

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent / "mpi_scripts"
LEAN_SITE = Path(__file__).resolve().parent / "lean_site"  # see its sitecustomize.py
REPORTS = "TFSIFT_TEST_REPORTS"
SIMHOSTS = ROOT / "scripts" / "simhosts.sh"  # simulated hosts: network namespaces


def environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The jobs' environment, ``LEAN_SITE`` first on the path."""
    path = [str(ROOT), str(ROOT / "tests"), str(SCRIPTS)]
    env = dict(os.environ)
    env.update(
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        TF_CPP_MIN_LOG_LEVEL="3",
        PYTHONPATH=os.pathsep.join([str(LEAN_SITE), *path]),
        OMP_NUM_THREADS="1",
        TF_NUM_INTEROP_THREADS="1",
        TF_NUM_INTRAOP_THREADS="1",
    )
    env.update(extra or {})
    return env


def run(
    np: int,
    script: str,
    *args: str,
    timeout: float = 300,
    env: dict[str, str] | None = None,
    launcher: str = "mpirun",
    hosts: int = 0,
) -> subprocess.CompletedProcess[str]:
    """Runs ``tests/mpi_scripts/<script>`` on ``np`` ranks; never hangs past ``timeout``.

    ``hosts``: spread the ranks evenly over that many simulated hosts (``simhosts.sh up``
    made them), ranks 0 .. np/hosts - 1 on the first, and so on.
    """
    argv = [str(SCRIPTS / script), *args]
    reports_dir = tempfile.mkdtemp(dir=_reports_root())
    env = {**(env or {}), REPORTS: reports_dir}
    if launcher == "horovodrun":
        cmd = [str(Path(sys.executable).parent / "horovodrun"), "-np", str(np)]
        cmd += ["-H", places(np, hosts) if hosts else f"localhost:{np}"]
        if hosts:  # the simulated hosts' interface: spares horovodrun finding a common one
            cmd += ["--network-interfaces", "tfsift0"]
        cmd += [sys.executable, *argv]
        if hosts:
            cmd = ["bash", str(SIMHOSTS), "exec", *cmd]
    else:
        cmd = mpirun_command(np, argv)
        if hosts:
            cmd = on_hosts(cmd, np, hosts)
    proc = subprocess.run(
        cmd,
        env=environment(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    proc.reports_dir = reports_dir  # type: ignore[attr-defined]
    return proc


@functools.cache
def _reports_root() -> str:
    """The folder that holds this process's jobs' report folders, removed when it exits
    (a suite run launches about 150 jobs: each left a folder in /tmp before)."""
    root = tempfile.mkdtemp(prefix="tfsift-reports-")
    atexit.register(shutil.rmtree, root, True)
    return root


def on_hosts(cmd: list[str], np: int, hosts: int) -> list[str]:
    """``cmd`` (an mpirun command) run on ``hosts`` simulated hosts, ``np / hosts`` ranks each."""
    return ["bash", str(SIMHOSTS), "exec", *cmd[:3], "--host", places(np, hosts), *cmd[3:]]


def places(np: int, hosts: int) -> str:
    """``np`` ranks spread evenly over ``hosts`` simulated hosts, as mpirun's ``--host`` and
    horovodrun's ``-H`` take them: ``10.251.0.1:2,10.251.0.2:2``."""
    return ",".join(f"{address(k)}:{np // hosts}" for k in range(1, hosts + 1))


def address(host: int) -> str:
    """The address of simulated host ``host`` (1-based)."""
    return f"10.251.0.{host}"


_SHARED: dict[tuple[Any, ...], Any] = {}


def shared_reports(np: int, script: str, *args: str, timeout: float = 300) -> Any:
    """``reports(run(np, script, *args))``, one job for every test that asks for the same.

    Several tests read one job's reports (a job costs every rank seconds of start-up): mark
    them ``@pytest.mark.xdist_group(NAME)`` so that one pytest worker runs them all. A failed
    job fails each of them with its output, without running again.
    """
    key = (np, script, *args)
    if key not in _SHARED:
        try:
            _SHARED[key] = reports(run(np, script, *args, timeout=timeout))
        except (AssertionError, subprocess.TimeoutExpired) as err:
            _SHARED[key] = err
    got = _SHARED[key]
    if isinstance(got, BaseException):
        raise AssertionError(f"the shared job {key} failed") from got
    return got


def reports(proc: subprocess.CompletedProcess[str]) -> dict[int, dict[str, Any]]:
    """The JSON each rank reported, by rank; fails with the job's output if it failed."""
    if proc.returncode != 0:
        raise AssertionError(
            f"job failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
        )
    found = {}
    for path in Path(proc.reports_dir).glob("rank*.json"):  # type: ignore[attr-defined]
        data = json.loads(path.read_text())
        found[data["rank"]] = data
    return found


def report(**values: Any) -> None:
    """Called inside a rank: writes one JSON file (stdout lines of ranks can interleave)."""
    path = Path(os.environ[REPORTS]) / f"rank{values['rank']}.json"
    path.write_text(json.dumps(values))

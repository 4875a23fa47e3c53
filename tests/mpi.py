"""Launches a script under real mpirun (or horovodrun) and parses what each rank reports."""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tfsift.parallel.launch import mpirun_command

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent / "mpi_scripts"
LEAN_SITE = Path(__file__).resolve().parent / "lean_site"  # see its sitecustomize.py
REPORTS = "TFSIFT_TEST_REPORTS"
SIMHOSTS = ROOT / "scripts" / "simhosts.sh"  # simulated hosts: network namespaces
Reports = dict[int, dict[str, Any]]  # what each rank reported, by rank


def environment(extra: dict[str, str] | None = None, unset: tuple[str, ...] = ()) -> dict[str, str]:
    """The jobs' environment, ``LEAN_SITE`` first on the path, without the variables ``unset``
    (this process's own, as ``import tfsift`` set them, would otherwise reach the job)."""
    path = [str(ROOT), str(ROOT / "tests"), str(SCRIPTS)]
    env = {k: v for k, v in os.environ.items() if k not in unset}
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
    unset: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    """Runs ``tests/mpi_scripts/<script>`` on ``np`` ranks; never hangs past ``timeout``.

    ``hosts``: spread the ranks evenly over that many simulated hosts (``simhosts.sh up``
    made them), ranks 0 .. np/hosts - 1 on the first, and so on. ``unset``: variables of
    this process's environment the job must not see.
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
        env=environment(env, unset),
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
    (each job of a suite run left a folder in /tmp before)."""
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


class SharedJob:
    """One job that runs several tests' scenarios one after another (``together.py``).

    A rank pays seconds of CPU before it checks anything: importing TensorFlow (about 3.3
    CPU seconds) and TensorFlow's first traces and kernels. Five 4-rank jobs of 2 stages x
    2 replicas took 138 CPU seconds one by one and 52 to 59 in one job, with the same
    reports. Jobs with the same ranks and layout share one: a test module declares its
    scenario when it is imported (``JOB.scenario(...)``), so the job, run when the first
    test asks for its reports, holds every scenario pytest collected. Mark the tests
    ``JOB.mark`` so that one pytest worker runs them all. The scenarios every rank
    finished keep their reports when the job fails; the tests of the others fail with the
    job's output (each scenario prints a header line as it starts), and nothing reruns.
    """

    def __init__(self, name: str, np: int) -> None:
        self.name, self.np = name, np
        self._scenarios: list[tuple[str, ...]] = []
        self._timeout = 0.0
        self._result: list[Reports | BaseException] | None = None

    @property
    def mark(self) -> Any:
        import pytest  # here: the ranks import this module too, and never need pytest

        return pytest.mark.xdist_group(self.name)

    def scenario(self, script: str, *args: str, timeout: float = 300) -> Callable[[], Reports]:
        """Adds ``script args`` to the job; returns what gives its reports, by rank."""
        if self._result is not None:
            raise RuntimeError(f"{self.name}: the job has run; declare scenarios at import")
        scenario = (script, *args)
        if scenario not in self._scenarios:
            self._scenarios.append(scenario)
            self._timeout += timeout
        index = self._scenarios.index(scenario)
        return lambda: self._reports(index)

    def _reports(self, index: int) -> Reports:
        if self._result is None:
            self._result = self._run()
        got = self._result[index]
        if isinstance(got, BaseException):
            scenario = " ".join(self._scenarios[index])
            raise AssertionError(
                f"the shared job {self.name} failed in or before: {scenario}"
            ) from got
        return got

    def _run(self) -> list[Reports | BaseException]:
        """Each scenario's reports, or the job's failure for those not every rank finished."""
        argv = [arg for s in self._scenarios for arg in ("--", *s)][1:]
        try:
            proc = run(self.np, "together.py", *argv, timeout=self._timeout)
        except subprocess.TimeoutExpired as err:
            return [err] * len(self._scenarios)
        try:
            reports(proc)  # fails with the job's output if it failed
            failure: AssertionError | None = None
        except AssertionError as err:
            failure = err
        root = Path(proc.reports_dir)  # type: ignore[attr-defined]
        folders = [root / str(i) for i in range(len(self._scenarios))]
        return [
            _read(folder)
            if failure is None or len(list(folder.glob("done.*"))) == self.np
            else failure
            for folder in folders
        ]


# The jobs tests share, by ranks and layout (their scripts' tfsift.init must agree on it)
TWO_STAGES = SharedJob("two_stages", 2)  # 2 stages, 1 replica (the docs' blocks too)
TWO_REPLICAS = SharedJob("two_replicas", 2)  # 1 stage x 2 replicas, placement "cluster"
FOUR_STAGES = SharedJob("four_stages", 4)  # 4 stages, 1 replica
CLUSTER_2X2 = SharedJob("cluster_2x2", 4)  # 2 stages x 2 replicas, placement "cluster"
SPREAD_2X2 = SharedJob("spread_2x2", 4)  # 2 stages x 2 replicas, placement "spread"
# the same layouts for tests that time their jobs (marked alone: nothing runs beside them)
TWO_STAGES_ALONE = SharedJob("two_stages_alone", 2)
CLUSTER_2X2_ALONE = SharedJob("cluster_2x2_alone", 4)


def reports(proc: subprocess.CompletedProcess[str]) -> Reports:
    """The JSON each rank reported, by rank; fails with the job's output if it failed."""
    if proc.returncode != 0:
        raise AssertionError(
            f"job failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
        )
    return _read(Path(proc.reports_dir))  # type: ignore[attr-defined]


def _read(folder: Path) -> Reports:
    found = {}
    for path in folder.glob("rank*.json"):
        data = json.loads(path.read_text())
        found[data["rank"]] = data
    return found


TIMINGS = "TFSIFT_TEST_TIMINGS"  # a file: rank 0 appends each timed part's seconds to it


def _rank_zero() -> bool:
    """Called inside a rank: whether it is rank 0 of its job (a process outside one is)."""
    return os.environ.get("OMPI_COMM_WORLD_RANK", "0") == "0"


@contextlib.contextmanager
def timed(label: str) -> Iterator[None]:
    """Called inside a rank: where ``TIMINGS`` names a file, rank 0 appends how long the
    block took, the CPU seconds it used, and ``label`` (how the suite's slowest scenarios
    are found)."""
    start, cpu = time.monotonic(), time.process_time()
    yield
    timings = os.environ.get(TIMINGS)
    if timings and _rank_zero():
        with open(timings, "a") as out:
            out.write(
                f"{time.monotonic() - start:7.1f} s {time.process_time() - cpu:7.1f} cpu  {label}\n"
            )


def computed_once(name: str, compute: Callable[[], Any], timeout: float = 600) -> Any:
    """Called inside every rank of a job on one host: rank 0 runs ``compute`` and pickles
    its value into the reports folder, the others sleep until it is there and read it. A
    one-process reference costs each rank seconds of CPU that the suite's other jobs want;
    a blocking MPI broadcast would keep the waiting ranks polling instead."""
    path = Path(os.environ[REPORTS]) / f"{name}.pickle"
    if _rank_zero():
        value = compute()
        partial = path.with_suffix(".partial")
        partial.write_bytes(pickle.dumps(value))
        partial.replace(path)  # whole or not there: a reader never sees half of it
        return value
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank 0 did not write {path} within {timeout:.0f} s")
        time.sleep(0.05)
    return pickle.loads(path.read_bytes())


def report(**values: Any) -> None:
    """Called inside a rank: writes one JSON file (stdout lines of ranks can interleave)."""
    path = Path(os.environ[REPORTS]) / f"rank{values['rank']}.json"
    path.write_text(json.dumps(values))

"""Running benchmark jobs: a quiet machine, one environment, a job per configuration."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tfsift.parallel.launch import mpirun_command  # noqa: E402

Result = dict[str, Any]
T = TypeVar("T")
SIMHOSTS = ROOT / "scripts" / "simhosts.sh"  # simulated hosts: network namespaces
OUT_DIR = "TFSIFT_BENCH_OUT"  # where a worker rank writes rank<r>.json
# A rank stands in for a device: one compute thread each, so that K ranks on K cores
# compare with one process on one core.
ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
       "TF_CPP_MIN_LOG_LEVEL": "3", "OMP_NUM_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1",
       "TF_NUM_INTEROP_THREADS": "1"}  # fmt: skip


def say(text: str) -> None:
    print(text, flush=True)


def wait_for_quiet(max_load: float, max_wait: float, poll: float = 15.0) -> tuple[float, str]:
    """Waits (up to ``max_wait`` s) until the 1-minute load is below ``max_load``.

    Returns the load then and a note for the docs: empty, how long it waited, or that
    the load never dropped and the run went ahead anyway."""
    start = time.monotonic()
    while os.getloadavg()[0] > max_load and time.monotonic() < start + max_wait:
        say(f"load {os.getloadavg()[0]:.2f} > {max_load}; waiting")
        time.sleep(poll)
    load, waited = os.getloadavg()[0], (time.monotonic() - start) / 60
    if load <= max_load:
        unit = "minute" if round(waited) == 1 else "minutes"
        return load, f"; it waited {waited:.0f} {unit} for a quiet machine" if waited >= 1 else ""
    return load, f"; the load never dropped below {max_load}, and it ran after {waited:.0f} minutes"


def environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The caller's environment with the benchmark threads and paths."""
    path = os.pathsep.join([str(ROOT), str(ROOT / "scripts")])
    return dict(os.environ) | ENV | {"PYTHONPATH": path} | (extra or {})


def run_job(worker: Path, args: Sequence[str], np: int, *, timeout: float = 900,
            mpi: bool = True, bind: str = "core", python: str = sys.executable,
            env: dict[str, str] | None = None,
            hosts: str | None = None) -> list[Result]:  # fmt: skip
    """Runs ``worker args`` on ``np`` ranks and returns each rank's JSON (``write_rank``), by
    rank; indented lines it prints are shown as they come, the rest only if it fails; a job
    past ``timeout`` seconds is killed. ``mpi=False``: one process without ``mpirun``;
    ``python``: another environment's (a peer framework's); ``hosts``: mpirun's
    ``--host`` list, on the simulated hosts."""
    argv = [str(worker), *args]
    if not mpi and np != 1:
        raise ValueError(f"a job without mpirun runs one process. Received: np={np}")
    cmd = launch_command(np, argv, bind, python) if mpi else [python, *argv]
    if hosts is not None:
        cmd = ["bash", str(SIMHOSTS), "exec", *cmd[:3], "--host", hosts, *cmd[3:]]
    with tempfile.TemporaryDirectory(prefix="tfsift-bench-") as folder:
        out = Path(folder)
        tail = _run(cmd, environment({**(env or {}), OUT_DIR: str(out)}), timeout)
        files = sorted(out.glob("rank*.json"), key=lambda f: int(f.stem[4:]))
        if len(files) != np or tail[0] != 0:
            raise RuntimeError(
                f"{worker.name} job failed (exit {tail[0]}, {len(files)} of {np} reports). "
                f"Received args: {list(args)}\n{tail[1]}"
            )
        return [json.loads(f.read_text()) for f in files]


def launch_command(np: int, argv: Sequence[str], bind: str, python: str) -> list[str]:
    """tfsift's own ``mpirun`` line (root, oversubscription) running ``python argv`` on
    ``np`` local ranks bound by ``bind``."""
    cmd = mpirun_command(np, argv, python=python)
    cmd[cmd.index("--bind-to") + 1] = bind
    return cmd


def _run(cmd: list[str], env: dict[str, str], timeout: float) -> tuple[int, str]:
    """(exit code, the last lines of output); indented lines are echoed live."""
    kept: list[str] = []
    with subprocess.Popen(
        cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:
        assert proc.stdout is not None
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        for line in proc.stdout:
            if line.startswith("  "):
                say(line.rstrip())
            kept = [*kept[-80:], line]
        timer.cancel()
    return proc.returncode, "".join(kept)


def write_rank(rank: int, values: Result) -> None:
    """Called in a worker rank: its JSON report (ranks' stdout lines can interleave)."""
    (Path(os.environ[OUT_DIR]) / f"rank{rank}.json").write_text(json.dumps(values))


def rounds(names: Sequence[str], repeats: int, job: Callable[[str], T]) -> list[dict[str, T]]:
    """``job(name)`` of every name in each of ``repeats`` rounds, by round; the order rotates
    (a b c, then b c a, c a b) so that a drifting machine hits every name alike."""
    out: list[dict[str, T]] = [{} for _ in range(repeats)]
    for r in range(repeats):
        for i in range(len(names)):
            name = names[(i + r) % len(names)]
            say(f"#{r} {name}")
            out[r][name] = job(name)
    return out


def by_name(rounds: list[dict[str, T]]) -> dict[str, list[T]]:
    """``rounds``' results by name, one a round."""
    return {name: [r[name] for r in rounds] for name in rounds[0]} if rounds else {}


def git(*args: str) -> str:
    run = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    return run.stdout.strip()


def metadata(load_start: float, seconds: float, note: str = "") -> Result:
    """Where and when a run was measured: date, cores, commit (``-dirty`` if uncommitted
    library or benchmark changes ran), the load before and after."""
    dirty = git(
        "status", "--porcelain", "--untracked-files=no", "--", "tfsift", "partitioner", "scripts"
    )
    commit = (git("rev-parse", "--short", "HEAD") or "unknown") + ("-dirty" if dirty else "")
    return {"date": datetime.date.today().isoformat(), "cores": os.cpu_count(), "commit": commit,
            "load_start": load_start, "load_end": os.getloadavg()[0], "seconds": seconds,
            "wait_note": note}  # fmt: skip

"""``tfsift doctor -H host1,host2``: what a job across hosts needs, checked before it starts.

From this host, as ``tfsift run`` would launch the job: ssh reaches every host and runs
this interpreter's path there (``ssh``); every host has the same Python, tfsift,
TensorFlow, Keras, Horovod and mpi4py (``versions``); ``mpirun`` starts one rank on each
host and they meet in an allreduce (``mpi``: the network Open MPI chooses works); and a
file written into the checkpoint directory here is seen by every other host
(``checkpoint dir``: a directory they share). Each check is a ``doctor.Check`` line.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tfsift.cli import hosts as hosts_lib
from tfsift.cli.doctor import Check

# What a host reports: its name, interpreter and the versions it imports. Run with this
# interpreter's path on every host; argv[1], if given, is a file to read (the shared check).
PROBE = """\
import importlib.metadata as md, json, os, socket, sys
def version(*names):
    for name in names:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            pass
try:
    import tfsift.version
    tfsift = tfsift.version.__version__
except Exception as err:
    tfsift = None
seen = None
if len(sys.argv) > 1:
    try:
        seen = open(sys.argv[1]).read()
    except OSError:
        seen = ""
print(json.dumps({"host": socket.gethostname(), "executable": sys.executable,
    "python": sys.version.split()[0], "tfsift": tfsift,
    "tensorflow": version("tensorflow-cpu", "tensorflow"), "keras": version("keras"),
    "horovod": version("horovod"), "mpi4py": version("mpi4py"), "seen": seen}))
"""
VERSIONS = ("python", "tfsift", "tensorflow", "keras", "horovod", "mpi4py")
# Every rank names its host and adds 1 in an allreduce; rank 0 prints both.
MPI_PROBE = """\
import json, socket
from mpi4py import MPI
world = MPI.COMM_WORLD
names = world.allgather(socket.gethostname())
total = world.allreduce(1)
if world.Get_rank() == 0:
    print(json.dumps([names, total]))
"""
SSH_FAILED = 255  # ssh's exit status when it could not run the command
MPI_TIMEOUT = 60  # seconds for the MPI check: a wrong interface makes it hang
SAME_ENV = "install the same environment at the same path on every host (docs/cluster.md)"
INTERFACE_FIX = (
    "choose the network the hosts share for Open MPI: export "
    "OMPI_MCA_btl_tcp_if_include=IFACE OMPI_MCA_oob_tcp_if_include=IFACE (an interface "
    "or a subnet such as 10.0.0.0/24; docs/cluster.md)"
)
Report = dict[str, Any]


def checks(names: Sequence[str], directory: str | None) -> list[Check]:
    """Every check across ``names``, the hosts; ``directory``: the checkpoint directory."""
    marker = _marker(directory) if directory else None
    try:
        reports = _probe_all(names, marker[0] if marker else None)
        found = [_ssh_check(name, got) for name, got in reports.items()]
        usable = {name: got for name, got in reports.items() if isinstance(got, dict)}
        found.append(versions_check(_local(), usable))
        found.append(mpi_check([n for n in names if n in usable], len(usable) < len(names)))
        found.append(shared_check(directory, marker[1] if marker else None, usable))
    finally:
        if marker:
            Path(marker[0]).unlink(missing_ok=True)
    return found


def _marker(directory: str) -> tuple[str, str] | None:
    """A file written into ``directory`` here (its path, its contents), or None when it
    cannot be written."""
    token = f"tfsift doctor {uuid.uuid4().hex}"
    path = Path(directory) / f".tfsift-doctor-{os.getpid()}-{token[-8:]}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(token)
    except OSError:
        return None
    return str(path.resolve()), token


def _probe_all(names: Sequence[str], marker: str | None) -> dict[str, Report | str]:
    """Each host's report, or why ssh could not get it; all hosts at once."""
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(max(1, len(names))) as pool:
        got = pool.map(lambda name: probe(name, marker), names)
        return dict(zip(names, got, strict=True))


def probe(name: str, marker: str | None = None) -> Report | str:
    """What host ``name`` reports through ssh (``PROBE``, run by this interpreter's path
    there), or why it did not."""
    argv = [sys.executable, "-c", PROBE, *([marker] if marker else [])]
    timeout = hosts_lib.CONNECT_TIMEOUT
    try:
        done = subprocess.run(
            hosts_lib.ssh_command(name, argv, timeout),
            capture_output=True, text=True, timeout=timeout + 30, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return f"ssh did not answer within {timeout + 30} s"
    except OSError as err:
        return f"ssh cannot run here: {err}"
    lines = done.stdout.strip().splitlines()
    why = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
    if done.returncode == SSH_FAILED:
        return why
    if done.returncode != 0 or not lines:
        return f"{sys.executable} did not run there: {why}"
    try:
        report: Report = json.loads(lines[-1])
    except json.JSONDecodeError:
        return f"unexpected output: {lines[-1][:200]}"
    return report


def _local() -> Report:
    """This host's report, by the same program."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60
    )
    report: Report = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def _ssh_check(name: str, got: Report | str) -> Check:
    if isinstance(got, str):
        fix = (
            f"make `ssh {name} true` work without a password from this host (ssh-copy-id), "
            f"and {SAME_ENV}"
        )
        return Check(f"ssh {name}", False, got, fix)
    detail = f"{got['host']}: Python {got['python']} at {got['executable']}"
    return Check(f"ssh {name}", True, detail)


def versions_check(here: Report, reports: dict[str, Report]) -> Check:
    """Whether every host reports the versions this one does.

    Example:
        >>> here = {"python": "3.11.9", "tfsift": "0.1.0", "horovod": "0.28.1"}
        >>> versions_check(here, {"b": {**here, "horovod": "0.28.0"}}).detail
        'b: horovod 0.28.0 (here 0.28.1)'
    """
    differ = [
        f"{name}: {key} {got.get(key)} (here {here.get(key)})"
        for name, got in reports.items()
        for key in VERSIONS
        if key in here and got.get(key) != here.get(key)
    ]
    if differ:
        return Check("versions", False, "; ".join(differ), SAME_ENV)
    if not reports:
        return Check("versions", False, "no host answered", "fix ssh first")
    found = ", ".join(f"{key} {here.get(key)}" for key in VERSIONS if key in here)
    return Check("versions", True, f"the same on every host that answered: {found}")


def mpi_check(names: Sequence[str], skipped: bool) -> Check:
    """``mpirun`` with one rank on each of ``names``: their allreduce must complete."""
    if skipped or not names:
        return Check("mpi", False, "not run: a host did not answer ssh", "fix ssh first")
    from tfsift.cli import run

    hostlist = hosts_lib.to_list([hosts_lib.Host(name) for name in names])
    parsed = run.RunArgs(len(names), ("--host", hostlist), ("-c", MPI_PROBE))
    start = time.monotonic()
    with subprocess.Popen(
        run.command(parsed), env=run.environment(os.environ), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    ) as proc:  # fmt: skip
        try:
            output = proc.communicate(timeout=MPI_TIMEOUT)[0]
        except subprocess.TimeoutExpired:
            for pid in run.descendants(proc.pid):  # its ssh and daemons too
                _kill(pid)
            proc.kill()
            proc.communicate()
            detail = f"{len(names)} ranks on {hostlist} had not met {MPI_TIMEOUT} s later"
            return Check("mpi", False, detail, INTERFACE_FIX)
    seconds = time.monotonic() - start
    last = (output.strip().splitlines() or [""])[-1]
    if proc.returncode != 0 or not last.startswith("[["):
        detail = f"mpirun exited with {proc.returncode}: {last[:300]}"
        return Check("mpi", False, detail, INTERFACE_FIX)
    ranks, total = json.loads(last)
    detail = f"{total} ranks on {', '.join(ranks)} met in an allreduce ({seconds:.1f} s)"
    return Check("mpi", True, detail)


def shared_check(directory: str | None, token: str | None, reports: dict[str, Report]) -> Check:
    """Whether every other host saw the file written into ``directory`` here."""
    name = "checkpoint dir"
    if directory is None:
        detail = "not checked: give --checkpoint-dir DIR, the directory the job saves into"
        return Check(name, True, detail, required=False)
    if token is None:
        return Check(name, False, f"{directory} cannot be written here", "check its permissions")
    here = socket.gethostname()
    # this host sees what it wrote (ssh back to it could land in another mount namespace)
    blind = [n for n, got in reports.items() if got["host"] != here and got.get("seen") != token]
    if blind:
        detail = (
            f"{directory} is not shared: {', '.join(blind)} cannot see the file written here, "
            "so each host would hold only a part of every checkpoint"
        )
        return Check(name, False, detail, "use a directory every host mounts at the same path")
    detail = f"{directory} is shared: every host that answered sees the file written here"
    return Check(name, True, detail)


def _kill(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)

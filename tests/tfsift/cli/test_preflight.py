"""``tfsift doctor -H``: ssh, the same versions, MPI and a shared checkpoint directory across
hosts; the comparisons here, the whole check on simulated hosts."""

from __future__ import annotations

import doctest
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import mpi
from tfsift.cli import main, preflight
from tfsift.cli.preflight import shared_check, versions_check

HERE = {"python": "3.11.7", "tfsift": "0.1.0", "tensorflow": "2.21.0", "keras": "3.15.1",
        "horovod": "0.28.1", "mpi4py": "4.1.2"}  # fmt: skip


def test_every_version_that_differs_is_named_with_its_host() -> None:
    reports = {"a": dict(HERE), "b": {**HERE, "horovod": None, "python": "3.11.9"}}
    check = versions_check(HERE, reports)
    assert not check.ok
    assert check.detail == "b: python 3.11.9 (here 3.11.7); b: horovod None (here 0.28.1)"
    assert check.fix == preflight.SAME_ENV
    same = versions_check(HERE, {"a": dict(HERE)})
    assert same.ok and same.detail.startswith("the same on every host that answered: python 3.11.7")


def test_a_directory_is_shared_when_every_other_host_read_the_token() -> None:
    here = socket.gethostname()
    reports = {"a": {"host": here, "seen": ""},  # this host: ssh back may see another mount
               "b": {"host": "b", "seen": "t"}, "c": {"host": "c", "seen": ""}}  # fmt: skip
    check = shared_check("/ckpt", "t", reports)
    assert not check.ok
    assert check.detail == (
        "/ckpt is not shared: c cannot see the file written here, so each host would hold "
        "only a part of every checkpoint"
    )
    assert shared_check("/ckpt", "t", {k: reports[k] for k in "ab"}).ok
    unchecked = shared_check(None, None, reports)
    assert unchecked.ok and not unchecked.required and "--checkpoint-dir" in unchecked.detail


def test_checkpoint_dir_needs_hosts() -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["doctor", "--checkpoint-dir", "/ckpt"])
    assert str(exit_.value) == (
        "tfsift doctor: --checkpoint-dir is checked across the hosts -H or --hostfile names. "
        "Received: --checkpoint-dir without hosts"
    )


def test_docstring_examples_run() -> None:
    assert doctest.testmod(preflight).failed == 0


def doctor(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(mpi.SIMHOSTS), "exec", sys.executable, "-m", "tfsift.cli", "doctor", *argv],
        env=mpi.environment(env), cwd=mpi.ROOT, capture_output=True, text=True, timeout=200,
    )  # fmt: skip


def lines(done: subprocess.CompletedProcess[str]) -> dict[str, str]:
    """The report's lines by check name, from ``ssh 10.251.0.1`` on."""
    out = done.stdout.splitlines()
    at = next(i for i, line in enumerate(out) if "ssh 10.251.0.1" in line)
    return {line[9:].split("  ")[0]: line for line in out[at:] if line[:1] in "oM"}


@pytest.mark.mpi
@pytest.mark.hosts
@pytest.mark.xdist_group("simhosts")
@pytest.mark.timeout(600)
def test_doctor_checks_two_simulated_hosts(two_hosts: int, tmp_path: Path) -> None:
    hostlist = mpi.places(4, two_hosts)
    done = doctor("-H", hostlist, "--checkpoint-dir", str(tmp_path / "ckpt"))
    assert done.returncode == 0, done.stdout + done.stderr
    found = lines(done)
    assert list(found) == ["ssh 10.251.0.1", "ssh 10.251.0.2", "versions", "mpi", "checkpoint dir"]
    assert found["ssh 10.251.0.2"].startswith("ok       ssh 10.251.0.2  tfsift-h2: Python ")
    assert "mpi             2 ranks on tfsift-h1, tfsift-h2 met in an allreduce" in found["mpi"]
    assert list((tmp_path / "ckpt").iterdir()) == []  # the probe file is gone

    private = tmp_path / "local-disk"  # a tmpfs of its own on each host
    done = doctor("-H", hostlist, "--checkpoint-dir", str(private / "ckpt"),
                  env={"TFSIFT_SIMHOSTS_PRIVATE": str(private)})  # fmt: skip
    assert done.returncode == 1
    assert lines(done)["checkpoint dir"] == (
        f"MISSING  checkpoint dir  {private}/ckpt is not shared: 10.251.0.2 cannot see the "
        "file written here, so each host would hold only a part of every checkpoint"
    )

    subprocess.run(["ip", "-n", "tfsift-h2", "link", "set", "tfsift0", "down"], check=True)
    try:
        done = doctor("-H", hostlist)
    finally:
        subprocess.run(["ip", "-n", "tfsift-h2", "link", "set", "tfsift0", "up"], check=True)
    assert done.returncode == 1
    found = lines(done)
    assert found["ssh 10.251.0.2"] in (
        f"MISSING  ssh 10.251.0.2  ssh: connect to host 10.251.0.2 port 22: {why}"
        for why in ("Connection timed out", "No route to host")
    ), done.stdout
    assert found["mpi"] == "MISSING  mpi             not run: a host did not answer ssh"
    assert done.stdout.endswith(
        "missing: ssh 10.251.0.2, mpi; fix them, then run `tfsift doctor` again\n"
    )

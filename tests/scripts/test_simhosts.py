"""scripts/simhosts.sh: simulated hosts made and removed inside their own namespaces only."""

from __future__ import annotations

import subprocess
import time

import pytest

import mpi

pytestmark = [pytest.mark.hosts, pytest.mark.xdist_group("simhosts")]


def simhosts(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(mpi.SIMHOSTS), *args], capture_output=True, text=True)


def namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return sorted(line.split()[0] for line in out.stdout.splitlines() if line.strip())


def outside() -> tuple[str, str]:
    """This machine's own links and addresses (the namespace the tests run in)."""
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    addrs = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, check=True)
    return links.stdout, addrs.stdout


def test_up_twice_down_twice_and_nothing_outside_changes() -> None:
    check = simhosts("check")
    if check.returncode != 0:
        pytest.skip(f"no simulated hosts here: {check.stdout.strip()}")
    others = [ns for ns in namespaces() if not ns.startswith("tfsift-")]
    # the session's hosts (conftest's two_hosts, made by an earlier test) come back after
    had = "tfsift-h2" in namespaces()
    before = outside()
    try:
        for _ in range(2):  # idempotent: the second up replaces the first set
            assert simhosts("up", "2").returncode == 0
            assert namespaces() == sorted([*others, "tfsift-h1", "tfsift-h2", "tfsift-sw"])
        assert outside() == before
        ran = simhosts("exec", "sh", "-c", "hostname; ssh 10.251.0.2 hostname")
        assert ran.stdout.split() == ["tfsift-h1", "tfsift-h2"], ran.stderr
        addr = subprocess.run(
            ["ip", "-n", "tfsift-h2", "-o", "-4", "addr", "show", "tfsift0"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert "10.251.0.2/24" in addr.stdout
    finally:
        assert simhosts("down").returncode == 0
    assert namespaces() == others
    assert simhosts("down").returncode == 0  # nothing to remove: still fine
    assert outside() == before
    if had:
        assert simhosts("up", "2").returncode == 0


def test_bad_arguments_say_what_was_expected() -> None:
    got = simhosts("up", "zero")
    assert got.returncode == 2
    assert "simhosts: up needs a number of hosts 1-99. Received: 'zero'" in got.stderr


def test_ssh_to_a_host_whose_link_is_down_fails_as_ssh_does(two_hosts: int) -> None:
    def ssh() -> subprocess.CompletedProcess[str]:
        return simhosts("exec", "ssh", "-o", "ConnectTimeout=2", mpi.address(2), "hostname")

    link = ["ip", "-n", "tfsift-h2", "link", "set", "tfsift0"]
    subprocess.run([*link, "down"], check=True)
    try:
        cut = ssh()
    finally:
        subprocess.run([*link, "up"], check=True)
    assert cut.returncode == 255 and cut.stdout == ""
    assert cut.stderr in (
        f"ssh: connect to host 10.251.0.2 port 22: {why}\n"
        for why in ("Connection timed out", "No route to host")
    ), cut.stderr
    # the link back up: the kernel may still hold the neighbour entry that failed while it
    # was down ("No route to host") for a moment, longer on a loaded machine
    deadline = time.monotonic() + 10
    back = ssh()
    while back.returncode != 0 and time.monotonic() < deadline:
        time.sleep(0.5)
        back = ssh()
    assert (back.returncode, back.stdout) == (0, "tfsift-h2\n"), back.stderr

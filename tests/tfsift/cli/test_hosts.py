"""``tfsift.cli.hosts``: host lists, hostfiles and the ssh that probes a host."""

from __future__ import annotations

import doctest
import shlex
import subprocess
from pathlib import Path

import pytest

from tfsift.cli import hosts
from tfsift.cli.hosts import Host, parse_hostfile, parse_list, ssh_command, to_list


def test_a_host_list_and_its_slots_round_trip() -> None:
    assert parse_list("a:2,b,c.example.org:16") == [
        Host("a", 2),
        Host("b", 1),
        Host("c.example.org", 16),
    ]
    assert to_list(parse_list("a:2,b")) == "a:2,b:1"


@pytest.mark.parametrize("text", ["a:0", "a:two", ":2", "a:"])
def test_bad_slots_are_refused_with_the_flag_given(text: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_list(text, "--host")
    assert str(err.value) == f"--host takes host:n[,host:n], n >= 1. Received: --host {text}"


def test_a_hostfile_gives_each_host_its_slots(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    path.write_text(
        "# the job's hosts\nnode1 slots=4 max_slots=8\n\n"
        "node2   slots = 2  # the small one\nnode3\n"
    )
    assert parse_hostfile(path) == [Host("node1", 4), Host("node2", 2), Host("node3", 1)]


def test_ssh_never_asks_for_a_password_and_quotes_the_command_once() -> None:
    cmd = ssh_command("node2", ["/opt/py/bin/python", "-c", "print('a b')", "x y"], 5)
    assert cmd[:-1] == ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "node2"]
    # the remote shell splits the one string back into the arguments
    assert shlex.split(cmd[-1]) == ["/opt/py/bin/python", "-c", "print('a b')", "x y"]


def test_unreachable_says_what_ssh_said(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = {
        "up": (0, ""),
        "down": (255, "Warning: x\nssh: connect to host down port 22: No route to host\n"),
    }

    def fake(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        code, err = answers[cmd[-2]]
        return subprocess.CompletedProcess(cmd, code, "", err)

    monkeypatch.setattr(hosts.subprocess, "run", fake)
    assert hosts.reachability(["up", "down"]) == {
        "up": None,
        "down": "ssh: connect to host down port 22: No route to host",
    }


def test_docstring_examples_run() -> None:
    assert doctest.testmod(hosts).failed == 0

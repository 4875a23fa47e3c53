"""The hosts of a command line (``-H host:n,...``, ``--hostfile``) and which of them ssh reaches.

Open MPI's launcher starts its daemon on every other host with ``ssh``, so a host that
ssh cannot reach cannot run ranks: ``tfsift doctor -H`` checks each host that way, and
``tfsift run --min-np`` relaunches a failed job on the hosts ssh still reaches.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import re
import shlex
import subprocess
from collections.abc import Sequence
from pathlib import Path

# how long ssh may take to connect, and a command on a host to run, in seconds
CONNECT_TIMEOUT = 10
# a hostfile line: the host, then options; Open MPI's "slots=N" (max_slots etc. ignored)
_SLOTS = re.compile(r"\bslots\s*=\s*(\d+)")


@dataclasses.dataclass(frozen=True)
class Host:
    """A host and the ranks it takes (its slots)."""

    name: str
    slots: int = 1

    def __str__(self) -> str:
        return f"{self.name}:{self.slots}"


def parse_list(text: str, flag: str = "-H") -> list[Host]:
    """``-H``'s list (``flag`` in the error): ``a:2,b`` is ``a`` with 2 slots, ``b`` with 1.

    Example:
        >>> parse_list("node1:4,node2")
        [Host(name='node1', slots=4), Host(name='node2', slots=1)]

    Raises:
        ValueError: an entry whose slots are not an integer >= 1.
    """
    hosts = []
    for entry in text.split(","):
        name, colon, count = entry.rpartition(":")
        if not colon:
            hosts.append(Host(entry))
        elif name and count.isdigit() and int(count) > 0:
            hosts.append(Host(name, int(count)))
        else:
            raise ValueError(f"{flag} takes host:n[,host:n], n >= 1. Received: {flag} {text}")
    return hosts


def parse_hostfile(path: str | Path) -> list[Host]:
    """Open MPI's hostfile: one host a line, ``node1 slots=4``, ``#`` starts a comment; a
    host without ``slots=`` takes 1 (as ``-H``)."""
    hosts = []
    for line in Path(path).read_text().splitlines():
        words = line.split("#", 1)[0].split()
        if words:
            found = _SLOTS.search(" ".join(words[1:]))
            hosts.append(Host(words[0], int(found.group(1)) if found else 1))
    return hosts


def to_list(hosts: Sequence[Host]) -> str:
    """``hosts`` as ``-H`` and mpirun's ``--host`` take them: ``node1:4,node2:4``."""
    return ",".join(map(str, hosts))


def ssh_command(host: str, argv: Sequence[str], timeout: int = CONNECT_TIMEOUT) -> list[str]:
    """``ssh`` running ``argv`` on ``host`` (quoted for the remote shell), failing instead
    of asking for a password, and giving up connecting after ``timeout`` seconds."""
    options = ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={timeout}"]
    return ["ssh", *options, host, shlex.join(argv)]


def unreachable(host: str, timeout: int = CONNECT_TIMEOUT) -> str | None:
    """Why ssh cannot run a command on ``host`` (its last line of stderr), or None if it can."""
    try:
        done = subprocess.run(
            ssh_command(host, ["true"], timeout),
            capture_output=True, text=True, timeout=timeout + 5, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return f"ssh did not connect within {timeout + 5} s"
    except OSError as err:
        return f"ssh cannot run: {err}"
    if done.returncode == 0:
        return None
    lines = done.stderr.strip().splitlines()
    return lines[-1] if lines else f"ssh exited with {done.returncode}"


def reachability(hosts: Sequence[str], timeout: int = CONNECT_TIMEOUT) -> dict[str, str | None]:
    """``unreachable`` for every host, probed at once (each may take ``timeout`` s)."""
    with concurrent.futures.ThreadPoolExecutor(max(1, len(hosts))) as pool:
        return dict(zip(hosts, pool.map(lambda h: unreachable(h, timeout), hosts), strict=True))

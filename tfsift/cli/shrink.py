"""``tfsift run --min-np M``: a restarted job relaunched on the hosts ssh still reaches.

Before each restart every host of the command line (``-H`` lists, ``--hostfile``) is
probed with ssh (``tfsift.cli.hosts``); the job is launched on those that answer, with
``np'`` ranks, the largest multiple of M within their slots and the ``-np`` given, and
never fewer than M. Once every host answers again, the next restart is on all of them,
with ``-np`` as given. The script sees the new size in ``tfsift.init`` (fewer replicas),
restores its checkpoint into that layout and, with ``global_batch_size``, keeps the
global batch and its place in the epoch (docs/cluster.md)::

    -np 4 -H a:2,b:2 --min-np 2     b lost      -np 2 --host a:2     (2 x 2 -> 2 x 1)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from tfsift.cli import hosts
from tfsift.cli.hosts import Host

HOST_LISTS = ("-H", "-host", "--host")
HOSTFILES = ("-hostfile", "--hostfile", "-machinefile", "--machinefile")
Probe = Callable[[Sequence[str]], dict[str, str | None]]


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where an attempt runs: its ranks, mpirun's flags (host flags included)."""

    np: int
    mpirun_flags: tuple[str, ...]


def given_hosts(flags: Sequence[str]) -> list[Host]:
    """The hosts and slots that ``flags`` (mpirun's) name, in order.

    Example:
        >>> given_hosts(["--host", "a:2,b:2", "--mca", "btl", "tcp,self"])
        [Host(name='a', slots=2), Host(name='b', slots=2)]
    """
    found: list[Host] = []
    for name, value in _host_flags(flags):
        listed = name in HOST_LISTS
        found += hosts.parse_list(value, name) if listed else hosts.parse_hostfile(value)
    return found


def without_hosts(flags: Sequence[str]) -> tuple[str, ...]:
    """``flags`` without their host lists and hostfiles."""
    out, i = [], 0
    while i < len(flags):
        name, eq, _ = flags[i].partition("=")
        if name in HOST_LISTS + HOSTFILES:
            i += 1 if eq else 2
            continue
        out.append(flags[i])
        i += 1
    return tuple(out)


def relaunch(given: Layout, min_np: int, probe: Probe | None = None) -> tuple[Layout, str]:
    """Where the next attempt runs, and what to say about it ("" when on every host given);
    ``probe``: what says which hosts ssh reaches (``hosts.reachability``, looked up now).

    Raises:
        RuntimeError: the hosts that answer have fewer than ``min_np`` slots.
    """
    listed = given_hosts(given.mpirun_flags)
    reach = (probe or hosts.reachability)(list(dict.fromkeys(h.name for h in listed)))
    lost = {name: why for name, why in reach.items() if why is not None}
    if not lost:
        return given, ""
    left = [h for h in listed if h.name not in lost]
    slots = sum(h.slots for h in left)
    np = min(given.np, slots) // min_np * min_np
    unreachable = "; ".join(f"{name} unreachable: {why}" for name, why in lost.items())
    if np < min_np:
        raise RuntimeError(
            f"the hosts that answer ssh give {slots} slot(s), fewer than --min-np {min_np} "
            f"({unreachable})"
        )
    flags = (*without_hosts(given.mpirun_flags), "--host", hosts.to_list(left))
    said = f"on {hosts.to_list(left)} with -np {np} instead of {given.np} ({unreachable})"
    return Layout(np, flags), said


def _host_flags(flags: Sequence[str]) -> list[tuple[str, str]]:
    """(flag, value) of each host list or hostfile in ``flags``."""
    out, i = [], 0
    while i < len(flags):
        name, eq, value = flags[i].partition("=")
        if name in HOST_LISTS + HOSTFILES and (eq or i + 1 < len(flags)):
            out.append((name, value if eq else flags[i + 1]))
            i += 0 if eq else 1
        i += 1
    return out

"""Builds mpirun command lines that work as root and on machines with fewer cores than ranks,
and reads the processes they start from Linux's /proc."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path


def mpirun_command(np: int, argv: Sequence[str], *, python: str | None = None) -> list[str]:
    """The ``mpirun`` command running ``python argv...`` on ``np`` local ranks.

    Adds ``--allow-run-as-root`` when run as root and ``--oversubscribe`` when
    ``np`` exceeds the cores, so the same call works in a container and on a laptop.

    Example:
        >>> mpirun_command(2, ["train.py"])[:3]
        ['mpirun', '-np', '2']
    """
    if np < 1:
        raise ValueError(f"np must be >= 1. Received: np={np}")
    cmd = ["mpirun", "-np", str(np), "--bind-to", "none"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    if np > (os.cpu_count() or 1):
        cmd.append("--oversubscribe")
    return [*cmd, python or sys.executable, *argv]


def stat_fields(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command's name (the state first, then
    the parent's pid, ...); None where there are none: gone, or no /proc (macOS).

    Example:
        >>> stat_fields(os.getpid())[0] in "RS"
        True
    """
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None

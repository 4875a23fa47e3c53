"""Builds mpirun command lines that work as root and on machines with fewer cores than ranks."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence


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

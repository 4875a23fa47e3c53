"""Whether every rank sees one checkpoint directory.

Each rank writes its own files of a checkpoint into the directory and rank 0 publishes
them: across hosts that only works on a path every host mounts (NFS, a cluster
filesystem). On a path local to each host the save would leave every host with a part of
the checkpoint and none able to restore it, so a manager's first save (or restore) checks
first: rank 0 writes a probe file, every rank looks for it, and if any rank cannot see
it, every rank fails at once with the same message.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import time
from pathlib import Path
from typing import Any

from tfsift.checkpoint import collective
from tfsift.checkpoint.files import CheckpointError

PROBE_PREFIX = ".tfsift-shared-"
#: How long a rank looks for the probe: a network filesystem may show a new file late.
LOOK_SECONDS = 2.0


def check(world: Any, directory: Path) -> None:
    """Raises ``CheckpointError`` on every rank unless every rank of ``world`` sees the
    file rank 0 writes in ``directory`` (created if missing). Collective."""
    if world.Get_size() == 1:
        return
    probe = collective.on_root(world, lambda: _write_probe(directory))
    seen = _sees(directory / probe)
    with collective.bounded():
        everyone = world.allgather((seen, socket.gethostname()))
    if world.Get_rank() == 0:
        (directory / probe).unlink(missing_ok=True)
    blind = [rank for rank, (ok, _) in enumerate(everyone) if not ok]
    if blind:
        raise CheckpointError(_message(directory, everyone, blind))


def _write_probe(directory: Path) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    name = f"{PROBE_PREFIX}{secrets.token_hex(8)}"
    with open(directory / name, "w") as f:
        f.write(f"{socket.gethostname()} {os.getpid()}\n")
        f.flush()
        os.fsync(f.fileno())
    return name


def _sees(path: Path) -> bool:
    deadline = time.monotonic() + LOOK_SECONDS
    while True:
        with contextlib.suppress(OSError):
            os.listdir(path.parent)  # revalidates a network filesystem's cached listing
        if path.is_file():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def _message(directory: Path, everyone: list[tuple[bool, str]], blind: list[int]) -> str:
    def hosts(ranks: list[int]) -> str:
        names = sorted({everyone[r][1] for r in ranks})
        return f"host{'s' if len(names) > 1 else ''} {', '.join(names)}"

    who = "rank" if len(blind) == 1 else "ranks"
    return (
        f"checkpoint directory {directory} is not shared by every rank: {who} "
        f"{', '.join(map(str, blind))} ({hosts(blind)}) cannot see the file rank 0 "
        f"({hosts([0])}) wrote there, so each host would hold only a part of every "
        "checkpoint and none could restore it. Use a directory that every host mounts at the "
        "same path (NFS or a cluster filesystem); nothing was saved"
    )

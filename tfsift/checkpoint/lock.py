"""The owner of a checkpoint directory: one job at a time saves into it.

Rank 0 of a job writes ``<directory>/.tfsift-lock`` (JSON: host, pid, start time and
command) at its first save, and removes it when the process ends (or at
``CheckpointManager.close``). Another job's ``CheckpointManager`` for the directory then
fails at its creation, or at its first save if both were created before either saved,
naming the owner, instead of the two jobs removing each other's partial saves. A manager
that only restores never locks. A lock whose process is gone on this host (a job killed,
or ended by ``MPI_Abort``, which runs no exit handlers) is taken over with a warning; one
from another host cannot be checked from here and is never taken over.
"""

from __future__ import annotations

import atexit
import dataclasses
import datetime
import json
import logging
import os
import shlex
import socket
import sys
from pathlib import Path

from tfsift.checkpoint.files import CheckpointError
from tfsift.parallel.launch import stat_fields

log = logging.getLogger("tfsift")

LOCK = ".tfsift-lock"


@dataclasses.dataclass(frozen=True)
class Owner:
    """The process that holds a directory's lock."""

    host: str
    pid: int
    started: str  # when it took the directory, ISO 8601 with the UTC offset
    command: str

    @classmethod
    def here(cls) -> Owner:
        """This process, now."""
        now = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        return cls(socket.gethostname(), os.getpid(), now, shlex.join(sys.argv))

    def same_process(self, other: Owner) -> bool:
        return (self.host, self.pid) == (other.host, other.pid)

    def alive(self) -> bool:
        """Whether the process still runs; True when it is on another host (unknowable)."""
        if self.host != socket.gethostname():
            return True
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # another user's process
            return True
        return not _zombie(self.pid)

    def describe(self) -> str:
        return (
            f"pid {self.pid} on host {self.host}, started {self.started}, running: {self.command}"
        )


def _zombie(pid: int) -> bool:
    """Whether ``pid`` has exited and waits to be reaped (a killed job's rank whose launcher
    has not reaped it yet): it holds nothing and never runs again."""
    fields = stat_fields(pid)  # None: no /proc (macOS), or gone since
    return fields is not None and fields[:1] == ["Z"]


def check(directory: Path) -> None:
    """Raises if another job that still runs holds ``directory``'s lock (the lock of one
    that has died is left for ``acquire`` to take over).

    Raises:
        CheckpointError: another job holds the directory, or its lock is unreadable.
    """
    path = Path(directory) / LOCK
    exists, other = _holder(path)
    if exists and _blocks(other, Owner.here()):
        raise CheckpointError(_in_use(Path(directory), path, other))


def acquire(directory: Path) -> Owner | None:
    """Makes this process the owner of ``directory`` (created if missing).

    Returns:
        The lock written, or None: this process held it already (another manager or an
        earlier save of the same job), or it cannot be written (then the save fails
        there too, with its own message).

    Raises:
        CheckpointError: another job holds the directory, or its lock is unreadable.
    """
    path, me = Path(directory) / LOCK, Owner.here()
    for _ in range(2):  # once more after removing a stale lock
        try:
            if _create(path, me):
                atexit.register(release, path)
                return me
        except OSError as err:
            log.warning("cannot lock checkpoint directory %s: %s", directory, err)
            return None
        exists, other = _holder(path)
        if not exists:  # its owner removed it since: try again
            continue
        if _blocks(other, me):
            raise CheckpointError(_in_use(Path(directory), path, other))
        assert other is not None  # an unreadable lock blocks
        if other.same_process(me):
            return None
        _take_over(Path(directory), path, other)
    raise CheckpointError(_in_use(Path(directory), path, None))


def release(path: Path) -> None:
    """Removes the lock at ``path`` if this process holds it."""
    try:
        owner = _read(path)
        if owner is not None and owner.same_process(Owner.here()):
            path.unlink()
    except OSError:  # gone already (the directory was removed), or unreadable: not ours
        pass


def _create(path: Path, owner: Owner) -> bool:
    """Writes the lock whole, atomically; False if one exists. A hard link, unlike
    ``O_EXCL`` on an empty file, never shows another job a lock without its owner."""
    path.parent.mkdir(parents=True, exist_ok=True)
    draft = path.with_name(f"{LOCK}.{owner.host}.{owner.pid}.draft")
    try:
        draft.write_text(json.dumps(dataclasses.asdict(owner)) + "\n", encoding="utf-8")
        os.link(draft, path)
    except FileExistsError:
        return False
    finally:
        draft.unlink(missing_ok=True)
    return True


def _holder(path: Path) -> tuple[bool, Owner | None]:
    """Whether the lock exists, and its owner (None if it cannot be read)."""
    try:
        return True, _read(path)
    except (FileNotFoundError, NotADirectoryError):
        return False, None
    except OSError:  # there, but not readable by this user
        return True, None


def _blocks(other: Owner | None, me: Owner) -> bool:
    """Whether a lock held by ``other`` (None: unreadable) keeps ``me`` out."""
    return other is None or (not other.same_process(me) and other.alive())


def _read(path: Path) -> Owner | None:
    """The lock's owner, or None if its text is not a lock tfsift wrote."""
    data = path.read_bytes()
    try:  # binary bytes too: a UnicodeDecodeError is a ValueError
        fields = json.loads(data.decode("utf-8"))
        return Owner(str(fields["host"]), int(fields["pid"]), fields["started"], fields["command"])
    except (ValueError, TypeError, KeyError):
        return None


def _in_use(directory: Path, path: Path, other: Owner | None) -> str:
    held = f"the lock {path} of {other.describe()}" if other else f"an unreadable lock {path}"
    return (
        f"a checkpoint directory takes one job at a time, and {directory} is in use by "
        f"another job. Received: {held} (delete the lock if that job has ended)"
    )


def _take_over(directory: Path, path: Path, other: Owner) -> None:
    log.warning(
        "taking over checkpoint directory %s from a job that is no longer running "
        "(killed?): its lock %s names %s",
        directory,
        path,
        other.describe(),
    )
    path.unlink(missing_ok=True)

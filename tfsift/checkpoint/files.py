"""Durable files: fsynced ``.npz`` files, SHA-256 checksums, directories renamed atomically."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

_CHUNK = 1 << 20


class CheckpointError(OSError):
    """A checkpoint could not be written or read (the message names the rank and the file)."""


@dataclasses.dataclass(frozen=True)
class FileEntry:
    """One file of a checkpoint as the manifest lists it."""

    name: str
    sha256: str
    bytes: int
    keys: tuple[str, ...]


def write_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> FileEntry:
    """Writes ``arrays`` uncompressed to ``path``, flushed to the disk, and describes the file."""
    with open(path, "wb") as f:
        np.savez(f, **arrays)  # type: ignore[arg-type]
        f.flush()
        os.fsync(f.fileno())
    return FileEntry(path.name, sha256(path), path.stat().st_size, tuple(arrays))


def write_text(path: Path, text: str) -> None:
    """Writes ``text`` to ``path`` and flushes it to the disk."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def unwritable(directory: Path) -> str | None:
    """Why files cannot be made in ``directory``, or None if they can. The directory is
    made, as a save would make it, and a file is written in it and removed: ``os.access``
    passed where permissions allow but the filesystem refuses (``/proc``, a read-only or
    root-squashed mount), and the save then failed after training."""
    found = Path(directory)
    while not found.exists() and found.parent != found:
        found = found.parent
    if not found.is_dir():
        return f"{found} is not a directory"
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
        # made, then removed as it closes
        tempfile.NamedTemporaryFile(dir=directory, prefix=".tfsift-writable-").close()
    except OSError as err:
        return f"{directory} cannot be made or written ({err.strerror or err})"
    return None


def sha256(path: Path) -> str:
    """The hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def fsync_dir(path: Path) -> None:
    """Flushes a directory's entries (a rename in it) to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(partial: Path, final: Path) -> None:
    """Renames the finished directory ``partial`` to ``final``, replacing an older one.

    A reader sees either the old ``final`` or the new one, never a mix: the old one is
    first renamed aside (a crash then leaves it hidden and the previous checkpoints valid).
    """
    fsync_dir(partial)
    old = final.with_name(f".{final.name}.old")
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(partial, final)
    fsync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)

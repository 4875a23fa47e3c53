"""Checkpoint directories on disk: finding the newest complete one and reading its arrays."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tfsift.checkpoint import manifest as manifest_lib
from tfsift.checkpoint.manifest import MANIFEST, Manifest, step_of

log = logging.getLogger("tfsift")


class Checkpoint:
    """One complete checkpoint directory: its manifest and its arrays, read lazily by key."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.manifest: Manifest = manifest_lib.read(self.path)
        self._open: dict[str, Any] = {}

    def arrays(self, name: str) -> Any:
        """The arrays of file ``name`` (an ``np.lib.npyio.NpzFile``, read as used)."""
        if name not in self._open:
            self._open[name] = np.load(self.path / name, allow_pickle=False)
        return self._open[name]

    def values(self, prefix: str) -> Stored:
        """Every stored array of the files named ``prefix*``, by key, each read when first
        used: a missing key's error can name what the checkpoint holds."""
        return Stored(self, prefix)

    def close(self) -> None:
        """Closes the files opened so far."""
        for npz in self._open.values():
            npz.close()
        self._open.clear()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Stored(Mapping[str, np.ndarray]):
    """The arrays of a checkpoint's files named ``prefix*`` by key (``Checkpoint.values``):
    the keys from the manifest, an array read from its file at its first use and kept."""

    def __init__(self, ckpt: Checkpoint, prefix: str) -> None:
        self._ckpt, self._where = ckpt, ckpt.manifest.index(prefix)
        self._read: dict[str, np.ndarray] = {}

    def __getitem__(self, key: str) -> np.ndarray:
        if key not in self._read:
            self._read[key] = self._ckpt.arrays(self._where[key])[key]
        return self._read[key]

    def __contains__(self, key: object) -> bool:  # from the manifest: nothing is read
        return key in self._where

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


def candidates(directory: Path) -> list[Path]:
    """The checkpoints in ``directory``, newest first; ``directory`` itself if it is one."""
    directory = Path(directory)
    if (directory / MANIFEST).exists() or step_of(directory) is not None:
        return [directory]
    if not directory.is_dir():
        return []
    found = [(step_of(p), p) for p in directory.iterdir() if p.is_dir()]
    return [p for step, p in sorted(((s, p) for s, p in found if s is not None), reverse=True)]


def latest_valid(directory: Path) -> Path | None:
    """The newest checkpoint whose files all match the manifest's checksums, else None.

    Each damaged one is skipped with a warning naming its bad files.
    """
    for path in candidates(directory):
        found = manifest_lib.problems(path)
        if not found:
            return path
        log.warning("skipping damaged checkpoint %s: %s", path, "; ".join(found))
    return None

"""A checkpoint's ``manifest.json``: what it holds, under which plan, and every file's checksum.

The manifest is written last, into the directory that is then renamed into place, so
a checkpoint directory with a manifest whose checksums all match is complete.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from tfsift.checkpoint.files import FileEntry, sha256

FORMAT = 1
MANIFEST = "manifest.json"
PREFIX = "ckpt-"


def weights_file(stage: int) -> str:
    """The model variables written by stage ``stage``'s writer (replica 0)."""
    return f"weights-s{stage}.npz"


def optimizer_file(stage: int) -> str:
    """The optimizer variables written by stage ``stage``'s writer (replica 0)."""
    return f"optimizer-s{stage}.npz"


def state_file(replica: int, stage: int) -> str:
    """One rank's own state: sifting and the Python and NumPy random generators."""
    return f"state-r{replica}-s{stage}.npz"


@dataclasses.dataclass(frozen=True)
class Manifest:
    """What ``manifest.json`` says (see docs/checkpoints.md for every field)."""

    step: int
    files: tuple[FileEntry, ...]
    partitions: int
    replicas: int
    placement: str
    bounds: tuple[int, ...]
    stages: tuple[tuple[str, ...], ...]  # the traced node names on each stage
    inputs: tuple[tuple[tuple[int, ...], str], ...]  # one microbatch: (shape, dtype) each
    config: dict[str, Any]
    tfsift_version: str
    format: int = FORMAT

    def to_json(self) -> str:
        """The manifest as indented JSON."""
        return json.dumps(dataclasses.asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        """Parses ``to_json``'s text; raises ValueError on anything else."""
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(
                f"not a tfsift checkpoint manifest of format {FORMAT}. "
                f"Received: format={data.get('format') if isinstance(data, dict) else None!r}"
            )
        try:
            return cls(
                step=int(data["step"]),
                files=tuple(
                    FileEntry(f["name"], f["sha256"], int(f["bytes"]), tuple(f["keys"]))
                    for f in data["files"]
                ),
                partitions=int(data["partitions"]),
                replicas=int(data["replicas"]),
                placement=str(data["placement"]),
                bounds=tuple(data["bounds"]),
                stages=tuple(tuple(s) for s in data["stages"]),
                inputs=tuple((tuple(shape), str(dtype)) for shape, dtype in data["inputs"]),
                config=dict(data["config"]),
                tfsift_version=str(data["tfsift_version"]),
            )
        except (KeyError, TypeError) as err:
            raise ValueError(f"manifest field missing or malformed: {err!r}") from err

    def entry(self, name: str) -> FileEntry | None:
        """The file called ``name``, if the checkpoint has one."""
        return next((f for f in self.files if f.name == name), None)

    def index(self, prefix: str) -> dict[str, str]:
        """``key -> file name`` over the files whose names start with ``prefix``."""
        found: dict[str, str] = {}
        for f in self.files:
            if f.name.startswith(prefix):
                for key in f.keys:
                    found.setdefault(key, f.name)
        return found


def step_of(path: Path) -> int | None:
    """The step in a checkpoint directory's name (``ckpt-120`` -> 120), else None."""
    name = path.name
    if not name.startswith(PREFIX) or not name[len(PREFIX) :].isdigit():
        return None
    return int(name[len(PREFIX) :])


def read(directory: Path) -> Manifest:
    """The manifest of a checkpoint directory; raises OSError or ValueError."""
    return Manifest.from_json((directory / MANIFEST).read_text(encoding="utf-8"))


def problems(directory: Path) -> list[str]:
    """Why ``directory`` is not a complete checkpoint, naming each bad file (empty if it is)."""
    try:
        manifest = read(directory)
    except FileNotFoundError:
        return [f"{MANIFEST} is missing"]
    except (OSError, ValueError, UnicodeDecodeError) as err:
        return [f"{MANIFEST} is unreadable: {err}"]
    found = []
    for entry in manifest.files:
        path = directory / entry.name
        if not path.is_file():
            found.append(f"{entry.name} is missing")
        elif os.path.getsize(path) != entry.bytes:
            found.append(
                f"{entry.name} has {os.path.getsize(path)} bytes, the manifest says {entry.bytes}"
            )
        elif sha256(path) != entry.sha256:
            found.append(f"{entry.name} does not match its sha256 checksum {entry.sha256[:12]}...")
    return found

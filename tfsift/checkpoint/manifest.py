"""A checkpoint's ``manifest.json``: what it holds, under which plan, and every file's checksum.

The manifest is written last, into the directory that is then renamed into place, so
a checkpoint directory with a manifest whose checksums all match is complete. The
manifest carries a checksum of its own fields too (``sha256``, format 2): a damaged or
edited manifest is refused like a damaged file, rather than read for a step or an input
shape it never held.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from tfsift.checkpoint.files import FileEntry, sha256

FORMAT = 2  # 2 adds the manifest's own checksum; 1 (tfsift before it) is still read
FORMATS = (1, 2)
MANIFEST = "manifest.json"
CHECKSUM = "sha256"  # the manifest's field holding the checksum of its other fields
# Bounds on the manifest's numbers, so that a manifest whose numbers cannot be a save's
# (a step of 10**30, a microbatch 10**12 samples long) is refused as damaged before
# anything is allocated for it: a step is an int64 (a tf.Variable holds it), an input
# dimension an int32 (one microbatch's shape).
MAX_STEP = 2**63 - 1
MAX_DIM = 2**31 - 1
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
    # the optimizer's class (None: saved without one, or before it was recorded): its slots
    # match by kind and layer path alone, so another optimizer's would load (SGD's
    # ``momentum`` from Adam's first moments)
    optimizer: str | None = None

    def to_json(self) -> str:
        """The manifest as indented JSON, its checksum (``sha256``) last."""
        fields = dataclasses.asdict(self)
        return json.dumps({**fields, CHECKSUM: _checksum(fields)}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        """Parses ``to_json``'s text (or a format 1 manifest, which has no checksum).

        Raises:
            ValueError: not a manifest, a checksum that does not match the fields, or a
                field missing, of the wrong type or out of bounds (named).
        """
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") not in FORMATS:
            raise ValueError(
                f"not a tfsift checkpoint manifest of format {FORMAT} (or 1). "
                f"Received: format={data.get('format') if isinstance(data, dict) else None!r}"
            )
        if data["format"] >= 2:
            _verify(data)
        try:
            return cls(
                step=_count(data["step"], "step", MAX_STEP),
                files=tuple(
                    FileEntry(
                        str(f["name"]),
                        str(f["sha256"]),
                        _count(f["bytes"], "bytes", MAX_STEP),
                        tuple(f["keys"]),
                    )
                    for f in data["files"]
                ),
                partitions=_count(data["partitions"], "partitions", MAX_DIM, least=1),
                replicas=_count(data["replicas"], "replicas", MAX_DIM, least=1),
                placement=str(data["placement"]),
                bounds=tuple(_count(b, "bounds", MAX_DIM) for b in data["bounds"]),
                stages=tuple(tuple(s) for s in data["stages"]),
                inputs=tuple(
                    (tuple(_count(d, "inputs", MAX_DIM) for d in shape), str(dtype))
                    for shape, dtype in data["inputs"]
                ),
                config=dict(data["config"]),
                tfsift_version=str(data["tfsift_version"]),
                format=int(data["format"]),
                optimizer=None if data.get("optimizer") is None else str(data["optimizer"]),
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


def _checksum(fields: dict[str, Any]) -> str:
    """The hex SHA-256 of ``fields`` as compact JSON with sorted keys: what a manifest's
    text parses back to, whatever its indentation."""
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _verify(data: dict[str, Any]) -> None:
    """Raises ValueError unless ``data`` (a parsed manifest) matches its own checksum."""
    fields = {k: v for k, v in data.items() if k != CHECKSUM}
    stored = data.get(CHECKSUM)
    if stored != _checksum(fields):
        raise ValueError(
            f"{MANIFEST} does not match its own sha256 checksum (damaged or edited). "
            f"Received: {CHECKSUM}={str(stored)[:12] + '...' if stored else None}"
        )


def _count(value: Any, field: str, most: int, least: int = 0) -> int:
    """``value`` if it is an int in ``[least, most]``; raises ValueError naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        raise ValueError(
            f"manifest field {field!r} must be an int from {least} to {most}. Received: {value!r}"[
                :200
            ]
        )
    return value

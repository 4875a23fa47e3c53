"""Checkpoint files and manifests: checksums, damage found and named, atomic replacement."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tfsift.checkpoint import files
from tfsift.checkpoint.manifest import (
    CHECKSUM,
    MANIFEST,
    Manifest,
    _checksum,
    problems,
    read,
    step_of,
)


def make(directory: Path, step: int = 3) -> Manifest:
    directory.mkdir(parents=True)
    entry = files.write_npz(directory / "weights-s0.npz", {"d1/kernel": np.arange(6.0)})
    manifest = Manifest(
        step, (entry,), 1, 1, "cluster", (0, 2), (("a", "b"),), (((4, 3), "float32"),), {}, "0"
    )
    files.write_text(directory / MANIFEST, manifest.to_json())
    return manifest


def test_a_manifest_round_trips_and_lists_every_file_with_its_checksum(tmp_path: Path) -> None:
    written = make(tmp_path / "ckpt-3")
    assert read(tmp_path / "ckpt-3") == written
    assert written.files[0].sha256 == files.sha256(tmp_path / "ckpt-3" / "weights-s0.npz")
    assert written.index("weights-") == {"d1/kernel": "weights-s0.npz"}
    assert problems(tmp_path / "ckpt-3") == []
    assert step_of(tmp_path / "ckpt-3") == 3 and step_of(tmp_path / ".ckpt-3.partial") is None


def flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-10])


@pytest.mark.parametrize(
    ("damage", "found"),
    [
        (flip, "weights-s0.npz does not match its sha256 checksum"),
        (truncate, "weights-s0.npz has"),
        (Path.unlink, "weights-s0.npz is missing"),
    ],
)
def test_a_flipped_byte_a_truncation_or_a_lost_file_is_found_and_named(
    tmp_path: Path, damage: object, found: str
) -> None:
    make(tmp_path / "ckpt-3")
    damage(tmp_path / "ckpt-3" / "weights-s0.npz")  # type: ignore[operator]
    (problem,) = problems(tmp_path / "ckpt-3")
    assert problem.startswith(found)


def test_a_missing_or_garbled_manifest_makes_the_checkpoint_incomplete(tmp_path: Path) -> None:
    make(tmp_path / "ckpt-3")
    (tmp_path / "ckpt-3" / MANIFEST).write_text('{"format": 1, "step": ')
    assert problems(tmp_path / "ckpt-3")[0].startswith(f"{MANIFEST} is unreadable")
    (tmp_path / "ckpt-3" / MANIFEST).unlink()
    assert problems(tmp_path / "ckpt-3") == [f"{MANIFEST} is missing"]


def edit(directory: Path, rehash: bool, **fields: object) -> None:
    """Changes ``fields`` of the manifest; with ``rehash`` its checksum follows them."""
    path = directory / MANIFEST
    data = json.loads(path.read_text())
    data.update(fields)
    data.pop(CHECKSUM)
    if rehash:
        data[CHECKSUM] = _checksum(data)
    path.write_text(json.dumps(data, indent=1))


def test_a_manifest_edited_or_damaged_fails_its_own_checksum(tmp_path: Path) -> None:
    make(tmp_path / "ckpt-3")
    assert json.loads((tmp_path / "ckpt-3" / MANIFEST).read_text())["format"] == 2
    edit(tmp_path / "ckpt-3", rehash=True)  # the same fields, another layout: still valid
    assert problems(tmp_path / "ckpt-3") == []
    edit(tmp_path / "ckpt-3", rehash=False, inputs=[[[10**12, 3], "float32"]])
    (problem,) = problems(tmp_path / "ckpt-3")
    assert problem.startswith(
        f"{MANIFEST} is unreadable: {MANIFEST} does not match its own sha256 checksum "
        "(damaged or edited). Received: sha256="
    )


@pytest.mark.parametrize(
    ("fields", "found"),
    [
        ({"step": 10**30}, f"'step' must be an int from 0 to {2**63 - 1}. Received: {10**30}"),
        ({"step": -1}, "'step' must be an int from 0 to"),
        ({"step": "3"}, "'step' must be an int from 0 to"),
        ({"inputs": [[[10**12, 3], "float32"]]}, "'inputs' must be an int from 0 to 2147483647"),
        ({"partitions": 0}, "'partitions' must be an int from 1 to"),
    ],
)
def test_a_manifest_whose_numbers_no_save_writes_is_refused(
    tmp_path: Path, fields: dict[str, object], found: str
) -> None:
    make(tmp_path / "ckpt-3")
    edit(tmp_path / "ckpt-3", rehash=True, **fields)
    (problem,) = problems(tmp_path / "ckpt-3")
    assert problem.startswith(f"{MANIFEST} is unreadable: manifest field {found}")


def test_a_manifest_of_format_1_without_a_checksum_is_still_read(tmp_path: Path) -> None:
    written = make(tmp_path / "ckpt-3")
    edit(tmp_path / "ckpt-3", rehash=False, format=1)
    assert problems(tmp_path / "ckpt-3") == []
    assert read(tmp_path / "ckpt-3").files == written.files


def test_publish_replaces_an_older_directory_of_the_same_name(tmp_path: Path) -> None:
    make(tmp_path / "ckpt-3")
    new = tmp_path / ".ckpt-3.partial"
    new.mkdir()
    (new / "marker").write_text("new")
    files.publish(new, tmp_path / "ckpt-3")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-3"]
    assert (tmp_path / "ckpt-3" / "marker").read_text() == "new"

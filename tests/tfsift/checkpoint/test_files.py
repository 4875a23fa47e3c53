"""Checkpoint files and manifests: checksums, damage found and named, atomic replacement."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tfsift.checkpoint import files
from tfsift.checkpoint.manifest import MANIFEST, Manifest, problems, read, step_of


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


def test_publish_replaces_an_older_directory_of_the_same_name(tmp_path: Path) -> None:
    make(tmp_path / "ckpt-3")
    new = tmp_path / ".ckpt-3.partial"
    new.mkdir()
    (new / "marker").write_text("new")
    files.publish(new, tmp_path / "ckpt-3")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-3"]
    assert (tmp_path / "ckpt-3" / "marker").read_text() == "new"

"""Checkpoints across simulated hosts: a directory each host has of its own is refused at
the first save on every rank (a shared one saves and resumes: tests/tfsift/parallel/
test_network.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

import mpi

pytestmark = [pytest.mark.mpi, pytest.mark.hosts, pytest.mark.xdist_group("simhosts")]


def test_a_directory_that_each_host_has_of_its_own_fails_the_first_save(
    two_hosts: int, tmp_path: Path
) -> None:
    private = tmp_path / "local-disk"  # a tmpfs of its own there on each host
    proc = mpi.run(
        2, "checkpoint_train.py", str(private), "2", "4", "2",
        timeout=120, hosts=two_hosts, env={"TFSIFT_SIMHOSTS_PRIVATE": str(private)},
    )  # fmt: skip
    assert proc.returncode != 0
    message = (
        f"checkpoint directory {private} is not shared by every rank: rank 1 (host tfsift-h2) "
        "cannot see the file rank 0 (host tfsift-h1) wrote there, so each host would hold "
        "only a part of every checkpoint and none could restore it. Use a directory that "
        "every host mounts at the same path (NFS or a cluster filesystem); nothing was saved"
    )
    assert message in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]
    assert "saved checkpoint" not in proc.stdout + proc.stderr
    # below each host's tmpfs, the directory this process sees got nothing either
    assert list(private.iterdir()) == []

"""Ranks decide together: one rank's failure is raised, naming it, on every rank."""

from __future__ import annotations

import errno
from typing import Any

import pytest

from tfsift.checkpoint.collective import on_root, together
from tfsift.checkpoint.files import CheckpointError


class TwoRanks:
    """This process as rank ``rank`` of two; the other rank's outcome is ``theirs``."""

    def __init__(self, rank: int, theirs: Any) -> None:
        self.rank, self.theirs = rank, theirs

    def Get_rank(self) -> int:
        return self.rank

    def Get_size(self) -> int:
        return 2

    def bcast(self, value: Any, root: int) -> Any:
        return value if self.rank == root else self.theirs

    def allgather(self, value: Any) -> list[Any]:
        return [value, self.theirs] if self.rank == 0 else [self.theirs, value]


def full_disk() -> None:
    raise OSError(errno.ENOSPC, "No space left on device", "weights-s1.npz")


def test_a_failure_on_another_rank_is_raised_here_naming_that_rank() -> None:
    theirs = ("error", "CheckpointError", "rank 1: [Errno 28] No space left on device")
    with pytest.raises(CheckpointError, match=r"rank 1: \[Errno 28\]"):
        together(TwoRanks(0, theirs), lambda: 5)


def test_every_rank_sees_rank_0s_result_or_its_error() -> None:
    assert on_root(TwoRanks(1, ("ok", "ckpt-4", "")), lambda: "unused") == "ckpt-4"
    with pytest.raises(ValueError, match="rank 0: bad"):
        on_root(TwoRanks(1, ("error", "ValueError", "rank 0: bad")), lambda: None)


def test_an_os_error_becomes_a_checkpoint_error_with_the_local_one_as_cause() -> None:
    with pytest.raises(CheckpointError, match=r"rank 0: .*No space left") as info:
        together(TwoRanks(0, ("ok", None, "")), full_disk)
    assert isinstance(info.value.__cause__, OSError)
    assert isinstance(info.value, OSError)


def test_a_directory_some_ranks_cannot_see_is_named_with_their_hosts() -> None:
    from pathlib import Path

    from tfsift.checkpoint import shared

    everyone = [(True, "a"), (True, "a"), (False, "b"), (False, "c")]
    assert shared._message(Path("/ckpt"), everyone, [2, 3]) == (
        "checkpoint directory /ckpt is not shared by every rank: ranks 2, 3 (hosts b, c) "
        "cannot see the file rank 0 (host a) wrote there, so each host would hold only a part "
        "of every checkpoint and none could restore it. Use a directory that every host mounts "
        "at the same path (NFS or a cluster filesystem); nothing was saved"
    )


def test_one_rank_has_nothing_to_check(tmp_path: Any) -> None:
    from tfsift.checkpoint import shared

    class One:
        def Get_size(self) -> int:
            return 1

    shared.check(One(), tmp_path / "never-made")
    assert not (tmp_path / "never-made").exists()

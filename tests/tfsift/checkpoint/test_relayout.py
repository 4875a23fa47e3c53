"""``tfsift.checkpoint.relayout``: which saved rank states a rank of another layout reads."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from tfsift.checkpoint import codec, relayout


class SavedStates:
    """A checkpoint's rank state files, by name, as ``Checkpoint.arrays`` gives them."""

    def __init__(self, replicas: int, kind: str | None = "rows") -> None:
        self.read: list[str] = []
        self.files = {
            f"state-r{r}-s{s}.npz": codec.pack({"variables": {}, "random": None, "sift": (
                None if kind is None else {
                    "kind": kind, "position": 7, "rows": 64,
                    "recorder": {"keys": np.array([float(r)]), "losses": np.array([0.5]),
                                 "epochs": np.array([1.0]), "yielded": None},
                    "metrics": {"samples_kept": 10 * (r + 1)}})})
            for r in range(replicas) for s in range(2)
        }  # fmt: skip

    def arrays(self, name: str) -> Any:
        self.read.append(name)
        return self.files[name]


def rank(replicas: int, replica: int) -> Any:
    return SimpleNamespace(topology=SimpleNamespace(replicas=replicas), replica=replica)


def test_a_rank_of_fewer_replicas_reads_stage_0_of_the_replicas_it_takes_over() -> None:
    saved = SavedStates(4)
    state = relayout.sift_state(saved, 4, rank(2, 1))  # type: ignore[arg-type]
    assert state is not None
    assert state["recorder"]["keys"].tolist() == [1.0, 3.0]  # old replicas 1 and 3
    assert state["metrics"]["samples_kept"] == 20 + 40 and state["position"] == 7
    assert saved.read == ["state-r0-s0.npz", "state-r1-s0.npz", "state-r3-s0.npz"]


def test_nothing_carries_without_a_dataset_sifted_by_row() -> None:
    for kind in (None, "stream"):
        assert relayout.sift_state(SavedStates(2, kind), 2, rank(1, 0)) is None  # type: ignore[arg-type]

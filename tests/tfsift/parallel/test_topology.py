"""Rank layouts: cluster keeps a pipeline on adjacent ranks, spread puts its stages far apart."""

from __future__ import annotations

import pytest

from tfsift.parallel.topology import Topology


def test_cluster_puts_each_pipeline_on_adjacent_ranks() -> None:
    t = Topology(8, 2, "cluster")
    assert [t.pipeline(r) for r in range(4)] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert [t.dp_group(s) for s in range(2)] == [(0, 2, 4, 6), (1, 3, 5, 7)]


def test_spread_puts_the_stages_of_a_pipeline_far_apart() -> None:
    t = Topology(8, 2, "spread")
    assert [t.pipeline(r) for r in range(4)] == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert [t.dp_group(s) for s in range(2)] == [(0, 1, 2, 3), (4, 5, 6, 7)]


@pytest.mark.parametrize("placement", ["cluster", "spread"])
@pytest.mark.parametrize(("size", "K"), [(1, 1), (4, 1), (4, 2), (4, 4), (12, 3)])
def test_every_rank_is_exactly_one_stage_of_one_replica(placement: str, size: int, K: int) -> None:
    t = Topology(size, K, placement)
    seen = sorted(t.rank(t.stage(r), t.replica(r)) for r in range(size))
    assert seen == list(range(size))
    assert {t.stage(r) for r in range(size)} == set(range(K))
    assert t.replicas == size // K


def test_world_size_must_be_divisible_by_partitions() -> None:
    with pytest.raises(ValueError) as err:
        Topology(3, 2)
    assert str(err.value) == (
        "world size 3 is not divisible by partitions=2; launch a multiple of 2 processes, e.g. "
        "mpirun -np 2 python train.py, horovodrun -np 2 -H localhost:2 python train.py or "
        "tfsift run -np 2 train.py"
    )
    with pytest.raises(ValueError, match=r"e\.g\. mpirun -np 6 python train\.py"):
        Topology(7, 3)  # the launch nearest below


def test_rank_out_of_range_is_named() -> None:
    with pytest.raises(ValueError, match=r"rank must be in \[0, 4\). Received: rank=4"):
        Topology(4, 2).stage(4)


def test_too_few_processes_suggest_a_launcher() -> None:
    with pytest.raises(ValueError) as err:
        Topology(1, 2)
    assert str(err.value) == (
        "world size 1 is not divisible by partitions=2; launch 2 or a multiple of 2 "
        "processes, e.g. mpirun -np 2 python train.py, horovodrun -np 2 -H localhost:2 python "
        "train.py or tfsift run -np 2 train.py"
    )

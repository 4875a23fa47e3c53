"""Pipelined gradients equal one-process gradients, for every K and each pair of model, M,
schedule and optimize mode."""

from __future__ import annotations

import itertools
from collections.abc import Collection
from typing import Any

import pytest

import mpi

pytestmark = pytest.mark.slow
MODELS = "conv,skip,dropout,ops"
VARIABLES = {"conv": 6, "skip": 8, "dropout": 6, "ops": 6}
# the grid: every model, M in 1, 2, 4, both schedules and modes, compiled, half the grid
GRID = (MODELS, "1,2,4", "simple,interleaved", "speed,memory", "true", "pairs")
# K=1 is one process (a one-rank mpirun): it runs with the one-process tests, on both cores;
# K=2 and 4 run in the jobs the other tests of as many stages share. At K=4, M=1 is left
# out: a batch that never splits runs the stages one after another, as K=2's M=1 does
MICROBATCHES = {1: [1, 2, 4], 2: [1, 2, 4], 4: [2, 4]}
GRID_ON = {
    2: mpi.TWO_STAGES.scenario("pipeline_check.py", "2", *GRID, timeout=900),
    4: mpi.FOUR_STAGES.scenario("pipeline_check.py", "4", MODELS, "2,4", *GRID[2:], timeout=900),
}
ON_RANKS = [
    pytest.param(1),
    pytest.param(2, marks=[pytest.mark.mpi, mpi.TWO_STAGES.mark]),
    pytest.param(4, marks=[pytest.mark.mpi, mpi.FOUR_STAGES.mark]),
]
# @tfsift.step(compile=False) on two models: each pair of schedule and mode values once
EAGER_HEAD = mpi.TWO_STAGES.scenario(
    "pipeline_check.py", "2", "skip,dropout", "2", "simple,interleaved", "speed,memory",
    "false", "pairs", timeout=600,
)  # fmt: skip


# the zero-bubble schedule (B and W apart on every stage but 0, where optimize="speed"):
# each model with M in 2, 4, 8 and both modes, each pair of those once; an eager head once
ZERO_BUBBLE = {
    2: mpi.TWO_STAGES.scenario(
        "pipeline_check.py", "2", MODELS, "2,4,8", "zero_bubble", "speed,memory", "true",
        "pairs", timeout=600,
    ),
    # with room for ZB-H1's deferral (stage s defers s W's); on 2 stages the plan's fit
    4: mpi.FOUR_STAGES.scenario(
        "pipeline_check.py", "4", "skip,dropout", "2,4,8", "zero_bubble@1GB", "speed,memory",
        "true", "pairs", timeout=600,
    ),
}  # fmt: skip
ZERO_BUBBLE_EAGER = mpi.TWO_STAGES.scenario(
    "pipeline_check.py", "2", "dropout", "4", "zero_bubble", "speed", "false", timeout=300
)
# virtual stages (Megatron-LM's interleaved 1F1B): each stage runs 2 chunks of the models
# with 4 nodes or more on 2 stages (conv, skip, dropout), of the one with 8 or more on 4
VIRTUAL = {
    2: mpi.TWO_STAGES.scenario(
        "pipeline_check.py", "2", "conv,skip,dropout", "2,4,8", "interleaved/2", "speed,memory",
        "true", "pairs", timeout=600,
    ),
    4: mpi.FOUR_STAGES.scenario(
        "pipeline_check.py", "4", "ops", "4,8", "interleaved/2", "speed,memory", "true",
        timeout=600,
    ),
}  # fmt: skip
# pipeline="auto": rank 0's plan picks the schedule, and every stage runs that one
AUTO = mpi.TWO_STAGES.scenario("pipeline_check.py", "2", "skip", "8", "auto", "speed")


def assert_every_pair(configs: Collection[tuple[Any, ...]], *values: list[Any]) -> None:
    """Each pair of columns of ``configs`` holds every pair of those columns' ``values``."""
    for a, b in itertools.combinations(range(len(values)), 2):
        pairs = {(c[a], c[b]) for c in configs}
        assert pairs == set(itertools.product(values[a], values[b])), (a, b, sorted(configs))


@pytest.mark.parametrize("K", ON_RANKS)
def test_gradients_and_loss_match_a_single_process_run(K: int) -> None:
    got = (
        GRID_ON[K]()
        if K > 1
        else mpi.reports(mpi.run(1, "pipeline_check.py", "1", *GRID, timeout=900))
    )
    assert sorted(got) == list(range(K))
    for rank, data in got.items():
        # half the grid: each model with every pair of (M, pipeline, optimize) values, each
        # triple on two models
        configs = [(r["model"], r["M"], r["pipeline"], r["optimize"]) for r in data["results"]]
        Ms = MICROBATCHES[K]
        assert len(configs) == len(set(configs)) == 4 * len(Ms) * 2 * 2 // 2
        values = (Ms, ["simple", "interleaved"], ["speed", "memory"])
        for model in MODELS.split(","):
            assert_every_pair([c[1:] for c in configs if c[0] == model], *values)
        assert {c[1:] for c in configs} == set(itertools.product(*values))
        for r in data["results"]:
            label = f"rank {rank} {r['model']} K={K} M={r['M']} {r['pipeline']} {r['optimize']}"
            assert r["grad_error"] < 1e-5, label
            assert abs(r["loss"] - r["ref_loss"]) <= 1e-5 * abs(r["ref_loss"]), label
            assert r["pred_shape"] == [8, 10], label
            assert r["stage"] == rank, label
            if rank == K - 1:  # the probe, then only traces of the compiled head: not 2 steps x M
                assert r["body_calls"] < 1 + 2 * r["M"], label
            assert r["only_stage_weights_kept"], label
    for i, first in enumerate(got[0]["results"]):
        per_rank = [got[rank]["results"][i]["num_grads"] for rank in range(K)]
        # each variable lives on exactly one stage (the solver may leave a stage without any,
        # e.g. a lone reshape when profiling finds it slow)
        assert sum(per_rank) == VARIABLES[first["model"]], first


@pytest.mark.mpi
@pytest.mark.parametrize(
    "K",
    [
        pytest.param(2, marks=mpi.TWO_STAGES.mark),
        pytest.param(4, marks=mpi.FOUR_STAGES.mark),
    ],
)
def test_the_zero_bubble_schedule_matches_a_single_process_run(K: int) -> None:
    got = ZERO_BUBBLE[K]()
    eager = ZERO_BUBBLE_EAGER() if K == 2 else {rank: {"results": []} for rank in got}
    assert sorted(got) == list(range(K))
    seen: set[tuple[int, ...]] = set()
    for rank, data in got.items():
        configs = {(r["model"], r["M"], r["optimize"]) for r in data["results"]}
        models = sorted({c[0] for c in configs})
        assert_every_pair(configs, models, [2, 4, 8], ["speed", "memory"])
        assert [r["compile"] for r in eager[rank]["results"]] == [False] * (K == 2)
        for r in data["results"] + eager[rank]["results"]:
            label = f"rank {rank} {r['model']} K={K} M={r['M']} {r['optimize']} {r['compile']}"
            assert r["planned"] == "zero_bubble", label
            # speed keeps tapes, so every stage but 0 splits its backward into B and W;
            # memory recomputes, and runs its backwards whole (as 1F1B), deferring nothing
            assert r["recompute"] == (r["optimize"] == "memory"), label
            if r["optimize"] == "memory":
                assert r["deferred"] == [0] * K, label
            elif K == 4:
                assert r["deferred"] == [0, 1, 2, 3], label  # ZB-H1's, in a roomy cap
            else:
                seen.add(tuple(r["deferred"]))
            assert r["grad_error"] < 1e-5, label
            assert abs(r["loss"] - r["ref_loss"]) <= 1e-5 * abs(r["ref_loss"]), label
            assert r["stage"] == rank, label
    # the plan's fit in 1F1B's peak: ZB-H1's (0, 1) where stage 1 has room (skip, dropout,
    # ops), none where its weights make it the largest already (conv, when its dense layers
    # are on stage 1, the cut every run has chosen so far): both orders of a split stage run
    if K == 2:
        assert (0, 1) in seen and seen <= {(0, 0), (0, 1)}, seen


@pytest.mark.mpi
@pytest.mark.parametrize(
    "K",
    [
        pytest.param(2, marks=mpi.TWO_STAGES.mark),
        pytest.param(4, marks=mpi.FOUR_STAGES.mark),
    ],
)
def test_virtual_stages_match_a_single_process_run(K: int) -> None:
    got = VIRTUAL[K]()
    assert sorted(got) == list(range(K))
    models = {2: ["conv", "dropout", "skip"], 4: ["ops"]}[K]
    for rank, data in got.items():
        configs = {(r["model"], r["M"], r["optimize"]) for r in data["results"]}
        if K == 2:
            assert_every_pair(configs, models, [2, 4, 8], ["speed", "memory"])
        else:
            assert configs == {("ops", M, o) for M in (4, 8) for o in ("speed", "memory")}
        for r in data["results"]:
            label = f"rank {rank} {r['model']} K={K} M={r['M']} {r['optimize']}"
            assert (r["pipeline"], r["planned"], r["virtual"]) == (
                "interleaved/2", "interleaved", 2
            ), label  # fmt: skip
            assert r["chunks"] == [rank, rank + K], label  # chunks s and s + K
            assert r["summary_title"].endswith(
                f"partitions={K}; this rank holds stage {rank} (virtual_stages=2: chunks "
                f"{rank}, {rank + K})"
            ), label
            assert r["grad_error"] < 1e-5, label
            assert abs(r["loss"] - r["ref_loss"]) <= 1e-5 * abs(r["ref_loss"]), label
            assert r["pred_shape"] == [8, 10], label
            assert r["only_stage_weights_kept"], label
            if rank == K - 1:  # the probe, then only traces of the compiled head
                assert r["body_calls"] < 1 + 2 * r["M"], label
    for i, first in enumerate(got[0]["results"]):
        # each variable on exactly one stage, whichever of its chunks holds it
        assert (
            sum(got[rank]["results"][i]["num_grads"] for rank in range(K))
            == (VARIABLES[first["model"]])
        ), first


@pytest.mark.mpi
@mpi.TWO_STAGES.mark
def test_auto_runs_the_schedule_rank_0_planned_on_every_stage() -> None:
    got = AUTO()
    [planned] = {(r["planned"], r["virtual"]) for data in got.values() for r in data["results"]}
    # skip has 6 nodes: 2 x 2 chunks fit, 2 x 4 do not
    assert planned in {("simple", 1), ("interleaved", 1), ("zero_bubble", 1), ("interleaved", 2)}
    for rank, data in got.items():
        [r] = data["results"]
        assert r["pipeline"] == "auto", rank
        assert r["grad_error"] < 1e-5, (rank, r)
        assert abs(r["loss"] - r["ref_loss"]) <= 1e-5 * abs(r["ref_loss"]), (rank, r)


@pytest.mark.mpi
@pytest.mark.hosts
@pytest.mark.xdist_group("simhosts")
def test_four_stages_on_two_hosts_match_with_the_middle_cut_between_them(two_hosts: int) -> None:
    # ranks 0, 1 on one simulated host, 2, 3 on the other: the activations and gradients
    # between stages 1 and 2 go over TCP between the hosts
    got = mpi.reports(
        mpi.run(4, "pipeline_check.py", "4", "conv,skip", "2,4", "simple,interleaved", "speed",
                "true", "pairs", timeout=600, hosts=two_hosts)
    )  # fmt: skip
    assert [got[rank]["host"] for rank in range(4)] == ["tfsift-h1"] * 2 + ["tfsift-h2"] * 2
    for rank, data in got.items():
        # each pair of model, M and schedule values once
        configs = {(r["model"], r["M"], r["pipeline"]) for r in data["results"]}
        assert len(configs) == len(data["results"]) == 2 * 2 * 2 // 2
        assert_every_pair(configs, ["conv", "skip"], [2, 4], ["simple", "interleaved"])
        for r in data["results"]:
            label = f"rank {rank} {r['model']} M={r['M']} {r['pipeline']}"
            assert r["grad_error"] < 1e-5, label
            assert abs(r["loss"] - r["ref_loss"]) <= 1e-5 * abs(r["ref_loss"]), label
            assert r["stage"] == rank, label
    for i, first in enumerate(got[0]["results"]):
        assert (
            sum(got[rank]["results"][i]["num_grads"] for rank in range(4))
            == VARIABLES[first["model"]]
        )


@pytest.mark.mpi
@mpi.TWO_STAGES.mark
def test_an_eager_head_matches_too() -> None:
    """@tfsift.step(compile=False): the last stage runs the step function without tf.function."""
    got = EAGER_HEAD()
    for rank, data in got.items():
        # each pair of model, schedule and mode values once
        configs = {(r["model"], r["pipeline"], r["optimize"]) for r in data["results"]}
        assert len(configs) == len(data["results"]) == 2 * 2 * 2 // 2
        assert_every_pair(configs, ["skip", "dropout"], ["simple", "interleaved"],
                          ["speed", "memory"])  # fmt: skip
        for r in data["results"]:
            label = f"rank {rank} {r['model']} {r['pipeline']} {r['optimize']}"
            assert r["compile"] is False, label
            if rank == 1:  # the probe, then every microbatch of the 2 steps, eagerly
                assert r["body_calls"] == 1 + 2 * 2, label
            assert r["grad_error"] < 1e-5, label
            assert abs(r["loss"] - r["ref_loss"]) <= 1e-5 * abs(r["ref_loss"]), label


@pytest.mark.mpi
@pytest.mark.parametrize("mode", ["unseeded", "shard"])
def test_stages_fed_different_batches_fail_with_the_reason(mode: str) -> None:
    proc = mpi.run(2, "mismatch_check.py", mode, timeout=120)
    assert proc.returncode != 0
    assert "stage 1 was given other data than stage 0 for microbatch 0 of this step" in (
        proc.stderr + proc.stdout
    )

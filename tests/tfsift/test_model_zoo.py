"""Realistic models pipelined on 2 stages (both schedules, both modes) equal one process.

ResNet-style CNN with BatchNormalization (moving statistics compared too), a transformer
encoder block, attention over padded (masked) time steps, custom layers owning
sub-layers, GRU + LSTM, a keras.Sequential block with dropout, and tied weights (one
layer called at two depths, on one stage or on two: each holder's gradients are the
whole model's). Multi-input and multi-output models: tests/tfsift/test_multi_io.py; a
tied embedding trained for many steps: tests/tfsift/test_big_models.py.
"""

from __future__ import annotations

import pytest

import mpi

pytestmark = [pytest.mark.mpi, pytest.mark.slow]
MODELS = "resnet_bn,encoder,masked,custom,recurrent,sequential,shared"
# half the grid: each model with both schedules and both modes, each (schedule, mode) pair on
# three models (tests/mpi_scripts/models.py: grid)
ON_TWO_STAGES = mpi.TWO_STAGES.scenario(
    "zoo_check.py", "2", MODELS, "simple,interleaved", "speed,memory", "pairs", timeout=600
)
# each model in one mode, each mode on two models (both modes of each: on two stages)
ON_FOUR_STAGES = mpi.FOUR_STAGES.scenario(
    "zoo_check.py", "4", "resnet_bn,encoder,custom,recurrent", "interleaved", "speed,memory",
    "pairs", timeout=600,
)  # fmt: skip


# virtual stages: 2 chunks a stage, for the models of 4 nodes or more (2 x 2 chunks) and of
# 8 or more (4 x 2), both modes; the tied layer's calls fall on one stage (one copy, its
# chunks' gradients added) or on two (a copy each, exchanged), as the solver cuts it
VIRTUAL_MODELS = "resnet_bn,encoder,custom,recurrent,shared"
VIRTUAL = {
    2: mpi.TWO_STAGES.scenario(
        "zoo_check.py", "2", VIRTUAL_MODELS, "interleaved/2", "speed,memory", "pairs",
        timeout=600,
    ),  # each model in one mode, the modes alternating (models.grid)
    4: mpi.FOUR_STAGES.scenario(
        "zoo_check.py", "4", "resnet_bn,encoder", "interleaved/2", "speed,memory", "all",
        timeout=600,
    ),
}  # fmt: skip


@pytest.mark.parametrize(
    "K",
    [
        pytest.param(2, marks=mpi.TWO_STAGES.mark),
        pytest.param(4, marks=mpi.FOUR_STAGES.mark),
    ],
)
def test_model_zoo_on_virtual_stages_matches_too(K: int) -> None:
    reports = VIRTUAL[K]()
    models = {2: VIRTUAL_MODELS, 4: "resnet_bn,encoder"}[K].split(",")
    assert sorted(reports) == list(range(K))
    own: dict[tuple[str, str], int] = {}
    for rank, rep in reports.items():
        configs = sorted((r["model"], r["config"]) for r in rep["results"])
        modes = {
            m: ("speed", "memory") if K == 4 else (("speed", "memory")[i % 2],)
            for i, m in enumerate(models)
        }
        assert configs == sorted((m, f"K={K} interleaved/2 {o}") for m in models for o in modes[m])
        for result in rep["results"]:
            assert "error" not in result, (rank, result)
            assert result["chunks"] == [rank, rank + K], (rank, result)
            assert result["grad_error"] < 1e-5, (rank, result)
            assert result["state_error"] < 1e-5, (rank, result)
            assert result["loss"] == pytest.approx(result["ref_loss"], rel=1e-5)
            key = (result["model"], result["config"])
            own[key] = own.get(key, 0) + result["num_grads"] - result["copies"]
            # a tie joins stages, never the two chunks of one stage
            assert all(len(set(g)) == len(g) > 1 for g in result["tied_stages"]), result
    totals = {r["model"]: r["total_grads"] for rep in reports.values() for r in rep["results"]}
    for (model, _), count in own.items():
        assert count == totals[model]  # the stages' variables partition the model's


# the zero-bubble schedule, which splits stage 1's backward node by node into B and W: on
# the models whose layers it splits apart from the chain's (BatchNorm's statistics,
# attention, a recurrent cell, a tied layer)
ZERO_BUBBLE_MODELS = "resnet_bn,encoder,masked,recurrent,shared"
ZERO_BUBBLE = mpi.TWO_STAGES.scenario(
    "zoo_check.py", "2", ZERO_BUBBLE_MODELS, "zero_bubble", "speed", "all", timeout=600
)


@mpi.TWO_STAGES.mark
def test_model_zoo_on_the_zero_bubble_schedule_matches_too() -> None:
    reports = ZERO_BUBBLE()
    assert len(reports) == 2
    for rank, rep in reports.items():
        assert sorted(r["model"] for r in rep["results"]) == sorted(ZERO_BUBBLE_MODELS.split(","))
        for result in rep["results"]:
            assert "error" not in result, (rank, result)
            assert result["config"] == "K=2 zero_bubble speed", (rank, result)
            assert result["grad_error"] < 1e-5, (rank, result)
            assert result["state_error"] < 1e-5, (rank, result)
            assert result["loss"] == pytest.approx(result["ref_loss"], rel=1e-5)


@mpi.TWO_STAGES.mark
def test_model_zoo_on_two_stages_matches_the_whole_model_run_per_microbatch() -> None:
    reports = ON_TWO_STAGES()
    assert len(reports) == 2
    checked = 0
    for rank, rep in reports.items():
        configs = [(r["model"], r["config"]) for r in rep["results"]]
        assert len(set(configs)) == len(configs) == len(MODELS.split(",")) * 2, configs
        for model in MODELS.split(","):
            words = {w for m, c in configs if m == model for w in c.split()[1:]}
            assert words == {"simple", "interleaved", "speed", "memory"}, (model, configs)
        for result in rep["results"]:
            assert "error" not in result, (rank, result)
            if result["model"] == "sequential":  # the block's layers, not the block
                assert {"Dense", "Dropout"} <= set(result["layers"]), result
                assert "Sequential" not in result["layers"], result
            checked += 1
            assert result["grad_error"] < 1e-5, (rank, result)
            assert result["state_error"] < 1e-5, (rank, result)
            assert result["loss"] == pytest.approx(result["ref_loss"], rel=1e-5)
    # every model in each of its configurations, on both ranks
    assert checked == 2 * len(MODELS.split(",")) * 2
    by_config: dict[tuple[str, str], int] = {}
    for rep in reports.values():
        for result in rep["results"]:
            key = (result["model"], result["config"])
            # a stage holding a copy of a tied layer reports its gradients too
            own = result["num_grads"] - result["copies"]
            by_config[key] = by_config.get(key, 0) + own
    totals = {r["model"]: r["total_grads"] for rep in reports.values() for r in rep["results"]}
    for (model, _), count in by_config.items():
        assert count == totals[model]  # the stages' variables partition the model's


@mpi.FOUR_STAGES.mark
def test_the_models_that_split_into_four_stages_match_too() -> None:
    reports = ON_FOUR_STAGES()
    assert len(reports) == 4
    for rank, rep in reports.items():
        configs = sorted((r["model"], r["config"]) for r in rep["results"])
        assert [m for m, _ in configs] == ["custom", "encoder", "recurrent", "resnet_bn"]
        assert sorted(c.split()[-1] for _, c in configs) == ["memory", "memory", "speed", "speed"]
        for result in rep["results"]:
            assert "error" not in result, (rank, result)
            assert result["grad_error"] < 1e-5, (rank, result)
            assert result["state_error"] < 1e-5, (rank, result)
            assert result["loss"] == pytest.approx(result["ref_loss"], rel=1e-5)

"""Stage bounds: the call guard, manual placement, rank 0's plan (logged, reused, re-solved)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import keras
import pytest
import tensorflow as tf

import tfsift
from partitioner.costs import format_bytes
from partitioner.experimental.scoring import sifted_step_time
from partitioner.plan import Plan
from partitioner.simulator import simulate_plan
from tfsift.config import Config
from tfsift.hooks import Reservation
from tfsift.planning import bounds as bounds_module
from tfsift.planning.bounds import (
    describe,
    ignored_placements,
    manual_bounds,
    plan_differences,
    rank0_bounds,
    weights,
)
from tfsift.planning.graph import Graph, trace
from tfsift.planning.profiler import profile


class Placed(tfsift.DistributedModel):
    def __init__(self, stages: tuple[int, int, int]) -> None:
        super().__init__()
        with tfsift.partition(stages[0]):
            self.a = keras.layers.Dense(4)
        with tfsift.partition(stages[1]):
            self.b = keras.layers.Dense(4)
        with tfsift.partition(stages[2]):
            self.c = keras.layers.Dense(2)

    def call(self, x: Any) -> Any:
        return self.c(keras.ops.relu(self.b(self.a(x))))


def bounds(stages: tuple[int, int, int], K: int) -> tuple[int, ...]:
    model = Placed(stages)
    graph = trace(model, [tf.zeros((2, 3))])
    return manual_bounds(graph, model._tfsift.placements, K, 0)


def test_calling_the_model_outside_a_step_is_an_error() -> None:
    with pytest.raises(RuntimeError) as err:
        Placed((0, 0, 0))(tf.zeros((2, 3)))
    assert "can only be called inside a @tfsift.step function" in str(err.value)


def test_manual_placement_sets_stage_bounds_and_ops_follow_the_layer_before() -> None:
    # nodes: a, b, relu, c -- relu stays with b
    assert bounds((0, 1, 1), 2) == (0, 1, 4)
    assert bounds((0, 0, 1), 2) == (0, 3, 4)


def test_manual_placement_out_of_call_order_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"is called after a layer of partition 1"):
        bounds((1, 0, 1), 2)


def test_manual_placement_with_an_empty_partition_is_rejected() -> None:
    with pytest.raises(ValueError) as err:
        bounds((0, 0, 0), 3)
    assert str(err.value) == (
        "every partition needs at least one layer. Received: no layers in partitions [1, 2]"
    )


def test_placements_the_solver_ignores_are_named_in_a_warning() -> None:
    # a script written for manual placement without auto_partition=False: the blocks used
    # to be ignored without a word
    model = Placed((0, 1, 1))
    graph = trace(model, [tf.zeros((2, 3))])
    auto, manual = (Config.from_dict({"partitions": 2, "auto_partition": a}) for a in (True, False))
    names = [gn.name for gn in graph.nodes if isinstance(gn.operation, keras.layers.Layer)]
    assert ignored_placements(graph, model._tfsift.placements, auto) == (
        f"tfsift.partition blocks placed 3 layers ({names[0]!r} in partition 0, {names[1]!r} "
        f"in partition 1, {names[2]!r} in partition 1), but auto_partition is True: the solver "
        'cuts the model and the blocks are ignored; set "auto_partition": False to place the '
        "layers by hand"
    )
    assert ignored_placements(graph, model._tfsift.placements, manual) == ""
    assert ignored_placements(graph, {}, auto) == ""  # no blocks: nothing to say


def test_the_first_step_warns_of_the_placements_it_ignores(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tfsift.init({})  # auto_partition=True
    model = Placed((0, 0, 0))

    @tfsift.step
    def forward(x: Any) -> Any:
        return model(x)

    with caplog.at_level(logging.WARNING, logger="tfsift"):
        forward(tf.zeros((2, 3)))
    [(level, text)] = messages(caplog)
    assert level == "WARNING" and text.startswith("tfsift.partition blocks placed 3 layers (")


def test_partition_index_must_be_a_non_negative_int() -> None:
    with pytest.raises(ValueError, match=r"Received: -1"):
        with tfsift.partition(-1):
            pass


def traced(units: int = 4) -> Graph:
    class Chain(tfsift.DistributedModel):
        def __init__(self) -> None:
            super().__init__()
            self.a = keras.layers.Dense(units, name="first")
            self.b = keras.layers.Dense(units, name="middle")
            self.c = keras.layers.Dense(2, name="last")

        def call(self, x: Any) -> Any:
            return self.c(keras.ops.relu(self.b(self.a(x))))

    return trace(Chain(), [tf.zeros((2, 3))])


def config(tmp_path: Path, **changes: Any) -> Config:
    """A 2-stage config; its pipeline is 1F1B's unless ``changes`` say otherwise (the
    default, "auto", may choose another where the profile's noise favours it)."""
    values = {"partitions": 2, "microbatches": 2, "profile_repeats": 1, "pipeline": "interleaved",
              "plan_file": str(tmp_path / "plan.json"), **changes}  # fmt: skip
    return Config.from_dict({key: value for key, value in values.items() if value is not None})


@pytest.fixture(autouse=True)
def pipelining_pays(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """These tiny chains never pay for a pipeline: the warning that says so is tested on
    its own (test_rank0_warns_...), the other tests read the messages without it."""
    if "warns" not in request.node.name:
        monkeypatch.setattr("tfsift.planning.bounds.no_gain", lambda *args: "")


def messages(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "tfsift"]


def test_rank0_says_it_profiles_then_prints_the_plan_and_writes_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = config(tmp_path)
    with caplog.at_level(logging.INFO, logger="tfsift"):
        bounds, recompute, pipeline, _, _ = rank0_bounds(traced(), [tf.zeros((1, 3))], cfg)
    plan = Plan.load(tmp_path / "plan.json")
    assert (bounds, recompute, pipeline) == (plan.bounds, plan.recompute, "interleaved")
    [profiling, described, wrote] = messages(caplog)
    assert profiling == ("INFO", "profiling 4 nodes on rank 0 (1 timed runs each) to cut them "
                         "into 2 stages; the other ranks wait")  # fmt: skip
    assert described[0] == "INFO"
    lines = described[1].splitlines()
    assert lines[0].startswith("plan: 2 stages, M=2, interleaved, optimize=speed: predicted step ")
    assert lines[0].endswith(f"bubble {plan.predicted_bubble:.1%}")
    names = [stage[0] + " .. " + stage[-1] for stage in plan.stage_layers]
    for s, line in enumerate(lines[1:]):
        assert line.startswith(f"  stage {s}: {names[s]} (")
        assert " weights, busy " in line and "(idle " in line
        assert line.endswith(f"peak {format_bytes(plan.peak_memory[s])}")
    assert wrote == ("INFO", f"wrote the plan to {cfg.plan_file}")


@pytest.mark.parametrize("recomputing_faster", [True, False])
def test_speed_recomputes_where_the_stage_timed_that_path_faster_and_the_plan_keeps_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, recomputing_faster: bool
) -> None:
    timed: list[bool] = []

    def stage_call(
        graph: Graph, example: Any, repeats: int, recompute: bool, ends: Any
    ) -> list[float]:
        # a microbatch through the stage code: 20 ms with a tape; recomputing 2 ms or 40 ms
        timed.append(recompute)
        return [(0.002 if recomputing_faster else 0.04) if recompute else 0.02] * len(ends)

    cfg, graph = config(tmp_path), traced()
    with caplog.at_level(logging.INFO, logger="tfsift"):
        got = rank0_bounds(graph, [tf.zeros((1, 3))], cfg, stage_call=stage_call)
    # each path's whole model once, then the chosen path's shorter prefixes; the layers
    # were profiled once
    assert timed == [False, True, recomputing_faster]
    plan = Plan.load(cfg.plan_file or "")
    assert got == (plan.bounds, recomputing_faster, "interleaved", 1, None)
    assert plan.recompute == recomputing_faster
    header = messages(caplog)[1][1].splitlines()[0]
    speed = (
        "optimize=speed with recompute (timed faster)" if recomputing_faster else ("optimize=speed")
    )
    assert header.startswith(f"plan: 2 stages, M=2, interleaved, {speed}: predicted step ")


def test_zero_bubble_keeps_tapes_without_timing_the_recompute(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # its gain is the split backward, which a recomputing stage does not make
    timed: list[bool] = []

    def stage_call(
        graph: Graph, example: Any, repeats: int, recompute: bool, ends: Any
    ) -> list[float]:
        timed.append(recompute)
        return [0.002 if recompute else 0.02] * len(ends)  # recomputing looks faster

    cfg = config(tmp_path, pipeline="zero_bubble")
    with caplog.at_level(logging.INFO, logger="tfsift"):
        got = rank0_bounds(traced(), [tf.zeros((1, 3))], cfg, stage_call=stage_call)
    assert timed == [False] and got[1:4] == (False, "zero_bubble", 1)
    # the W's each stage defers, fitted by the plan (none on stage 0), reach every rank
    deferred = Plan.load(cfg.plan_file or "").deferred
    assert deferred is not None and got.deferred == deferred and deferred[0] == 0
    header = messages(caplog)[1][1].splitlines()[0]  # the stages, M, pipeline as for any plan
    assert header.startswith("plan: 2 stages, M=2, zero_bubble, optimize=speed: predicted step ")
    assert header.endswith(f"; W's deferred per stage: 0, {deferred[1]}")


def test_auto_plans_the_fastest_pipeline_and_reuses_any_plan_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import partitioner.plan as plan_module

    chosen: list[plan_module.AutoChoice] = []
    compare = plan_module.compare_plans

    def recorded(*args: Any, **kwargs: Any) -> plan_module.AutoChoice:
        chosen.append(compare(*args, **kwargs))
        return chosen[-1]

    monkeypatch.setattr(plan_module, "compare_plans", recorded)
    graph, example = traced(units=64), [tf.zeros((1, 3))]
    with caplog.at_level(logging.INFO, logger="tfsift"):
        got = rank0_bounds(graph, example, config(tmp_path, pipeline=None))  # the default: auto
    [choice] = chosen
    plan = choice.chosen
    assert got == (plan.bounds, plan.recompute, plan.pipeline, plan.virtual_stages, plan.deferred)
    assert plan.pipeline in ("simple", "interleaved", "zero_bubble")
    assert Plan.load(tmp_path / "plan.json") == plan
    # rank 0 says what it chose and what it compared, before the plan's lines
    assert messages(caplog)[1] == ("INFO", choice.note())
    assert choice.note().startswith('pipeline "auto": ')
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tfsift"):  # whichever pipeline it chose
        assert rank0_bounds(graph, example, config(tmp_path, pipeline="auto")) == got
    assert messages(caplog)[0][1].startswith("reusing the plan in ")
    assert len(chosen) == 1


def test_rank0_charges_the_message_latency_at_every_stage_crossing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    graph, example = traced(), [tf.zeros((1, 3))]
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
    rank0_bounds(graph, example, config(tmp_path / "a"))  # the profile, cached for the next
    with caplog.at_level(logging.INFO, logger="tfsift"):
        rank0_bounds(graph, example, config(tmp_path / "b"), latency=0.002)
    assert messages(caplog)[0] == ("INFO", "profiling 4 nodes on rank 0 (1 timed runs each) to "
                                   "cut them into 2 stages; a message between stages takes 2 ms; "
                                   "the other ranks wait")  # fmt: skip
    plain, charged = (Plan.load(tmp_path / run / "plan.json") for run in ("a", "b"))
    # the cut itself may change: near-ties are settled by the bytes crossing them (a
    # window relative to the step, which the latency lengthens); the same profile, cached
    costs = profile(graph, example, 1)
    for plan in (plain, charged):
        latency = 0.002 if plan is charged else 0.0
        want = simulate_plan(dataclasses.replace(costs, latency=latency), plan.partition, 2,
                             pipeline=plan.pipeline, recompute=plan.recompute,
                             deferred=plan.deferred)  # fmt: skip
        assert plan.predicted_step_time == pytest.approx(want.step_time)
    # the critical path crosses the boundary twice: activations forward, gradients back
    same = [
        simulate_plan(dataclasses.replace(costs, latency=latency), charged.partition, 2,
                      pipeline=charged.pipeline, recompute=charged.recompute,
                      deferred=charged.deferred).step_time
        for latency in (0.0, 0.002)
    ]  # fmt: skip
    assert same[1] == pytest.approx(same[0] + 2 * 0.002)


def test_describe_counts_each_stages_weights() -> None:
    graph = traced()
    names = (("first",), ("middle", graph.nodes[2].name, "last"))
    plan = Plan((0, 1, 4), names, "speed", "simple", 4, 0.5, 0.25, (1024, 2048), "x")
    text = describe(plan, weights(graph, plan))
    assert weights(graph, plan) == [(3 * 4 + 4) * 4, (4 * 4 + 4 + 4 * 2 + 2) * 4]
    assert text == (
        "plan: 2 stages, M=4, simple, optimize=speed: predicted step 500 ms, bubble 25.0%\n"
        "  stage 0: first .. first (1 node), 64 B weights, peak 1.00 KiB\n"
        "  stage 1: middle .. last (3 nodes), 120 B weights, peak 2.00 KiB"
    )


def test_a_plan_file_made_for_this_run_is_reused_without_profiling(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg, graph = config(tmp_path), traced()
    first = rank0_bounds(graph, [tf.zeros((1, 3))], cfg)
    written = Path(cfg.plan_file or "").read_text()

    def no_profiling(*args: Any) -> None:
        raise AssertionError("profiled although the plan file fits")

    monkeypatch.setattr(bounds_module, "profile", no_profiling)
    with caplog.at_level(logging.INFO, logger="tfsift"):
        assert rank0_bounds(graph, [tf.zeros((1, 3))], cfg) == first
    [(level, text)] = messages(caplog)
    assert level == "INFO" and text.startswith(f"reusing the plan in {cfg.plan_file}\nplan: ")
    assert Path(cfg.plan_file or "").read_text() == written


@pytest.mark.parametrize(
    "changes, difference",
    [({"microbatches": 4}, "microbatches: plan 2, this run 4"),
     ({"pipeline": "simple"}, "pipeline: plan 'interleaved', this run 'simple'"),
     ({"optimize": "memory"}, "optimize: plan 'speed', this run 'memory'"),
     ({"partitions": 3}, "partitions: plan 2, this run 3"),
     ({"virtual_stages": 2}, "virtual_stages: plan 1, this run 2")],
)  # fmt: skip
def test_a_plan_file_made_for_another_config_is_solved_again_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, changes: dict[str, Any], difference: str
) -> None:
    graph = traced()
    rank0_bounds(graph, [tf.zeros((1, 3))], config(tmp_path))
    cfg = config(tmp_path, **changes)
    with caplog.at_level(logging.WARNING, logger="tfsift"):
        bounds = rank0_bounds(graph, [tf.zeros((1, 3))], cfg).bounds
    assert messages(caplog) == [
        ("WARNING", f"the plan file {cfg.plan_file} was made for another run ({difference}); "
                    "solving again and overwriting it")
    ]  # fmt: skip
    plan = Plan.load(cfg.plan_file or "")
    assert plan_differences(plan, graph, cfg) == [] and plan.bounds == bounds


def test_virtual_stages_cut_k_v_chunks_and_the_plan_line_lists_them_by_stage(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    graph, example = traced(), [tf.zeros((1, 3))]
    cfg = config(tmp_path, virtual_stages=2)
    with caplog.at_level(logging.INFO, logger="tfsift"):
        got = rank0_bounds(graph, example, cfg)
    plan = Plan.load(cfg.plan_file or "")
    assert got == ((0, 1, 2, 3, 4), plan.recompute, "interleaved", 2, None) == (
        plan.bounds, plan.recompute, plan.pipeline, plan.virtual_stages, plan.deferred
    )  # fmt: skip
    lines = messages(caplog)[1][1].splitlines()
    assert lines[0].startswith("plan: 2 stages x 2 virtual stages, M=2, interleaved, ")
    assert [line.split(":")[0] for line in lines[1:]] == [
        "  stage 0", "    chunk 0", "    chunk 2", "  stage 1", "    chunk 1", "    chunk 3"
    ]  # fmt: skip
    assert lines[2] == "    chunk 0: first .. first (1 node), 64 B weights"
    assert lines[1].endswith(f"peak {format_bytes(plan.peak_memory[0])}")
    # auto chooses the virtual stages when they are unset, keeps them when set
    assert plan_differences(plan, graph, config(tmp_path, pipeline="auto")) == []
    assert plan_differences(plan, graph, config(tmp_path, pipeline="auto", virtual_stages=1)) == [
        "virtual_stages: plan 2, this run 1"
    ]


def test_a_plan_file_made_for_another_model_names_the_first_different_node(
    tmp_path: Path,
) -> None:
    graph = traced()
    relu = graph.nodes[2].name  # keras.ops names are numbered per process: relu, relu_1...
    plan = Plan((0, 1, 3), (("first",), ("middle", "last")), "speed", "interleaved", 2,
                0.5, 0.25, (1, 1), "x")  # fmt: skip
    assert plan_differences(plan, graph, config(tmp_path)) == [
        "model: plan 3 nodes, this model 4 nodes, first different at node 2 "
        f"(plan 'last', this model {relu!r})"
    ]
    same_prefix = Plan((0, 1, 5), (("first",), ("middle", relu, "last", "extra")), "speed",
                       "interleaved", 2, 0.5, 0.25, (1, 1), "x")  # fmt: skip
    assert plan_differences(same_prefix, graph, config(tmp_path)) == [
        "model: plan 5 nodes, this model 4 nodes"
    ]


def test_an_invalid_plan_file_is_still_an_error(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    Path(cfg.plan_file or "").write_text("{}")
    with pytest.raises(ValueError, match="is not a valid tfsift plan"):
        rank0_bounds(traced(), [tf.zeros((1, 3))], cfg)


def test_a_plan_made_without_room_for_sifting_is_solved_again_with_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    graph = traced()
    cfg = config(tmp_path)
    rank0_bounds(graph, [tf.zeros((1, 3))], cfg)
    measured: list[tuple[Graph, int]] = []

    def call(traced: Graph, rows: int) -> float:
        measured.append((traced, rows))
        return 2.5e-4

    # 2 source batches a step (tfsift.hooks): 4 forwards of M = 2 microbatches
    room = Reservation(2.0, sifted_step_time, call)
    with caplog.at_level(logging.INFO, logger="tfsift"):
        bounds, *_ = rank0_bounds(graph, [tf.zeros((1, 3))], cfg, room)
    # measured once, when it solves, on the traced model and a source batch: M = 2
    # microbatches of the example's row
    assert measured == [(graph, 2)]
    assert messages(caplog)[0] == (
        "WARNING",
        f"the plan file {cfg.plan_file} was made for another run (stage 0's sifting forwards "
        "per step: plan 0, this run 4); solving again and overwriting it",
    )
    plan = Plan.load(cfg.plan_file or "")
    assert (plan.bounds, plan.scoring, plan.scoring_call) == (bounds, 4.0, 2.5e-4)
    assert (
        "stage 0 left room for 4 sifting forwards per step in its waits, 0.25 ms a call "
        "beyond them (not in the prediction)"
    ) in messages(caplog)[2][1].splitlines()[0]
    assert plan_differences(plan, graph, cfg, 4.0) == []
    rank0_bounds(graph, [tf.zeros((1, 3))], cfg, room)
    assert len(measured) == 1  # the plan is reused with the cost it was made with


def test_a_call_cost_that_cannot_be_measured_plans_without_it_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # rank 0 alone measures, while the other ranks wait for the plan's broadcast: an
    # error that left rank0_bounds other than as a ValueError would hang them
    def call(traced: Graph, rows: int) -> float:
        raise TypeError("the loss takes no such labels")

    cfg = config(tmp_path)
    with caplog.at_level(logging.WARNING, logger="tfsift"):
        rank0_bounds(traced(), [tf.zeros((1, 3))], cfg, Reservation(2.0, sifted_step_time, call))
    assert messages(caplog) == [
        (
            "WARNING",
            "could not time a sifting scoring call for the plan (TypeError: the loss takes no "
            "such labels); planning stage 0's room for scoring without its fixed cost",
        )
    ]
    assert Plan.load(cfg.plan_file or "").scoring_call == 0.0


def test_room_for_scoring_keeps_a_learnt_layer_on_stage_0(tmp_path: Path) -> None:
    # Scoring dwarfs everything, so the solver alone would leave stage 0 only the reshape
    # (free, no weights), and the exit head at its end would score the raw input.
    class Wide(tfsift.DistributedModel):
        def __init__(self) -> None:
            super().__init__()
            self.reshape = keras.layers.Reshape((64,), name="reshape")
            self.a = keras.layers.Dense(256, name="a")
            self.b = keras.layers.Dense(256, name="b")
            self.c = keras.layers.Dense(2, name="c")

        def call(self, x: Any) -> Any:
            return self.c(self.b(self.a(self.reshape(x))))

    graph = trace(Wide(), [tf.zeros((8, 8, 8))])
    assert [n.name for n in graph.nodes][:2] == ["reshape", "a"]
    room = Reservation(5e3, sifted_step_time)  # 1e4 forwards a step
    assert rank0_bounds(graph, [tf.zeros((8, 8, 8))], config(tmp_path), room)[0][1] == 2


def test_a_memory_plan_ignores_room_for_scoring(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    graph = traced()
    cfg = config(tmp_path, optimize="memory")
    rank0_bounds(graph, [tf.zeros((1, 3))], cfg, Reservation(2.0, sifted_step_time))
    assert Plan.load(cfg.plan_file or "").scoring == 0.0
    with caplog.at_level(logging.WARNING, logger="tfsift"):
        rank0_bounds(graph, [tf.zeros((1, 3))], cfg)  # reused: nothing differs
    assert messages(caplog) == []


def test_a_pipeline_predicted_slower_than_one_process_warns_with_the_numbers() -> None:
    from partitioner.costs import CostModel, LayerCost
    from tfsift.planning.bounds import no_gain

    layers = tuple(LayerCost(f"l{i}", 1e-4, 2e-4, 0, 0, 0) for i in range(2))
    costs = CostModel(layers, action_overhead=5e-4)
    # one process: 4 microbatches x 0.6 ms of compute + 2 x 0.5 ms = 3.4 ms
    assert no_gain(costs, 4, 3.4e-3) == ""
    assert no_gain(costs, 4, 5e-3) == (
        "pipelining does not pay for this model: predicted step 5 ms against about 3.4 ms "
        "in one process (the layers' compute is 2.4 ms a step, and each of a stage's "
        "forwards and backwards costs the runtime about 0.5 ms); use fewer microbatches, "
        "a larger batch or partitions=1"
    )


def test_rank0_warns_when_the_pipeline_is_predicted_slower_than_one_process(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the chain's profile with each action's runtime cost far above its layers' compute, as
    # on a tiny model: a profile timed under the suite's load once measured that cost near
    # zero, and the pipeline was then predicted to pay
    def overhead_bound(*args: Any, **kwargs: Any) -> Any:
        return dataclasses.replace(profile(*args, **kwargs), action_overhead=1.0)

    monkeypatch.setattr(bounds_module, "profile", overhead_bound)
    with caplog.at_level(logging.INFO, logger="tfsift"):
        rank0_bounds(traced(), [tf.zeros((1, 3))], config(tmp_path))
    warned = [text for level, text in messages(caplog) if level == "WARNING"]
    assert len(warned) == 1
    assert warned[0].startswith("pipelining does not pay for this model: predicted step ")
    assert warned[0].endswith("use fewer microbatches, a larger batch or partitions=1")

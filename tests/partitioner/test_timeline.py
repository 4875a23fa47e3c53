"""Gantt charts and Chrome traces of simulated and measured steps."""

from __future__ import annotations

import doctest
import json
from pathlib import Path

import pytest

from partitioner.costs import CostModel, LayerCost
from partitioner.partition import Partition
from partitioner.schedule import Action, Kind, build
from partitioner.simulator import Event, simulate
from partitioner.timeline import (
    MEASURED_NOTE,
    _legend,
    _summary,
    chrome_trace,
    draw_events,
    draw_timeline,
    draw_timelines,
    format_bubble,
    save_chrome_trace,
    track_names,
)


def test_draws_a_png(tmp_path: Path) -> None:
    costs = CostModel(
        tuple(LayerCost(f"l{i}", 1.0, 2.0, 0, 0, 100) for i in range(3)), bandwidth=1000.0
    )
    result = simulate(costs, Partition((0, 1, 2, 3)), build("interleaved", 3, 4))
    path = tmp_path / "timeline.png"
    draw_timeline(result, path, title="K=3, M=4")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_charts_title_gives_the_step_in_the_plans_unit() -> None:
    # a millisecond step read "step 0.09298 s" where the plan's lines say 93 ms
    costs = CostModel(tuple(LayerCost(f"l{i}", 0.01, 0.02, 0, 0, 0) for i in range(2)))
    result = simulate(costs, Partition((0, 1, 2)), build("simple", 2, 2))
    assert _summary("step", result) == "step 90 ms, bubble 33.3%"


def test_a_measured_chart_labels_the_fused_last_stage_and_explains_its_bubble(
    tmp_path: Path,
) -> None:
    costs = CostModel(tuple(LayerCost(f"l{i}", 1.0, 2.0, 0, 0, 0) for i in range(2)))
    result = simulate(costs, Partition((0, 1, 2)), build("simple", 2, 2))
    path = tmp_path / "measured.png"
    draw_events(result.events, 2, result.step_time, path, "a step", fused_last=True,
                note=MEASURED_NOTE)  # fmt: skip
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert _legend(Kind.FORWARD, fused_last=True) == (
        "forward (last stage:\nforward + backward,\none fused call)"
    )
    assert _legend(Kind.FORWARD, fused_last=False) == "forward"
    assert _legend(Kind.BACKWARD, fused_last=True) == "backward"
    assert _legend(Kind.WEIGHT, fused_last=True) == "weight gradients"


def test_draws_several_steps_into_one_png(tmp_path: Path) -> None:
    costs = CostModel(tuple(LayerCost(f"l{i}", 1.0, 2.0, 0, 0, 0) for i in range(2)))
    results = [
        (f"{pipeline}, M={M}", simulate(costs, Partition((0, 1, 2)), build(pipeline, 2, M)))
        for pipeline in ("simple", "interleaved")
        for M in (1, 4)
    ]
    path = tmp_path / "all.png"
    draw_timelines(results, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match=r"Received: results=\[\]"):
        draw_timelines([], path)


def events(*rows: tuple[str, float, float]) -> list[Event]:
    return [Event(Action.parse(a).stage, Action.parse(a), start, end) for a, start, end in rows]


def test_chrome_trace_has_one_track_per_stage_and_names_actions_without_the_stage() -> None:
    step = events(("0F0", 0.0, 1.0), ("0SF0", 1.0, 1.5), ("1RF0", 0.0, 1.75),
                  ("1F0", 1.75, 3.0), ("1B0", 3.0, 3.25), ("1SB0", 3.25, 3.5),
                  ("0RB0", 1.5, 3.75), ("0B0", 3.75, 5.0))  # fmt: skip
    records = chrome_trace(step, 2, fused_last=True, offset=10.0)
    assert [(r["name"], r["tid"], r["cat"]) for r in records] == [
        ("F0", 0, "forward"),
        ("SF0", 0, "send"),
        ("RF0", 1, "receive (includes the wait)"),
        ("F0+B0 (fused)", 1, "forward"),
        ("B0 (done in F0+B0)", 1, "backward"),
        ("SB0", 1, "send"),
        ("RB0", 0, "receive (includes the wait)"),
        ("B0", 0, "backward"),
    ]
    assert {r["ph"] for r in records} == {"X"}
    assert (records[2]["ts"], records[2]["dur"]) == (10e6, 1.75e6)  # microseconds
    assert records[3]["args"] == {"action": "1F0", "microbatch": 0}
    plain = chrome_trace(step, 2)  # a simulated step: no fusion
    assert [r["name"] for r in plain][3:5] == ["F0", "B0"]


def test_a_trace_of_virtual_stages_names_each_chunk_and_fuses_the_last_one_only(
    tmp_path: Path,
) -> None:
    costs = CostModel(tuple(LayerCost(f"l{i}", 1.0, 2.0, 0, 0, 0) for i in range(4)))
    schedule = build("interleaved", 2, 2, virtual_stages=2)
    result = simulate(costs, Partition((0, 1, 2, 3, 4)), schedule, virtual_stages=2)
    records = chrome_trace(result.events, 2, fused_last=True)
    names = {(r["tid"], r["name"]) for r in records}
    # stage 1 runs chunks 1 and 3: only the last chunk's forward ran its backward
    assert {(1, "1F0"), (1, "1B0"), (1, "3F0+B0 (fused)"), (1, "3B0 (done in F0+B0)")} <= names
    assert (0, "2F1") in names and (0, "0B1") in names
    draw_timeline(result, tmp_path / "virtual.png", "K=2, v=2, M=2")
    assert (tmp_path / "virtual.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_forward_only_steps_are_not_labelled_fused() -> None:
    records = chrome_trace(events(("0F0", 0.0, 1.0), ("0F1", 1.0, 2.0)), 1, fused_last=True)
    assert [r["name"] for r in records] == ["F0", "F1"]


def test_saved_trace_is_trace_event_json(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    records = track_names(2) + chrome_trace(events(("0F0", 0.0, 1.0)), 2)
    save_chrome_trace(path, records, {"simulated_bubble": 0.25})
    trace = json.loads(path.read_text())
    assert trace["displayTimeUnit"] == "ms"
    assert trace["otherData"] == {"simulated_bubble": 0.25}
    names = {
        r["tid"]: r["args"]["name"] for r in trace["traceEvents"] if r["name"] == "thread_name"
    }
    assert names == {0: "stage 0", 1: "stage 1"}


def test_format_bubble_puts_the_simulated_value_in_parentheses() -> None:
    assert format_bubble(0.2341, 0.18) == "measured bubble 23.4% (simulated 18.0%)"
    assert format_bubble(0.5) == "measured bubble 50.0%"


def test_docstring_examples_run() -> None:
    import partitioner.timeline

    assert doctest.testmod(partitioner.timeline).failed == 0

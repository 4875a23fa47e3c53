"""tfsift.timeline(): measured per-action timelines of pipelined steps."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import keras
import pytest
import tensorflow as tf

import mpi
import tfsift
from partitioner.schedule import COMPUTE, Action, Kind, add_communication, build
from partitioner.simulator import Event
from tfsift.pipeline.timeline import StepTimeline, Timeline

LOSS = keras.losses.MeanSquaredError()
SKEW = 2e-3  # seconds: tolerance for comparing times taken on two ranks


class Pair(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.a = keras.layers.Dense(4)
        self.b = keras.layers.Dense(2)

    def call(self, x: Any) -> Any:
        return self.b(self.a(x))


def expected(pipeline: str, K: int, M: int) -> dict[int, list[str]]:
    """Every stage's actions, communication included, as the executor runs them."""
    return {s: [str(a) for a in row] for s, row in add_communication(build(pipeline, K, M)).items()}


def test_one_process_records_each_action_of_each_step_inside_the_block(tmp_path: Path) -> None:
    tfsift.init({"microbatches": 4})
    model = Pair()

    @tfsift.step
    def train(x: tf.Tensor, y: tf.Tensor) -> Any:
        loss = LOSS(y, model(x, training=True))
        return tfsift.gradients(loss, model.trainable_variables), loss

    x, y = tf.ones((8, 3)), tf.zeros((8, 2))
    train(x, y)
    with tfsift.timeline() as recorded:
        train(x, y)
    train(x, y)
    assert len(recorded.steps) == 1
    step = recorded.steps[0]
    assert [str(e.action) for e in step.events] == expected("simple", 1, 4)[0]
    assert step.stages == 1
    ends = [0.0] + [e.end for e in step.events]
    for event, previous_end in zip(step.events, ends, strict=False):
        assert previous_end <= event.start <= event.end, event
    assert step.step_time == step.events[-1].end
    forward = sum(e.end - e.start for e in step.events if e.action.kind == Kind.FORWARD)
    backward = sum(e.end - e.start for e in step.events if e.action.kind == Kind.BACKWARD)
    assert step.seconds(0) == {"F": forward, "B": backward}
    assert step.busy() == (forward + backward,)
    assert step.bubble_fraction == pytest.approx(1 - (forward + backward) / step.step_time)
    path = tmp_path / "measured.png"
    step.draw(path, title="K=1, M=4")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    step.to_chrome_trace(tmp_path / "measured.json")
    trace = json.loads((tmp_path / "measured.json").read_text())["traceEvents"]
    assert [e["name"] for e in trace if e["ph"] == "X" and e["tid"] == 0] == [
        name for m in range(4) for name in (f"F{m}+B{m} (fused)", f"B{m} (done in F{m}+B{m})")
    ]


def measured(K: int, M: int, pipeline: str, *, shift: float = 0.0) -> StepTimeline:
    """A made-up measured step: every action 1 ms after the one before on its stage."""
    rows = add_communication(build(pipeline, K, M))
    found = [Event(s, a, shift + i * 1e-3, shift + (i + 1) * 1e-3)
             for s, row in rows.items() for i, a in enumerate(row)]  # fmt: skip
    return StepTimeline(tuple(found), K)


def test_trace_of_recorded_steps_lays_them_end_to_end_one_track_per_stage(
    tmp_path: Path,
) -> None:
    steps = [measured(2, 2, "interleaved"), measured(2, 2, "interleaved")]
    path = tmp_path / "trace.json"
    Timeline(steps).save_trace(path, simulated_bubble=0.25)
    trace = json.loads(path.read_text())
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    tracks = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"
              and e["name"] == "thread_name"}  # fmt: skip
    assert tracks == {0: "stage 0", 1: "stage 1", 2: "steps"}
    first = [e["name"] for e in complete if e["tid"] == 1][:8]
    assert first == ["RF0", "F0+B0 (fused)", "B0 (done in F0+B0)", "SB0",
                     "RF1", "F1+B1 (fused)", "B1 (done in F1+B1)", "SB1"]  # fmt: skip
    assert [e["name"] for e in complete if e["tid"] == 0][:4] == ["F0", "SF0", "F1", "SF1"]
    step_marks = [(e["name"], e["ts"], e["dur"]) for e in complete if e["tid"] == 2]
    length = steps[0].step_time * 1e6
    assert step_marks == [("step 0", 0.0, length), ("step 1", length, length)]
    second = [e for e in complete if e["tid"] == 0 and e["ts"] >= length]
    assert second[0]["name"] == "F0" and second[0]["ts"] == pytest.approx(length)
    bubble = steps[0].bubble_fraction
    assert trace["otherData"] == {
        "measured_bubble": [bubble, bubble],
        "simulated_bubble": 0.25,
        "summary": f"measured bubble {bubble:.1%} (simulated 25.0%)",
    }


def test_summary_puts_the_measured_bubble_next_to_the_simulated_one() -> None:
    step = measured(2, 4, "simple")
    bubble = f"{step.bubble_fraction:.1%}"
    assert step.step_time < 1  # in ms, as the plan's line and tfsift plan print a step
    ms = f"{step.step_time * 1e3:.3g} ms"
    assert step.summary(0.125) == (
        f"measured step {ms}, measured bubble {bubble} (simulated 12.5%)"
    )
    assert step.summary() == f"measured step {ms}, measured bubble {bubble}"


TIMED = {p: mpi.TWO_STAGES_ALONE.scenario("timing_check.py", p) for p in ("simple", "interleaved")}


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.alone
@mpi.TWO_STAGES_ALONE.mark
@pytest.mark.parametrize("pipeline", ["simple", "interleaved"])
def test_two_stages_see_the_same_timeline_of_their_schedule(pipeline: str) -> None:
    got = TIMED[pipeline]()
    assert got[0]["steps"] == got[1]["steps"]  # gathered to every rank
    steps = got[0]["steps"]
    assert len(steps) == 2  # the two steps inside the block, not the ones around it
    want = expected(pipeline, 2, 4)
    for step in steps:
        by_stage = {s: [e for e in step["events"] if e[0] == s] for s in range(2)}
        when = {e[1]: (e[2], e[3]) for e in step["events"]}
        for s, events in by_stage.items():
            assert [e[1] for e in events] == want[s]
            for before, after in itertools.pairwise(events):
                assert before[3] <= after[2], (before, after)  # one stage runs one at a time
            assert step["busy"][s] == pytest.approx(
                sum(e[3] - e[2] for e in events if Action.parse(e[1]).kind in COMPUTE)
            )
            assert set(step["seconds"][s]) == {Action.parse(e[1]).kind.value for e in events}
        assert step["step_time"] == max(e[3] for e in step["events"])
        for m in range(4):
            # a receive cannot end before the matching send started on the other rank
            assert when[f"1RF{m}"][1] >= when[f"0SF{m}"][0] - SKEW, m
            assert when[f"0RB{m}"][1] >= when[f"1SB{m}"][0] - SKEW, m

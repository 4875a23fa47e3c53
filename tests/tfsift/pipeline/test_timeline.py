"""tfsift.timeline(): measured per-action timelines of pipelined steps."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import keras
import pytest
import tensorflow as tf

import mpi
import tfsift
from partitioner.schedule import COMPUTE, Action, Kind, add_communication, build

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


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("pipeline", ["simple", "interleaved"])
def test_two_stages_see_the_same_timeline_of_their_schedule(pipeline: str) -> None:
    got = mpi.reports(mpi.run(2, "timing_check.py", pipeline, timeout=300))
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

"""The run log of ``log_dir``: every rank's recorded steps and rank 0's TensorBoard scalars."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf
from events import scalars

import tfsift
from partitioner.schedule import add_communication, build
from tfsift import state
from tfsift.pipeline import rundir, runlog
from tfsift.pipeline.outputs import GradientOutput, StepOutput
from tfsift.state import STATE

LOSS = keras.losses.MeanSquaredError()


class Pair(tfsift.DistributedModel):
    def __init__(self) -> None:
        super().__init__()
        self.a = keras.layers.Dense(4)
        self.b = keras.layers.Dense(2)

    def call(self, x: Any) -> Any:
        return self.b(self.a(x))


def steps(model: Pair) -> tuple[Any, Any]:
    @tfsift.step
    def train(x: tf.Tensor, y: tf.Tensor) -> Any:
        loss = LOSS(y, model(x, training=True))
        return tfsift.gradients(loss, model.trainable_variables), loss

    @tfsift.step
    def evaluate(x: tf.Tensor, y: tf.Tensor) -> Any:
        return LOSS(y, model(x))

    return train, evaluate


def run_steps(log_dir: Path, calls: int = 5) -> list[float]:
    """``calls`` training steps, then one evaluation; the training losses."""
    tfsift.init({"microbatches": 2, "log_dir": str(log_dir)})
    train, evaluate = steps(Pair())
    losses = []
    for i in range(calls):
        _, loss = train(tf.fill((8, 3), float(i)), tf.zeros((8, 2)))
        losses.append(float(loss.reduce_mean()))
    evaluate(tf.ones((4, 3)), tf.zeros((4, 2)))
    return losses


def test_each_rank_writes_its_recorded_steps_to_its_file(tmp_path: Path) -> None:
    run_steps(tmp_path)
    header, records = rundir.read_rank_file(tmp_path / "timeline" / "rank-0.jsonl")
    assert header.stages == 1
    assert (header.rank, header.stage, header.replica, header.ranks, header.replicas) == (
        0, 0, 0, (0,), 1,
    )  # fmt: skip
    assert (header.microbatches, header.pipeline, header.optimize, header.plan_file) == (
        2, "interleaved", "speed", None,
    )  # fmt: skip
    assert header.clock_offset == 0.0
    assert [(r.step, r.name, r.call, r.training, r.stage, r.samples) for r in records] == [
        (0, "steps.<locals>.train", 0, True, 0, 8),
        (1, "steps.<locals>.train", 1, True, 0, 8),
        (2, "steps.<locals>.train", 2, True, 0, 8),
        (4, "steps.<locals>.train", 4, True, 0, 8),  # call 3 is not recorded
        (5, "steps.<locals>.evaluate", 0, False, 0, 4),
    ]
    schedule = {
        training: [
            str(a)
            for a in add_communication(build("interleaved", 1, 2, forward_only=not training))[0]
        ]
        for training in (True, False)
    }
    for r in records:
        assert [a for a, _, _ in r.actions] == schedule[r.training]
        times = [r.entered] + [t for _, start, end in r.actions for t in (start, end)] + [r.left]
        assert times == sorted(times), r


def test_rank_0_writes_tensorboard_scalars_of_the_training_steps(tmp_path: Path) -> None:
    losses = run_steps(tmp_path)
    state.reset()  # closes the log: the buffered scalars are written
    found = scalars(tmp_path)
    recorded = [0, 1, 2, 4]
    assert sorted(found) == [
        "stage0/busy_fraction", "stage0/idle_fraction", "step/bubble_fraction", "step/loss",
        "step/samples_per_second", "step/seconds",
    ]  # fmt: skip
    assert found["step/loss"] == [(i, float(np.float32(loss))) for i, loss in enumerate(losses)]
    assert [at for at, _ in found["step/seconds"]] == [0, 1, 2, 3, 4]
    assert [at for at, _ in found["step/samples_per_second"]] == [1, 2, 3, 4]
    merged = [s.timeline for s in rundir.Run.load(tmp_path).steps if s.training]
    busy = [step.busy()[0] / step.step_time for step in merged]
    assert found["stage0/busy_fraction"] == [
        (at, float(np.float32(b))) for at, b in zip(recorded, busy, strict=True)
    ]
    assert found["stage0/idle_fraction"] == [
        (at, float(np.float32(1 - b))) for at, b in zip(recorded, busy, strict=True)
    ]
    assert found["step/bubble_fraction"] == [
        (at, float(np.float32(step.bubble_fraction)))
        for at, step in zip(recorded, merged, strict=True)
    ]


def test_without_log_dir_nothing_is_recorded(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    tfsift.init({"microbatches": 2})
    train, _ = steps(Pair())
    train(tf.ones((4, 3)), tf.zeros((4, 2)))
    assert STATE.run_log is None
    assert list(tmp_path.iterdir()) == []


def test_a_rank_that_cannot_write_its_file_warns_once_and_trains_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "timeline").write_text("a file where the directory goes")
    with caplog.at_level(logging.WARNING, logger="tfsift"):
        losses = run_steps(tmp_path, calls=3)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].startswith(
        f"log_dir: cannot write {tmp_path / 'timeline' / 'rank-0.jsonl'} ("
    )
    assert warnings[0].endswith("); this rank stops recording")
    assert len(losses) == 3


def test_a_new_init_with_another_log_dir_opens_a_new_log(tmp_path: Path) -> None:
    run_steps(tmp_path / "a", calls=1)
    first = STATE.run_log
    run_steps(tmp_path / "b", calls=1)
    assert STATE.run_log is not first
    assert first.scalars is None  # closed
    assert [r.step for r in rundir.read_rank_file(rundir.rank_file(tmp_path / "b", 0))[1]] == [
        0,
        1,
    ]


def loss_output(*values: float) -> StepOutput:
    return StepOutput([tf.constant(v) for v in values])


@pytest.mark.parametrize(
    ("outputs", "loss"),
    [
        ((GradientOutput(tf.constant(5.0), 2), loss_output(1.0, 3.0)), 2.0),
        ({"accuracy": loss_output(0.5), "loss": loss_output(4.0)}, 4.0),
        ([StepOutput([tf.ones((2,))]), loss_output(0.25), loss_output(9.0)], 0.25),
        ([StepOutput([tf.ones((2,))]), StepOutput([tf.constant(3)])], None),
        ([GradientOutput(tf.constant(5.0), 2)], None),
        (None, None),
    ],
)
def test_the_loss_is_the_output_named_loss_else_the_first_scalar_float(
    outputs: Any, loss: float | None
) -> None:
    assert runlog.step_loss(outputs) == loss


class Clock:
    """A ``time.perf_counter`` that reads out the given values."""

    def __init__(self, values: list[float]) -> None:
        self.values: Iterator[float] = iter(values)

    def __call__(self) -> float:
        return next(self.values)


class FakeComm:
    """One side of a pipeline whose ranks sit on different hosts."""

    def __init__(self, rank: int, replies: list[Any]) -> None:
        self.rank, self.replies, self.sent = rank, iter(replies), []

    def Get_rank(self) -> int:
        return self.rank

    def Get_size(self) -> int:
        return 2

    def allgather(self, value: Any) -> list[str]:
        return ["host-a", "host-b"]

    def send(self, value: Any, dest: int, tag: int) -> None:
        self.sent.append((value, dest, tag))

    def recv(self, source: int, tag: int) -> Any:
        return next(self.replies)


def test_stage_0_takes_the_offset_from_the_shortest_round_trip(monkeypatch: Any) -> None:
    # trips: 0 -> 10 (stage 1 read 105), 20 -> 22 (read 121), 30 -> 36 (read 133)
    monkeypatch.setattr(runlog.time, "perf_counter", Clock([0, 10, 20, 22, 30, 36]))
    comm = FakeComm(0, [105.0, 121.0, 133.0])
    assert runlog.clock_offset(comm, rounds=3) == 0.0  # stage 0's own clock
    assert comm.sent[-1] == (100.0, 1, runlog.CLOCK_TAG)  # 121 - (20 + 22) / 2


def test_another_stage_answers_and_keeps_the_offset_it_is_sent(monkeypatch: Any) -> None:
    monkeypatch.setattr(runlog.time, "perf_counter", Clock([7.0, 8.0]))
    comm = FakeComm(1, [None, None, 2.5])
    assert runlog.clock_offset(comm, rounds=2) == 2.5
    assert comm.sent == [(7.0, 0, runlog.CLOCK_TAG), (8.0, 0, runlog.CLOCK_TAG)]

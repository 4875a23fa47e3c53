"""Measured timelines: when each schedule action of a pipelined step ran, on every stage.

The executor times every action it runs; inside ``with tfsift.timeline()`` each
``@tfsift.step`` call also starts with a barrier of the pipeline's ranks (the common
time origin) and ends by gathering every stage's actions to every rank. The result
uses the simulator's ``Event`` records, so a measured step is drawn (``draw``) like
``tfsift simulate --timeline`` draws a simulated one, and exported as a Chrome/Perfetto
trace (``to_chrome_trace``, ``Timeline.save_trace``) for ui.perfetto.dev.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from partitioner.costs import format_seconds
from partitioner.schedule import Action
from partitioner.simulator import Event, bubble_fraction, busy_seconds
from partitioner.timeline import (
    MEASURED_NOTE,
    chrome_trace,
    draw_events,
    format_bubble,
    save_chrome_trace,
    track_names,
)
from tfsift.state import STATE


@dataclasses.dataclass(frozen=True)
class StepTimeline:
    """One measured step: every stage's actions, in seconds from a common start.

    The start is the moment each rank leaves a barrier of the pipeline's ranks, so
    times on different ranks agree to within that barrier's exit skew.

    Args:
        events: every action of every stage, in each stage's execution order.
        stages: the number of stages K.
    """

    events: tuple[Event, ...]
    stages: int

    @property
    def step_time(self) -> float:
        """Seconds from the start to the end of the last action."""
        return max((e.end for e in self.events), default=0.0)

    def busy(self) -> tuple[float, ...]:
        """Seconds each stage spent in forward and backward actions."""
        return busy_seconds(self.events, self.stages)

    def seconds(self, stage: int) -> dict[str, float]:
        """Seconds ``stage`` spent per kind of action ("F", "B", "RF", ...); a receive's
        time includes the wait for its message."""
        out: dict[str, float] = {}
        for e in self.events:
            if e.stage == stage:
                out[e.action.kind.value] = out.get(e.action.kind.value, 0.0) + e.end - e.start
        return out

    @property
    def bubble_fraction(self) -> float:
        """``1 - sum(busy) / (K * step_time)``, as the simulator defines it."""
        return bubble_fraction(self.busy(), self.step_time)

    def summary(self, simulated_bubble: float | None = None) -> str:
        """``"measured step 12.3 ms, measured bubble 23.4% (simulated 18.0%)"``.

        Args:
            simulated_bubble: the plan's ``predicted_bubble``, when known: from the plan
                file (``partitioner.plan.Plan.load(path)``) or the plan rank 0 logs at the
                first step.
        """
        bubble = format_bubble(self.bubble_fraction, simulated_bubble)
        return f"measured step {format_seconds(self.step_time)}, {bubble}"

    def to_chrome_trace(self, path: str | Path, simulated_bubble: float | None = None) -> None:
        """Writes this step as a Chrome/Perfetto trace JSON (open it in ui.perfetto.dev).

        One track per stage; every action is a complete event named ``F3``, ``B3``,
        ``SF3``, ``RB3`` (a receive lasts until its message arrived, so it shows the
        wait); the last stage's forward, which runs that microbatch's backward in the
        same compiled call, is ``F3+B3 (fused)``. ``otherData`` holds the measured
        bubble and, when given, the simulated one.
        """
        Timeline([self]).save_trace(path, simulated_bubble)

    def draw(self, path: str | Path, title: str = "") -> None:
        """Writes a PNG Gantt chart of the forwards and backwards to ``path``, with a note
        on what the measured bubble counts (``MEASURED_NOTE``)."""
        summary = (
            f"measured step {format_seconds(self.step_time)}, bubble {self.bubble_fraction:.1%}"
        )
        draw_events(
            self.events,
            self.stages,
            self.step_time,
            path,
            f"{title}: {summary}" if title else summary,
            fused_last=True,
            note=MEASURED_NOTE,
        )


class Timeline:
    """The steps recorded inside one ``with tfsift.timeline()`` block, in call order."""

    def __init__(self, steps: Sequence[StepTimeline] = ()) -> None:
        self.steps: list[StepTimeline] = list(steps)

    def save_trace(
        self,
        path: str | Path,
        simulated_bubble: float | None = None,
        *,
        ranks: Sequence[int] | None = None,
        step_names: Sequence[str] | None = None,
    ) -> None:
        """Writes every recorded step, end to end, as one Chrome/Perfetto trace JSON.

        Each step also appears as a ``step i`` event on a track of its own, below the
        stages; see ``StepTimeline.to_chrome_trace`` for the events.

        Args:
            path: where to write the JSON.
            simulated_bubble: the plan's ``predicted_bubble``, stored next to the
                measured one in ``otherData``.
            ranks: the global rank of each stage: tracks read ``rank 3 (stage 1)``.
            step_names: the steps' events' names instead of ``step 0``, ``step 1``...
        """
        K = max((step.stages for step in self.steps), default=0)
        records, offset = _rank_names(track_names(K), ranks), 0.0
        records += _steps_track(K)
        names = step_names or [f"step {i}" for i in range(len(self.steps))]
        for name, step in zip(names, self.steps, strict=True):
            records += chrome_trace(step.events, step.stages, fused_last=True, offset=offset)
            records.append(_step_record(name, K, offset, step))
            offset += step.step_time
        save_chrome_trace(path, records, self._bubbles(simulated_bubble))

    def _bubbles(self, simulated: float | None) -> dict[str, Any]:
        measured = [step.bubble_fraction for step in self.steps]
        other: dict[str, Any] = {"measured_bubble": measured, "simulated_bubble": simulated}
        if measured:
            other["summary"] = format_bubble(measured[-1], simulated)
        return other


def _steps_track(K: int) -> list[dict[str, Any]]:
    return [
        {"name": "thread_name", "ph": "M", "pid": 0, "tid": K, "args": {"name": "steps"}},
        {"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": K, "args": {"sort_index": K}},
    ]


def _rank_names(records: list[dict[str, Any]], ranks: Sequence[int] | None) -> list[dict[str, Any]]:
    if ranks is None:
        return records
    for record in records:
        if record["name"] == "thread_name":
            s = record["tid"]
            record["args"]["name"] = f"rank {ranks[s]} (stage {s})"
    return records


def _step_record(name: str, K: int, offset: float, step: StepTimeline) -> dict[str, Any]:
    return {
        "name": name,
        "cat": "step",
        "ph": "X",
        "ts": offset * 1e6,
        "dur": step.step_time * 1e6,
        "pid": 0,
        "tid": K,
        "args": {"bubble": step.bubble_fraction},
    }


@contextlib.contextmanager
def timeline() -> Iterator[Timeline]:
    """Records when every schedule action of each ``@tfsift.step`` call inside runs.

    A collective: every rank of a pipeline must enter it around the same step calls
    (each recorded step begins with a barrier and ends with a gather of the pipeline's
    ranks), like ``tfsift.allreduce``.

    Example:
        >>> with tfsift.timeline() as recorded:
        ...     grads, loss = forward_backward(images, labels)
        >>> step = recorded.steps[-1]
        >>> step.busy(), step.bubble_fraction
        >>> if tfsift.rank() == 0:
        ...     step.draw("timeline.png", title="K=2, M=8, interleaved")
        ...     recorded.save_trace("timeline.json")  # open in ui.perfetto.dev
        ...     from partitioner import Plan  # the plan file's reader (tfsift plan reads it)
        ...     predicted = Plan.load("plan.json").predicted_bubble  # with plan_file set
        ...     print(step.summary(predicted))  # measured bubble 23.4% (simulated 18.0%)

    Returns:
        A ``Timeline`` whose ``steps`` fill in as the steps run.
    """
    recording = Timeline()
    STATE.timelines.append(recording)
    try:
        yield recording
    finally:
        STATE.timelines.remove(recording)


def active() -> Timeline | None:
    """The innermost recording ``timeline()`` block, if any."""
    return STATE.timelines[-1] if STATE.timelines else None


def start(comm: Any) -> float:
    """The step's time origin on this rank: right after a barrier of ``comm``."""
    comm.Barrier()
    return time.perf_counter()


def finish(
    recording: Timeline,
    comm: Any,
    stage: int,
    origin: float,
    timed: Sequence[tuple[Action, float, float]],
) -> None:
    """Gathers every stage's timed actions over ``comm`` and appends the step."""
    mine = [(str(a), begin - origin, end - origin) for a, begin, end in timed]
    gathered = comm.allgather((stage, mine))
    events = tuple(
        Event(s, Action.parse(text), begin, end)
        for s, actions in sorted(gathered)
        for text, begin, end in actions
    )
    recording.steps.append(StepTimeline(events, len(gathered)))

"""A step's timeline, drawn: a Gantt chart (PNG) or a Chrome/Perfetto trace (JSON).

Simulated steps (`partitioner.simulator`) and measured ones (`tfsift.timeline`) share
both, since both are `Event` records: (stage, action, start, end) in seconds from the
step's start.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from partitioner.costs import format_seconds
from partitioner.schedule import Action, Kind
from partitioner.simulator import Event, SimResult

COLOURS = {Kind.FORWARD: "#4C72B0", Kind.BACKWARD: "#DD8452", Kind.WEIGHT: "#55A868"}
CATEGORIES = {
    Kind.FORWARD: "forward",
    Kind.BACKWARD: "backward",
    Kind.WEIGHT: "weight gradients",
    Kind.SEND_F: "send",
    Kind.SEND_B: "send",
    Kind.RECV_F: "receive (includes the wait)",
    Kind.RECV_B: "receive (includes the wait)",
}


def format_bubble(measured: float, simulated: float | None = None) -> str:
    """``"measured bubble 23.4% (simulated 18.0%)"``; without ``simulated``, the first half.

    Example:
        >>> format_bubble(0.234, 0.18)
        'measured bubble 23.4% (simulated 18.0%)'
    """
    text = f"measured bubble {measured:.1%}"
    return text if simulated is None else f"{text} (simulated {simulated:.1%})"


def draw_timeline(result: SimResult, path: str | Path, title: str = "") -> None:
    """Writes a PNG Gantt chart of a simulated step to `path`; idle time stays blank.

    Args:
        result: a `simulate` result.
        path: where to write the PNG.
        title: the chart title.
    """
    draw_timelines([(title, result)], path)


def draw_timelines(results: Sequence[tuple[str, SimResult]], path: str | Path) -> None:
    """Writes one PNG with a Gantt chart per (title, simulated step), on a shared time axis,
    so that pipelines and microbatch counts compare at a glance.

    Args:
        results: (title, `simulate` result) pairs, one panel each, top to bottom.
        path: where to write the PNG.

    Raises:
        ValueError: ``results`` is empty.
    """
    if not results:
        raise ValueError("draw_timelines needs at least one result. Received: results=[]")
    longest = max(result.step_time for _, result in results)
    panels = [
        (result.events, len(result.busy), _titled(title, _summary("step", result)))
        for title, result in results
    ]
    _save(panels, longest, path)


# Under a measured step's chart: what its bubble counts, and why a simulated one is lower.
MEASURED_NOTE = (
    "Measured bubble: the share of this step each stage spent outside forwards and backwards "
    "(waiting for messages, sending them, the runtime's own work). The simulated bubble of "
    "`tfsift plan` counts only the schedule's waits, so the measured one is higher, most on "
    "small models."
)


def draw_events(
    events: Sequence[Event],
    stages: int,
    step_time: float,
    path: str | Path,
    title: str,
    *,
    fused_last: bool = False,
    note: str = "",
) -> None:
    """Writes a PNG Gantt chart of the forward and backward ``events`` of one step.

    Events of other kinds (transfers, waits) are left blank.

    Args:
        events: (stage, action, start, end) records, seconds from the step's start.
        stages: the number of stages K (one row each).
        step_time: the x-axis extent in seconds.
        path: where to write the PNG.
        title: the chart title.
        fused_last: the last stage runs each microbatch's forward and backward as one call
            (a measured training step): the legend says its forward boxes are F+B.
        note: a line of text under the chart.
    """
    _save([(events, stages, title)], step_time, path, fused_last=fused_last, note=note)


def chrome_trace(
    events: Sequence[Event], stages: int, *, fused_last: bool = False, offset: float = 0.0
) -> list[dict[str, Any]]:
    """The Trace Event Format records of one step: a complete ("X") event per action.

    Each stage is one track (``tid``), each event is named for its action without the
    stage (``F3``, ``RB3``; with virtual stages, where a track runs several chunks, with
    the chunk: ``2F3``); a receive lasts from its call to its message's arrival, so the
    waits show as receives. With ``fused_last`` (a measured training step) the last
    stage's (chunk's) forward, which also ran that microbatch's backward in one compiled
    call, is named ``F3+B3 (fused)`` and its backward action ``B3 (done in F3+B3)``.

    Args:
        events: (stage, action, start, end) records, seconds from the step's start.
        stages: K.
        fused_last: label the last stage's forward and backward as one fused call.
        offset: seconds added to every time (steps laid end to end).

    Returns:
        A list of event dicts; `save_chrome_trace` wraps and writes them.
    """
    backward = {
        (e.action.stage, e.action.microbatch) for e in events if e.action.kind is Kind.BACKWARD
    }
    last = max((e.action.stage for e in events), default=stages - 1)  # the last chunk
    chunks = any(e.action.stage != e.stage for e in events)
    return [
        {
            "name": _trace_name(e.action, fused_last and e.action.stage == last, backward, chunks),
            "cat": CATEGORIES[e.action.kind],
            "ph": "X",
            "ts": (offset + e.start) * 1e6,
            "dur": (e.end - e.start) * 1e6,
            "pid": 0,
            "tid": e.stage,
            "args": {"action": str(e.action), "microbatch": e.action.microbatch},
        }
        for e in events
    ]


def track_names(stages: int, title: str = "tfsift step") -> list[dict[str, Any]]:
    """Metadata ("M") records naming the process ``title`` and each track ``stage s``."""
    names: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": title}}
    ]
    for s in range(stages):
        names.append(
            {"name": "thread_name", "ph": "M", "pid": 0, "tid": s, "args": {"name": f"stage {s}"}}
        )
        names.append(
            {"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": s, "args": {"sort_index": s}}
        )
    return names


def save_chrome_trace(
    path: str | Path, records: Sequence[dict[str, Any]], other: dict[str, Any] | None = None
) -> None:
    """Writes ``{"traceEvents": records, ...}`` to ``path`` for ui.perfetto.dev or
    chrome://tracing; ``other`` lands in ``otherData`` (bubbles, config)."""
    trace = {"traceEvents": list(records), "displayTimeUnit": "ms", "otherData": other or {}}
    Path(path).write_text(json.dumps(trace, indent=1) + "\n")


def _trace_name(
    action: Action, fused: bool, backward: set[tuple[int, int]], chunks: bool = False
) -> str:
    m = action.microbatch
    chunk = str(action.stage) if chunks else ""
    name = f"{chunk}{action.kind.value}{m}"
    if not fused or (action.stage, m) not in backward:
        return name
    if action.kind is Kind.FORWARD:
        return f"{chunk}F{m}+B{m} (fused)"
    return f"{chunk}B{m} (done in F{m}+B{m})" if action.kind is Kind.BACKWARD else name


def _summary(what: str, result: SimResult) -> str:
    """The step and its bubble, the step in the unit the plan's lines give it (ms, s)."""
    return f"{what} {format_seconds(result.step_time)}, bubble {result.bubble_fraction:.1%}"


def _titled(title: str, summary: str) -> str:
    return f"{title}: {summary}" if title else summary


Panel = tuple[Sequence[Event], int, str]


def _save(
    panels: Sequence[Panel],
    step_time: float,
    path: str | Path,
    *,
    fused_last: bool = False,
    note: str = "",
) -> None:
    # matplotlib is imported here, with the Agg canvas and no pyplot, so importing the
    # partitioner stays light and never touches the caller's plotting backend.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    rows = [1.0 + 0.5 * stages for _, stages, _ in panels]
    figure = Figure(figsize=(11, 0.2 + sum(rows) + 0.5 * bool(note)), dpi=100)
    FigureCanvasAgg(figure)
    grid = figure.add_gridspec(len(panels), 1, height_ratios=rows)
    for i, (events, stages, title) in enumerate(panels):
        _draw_panel(figure.add_subplot(grid[i]), events, stages, step_time, title)
    shown = {e.action.kind for events, _, _ in panels for e in events}
    handles = [
        Patch(color=c, label=_legend(k, fused_last))
        for k, c in COLOURS.items()
        if k in shown or k is not Kind.WEIGHT  # W only where a schedule splits backwards
    ]
    figure.axes[0].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    if note:
        figure.text(0.01, 0.01, note, fontsize=7, wrap=True, va="bottom")
    figure.tight_layout(rect=(0, 0.08 if note else 0, 1, 1))
    figure.savefig(str(path), format="png")


def _legend(kind: Kind, fused_last: bool) -> str:
    if fused_last and kind is Kind.FORWARD:
        return "forward (last stage:\nforward + backward,\none fused call)"
    return CATEGORIES[kind]


def _draw_panel(
    axes: Any, events: Sequence[Event], stages: int, step_time: float, title: str
) -> None:
    for event in events:
        if event.action.kind not in COLOURS:
            continue
        width = event.end - event.start
        axes.barh(
            event.stage,
            width,
            left=event.start,
            height=0.8,
            color=COLOURS[event.action.kind],
            # a rank's later chunks (virtual stages) lighter: chunk s + j K at 1 - 0.3 j
            alpha=max(1.0 - 0.3 * (event.action.stage // max(stages, 1)), 0.25),
            edgecolor="white",
            linewidth=0.5,
        )
        if width > step_time / 60:
            axes.text(
                event.start + width / 2,
                event.stage,
                str(event.action.microbatch),
                ha="center",
                va="center",
                fontsize=7,
                color="white",
            )
    axes.set_yticks(range(stages), [f"stage {s}" for s in range(stages)])
    axes.set_ylim(stages - 0.5, -0.5)
    axes.set_xlim(0, max(step_time, 1e-12))
    axes.set_xlabel("seconds")
    axes.set_title(title, fontsize=10)

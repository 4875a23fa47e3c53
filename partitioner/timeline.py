"""A Gantt chart of a simulated step: one row per stage, forwards and backwards coloured."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from partitioner.schedule import Kind
from partitioner.simulator import Event, SimResult

COLOURS = {Kind.FORWARD: "#4C72B0", Kind.BACKWARD: "#DD8452"}


def draw_timeline(result: SimResult, path: str | Path, title: str = "") -> None:
    """Writes a PNG Gantt chart of a simulated step to `path`; idle time stays blank.

    Args:
        result: a `simulate` result.
        path: where to write the PNG.
        title: the chart title.
    """
    summary = f"step {result.step_time:.4g} s, bubble {result.bubble_fraction:.1%}"
    draw_events(
        result.events,
        len(result.busy),
        result.step_time,
        path,
        f"{title}: {summary}" if title else summary,
    )


def draw_events(
    events: Sequence[Event], stages: int, step_time: float, path: str | Path, title: str
) -> None:
    """Writes a PNG Gantt chart of the forward and backward ``events`` of one step.

    Simulated steps (`draw_timeline`) and measured ones (`tfsift.timeline`) share it;
    events of other kinds (transfers, waits) are left blank. matplotlib is imported
    here, with the Agg canvas and no pyplot, so importing the partitioner stays light
    and never touches the caller's plotting backend.

    Args:
        events: (stage, action, start, end) records, seconds from the step's start.
        stages: the number of stages K (one row each).
        step_time: the x-axis extent in seconds.
        path: where to write the PNG.
        title: the chart title.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    figure = Figure(figsize=(11, 1.2 + 0.5 * stages), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
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
    axes.set_title(title)
    handles = [Patch(color=c, label=k.name.lower()) for k, c in COLOURS.items()]
    axes.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    figure.tight_layout()
    figure.savefig(str(path), format="png")

"""A Gantt chart of a simulated step: one row per stage, forwards and backwards coloured."""

from __future__ import annotations

from pathlib import Path

from partitioner.schedule import Kind
from partitioner.simulator import SimResult

COLOURS = {Kind.FORWARD: "#4C72B0", Kind.BACKWARD: "#DD8452"}


def draw_timeline(result: SimResult, path: str | Path, title: str = "") -> None:
    """Writes a PNG Gantt chart of `result` to `path`; idle time stays blank.

    matplotlib is imported here, with the Agg canvas and no pyplot, so importing the
    partitioner stays light and never touches the caller's plotting backend.

    Args:
        result: a `simulate` result.
        path: where to write the PNG.
        title: the chart title.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    K = len(result.busy)
    figure = Figure(figsize=(11, 1.2 + 0.5 * K), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for event in result.events:
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
        if width > result.step_time / 60:
            axes.text(
                event.start + width / 2,
                event.stage,
                str(event.action.microbatch),
                ha="center",
                va="center",
                fontsize=7,
                color="white",
            )
    axes.set_yticks(range(K), [f"stage {s}" for s in range(K)])
    axes.set_ylim(K - 0.5, -0.5)
    axes.set_xlim(0, max(result.step_time, 1e-12))
    axes.set_xlabel("seconds")
    summary = f"step {result.step_time:.4g} s, bubble {result.bubble_fraction:.1%}"
    axes.set_title(f"{title}: {summary}" if title else summary)
    handles = [Patch(color=c, label=k.name.lower()) for k, c in COLOURS.items()]
    axes.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    figure.tight_layout()
    figure.savefig(str(path), format="png")

"""``tfsift timeline RUN_DIR``: the steps a run recorded with ``log_dir``, merged over its ranks.

Writes a Chrome/Perfetto trace (one track per rank) and a Gantt chart, and prints each
recorded step's measured bubble next to the plan's simulated one, e.g.

    runs/exp1: replica 0, ranks 0, 1 (K=2), M=4, interleaved; 5 recorded steps
    step 0 (train, call 0, training): measured step 412 ms, measured bubble 61.0% ...
    ...
    median of 4 training steps (first calls left out: they compile): measured bubble ...
    simulated bubble from runs/exp1/plan.json
    wrote runs/exp1/timeline.json
    wrote runs/exp1/timeline.png
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from partitioner.timeline import MEASURED_NOTE, format_bubble
from tfsift.pipeline.rundir import RecordedStep, Run, predicted_bubble
from tfsift.pipeline.timeline import Timeline


def add_subcommand(commands: Any) -> None:
    """Registers ``timeline`` on the ``tfsift`` argument parser."""
    cmd = commands.add_parser(
        "timeline",
        help="merge the steps a run recorded in its log_dir into a Chrome/Perfetto trace and "
        "a chart, and print their bubbles",
        description="Merges the steps a run recorded with tfsift.init({..., 'log_dir': RUN_DIR}) "
        "over the ranks of one pipeline replica: writes a Chrome/Perfetto trace (one track per "
        "rank) and a Gantt chart, and prints each step's measured bubble next to the plan's "
        "simulated one.",
    )
    cmd.add_argument("run_dir", metavar="RUN_DIR", help="the run's log_dir")
    cmd.add_argument(
        "--out",
        metavar="JSON",
        help="the trace file (default: RUN_DIR/timeline.json); the chart goes beside it, .png",
    )
    cmd.add_argument(
        "--step",
        type=int,
        metavar="N",
        help="only step N, as listed (default: every recorded step in the trace, the last "
        "recorded training step in the chart)",
    )
    cmd.add_argument(
        "--replica", type=int, default=0, metavar="R", help="the pipeline replica (default: 0)"
    )
    cmd.add_argument(
        "--plan",
        metavar="PLAN.json",
        help="the plan whose simulated bubble is printed (default: RUN_DIR/plan.json, "
        "else the run's plan_file)",
    )
    cmd.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Merges the run's files and writes the trace and the chart; 1 with the reason on error."""
    try:
        recorded = Run.load(args.run_dir, args.replica)
        steps = _chosen(recorded.steps, args.step)
        simulated, source = predicted_bubble(args.run_dir, recorded.header, args.plan)
    except (OSError, ValueError) as err:
        print(f"tfsift timeline: {err}", file=sys.stderr)
        return 1
    print(_describe(args.run_dir, recorded, len(steps)))
    for step in steps:
        print(f"{_name(step)}: {step.timeline.summary(simulated if step.training else None)}")
    median = _median(steps)
    if median is not None:
        print(f"{median[0]}: {format_bubble(median[1], simulated)}")
    print(source)
    if simulated is not None:
        print(MEASURED_NOTE)
    out = Path(args.out) if args.out else Path(args.run_dir) / "timeline.json"
    ranks = recorded.header.ranks
    names = [_name(step) for step in steps]
    Timeline([s.timeline for s in steps]).save_trace(out, simulated, ranks=ranks, step_names=names)
    print(f"wrote {out}")
    _chart(steps, out.with_suffix(".png"))
    return 0


def _chosen(steps: Sequence[RecordedStep], index: int | None) -> list[RecordedStep]:
    if not steps:
        raise ValueError("the run recorded no step that every rank of its pipeline finished")
    if index is None:
        return list(steps)
    chosen = [step for step in steps if step.step == index]
    if not chosen:
        raise ValueError(
            f"step {index} was not recorded. Received: --step {index}; recorded steps: "
            f"{', '.join(str(step.step) for step in steps)}"
        )
    return chosen


def _describe(run_dir: str, recorded: Run, count: int) -> str:
    h = recorded.header
    return (
        f"{run_dir}: replica {h.replica}, ranks {', '.join(map(str, h.ranks))} (K={h.stages}), "
        f"M={h.microbatches}, {h.pipeline}; {count} recorded step{'s' * (count != 1)}"
    )


def _name(step: RecordedStep) -> str:
    kind = "training" if step.training else "forward only"
    return f"step {step.step} ({step.name}, call {step.call}, {kind})"


def _median(steps: Sequence[RecordedStep]) -> tuple[str, float] | None:
    """The median bubble of the training steps, leaving out first calls (they compile)."""
    training = [step for step in steps if step.training]
    later = [step for step in training if step.call > 0]
    if len(later) > 1:
        what = f"median of {len(later)} training steps (first calls left out: they compile)"
        return what, statistics.median(s.timeline.bubble_fraction for s in later)
    if len(training) > 1:
        what = f"median of {len(training)} training steps"
        return what, statistics.median(s.timeline.bubble_fraction for s in training)
    return None


def _chart(steps: Sequence[RecordedStep], path: Path) -> None:
    if importlib.util.find_spec("matplotlib") is None:
        print(f"no chart in {path}: matplotlib is not installed (pip install matplotlib)")
        return
    training = [step for step in steps if step.training]
    step = (training or list(steps))[-1]
    step.timeline.draw(path, title=_name(step))
    print(f"wrote {path}")

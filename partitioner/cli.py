"""The `plan` and `simulate` commands: solve a cost file and print what to expect.

`tfsift` mounts them with `add_subcommands`; each sets `func`, which takes the parsed
arguments and returns the exit code. Standalone: `python -m partitioner plan ...`.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence

from partitioner.costs import CostModel, format_bytes
from partitioner.plan import (
    AUTO,
    AUTO_VIRTUAL_STAGES,
    Plan,
    candidates,
    deferral_note,
    label,
    make_plan,
    solve_plan,
    within_1f1b,
)
from partitioner.schedule import PIPELINES
from partitioner.simulator import SimResult, simulate_plan, stage_times
from partitioner.solver import OPTIMIZE, InfeasibleError, stage_transfers
from partitioner.ties import first_near_fastest
from partitioner.timeline import draw_timeline, draw_timelines

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
# What `python -m partitioner --help` tells a user (the module docstring is for its readers).
DESCRIPTION = (
    "Cuts a model into pipeline stages from its cost file (written by `tfsift profile`) and "
    "prints what to expect: `plan` solves one partition, prints each stage's layers, compute, "
    "transfers, idle share and peak memory, and writes the plan file that "
    "tfsift.init({'plan_file': ...}) reads; `simulate` compares microbatch counts and "
    "pipelines. The same commands are `tfsift plan` and `tfsift simulate`."
)
_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """Bytes from "8GiB", "512MB", "1e9" or "4096" (KB, MB... are powers of 1000)."""
    match = _SIZE.fullmatch(text)
    unit = match[2].lower() if match else ""
    if match is None or unit not in _UNITS:
        raise ValueError(
            f"a size is a number with an optional unit among B, KB, MB, GB, TB, KiB, MiB, "
            f"GiB, TiB, e.g. 8GiB. Received: {text!r}"
        )
    return int(float(match[1]) * _UNITS[unit])


def add_subcommands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Registers `plan` and `simulate`; each parser's `func(args)` returns an exit code."""
    plan = subparsers.add_parser(
        "plan", help="solve a partition and write it as a plan", description=_plan.__doc__
    )
    _common(plan)
    plan.add_argument(
        "--microbatches",
        type=int,
        default=8,
        metavar="M",
        help="microbatches per step (default: 8)",
    )
    plan.add_argument(
        "--pipeline",
        choices=(*PIPELINES, AUTO),
        default=AUTO,
        help="the schedule; auto: the one whose simulated step is the shortest within "
        "the memory cap, or without one within 1F1B's peak memory (default: auto)",
    )
    plan.add_argument(
        "--virtual-stages",
        type=int,
        metavar="V",
        help="model chunks per stage (Megatron-LM's interleaved 1F1B, --pipeline interleaved "
        "or auto; default: 1, or with --pipeline auto the fastest of "
        f"{', '.join(map(str, AUTO_VIRTUAL_STAGES))})",
    )
    plan.add_argument("--output", default="plan.json", help="plan file (default: plan.json)")
    plan.add_argument("--timeline", metavar="PNG", help="also draw the simulated step")
    plan.set_defaults(func=_plan)
    simulate = subparsers.add_parser(
        "simulate", help="compare microbatch counts and pipelines", description=_simulate.__doc__
    )
    _common(simulate)
    simulate.add_argument(
        "--microbatches",
        type=_ints,
        default=[1, 2, 4, 8],
        metavar="M,...",
        help="comma-separated microbatch counts (default: 1,2,4,8)",
    )
    simulate.add_argument(
        "--pipeline",
        type=_pipelines,
        default=list(PIPELINES),
        metavar="NAME,...",
        help=f"comma-separated (default: {','.join(PIPELINES)})",
    )
    simulate.add_argument(
        "--virtual-stages",
        type=_ints,
        default=list(AUTO_VIRTUAL_STAGES),
        metavar="V,...",
        help="comma-separated model chunks per stage, for interleaved (Megatron-LM's "
        "interleaved 1F1B where V > 1); rows the model or M does not allow are left out "
        f"(default: {','.join(map(str, AUTO_VIRTUAL_STAGES))})",
    )
    simulate.add_argument(
        "--timeline",
        metavar="PNG",
        help="also draw every simulated step, one panel per row, on one time axis",
    )
    simulate.set_defaults(func=_simulate)


def main(argv: list[str] | None = None) -> int:
    """Standalone entry point: `python -m partitioner plan COSTS.json --partitions 4`."""
    parser = argparse.ArgumentParser(prog="python -m partitioner", description=DESCRIPTION)
    add_subcommands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "costs", metavar="COSTS.json", help="the cost file `tfsift profile -o` wrote"
    )
    parser.add_argument(
        "--partitions", type=int, required=True, metavar="K", help="number of pipeline stages"
    )
    parser.add_argument(
        "--optimize",
        choices=OPTIMIZE,
        default="speed",
        help="speed: fastest step under the cap; memory: least memory, recompute",
    )
    parser.add_argument(
        "--memory-cap",
        type=_bytes,
        metavar="SIZE",
        help="bytes per stage for --optimize speed, e.g. 8GiB",
    )


def _plan(args: argparse.Namespace) -> int:
    """Solves COSTS.json into K stages, prints the stages and writes the plan file."""
    try:
        costs = CostModel.load(args.costs)
        plan, choice = solve_plan(
            costs,
            args.partitions,
            args.microbatches,
            args.pipeline,
            args.virtual_stages,
            optimize=args.optimize,
            memory_cap=args.memory_cap,
        )
    except (OSError, ValueError) as error:
        return _fail(error)
    print(format_plan(costs, plan))
    if choice is not None:
        print(choice.note())
    plan.save(args.output)
    print(f"wrote {args.output}")
    if args.timeline:
        result = simulate_plan(
            costs,
            plan.partition,
            plan.microbatches,
            pipeline=plan.pipeline,
            recompute=plan.recompute,
            virtual_stages=plan.virtual_stages,
            deferred=plan.deferred,
        )
        draw_timeline(
            result,
            args.timeline,
            f"{args.costs}: {label(plan.pipeline, plan.virtual_stages, plan.deferred)}, "
            f"K={plan.partitions}, M={plan.microbatches}",
        )
        print(f"wrote {args.timeline}")
    return 0


def _simulate(args: argparse.Namespace) -> int:
    """Solves COSTS.json for each microbatch count, pipeline and count of virtual stages,
    and prints the predictions."""
    try:
        costs = CostModel.load(args.costs)
        rows = [
            _simulate_row(costs, args, M, pipeline, v)
            for M in args.microbatches
            for pipeline, v in candidates(args.partitions, M, costs.num_layers)
            if pipeline in args.pipeline and v in args.virtual_stages
        ]
    except (OSError, ValueError) as error:
        return _fail(error)
    header = ["pipeline", "M", "step time", "per sample", "bubble", "max peak memory"]
    print(_table(header, [row for row, _ in rows]))
    print(
        f"Every row runs M microbatches of {costs.batch_size} samples (the profiled size), so "
        "a step's batch and time grow with M: compare the time per sample across rows."
    )
    found = [(int(row[1]), row[0], result) for row, result in rows]
    for line in fastest_lines(found, capped=args.memory_cap is not None):
        print(line)
    drawn = [(f"{row[0]}, M={row[1]}", result) for row, result in rows if result is not None]
    if args.timeline and drawn:
        draw_timelines(drawn, args.timeline)
        print(f"wrote {args.timeline}")
    elif args.timeline:
        print(f"nothing drawn in {args.timeline}: no row fits the memory cap", file=sys.stderr)
    return 0


def _simulate_row(
    costs: CostModel, args: argparse.Namespace, M: int, pipeline: str, v: int = 1
) -> tuple[list[str], SimResult | None]:
    try:  # as `plan` makes it: the same cut, and the zero-bubble schedule's deferral
        plan = make_plan(
            costs,
            args.partitions,
            M,
            optimize=args.optimize,
            pipeline=pipeline,
            memory_cap=args.memory_cap,
            virtual_stages=v,
        )
    except InfeasibleError as error:
        needs = f"over the cap, needs {format_bytes(error.smallest_cap)}"
        return [label(pipeline, v), str(M), "-", "-", "-", needs], None
    result = simulate_plan(
        costs,
        plan.partition,
        M,
        pipeline=pipeline,
        recompute=plan.recompute,
        virtual_stages=v,
        deferred=plan.deferred,
    )
    row = [
        label(pipeline, v, plan.deferred),
        str(M),
        _seconds(result.step_time),
        _seconds(result.step_time / (M * costs.batch_size)),
        f"{result.bubble_fraction:.1%}",
        format_bytes(max(result.peak_memory)),
    ]
    return row, result


def fastest_lines(
    rows: Sequence[tuple[int, str, SimResult | None]], capped: bool = True
) -> list[str]:
    """Per M, the pipeline `partitioner.plan.fastest_plan` chooses among the rows (listed
    in its order of preference: `label`s of pipelines and virtual stages): of those that
    fit the cap, or without one (``capped`` False) within `partitioner.plan.MEMORY_SLACK`
    times the `interleaved` row's peak where there is one, the first within
    `partitioner.ties.NEAR_TIE` of the shortest step; against the others.

    Example:
        >>> fastest_lines([(8, "interleaved", None)])
        ['M=8: no pipeline fits the memory cap']
    """
    lines = []
    for M in dict.fromkeys(m for m, _, _ in rows):
        fits = [(p, r) for m, p, r in rows if m == M and r]
        if not fits:
            lines.append(f"M={M}: no pipeline fits the memory cap")
            continue
        kept, bounded = fits, not capped and any(_is_1f1b_row(row) for row in fits)
        if bounded:  # no cap, and a 1F1B row to bound the memory by
            kept = within_1f1b(fits, lambda row: max(row[1].peak_memory), _is_1f1b_row)
        best, chosen = kept[first_near_fastest([r.step_time for _, r in kept])]
        step = chosen.step_time
        others = ", ".join(f"{p} {r.step_time / step:.2f}x" for p, r in kept if p != best)
        over = ", ".join(f"{p} {r.step_time / step:.2f}x" for p, r in fits if (p, r) not in kept)
        within = " within the cap" if capped else " within 1F1B's memory" if bounded else ""
        lines.append(
            f"M={M}: fastest{within}: {best} ({_seconds(step)}"
            + (f"; {others} as long" if others else "")
            + (f"; over it (set --memory-cap): {over}" if over else "")
            + ")"
        )
    return lines


def _is_1f1b_row(row: tuple[str, SimResult]) -> bool:
    return row[0] == "interleaved"


def format_plan(costs: CostModel, plan: Plan) -> str:
    """The stage table of a plan, then its predicted step time and bubble.

    Per stage: its layers, their parameter bytes, the compute seconds of one microbatch
    (the runtime's ``action_overhead`` per forward and backward included), the seconds of
    its input and output transfers, the fraction of the simulated step it idles, and its
    peak memory. With virtual stages, a row per chunk, the idle time and peak memory being
    its rank's.
    """
    partition, v = plan.partition, plan.virtual_stages
    compute = stage_times(costs, partition)
    transfers = stage_transfers(costs, partition)
    result = simulate_plan(
        costs,
        partition,
        plan.microbatches,
        pipeline=plan.pipeline,
        recompute=plan.recompute,
        virtual_stages=v,
        deferred=plan.deferred,
    )
    rows = []
    for c, names in enumerate(plan.stage_layers):
        forward, backward = compute[c]
        params = sum(costs.layers[i].param_bytes for i in partition.stage_layers(c))
        s = c % plan.partitions  # its rank
        rows.append(
            [str(c)]
            + [str(s)] * (v > 1)
            + [
                f"{names[0]} .. {names[-1]}",
                str(len(names)),
                format_bytes(params),
                _seconds(forward + backward),
                _seconds(transfers[c]),
                f"{result.idle[s] / result.step_time:.1%}" if result.step_time > 0 else "-",
                format_bytes(plan.peak_memory[s]),
            ]
        )
    header = ["stage", "layers", "count", "params", "compute", "transfers", "idle", "peak memory"]
    if v > 1:
        header = ["chunk", "stage", *header[1:]]
    return (
        f"{_table(header, rows)}\n"
        f"predicted step time {_seconds(plan.predicted_step_time)}, bubble "
        f"{plan.predicted_bubble:.1%} (M={plan.microbatches}, "
        f"{label(plan.pipeline, v)}, "
        f"optimize={plan.optimize}{', recompute' if plan.recompute else ''})" + deferral_note(plan)
    )


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[c]) for row in [header, *rows]) for c in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]
    return "\n".join(lines)


def _seconds(value: float) -> str:
    """A time with its unit: us below a millisecond, ms below a second, else s."""
    if value < 1e-3:
        return f"{value * 1e6:.1f} us"
    return f"{value * 1e3:.3f} ms" if value < 1 else f"{value:.3f} s"


def _fail(error: Exception) -> int:
    print(f"error: {error}", file=sys.stderr)
    return 2


def _bytes(text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _ints(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers >= 1, e.g. 1,2,4,8. Received: {text!r}"
        )
    return values


def _pipelines(text: str) -> list[str]:
    names = text.split(",")
    if not set(names) <= set(PIPELINES):
        raise argparse.ArgumentTypeError(
            f"pipelines must be among {list(PIPELINES)}. Received: {text!r}"
        )
    return names


if __name__ == "__main__":
    raise SystemExit(main())

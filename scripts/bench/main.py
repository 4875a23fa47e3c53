"""The command line every benchmark shares: measure or re-render, then publish."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from bench import harness, report
from bench.harness import Result

S = TypeVar("S")


@dataclass(frozen=True)
class Benchmark(Generic[S]):
    """A benchmark: its question, its settings, how it measures and how it renders.

    ``measure(settings)`` returns the raw results (JSON-able); ``render(raw, meta,
    settings)`` returns the Markdown of the docs section named ``section``; ``figures``,
    if given, draws the section's images from the same raw results.
    """

    name: str  # the docs section's marker; scripts/bench_<name, "-" as "_">.py
    question: str
    full: S
    quick: S
    measure: Callable[[S], Result]
    render: Callable[[Result, Result, S], str]
    figures: Callable[[Result, S], None] | None = None
    max_load: float = 1.5
    max_wait: float = 600.0

    @property
    def command(self) -> str:
        return f".venv/bin/python scripts/bench_{self.name.replace('-', '_')}.py"

    def section(self, meta: Result, *parts: str) -> str:
        return report.section(meta, self.command, *parts)


def parser(
    bench: Benchmark[S], own: argparse.ArgumentParser | None = None
) -> argparse.ArgumentParser:
    """The shared options, and ``own``'s (a parser made with ``add_help=False``: the
    benchmark's own options, which it reads itself) so that ``--help`` lists them too."""
    p = argparse.ArgumentParser(description=bench.question, parents=[own] if own else [])
    p.add_argument("--quick", action="store_true", help="a smoke test: small and short")
    p.add_argument("--no-docs", action="store_true", help="print only; leave docs/ as it is")
    p.add_argument("--json", type=Path, help="save the raw results and metadata here")
    p.add_argument("--render", type=Path, help="render the docs from a saved --json file")
    default = getattr(bench.full, "repeats", None)  # the benchmarks that repeat their jobs
    if default is not None:
        p.add_argument(
            "--repeats", type=int, help=f"jobs of each configuration (default {default})"
        )
    return p


def at_least_one(p: argparse.ArgumentParser, **counts: int | None) -> None:
    """Refuses a count option given below 1 (``repeats=0`` is ``--repeats 0``)."""
    for name, value in counts.items():
        flag = "--" + name.replace("_", "-")
        if value is not None and value < 1:
            p.error(f"{flag} must be at least 1. Received: {flag} {value}")


def run(
    bench: Benchmark[S],
    argv: list[str] | None = None,
    settings: S | None = None,
    own: argparse.ArgumentParser | None = None,
) -> str:
    """Measures (or loads ``--render``), prints the section and writes it into the docs;
    ``own``'s options in ``argv`` are the caller's, read into ``settings``; ``--repeats``
    is read here, into whichever settings run."""
    p = parser(bench, own)
    args = p.parse_args(argv)
    chosen = settings if settings is not None else bench.quick if args.quick else bench.full
    repeats = getattr(args, "repeats", None)
    at_least_one(p, repeats=repeats)
    if repeats is not None:
        chosen = dataclasses.replace(chosen, repeats=repeats)
    if args.render:
        saved = json.loads(args.render.read_text())
        raw, meta = saved["raw"], saved["meta"]
        chosen = bench.quick if meta.get("quick") and settings is None else chosen
    else:
        if not args.no_docs and not args.quick:  # before an hour's run, not after it
            report.section_file(bench.name)
        load, note = harness.wait_for_quiet(bench.max_load, 0.0 if args.quick else bench.max_wait)
        start = time.monotonic()
        raw = bench.measure(chosen)
        meta = harness.metadata(load, time.monotonic() - start, note) | {"quick": args.quick}
        if args.json:
            args.json.write_text(json.dumps({"raw": raw, "meta": meta}, indent=1))
    text = bench.render(raw, meta, chosen)
    print(text, flush=True)
    if not args.no_docs and not meta.get("quick"):
        report.write_section(bench.name, text)
        if bench.figures is not None:
            bench.figures(raw, chosen)
    return text

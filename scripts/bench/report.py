"""Rendering saved results: Markdown tables, provenance lines, docs sections."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

from bench.harness import ROOT, Result

DOC = ROOT / "docs" / "benchmarks.md"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def median_ms(times: Sequence[float]) -> float:
    return 1000 * statistics.median(times)


def provenance(meta: Result, command: str) -> str:
    """The line under every generated table: when, where, which commit, how to rerun."""
    minutes = meta.get("seconds", 0) / 60
    return (
        f"Measured {meta['date']} on {meta['cores']} cores at commit {meta['commit']} "
        f"(1-minute load {meta['load_start']:.2f} at start, {meta['load_end']:.2f} at end"
        f"{meta.get('wait_note', '')}; it took {minutes:.1f} min). Rerun: `{command}`."
    )


def write_section(name: str, text: str, path: Path = DOC) -> None:
    """Replaces the text between ``<!-- name:begin -->`` and ``<!-- name:end -->``, leaving
    the rest of the file as it is; appends the section if the markers are missing."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    current = path.read_text() if path.exists() else "# Benchmarks\n"
    block = f"{begin}\n{text}\n{end}"
    if begin in current and end in current:
        head, rest = current.split(begin, 1)
        path.write_text(head + block + rest.split(end, 1)[1])
    else:
        path.write_text(current.rstrip("\n") + "\n\n" + block + "\n")

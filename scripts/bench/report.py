"""Rendering saved results: Markdown tables, provenance lines, docs sections."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path

from bench.harness import ROOT, Result

# Where a section's markers are looked for, in this order: the answers, then the log
# (where a section moves once its question is settled).
DOCS = (ROOT / "docs" / "benchmarks.md", ROOT / "docs" / "benchmarks-log.md")


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def median_ms(times: Sequence[float]) -> float:
    return 1000 * statistics.median(times)


def listed(values: Iterable[float], spec: str = ".3f", sep: str = ", ") -> str:
    return sep.join(format(v, spec) for v in values)


def section(meta: Result, command: str, *parts: str) -> str:
    """A docs section: the provenance line, then ``parts`` (tables, headings)."""
    return "\n\n".join([provenance(meta, command), *parts])


def provenance(meta: Result, command: str) -> str:
    """The line under every generated table: when, where, which commit, how to rerun."""
    minutes = meta.get("seconds", 0) / 60
    return (
        f"Measured {meta['date']} on {meta['cores']} cores at commit {meta['commit']} "
        f"(1-minute load {meta['load_start']:.2f} at start, {meta['load_end']:.2f} at end"
        f"{meta.get('wait_note', '')}; it took {minutes:.1f} min). Rerun: `{command}`."
    )


def section_file(name: str, paths: Sequence[Path] = DOCS) -> Path:
    """The first of ``paths`` holding both of section ``name``'s markers.

    Raises:
        ValueError: no file of ``paths`` has both markers.
    """
    for path in paths:
        current = path.read_text() if path.exists() else ""
        if all(marker in current for marker in markers(name)):
            return path
    begin, end = markers(name)
    raise ValueError(
        f"a benchmark's section needs {begin} and {end} in {' or '.join(map(str, paths))}. "
        f"Received: name={name!r}, in neither"
    )


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def write_section(name: str, text: str, paths: Sequence[Path] = DOCS) -> Path:
    """Replaces the text between ``<!-- name:begin -->`` and ``<!-- name:end -->`` in
    ``section_file(name, paths)``, leaving the rest of that file as it is; returns it."""
    path, (begin, end) = section_file(name, paths), markers(name)
    head, rest = path.read_text().split(begin, 1)
    path.write_text(f"{head}{begin}\n{text}\n{end}{rest.split(end, 1)[1]}")
    return path

"""scripts/bench/report.py's docs sections: found in the answers or, failing that, the log."""

from __future__ import annotations

from pathlib import Path

import pytest
import scripts_module

scripts_module.load("bench_pipeline")  # puts scripts/ on the path, as when a benchmark runs
from bench import report  # noqa: E402
from bench.main import Benchmark, run  # noqa: E402

SCRIPTS = scripts_module.SCRIPTS


def docs(tmp_path: Path, answers: str, log: str) -> tuple[Path, Path]:
    paths = (tmp_path / "benchmarks.md", tmp_path / "benchmarks-log.md")
    for path, text in zip(paths, (answers, log), strict=True):
        path.write_text(text)
    return paths


SECTION = "intro\n<!-- calls:begin -->\nold\n<!-- calls:end -->\nafter\n"


def test_a_section_is_rewritten_in_the_answers_where_its_markers_are(tmp_path: Path) -> None:
    paths = docs(tmp_path, SECTION, SECTION)
    assert report.write_section("calls", "new", paths) == paths[0]
    assert paths[0].read_text() == "intro\n<!-- calls:begin -->\nnew\n<!-- calls:end -->\nafter\n"
    assert paths[1].read_text() == SECTION  # the log's copy left as it is


def test_a_section_moved_to_the_log_is_rewritten_there(tmp_path: Path) -> None:
    paths = docs(tmp_path, "intro\n<!-- calls:begin -->\nno end marker\n", SECTION)
    assert report.write_section("calls", "new", paths) == paths[1]
    assert paths[1].read_text() == "intro\n<!-- calls:begin -->\nnew\n<!-- calls:end -->\nafter\n"
    assert paths[0].read_text() == "intro\n<!-- calls:begin -->\nno end marker\n"


def test_a_section_in_neither_file_is_an_error_naming_both(tmp_path: Path) -> None:
    paths = docs(tmp_path, SECTION, SECTION)
    with pytest.raises(ValueError) as error:
        report.write_section("sifting", "new", paths)
    assert str(error.value) == (
        "a benchmark's section needs <!-- sifting:begin --> and <!-- sifting:end --> in "
        f"{paths[0]} or {paths[1]}. Received: name='sifting', in neither"
    )
    assert paths[0].read_text() == paths[1].read_text() == SECTION


def test_every_benchmarks_section_is_in_the_answers_or_the_log() -> None:
    names = [f.stem.removeprefix("bench_").replace("_", "-") for f in SCRIPTS.glob("bench_*.py")]
    assert len(names) >= 7
    assert {name: report.section_file(name).parent.name for name in names} == dict.fromkeys(
        names, "docs"
    )


def test_a_run_that_would_write_nowhere_is_refused_before_it_measures() -> None:
    def measure(settings: None) -> dict[str, object]:
        raise AssertionError("measured")

    bench = Benchmark("nowhere", "?", None, None, measure, lambda raw, meta, s: "")
    with pytest.raises(ValueError, match="Received: name='nowhere', in neither"):
        run(bench, [])

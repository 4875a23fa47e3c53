"""scripts/bench_peers.py's reading of its jobs: rounds paired, the rotation's count."""

from __future__ import annotations

from types import ModuleType

import pytest
import scripts_module

DP = "data parallel, 2 x B/2"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return scripts_module.load("bench_peers")


def medians() -> dict[str, list[float]]:
    """Three rounds on a machine that slows down: round 2 runs everything 1.5x longer."""
    return {
        "one process | tfsift / Keras": [2.0, 3.0, 2.0],
        f"{DP} | tfsift": [1.05, 1.5, 1.0],  # the slow round alone puts its median at 1.05
        f"{DP} | tf.distribute MWMS": [1.0, 1.56, 1.02],
    }


def test_paired_divides_job_by_job_in_round_order(bench: ModuleType) -> None:
    ratios = bench.paired(medians(), f"{DP} | tfsift", f"{DP} | tf.distribute MWMS")
    assert ratios == pytest.approx([1.05, 1.5 / 1.56, 1.0 / 1.02])


def test_paired_rows_report_the_pairs_that_ran(bench: ModuleType) -> None:
    # the pipelines' and PyTorch's rows did not run: only tfsift against MWMS is paired
    rows = bench.paired_rows(medians())
    assert rows == [
        [f"{DP}: tfsift / tf.distribute MWMS", "0.980", "2 of 3", "1.050, 0.962, 0.980"]
    ]


def test_paired_rows_name_tfsifts_own_schedules_by_row(bench: ModuleType) -> None:
    gpipe, one_f_one_b = "K=2 pipeline, GPipe", "K=2 pipeline, 1F1B"
    rows = bench.paired_rows(
        {f"{gpipe} | tfsift": [1.0, 2.0], f"{one_f_one_b} | tfsift": [1.1, 1.9]}
    )
    assert rows == [[f"tfsift: {one_f_one_b} / {gpipe}", "1.025", "1 of 2", "1.100, 0.950"]]


def test_render_counts_the_rounds_measured(bench: ModuleType) -> None:
    # the medians of the whole run disagree with the rounds: 1.05 against 1.02 (tfsift
    # 2.9% longer), while tfsift's job was the shorter in 2 of 3 rounds
    text = bench.render({"medians": medians()}, META, bench.Settings())
    assert "### M=8 microbatches in the pipelines, 3 jobs per configuration" in text
    assert f"| {DP} | tfsift | 1050.0 | 1.90x | 1050, 1500, 1000 |" in text
    assert f"| {DP}: tfsift / tf.distribute MWMS | 0.980 | 2 of 3 |" in text
    assert scripts_module.prose(text) == []


def test_render_names_the_microbatches_measured(bench: ModuleType) -> None:
    # a --render of an M=16 run names M=16 without --microbatches given again
    text = bench.render({"medians": medians(), "M": 16}, META, bench.Settings())
    assert "### M=16 microbatches in the pipelines, 3 jobs per configuration" in text


META = {
    "date": "2026-11-29",
    "cores": 2,
    "commit": "abc1234",
    "load_start": 0.1,
    "load_end": 0.2,
    "seconds": 60.0,
}


def test_help_lists_its_own_options_beside_the_shared_ones(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for option in ("--torch", "--repeats", "--quick", "--no-docs", "--json", "--render"):
        assert option in out


def test_repeats_below_one_is_refused_before_any_job(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--repeats", "0", "--quick"])
    assert exit_.value.code == 2
    assert "--repeats must be at least 1. Received: --repeats 0" in capsys.readouterr().err


def test_pipelines_only_leaves_out_the_data_parallel_rows(bench: ModuleType) -> None:
    settings = bench.Settings(torch="/nonexistent/python", pipelines_only=True)
    assert bench.cases(settings) == [
        ("one process", "tfsift / Keras", 1, "reference"),
        ("K=2 pipeline, GPipe", "tfsift", 2, "simple"),
        ("K=2 pipeline, 1F1B", "tfsift", 2, "interleaved"),
        ("K=2 pipeline, interleaved 1F1B, 2 stages a rank", "tfsift", 2, "interleaved/2"),
        ("K=2 pipeline, zero bubble (ZB-H1)", "tfsift", 2, "zero_bubble@1GB"),
    ]


def test_torchs_interleaved_schedules_run_beside_tfsifts(bench: ModuleType) -> None:
    torch_rows = [(row, mode) for row, fw, _, mode in bench.CASES if fw == "PyTorch"]
    assert ("K=2 pipeline, zero bubble (ZB-H1)", "zero_bubble") in torch_rows
    assert ("K=2 pipeline, interleaved 1F1B, 2 stages a rank", "interleaved_1f1b") in torch_rows
    zb, one_f_one_b = "K=2 pipeline, zero bubble (ZB-H1)", "K=2 pipeline, 1F1B"
    virtual = "K=2 pipeline, interleaved 1F1B, 2 stages a rank"
    rows = bench.paired_rows(
        {
            f"{zb} | tfsift": [0.9, 1.0],
            f"{zb} | PyTorch": [1.0, 1.0],
            f"{one_f_one_b} | tfsift": [1.0, 1.0],
            f"{virtual} | tfsift": [0.9, 1.1],
            f"{virtual} | PyTorch": [1.0, 1.0],
        }
    )
    assert rows == [
        [f"{zb}: tfsift / PyTorch", "0.950", "1 of 2", "0.900, 1.000"],
        [f"tfsift: {zb} / {one_f_one_b}", "0.950", "1 of 2", "0.900, 1.000"],
        [f"{virtual}: tfsift / PyTorch", "1.000", "1 of 2", "0.900, 1.100"],
        [f"tfsift: {virtual} / {one_f_one_b}", "1.000", "1 of 2", "0.900, 1.100"],
    ]


@pytest.mark.parametrize("args", [["--microbatches", "16"], ["--pipelines-only"]])
def test_other_settings_than_the_docs_table_need_no_docs(
    bench: ModuleType, capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        bench.main([*args, "--quick"])
    assert exit_.value.code == 2
    expected = "--microbatches and --pipelines-only need --no-docs (the docs keep M=8's run)"
    assert expected in capsys.readouterr().err


def test_microbatches_below_one_is_refused(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        bench.main(["--microbatches", "0", "--no-docs"])
    assert (
        "--microbatches must be at least 1. Received: --microbatches 0" in capsys.readouterr().err
    )

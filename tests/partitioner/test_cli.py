import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from partitioner.cli import add_subcommands, fastest_lines, main, parse_bytes
from partitioner.costs import CostModel, LayerCost
from partitioner.plan import Plan
from partitioner.ties import NEAR_TIE

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def costs_file(tmp_path: Path) -> Path:
    layers = tuple(
        LayerCost(f"layer{i}", 0.001 * (1 + i % 3), 0.002, 2**20 * (i + 1), 2**14, 2**12)
        for i in range(8)
    )
    path = tmp_path / "costs.json"
    CostModel(layers, batch_size=8).save(path)
    return path


@pytest.mark.parametrize(
    "text, expected",
    [("8GiB", 8 * 2**30), ("512MB", 512 * 10**6), ("1e9", 10**9), ("4096", 4096),
     ("1.5 kib", 1536), ("100B", 100)],
)  # fmt: skip
def test_parse_bytes_reads_units(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["8XB", "", "GiB", "-1GiB", "1e9e9"])
def test_parse_bytes_names_the_bad_string(text: str) -> None:
    with pytest.raises(ValueError, match=f"Received: {text!r}"):
        parse_bytes(text)


def test_plan_prints_the_stage_table_and_writes_the_plan(
    costs_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "plan.json"
    timeline = tmp_path / "step.png"
    code = main(["plan", str(costs_file), "--partitions", "3", "--microbatches", "4",
                 "--pipeline", "interleaved", "--output", str(output),
                 "--timeline", str(timeline)])  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    assert code == 0
    assert lines[0].split() == [
        "stage",
        "layers",
        "count",
        "params",
        "compute",
        "transfers",
        "idle",
        "peak",
        "memory",
    ]
    assert [line.split()[0] for line in lines[1:4]] == ["0", "1", "2"]
    plan = Plan.load(output)
    assert lines[1].split()[1:4] == ["layer0", "..", plan.stage_layers[0][-1]]
    # layer i holds (i + 1) MiB of parameters
    params = [sum(int(n[len("layer") :]) + 1 for n in names) for names in plan.stage_layers]
    assert [line.split()[5:7] for line in lines[1:4]] == [[f"{p}.00", "MiB"] for p in params]
    assert all(line.split()[11].endswith("%") for line in lines[1:4])
    assert f"predicted step time {plan.predicted_step_time * 1e3:.3f} ms" in lines[4]
    assert f"bubble {plan.predicted_bubble:.1%} (M=4, interleaved, optimize=speed)" in lines[4]
    assert lines[5:] == [f"wrote {output}", f"wrote {timeline}"]
    assert timeline.read_bytes()[:4] == b"\x89PNG"
    plan.check(CostModel.load(costs_file))


def test_plan_prints_each_stages_transfers_apart_from_the_per_action_overhead(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a plain CNN's profile: 0.58 ms a forward or backward action, cuts of a few us; the
    # transfers were the stage's load less its compute with that overhead: -1157.2 us
    layers = tuple(LayerCost(f"conv{i}", 1e-3, 2e-3, 4096, 1024, 256) for i in range(4))
    costs = tmp_path / "costs.json"
    CostModel(layers, batch_size=8, bandwidth=1e9, latency=2e-6, action_overhead=5.8e-4).save(costs)
    code = main(["plan", str(costs), "--partitions", "2", "--output", str(tmp_path / "p.json")])
    lines = capsys.readouterr().out.splitlines()
    assert code == 0
    cut = 2e-6 + 8 * 256 / 1e9  # latency + a microbatch's bytes over the bandwidth
    assert [line.split()[9:11] for line in lines[1:3]] == [[f"{cut * 1e6:.1f}", "us"]] * 2
    # compute holds the overhead: 2 layers' forward and backward, plus two actions
    assert lines[1].split()[7:9] == [f"{(2 * 3e-3 + 2 * 5.8e-4) * 1e3:.3f}", "ms"]


def test_plan_reports_an_infeasible_cap(
    costs_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["plan", str(costs_file), "--partitions", "2", "--memory-cap", "1MiB",
                 "--output", str(tmp_path / "plan.json")])  # fmt: skip
    assert code == 2
    assert "smallest cap that fits is" in capsys.readouterr().err
    assert not (tmp_path / "plan.json").exists()


def test_bad_memory_cap_is_a_usage_error(
    costs_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["plan", str(costs_file), "--partitions", "2", "--memory-cap", "8XB"])
    assert info.value.code == 2
    assert "Received: '8XB'" in capsys.readouterr().err


def test_simulate_prints_one_row_per_microbatch_count_and_pipeline(
    costs_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["simulate", str(costs_file), "--partitions", "2", "--microbatches", "1,4",
                 "--pipeline", "simple,interleaved", "--optimize", "memory",
                 "--virtual-stages", "1"])  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    assert code == 0
    assert lines[0].split() == [
        "pipeline", "M", "step", "time", "per", "sample", "bubble", "max", "peak", "memory"
    ]  # fmt: skip
    assert [line.split()[:2] for line in lines[1:5]] == [
        ["interleaved", "1"],
        ["simple", "1"],
        ["interleaved", "4"],
        ["simple", "4"],
    ]
    # One microbatch on two stages: each idles while the other works, plus the transfers.
    assert float(lines[1].split()[6].rstrip("%")) >= 50.0
    units = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
    row = lines[4].split()  # simple, M=4: the step time and the time per sample, with units
    step, per_sample = (float(row[i]) * units[row[i + 1]] for i in (2, 4))
    assert per_sample == pytest.approx(step / (4 * 8), rel=2e-3)  # 4 microbatches of 8
    assert lines[5].startswith("Every row runs M microbatches of")
    # one microbatch: the two schedules are one, and the tie goes to the first (1F1B); no
    # cap: the rows within 1F1B's peak memory
    assert lines[6].startswith("M=1: fastest within 1F1B's memory: interleaved (")
    assert lines[7].startswith("M=4: fastest within 1F1B's memory: ")


def test_simulate_draws_every_row_into_one_timeline(
    costs_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    timeline = tmp_path / "out.png"
    code = main(["simulate", str(costs_file), "--partitions", "2", "--microbatches", "2,4",
                 "--timeline", str(timeline)])  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    assert code == 0
    # header, the three pipelines and interleaved on 2 and 4 virtual stages (8 layers make
    # 2 x 4 chunks) for M=2 and 4, the note, the fastest per M, wrote
    assert len(lines) == 1 + 10 + 1 + 2 + 1
    # in auto's order of preference
    assert [line.split()[0] for i, line in enumerate(lines[1:6]) if i != 1] == [
        "interleaved", "interleaved(v=2)", "interleaved(v=4)", "simple"
    ]  # fmt: skip
    # the zero-bubble row names the W's its plan defers on each stage (none on stage 0)
    assert re.fullmatch(r"zero_bubble\(d=0,[01]\)", lines[2].split()[0])
    assert lines[-1] == f"wrote {timeline}"
    assert timeline.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_simulate_draws_nothing_when_no_row_fits_the_cap(
    costs_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    timeline = tmp_path / "out.png"
    code = main(["simulate", str(costs_file), "--partitions", "2", "--microbatches", "2",
                 "--memory-cap", "1MiB", "--timeline", str(timeline)])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0
    assert "over the cap" in captured.out
    assert captured.err == f"nothing drawn in {timeline}: no row fits the memory cap\n"
    assert not timeline.exists()


def test_plan_auto_picks_the_pipeline_with_the_shortest_simulated_step(
    costs_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "plan.json"
    code = main(["plan", str(costs_file), "--partitions", "2", "--microbatches", "8",
                 "--pipeline", "auto", "--output", str(output)])  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    assert code == 0
    plan = Plan.load(output)
    steps = {}
    for pipeline, v in [("simple", 1), ("interleaved", 1), ("zero_bubble", 1),
                        ("interleaved", 2), ("interleaved", 4)]:  # fmt: skip
        path = tmp_path / f"{pipeline}{v}.json"
        main(["plan", str(costs_file), "--partitions", "2", "--microbatches", "8", "--pipeline",
              pipeline, "--virtual-stages", str(v), "--output", str(path)])  # fmt: skip
        steps[pipeline, v] = Plan.load(path).predicted_step_time
    # two chunks a stage shorten 1F1B's bubble by more than the extra transfers cost here
    assert min(steps, key=lambda k: steps[k]) == ("interleaved", 2)
    assert (plan.pipeline, plan.virtual_stages) == ("interleaved", 2)
    assert plan.predicted_step_time == steps["interleaved", 2] < steps["zero_bubble", 1]
    # the choice in words, each other candidate's predicted step against it
    assert lines[-2] == (
        'pipeline "auto": interleaved(v=2), the first of interleaved, zero_bubble, '
        "interleaved(v=2), interleaved(v=4), simple whose predicted step is within 3% of the "
        "shortest (the others' against it: interleaved 1.11x, zero_bubble(d=0,0) 1.08x, "
        "interleaved(v=4) 1.05x, simple 1.11x)"
    )
    # given one chunk a stage, auto compares the pipelines only: the zero-bubble schedule's
    # step is shorter than 1F1B's, but by less than NEAR_TIE (3%): a near-tie, which goes
    # to 1F1B; it is the default (no --pipeline)
    assert 1 - NEAR_TIE < steps["zero_bubble", 1] / steps["interleaved", 1] < 1
    main(["plan", str(costs_file), "--partitions", "2", "--microbatches", "8",
          "--virtual-stages", "1", "--output", str(output)])  # fmt: skip
    assert (Plan.load(output).pipeline, Plan.load(output).virtual_stages) == ("interleaved", 1)


def test_plan_on_virtual_stages_prints_a_row_per_chunk_with_its_stage(
    costs_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "plan.json"
    code = main(["plan", str(costs_file), "--partitions", "2", "--microbatches", "4",
                 "--virtual-stages", "2", "--output", str(output)])  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    assert code == 0
    plan = Plan.load(output)
    assert (plan.virtual_stages, plan.partitions, len(plan.stage_layers)) == (2, 2, 4)
    assert lines[0].split()[:3] == ["chunk", "stage", "layers"]
    # chunks 0 and 2 on stage 0, 1 and 3 on stage 1, each row with its stage's peak memory
    assert [line.split()[:2] for line in lines[1:5]] == [["0", "0"], ["1", "1"], ["2", "0"],
                                                         ["3", "1"]]  # fmt: skip
    assert lines[1].split()[-2:] == lines[3].split()[-2:]
    assert "(M=4, interleaved(v=2), optimize=speed)" in lines[5]


def test_plan_on_virtual_stages_refuses_other_pipelines(
    costs_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["plan", str(costs_file), "--partitions", "2", "--pipeline", "zero_bubble",
                 "--virtual-stages", "2", "--output", str(tmp_path / "p.json")])  # fmt: skip
    assert code == 2
    assert "Received: pipeline='zero_bubble', virtual_stages=2" in capsys.readouterr().err


def test_the_fastest_pipeline_per_microbatch_count_fits_the_cap() -> None:
    from partitioner.simulator import SimResult

    def result(step: float, peak: int) -> SimResult:
        return SimResult(step, (step,), (0.0,), 0.0, (peak,), ())

    rows = [  # in fastest_plan's order of preference
        (4, "interleaved", result(0.010, 5)),
        (4, "zero_bubble", None),  # over the cap
        (4, "interleaved(v=2)", result(0.010, 5)),  # a full tie: the row listed first wins
        (4, "simple", result(0.0099, 9)),  # 1% faster: a near-tie, which 1F1B wins
        (8, "interleaved", result(0.020, 5)),
        (8, "zero_bubble", result(0.018, 5.2)),  # 10% faster, 4% more memory
        (8, "interleaved(v=2)", result(0.020, 5)),
        (8, "simple", result(0.017, 9)),
        (16, "zero_bubble", None),
    ]
    assert fastest_lines(rows) == [
        "M=4: fastest within the cap: interleaved (10.000 ms; interleaved(v=2) 1.00x, "
        "simple 0.99x as long)",
        "M=8: fastest within the cap: simple (17.000 ms; interleaved 1.18x, zero_bubble 1.06x, "
        "interleaved(v=2) 1.18x as long)",
        "M=16: no pipeline fits the memory cap",
    ]
    # without a cap: the rows within 1.05x 1F1B's peak memory; the others are named
    assert fastest_lines(rows, capped=False)[1] == (
        "M=8: fastest within 1F1B's memory: zero_bubble (18.000 ms; interleaved 1.11x, "
        "interleaved(v=2) 1.11x as long; over it (set --memory-cap): simple 0.94x)"
    )
    # no 1F1B row to bound the memory by (--pipeline left it out): the fastest of the rows
    unbounded = [row for row in rows if row[0] == 8 and row[1] in ("zero_bubble", "simple")]
    assert fastest_lines(unbounded, capped=False) == [
        "M=8: fastest: simple (17.000 ms; zero_bubble 1.06x as long)"
    ]


def test_subcommands_mount_on_another_parser(costs_file: Path, tmp_path: Path) -> None:
    parser = argparse.ArgumentParser(prog="tfsift")
    add_subcommands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["plan", str(costs_file), "--partitions", "2",
                              "--output", str(tmp_path / "p.json")])  # fmt: skip
    assert args.func(args) == 0
    assert json.loads((tmp_path / "p.json").read_text())["microbatches"] == 8


@pytest.mark.parametrize("module", ["partitioner", "partitioner.cli"])
def test_runs_as_a_module(module: str, costs_file: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", module, "simulate", str(costs_file), "--partitions", "2",
         "--microbatches", "2"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1].split()[:2] == ["interleaved", "2"]


def test_help_tells_a_user_what_the_commands_do_not_how_they_are_mounted(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Cuts a model into pipeline stages from its cost file" in text
    assert "The same commands are `tfsift plan` and `tfsift simulate`" in text
    assert "add_subcommands" not in text and "func" not in text


def test_the_transfers_column_leaves_out_the_runtimes_cost_per_action(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    costs = CostModel(tuple(LayerCost(f"l{i}", 0.004, 0.008, 0, 0, 1000) for i in range(4)),
                      bandwidth=1e6, latency=1e-4, action_overhead=6e-4)  # fmt: skip
    costs.save(tmp_path / "costs.json")
    main(["plan", str(tmp_path / "costs.json"), "--partitions", "2",
          "--output", str(tmp_path / "plan.json")])  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    # each stage sends or receives across its one cut: 0.1 ms + 1000 B at 1 MB/s = 1.1 ms;
    # its compute column holds 2 x 12 ms and the 0.6 ms per forward and per backward
    assert [line.split()[7:11] for line in lines[1:3]] == [["25.200", "ms", "1.100", "ms"]] * 2


def test_the_zero_bubble_rows_defer_what_the_cap_holds(
    costs_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--partitions", "2", "--pipeline", "zero_bubble", "--memory-cap", "1GB"]
    assert main(["simulate", str(costs_file), "--microbatches", "4", *args]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[0] == "zero_bubble(d=0,1)"  # ZB-H1
    output = tmp_path / "plan.json"
    code = main(["plan", str(costs_file), "--microbatches", "4", "--output", str(output), *args])
    assert code == 0 and Plan.load(output).deferred == (0, 1)
    assert "(M=4, zero_bubble, optimize=speed); W's deferred per stage: 0, 1\n" in (
        capsys.readouterr().out
    )
